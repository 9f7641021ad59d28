"""A Braid job on Ray: its named, detached actors, found by every rank of the job.

Names: ``JOB.planner``, ``JOB.sources.K`` (K < runtime.source_actors; source i lives in
actor i % source_actors; with source_actors 0 the planner serves the payloads;
``JOB.sources.K.shadow`` with runtime.shadow) and ``JOB.constructor.NODE`` (one per node that hosts trainer
ranks, pinned to it), all in ``runtime.namespace``. ``JOB`` is ``runtime.job`` or
``braid-`` and a hash of the config's fingerprint, topology and start state, so the ranks
of one job (same config, same state) find the same actors and another job never does.

The first rank to arrive creates the actors (``get_if_exists``: race-free); every rank
attaches with a client id and detaches when it closes or exits; the last to detach stops
the job. ``stop(JOB)`` removes a crashed job's actors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from braid import _core
from braid.ray_runtime._ray import ray
from braid.ray_runtime.actors import (ConstructorActor, PlannerActor, SourceActor,
                                     internal_kv, job_keys)
from braid.ray_runtime.names import job_name

_Planner = ray.remote(PlannerActor)
_Sources = ray.remote(SourceActor)
_Constructor = ray.remote(ConstructorActor)


def keep_steps(config: "_core.Config") -> int:
    """Steps of plans the planner keeps behind the newest one asked for."""
    # The trainers request about 2 steps ahead, the constructors build steps_in_flight
    # ahead of that and the planner plans one further.
    return 2 * int(config.runtime["steps_in_flight"]) + 6


def keep_builds(config: "_core.Config") -> int:
    """Steps of builds and views a constructor keeps behind the newest one asked for.

    Fewer than the planner's plans: the ranks of a node move within about a step of each
    other, and a rank further behind only costs a rebuild (the same bytes, from the
    planner's plan). Each kept step holds every bucket's micro-batches of the node.
    """
    return int(config.runtime["steps_in_flight"]) + 2


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
        ray.init(namespace=rt["namespace"], include_dashboard=False, log_to_driver=False,
                 configure_logging=False)


def _options(name: str, namespace: str, **extra: Any) -> Dict[str, Any]:
    opts = dict(name=name, namespace=namespace, lifetime="detached", get_if_exists=True,
                num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=16)
    opts.update(extra)
    return opts


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


def attach(config: "_core.Config", state_json: str, client: str) -> Job:
    """Creates the job's actors if they do not exist yet, and attaches ``client``."""
    rt = config.runtime
    name, ns = job_name(config, state_json), rt["namespace"]
    n = len(config.source_names)
    n_actors = min(int(rt["source_actors"]), n)
    # Source i's payloads: actor i % source_actors, or the planner's (-1) with 0 actors.
    source_actor_of = [i % n_actors if n_actors else -1 for i in range(n)]
    keep = keep_steps(config)
    node = ray.get_runtime_context().get_node_id()
    affinity = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    # The planner and source actors go where Ray places them, on nodes with
    # runtime.actor_resources when given (and again there after a restart); a
    # constructor stays on its node.
    shared = {"resources": dict(rt["actor_resources"])} if rt["actor_resources"] else {}
    planner = _Planner.options(**_options(f"{name}.planner", ns, **shared)).remote(
        config, os.getcwd(), state_json, keep, [i for i in range(n) if not n_actors])
    sources = [
        _Sources.options(**_options(f"{name}.sources.{k}", ns, **shared)).remote(
            config, os.getcwd(), [i for i, a in enumerate(source_actor_of) if a == k])
        for k in range(n_actors)]
    if rt["shadow"]:  # hot standbys, spread over the nodes (docs/distributed.md)
        sources += [
            _Sources.options(**_options(f"{name}.sources.{k}.shadow", ns,
                                        scheduling_strategy="SPREAD", **shared)).remote(
                config, os.getcwd(), [i for i, a in enumerate(source_actor_of) if a == k])
            for k in range(n_actors)]
    constructor = _Constructor.options(
        **_options(f"{name}.constructor.{node[:16]}", ns,
                   scheduling_strategy=affinity(node_id=node, soft=False))
    ).remote(config, name, ns, source_actor_of, keep_builds(config))
    job = Job(name, ns, planner, sources, constructor, float(rt["timeout_s"]))
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


def actor_names(name: str, namespace: str) -> List[str]:
    """The names of job ``name``'s actors alive in ``namespace``."""
    found = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in found
                  if a["namespace"] == namespace and a["name"].startswith(name + "."))


def stop(name: str, namespace: str, skip: Optional[str] = None) -> List[str]:
    """Kills every actor of job ``name`` (also a crashed job's) but ``skip`` (the
    caller's own, when an actor stops its job); returns their names."""
    names = [n for n in actor_names(name, namespace) if n != skip]
    for key in job_keys(namespace, name):
        internal_kv._internal_kv_del(key)
    for actor_name in names:
        try:
            ray.kill(ray.get_actor(actor_name, namespace=namespace), no_restart=True)
        except ValueError:  # already gone
            pass
    return names


def status(name: str, namespace: str, timeout_s: float = 10.0) -> List[Dict[str, Any]]:
    """Each actor of job ``name``: its name and what it reports (role, node, pid, memory,
    steps reached), or the error that kept it from answering."""
    out = []
    for actor_name in actor_names(name, namespace):
        entry: Dict[str, Any] = {"name": actor_name}
        try:
            actor = ray.get_actor(actor_name, namespace=namespace)
            entry.update(ray.get(actor.status.remote(), timeout=timeout_s))
        except Exception as exc:  # reported, not raised: status is for crashed jobs too
            entry["error"] = f"{type(exc).__name__}: {exc}"
        out.append(entry)
    return out


def jobs(namespace: Optional[str] = None) -> List[str]:
    """Names of the Braid jobs with actors alive (in ``namespace``, or every one)."""
    found = ray.util.list_named_actors(all_namespaces=True)
    return sorted({a["name"].rsplit(".planner", 1)[0] for a in found
                   if a["name"].endswith(".planner")
                   and (namespace is None or a["namespace"] == namespace)})
