"""A job's named actors and its entry in Ray's key-value store: found, reported and
removed by name (``braid status``, ``braid stop``, the last rank to detach).

Names: ``JOB.planner`` (by default the job's first node's host: the planner, the
sources and that node's constructor), ``JOB.constructor.NODE`` (every other node's host),
``JOB.sources.K`` (with ``runtime.source_actors: K``) and ``JOB.sources.K.shadow`` (a
source host's standby), all in ``runtime.namespace`` (hosts.py).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from braid.ray_runtime._ray import ray
# Ray's internal key-value store (private API of the pinned Ray version): the only state
# of a job that outlives its actors' restarts (journal_key).
from ray.experimental import internal_kv


def journal_key(namespace: str, job: str) -> str:
    """The key, in Ray's key-value store (kept by the GCS), of job ``job``'s planner
    journal: its start, newest checkpoints and attached ranks
    (service/planner_service_state.h), so a restarted planner resumes from it."""
    return f"braid/{namespace}/{job}/journal"


def actor_names(name: str, namespace: str) -> List[str]:
    """The names of job ``name``'s actors alive in ``namespace``."""
    found = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in found
                  if a["namespace"] == namespace and a["name"].startswith(name + "."))


def stop(name: str, namespace: str, skip: Optional[str] = None) -> List[str]:
    """Kills every actor of job ``name`` (also a crashed job's) but ``skip`` (the
    caller's own, when an actor stops its job), and drops its journal; returns the
    actors' names."""
    names = [n for n in actor_names(name, namespace) if n != skip]
    internal_kv._internal_kv_del(journal_key(namespace, name))
    for actor_name in names:
        try:
            ray.kill(ray.get_actor(actor_name, namespace=namespace), no_restart=True)
        except ValueError:  # already gone
            pass
    return names


def status(name: str, namespace: str, timeout_s: float = 10.0) -> List[Dict[str, Any]]:
    """Each service of job ``name``: the name of the actor that hosts it and what it
    reports (role, node, pid, memory, steps reached), one entry per role an actor hosts;
    or, for an actor that did not answer, the error."""
    out = []
    for actor_name in actor_names(name, namespace):
        try:
            actor = ray.get_actor(actor_name, namespace=namespace)
            reply = ray.get(actor.status.remote(), timeout=timeout_s)
        except Exception as exc:  # reported, not raised: status is for crashed jobs too
            out.append({"name": actor_name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        out.extend({"name": actor_name, **role} for role in reply["roles"])
    return out


def jobs(namespace: Optional[str] = None) -> List[str]:
    """Names of the Braid jobs with actors alive (in ``namespace``, or every one)."""
    found = ray.util.list_named_actors(all_namespaces=True)
    return sorted({a["name"].rsplit(".planner", 1)[0] for a in found
                   if a["name"].endswith(".planner")
                   and (namespace is None or a["namespace"] == namespace)})
