"""A Braid job on Ray: its named, detached actors, found by every rank of the job.

``JOB`` is ``runtime.job`` or ``braid-`` and a hash of the config's fingerprint, topology
and start state, so the ranks of one job (same config, same state) find the same actors
and another job never does. Where each service runs follows ``_core.placement(config)``
(service/hosting.h, hosts.py): by default one host process per node, the first node's
``JOB.planner`` with the planner, the sources and its constructor, the others'
``JOB.constructor.NODE``; with ``runtime.source_actors`` or ``runtime.actor_resources``
the planner, ``JOB.sources.K`` and each node's constructor apart; hot standbys
``JOB.sources.K.shadow`` with ``runtime.shadow``.

The first rank to arrive creates the actors (``get_if_exists``: race-free); every rank
attaches with a client id and detaches when it closes or exits; the last to detach stops
the job. ``stop(JOB)`` removes a crashed job's actors.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, List

from braid import _core
from braid.ray_runtime import hosts
from braid.ray_runtime._ray import ray
from braid.ray_runtime.names import job_name
from braid.ray_runtime.registry import actor_names, jobs, status, stop

__all__ = ["Job", "actor_names", "attach", "connect", "detach", "jobs", "status", "stop"]


def connect(config: "_core.Config", start_local: bool = False) -> None:
    """Joins ``runtime.address`` (unless this process already joined a cluster); with
    ``start_local``, starts a local Ray instance when none is running there."""
    if ray.is_initialized():
        return
    rt = config.runtime
    try:
        ray.init(address=rt["address"], namespace=rt["namespace"], log_to_driver=False,
                 configure_logging=False)
    except ConnectionError as exc:
        if not start_local:
            raise _core.ConfigError(
                f"runtime.address: no Ray cluster at {rt['address']!r} ({exc}); start one "
                "with `ray start --head` on this node, or use `braid run --runtime ray`, "
                "which starts a local one") from exc
        # "local": a new instance even where /tmp/ray/ray_current_cluster names a cluster
        # that is gone (a crashed one), which a plain ray.init() would try to join.
        ray.init(address="local", namespace=rt["namespace"], include_dashboard=False,
                 log_to_driver=False, configure_logging=False)


@dataclass
class Job:
    """Handles on one job's actors, as seen from one node."""
    name: str
    namespace: str
    planner: Any
    sources: List[Any]
    constructor: Any
    timeout_s: float
    clients: List[str] = field(default_factory=list)


def _ended_or_raced(exc: BaseException) -> bool:
    """Whether an attach failed because the job was ending (its planner refuses ranks
    once the last one detached) or because Ray's ``get_if_exists`` lost a race for a name
    another rank just took: both pass once the old actors are gone or the new one is
    known."""
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
    if isinstance(cause, ConnectionError):  # the planner: the job ended
        return True
    return isinstance(exc, ValueError) and "Failed to look up actor" in str(exc)


def attach(config: "_core.Config", state_json: str, client: str) -> Job:
    """Creates the job's actors if they do not exist yet, and attaches ``client``. A rank
    that arrives while the job stops (its last rank detached: a rank that starts late,
    after the others finished) is refused by the ended planner and, once the job's actors
    are gone, starts it again from the same start state; it tries for
    ``runtime.timeout_s`` (a loaded cluster takes seconds to kill the old actors and
    release their names). Ranks that attach at once from several nodes race to create
    the actors: Ray's ``get_if_exists`` can then fail to look up the name another rank
    just took, and the next try finds it. An actor whose creation failed is an error at
    once."""
    deadline = time.monotonic() + float(config.runtime["timeout_s"])
    while True:
        try:
            return _attach_once(config, state_json, client)
        except Exception as exc:  # noqa: BLE001 - raised again unless worth a retry
            if isinstance(exc, ray.exceptions.RayActorError):  # killed as the job ended
                retry, pause = not exc.actor_init_failed, 0.5
            else:
                retry, pause = _ended_or_raced(exc), 0.2
            if not retry or time.monotonic() > deadline:
                raise
            time.sleep(pause)


def _attach_once(config: "_core.Config", state_json: str, client: str) -> Job:
    rt = config.runtime
    name, ns, cwd = job_name(config, state_json), rt["namespace"], os.getcwd()
    node = ray.get_runtime_context().get_node_id()
    placement = _core.placement(config)
    where = placement["sources"]
    # The actor that serves each source host's payloads (the first rank's choice wins:
    # the planner keeps the list it was created with).
    if where == "actors":
        source_hosts = [f"{name}.sources.{k}" for k in range(placement["hosts"])]
    else:  # with the planner (in the first node's host by default)
        source_hosts = [f"{name}.planner"]
    planner = hosts.start_planner(
        config, name, ns, cwd, state_json, source_hosts,
        placement["sources_of_host"][0] if where != "actors" else [],
        node=node if where == "node" else None)
    sources = []
    if where == "actors":
        sources = [hosts.start_sources(config, name, ns, cwd, k)
                   for k in range(placement["hosts"])]
    if placement["standby"]:  # hot standbys, spread over the nodes (docs/distributed.md)
        sources += [hosts.start_sources(config, name, ns, cwd, k, standby=True)
                    for k in range(placement["hosts"])]
    timeout_s = float(rt["timeout_s"])
    if where == "node" and ray.get(planner.node.remote(), timeout=timeout_s) == node:
        constructor = planner  # this node's host is the planner's
    else:
        constructor = hosts.start_node_host(config, name, ns, cwd, node)
    job = Job(name, ns, planner, sources, constructor, timeout_s)
    ray.get(planner.attach.remote(client), timeout=job.timeout_s)
    return job


def detach(job: Job, client: str) -> None:
    """Detaches ``client``; the last client to detach stops the job."""
    try:
        left = ray.get(job.planner.detach.remote(client), timeout=job.timeout_s)
    except Exception:  # the job is already gone
        return
    if left == 0:
        stop(job.name, job.namespace)
