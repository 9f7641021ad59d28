"""Names every process of a job computes alike, without Ray: the job's name and the
abstract Unix socket names of node delivery (``node_delivery.py``).

Abstract socket names live in the network namespace of the processes that use them (a
host, or a container with its own network), so a name need not say which node it is on.
"""

from __future__ import annotations

import hashlib
import json

from braid import _core


def job_tag(config: "_core.Config", state_json: str) -> str:
    """``braid-`` and a hash of what makes the job's stream: the config's fingerprint,
    topology and start state."""
    key = json.dumps([config.fingerprint(), config.topology, json.loads(state_json)],
                     sort_keys=True)
    return "braid-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def job_name(config: "_core.Config", state_json: str) -> str:
    """``runtime.job``, else ``job_tag``: the ranks of one job find the same actors,
    another job never does."""
    return config.runtime["job"] or job_tag(config, state_json)


def _hashed(*parts: str) -> str:
    return "braid-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def constructor_socket(namespace: str, job: str) -> str:
    """The name trainers connect to: job ``job``'s constructor on this host (the first
    one to bind it, when simulated nodes share a host)."""
    return _hashed(namespace, job, "constructor")


def node_constructor_socket(namespace: str, job: str, node_id: str) -> str:
    """The name of a constructor that found ``constructor_socket`` taken (another
    simulated node's constructor on the same host); only Ray drivers use it."""
    return _hashed(namespace, job, "constructor", node_id)


def attach_lock(namespace: str, job: str) -> str:
    """Held (bound) by the one trainer of this host that starts the attach helper; the
    others wait for the constructor's socket instead of starting helpers of their own."""
    return _hashed(namespace, job, "attach")
