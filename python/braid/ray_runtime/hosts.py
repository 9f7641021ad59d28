"""The actors that host Braid's services on Ray. Each method forwards to a C++ service
(``cpp/src/braid/service/``); what is decided (plans, checkpoints, replays, which plans
to ask for, builds ahead, hedging, what to keep) is decided there. This module moves
bytes: plans, piece requests and replies between the actors, views to the trainer ranks.

- ``PlannerHost`` (``JOB.planner``): the planner service; its journal goes to Ray's
  key-value store. With ``runtime.source_actors: 0`` it serves the sources too.
- ``NodeHost`` (``JOB.constructor.NODE``, one per node with trainer ranks, pinned to it):
  the node's constructor service, and by default, on the job's first node, the sources'
  payloads (one process per node); serves the node's ranks their views.
- ``SourcesHost`` (``JOB.sources.K`` with ``runtime.source_actors: K``, and standbys
  ``JOB.sources.K.shadow``): sources' payloads.

Requests are keyed and idempotent (a retried call returns the same bytes), so Ray may
re-run a call on a restarted actor (``max_task_retries=-1``). Threaded actors
(``max_concurrency``): the C++ calls release the GIL, so requests overlap.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from braid import _core
from braid.ray_runtime import names, node_delivery, registry
from braid.ray_runtime._ray import ray
from braid.ray_runtime.registry import internal_kv


def process_status(role: str) -> Dict[str, Any]:
    """What every actor reports of its process."""
    with open(f"/proc/{os.getpid()}/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"role": role, "pid": os.getpid(), "rss_bytes": rss,
            "node": ray.get_runtime_context().get_node_id()}


def braid_error(exc: BaseException) -> Tuple[str, str]:
    """(kind, message) of an error raised through Ray: the role's own error (a
    ConfigError, DataError, StorageError, TimeoutError), ``ConnectionError`` for an actor
    that cannot be reached, else the exception's type name."""
    if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None:
        exc = exc.cause
    if isinstance(exc, ray.exceptions.RayActorError):
        return "ConnectionError", str(exc)[:8000]
    if isinstance(exc, ray.exceptions.GetTimeoutError):
        return "TimeoutError", str(exc)[:8000]
    for cls in (_core.ConfigError, _core.DataError, _core.StorageError, TimeoutError,
                ConnectionError):
        if isinstance(exc, cls):
            return cls.__name__, str(exc)[:8000]
    return type(exc).__name__, str(exc)[:8000]


class _Serving:
    """Answers piece requests for the sources this process serves."""

    _sources: Optional["_core.SourceHost"] = None

    def _serve(self, config: "_core.Config", sources: List[int]) -> None:
        self._sources = _core.make_source_host(config, sources) if sources else None

    def fetch(self, requests: Dict[int, np.ndarray]) -> Dict[int, Tuple]:
        """Per source, ``(tokens, offsets, loss_mask, images, image_bytes, paths)`` (None
        where a source has none) for its piece requests; images stay encoded."""
        if self._sources is None:
            raise _core.ConfigError("sources: this actor serves none")
        return self._sources.fetch(requests)

    def _serving_status(self) -> Dict[str, Any]:
        return self._sources.status() if self._sources is not None else {}


class PlannerHost(_Serving):
    """The planner service (``_core.PlannerService``) of job ``JOB``, from ``state_json``;
    its journal lives in Ray's key-value store, so a restarted planner resumes from the
    newest checkpoint it committed."""

    def __init__(self, config: "_core.Config", cwd: str, state_json: str,
                 source_hosts: List[str], sources: List[int]) -> None:
        os.chdir(cwd)  # relative source paths resolve as in the job's first rank
        context = ray.get_runtime_context()
        job = context.get_actor_name().rsplit(".planner", 1)[0]
        self._key = registry.journal_key(context.namespace, job)
        # What the journal belongs to: this job (config, topology, start), not an earlier
        # one of the same name whose actors were removed without `braid stop`.
        self._tag = names.job_tag(config, state_json)
        self._source_hosts = source_hosts
        self._serve(config, sources)
        self._service = _core.make_planner_service(config, state_json, self._load(),
                                                   self._commit)

    def _load(self) -> str:
        held = internal_kv._internal_kv_get(self._key)
        entry = json.loads(held) if held else {}
        return entry.get("value", "") if entry.get("job") == self._tag else ""

    def _commit(self, journal: str) -> None:
        if journal:
            internal_kv._internal_kv_put(self._key,
                                         json.dumps({"job": self._tag, "value": journal}))
        else:  # every rank detached: the job ends
            internal_kv._internal_kv_del(self._key)

    def plan(self, step: int, timeout_s: float,
             buckets: Optional[List[int]] = None) -> Dict[str, Any]:
        """Step ``step``'s plan (wire message and states), of ``buckets`` only when given."""
        return self._service.plan(step, timeout_s, buckets)

    def attach(self, client: str) -> int:
        return self._service.attach(client)

    def detach(self, client: str) -> int:
        return self._service.detach(client)

    def source_hosts(self) -> List[str]:
        """The actor that serves each source host's payloads."""
        return self._source_hosts

    def status(self) -> Dict[str, Any]:
        return {**process_status("planner"), **self._service.figures(),
                **self._serving_status()}


class SourcesHost(_Serving):
    """The payloads of ``sources``, by key."""

    def __init__(self, config: "_core.Config", cwd: str, sources: List[int]) -> None:
        os.chdir(cwd)
        self._serve(config, sources)

    def status(self) -> Dict[str, Any]:
        return {**process_status("sources"), **self._serving_status()}


class RayTransport:
    """A node constructor's ports over Ray (``_core.make_constructor_service``'s
    callables): plans from the planner actor, piece requests to the actors that serve the
    sources. Replica 1 of a source host is its standby, ``JOB.sources.K.shadow``,
    started here when it does not run yet (its host's node is gone)."""

    def __init__(self, config: "_core.Config", job: str, namespace: str,
                 hosts: List[str], cwd: str) -> None:
        self._config, self._job, self._ns, self._cwd = config, job, namespace, cwd
        self._hosts = hosts
        self._timeout = float(config.runtime["timeout_s"])
        self._lock = threading.Lock()
        self._handles: Dict[str, Any] = {}
        self._calls: Dict[int, Tuple[Any, List[int]]] = {}
        self._next = 0

    def _handle(self, name: str, standby_of: Optional[int] = None):
        with self._lock:
            actor = self._handles.get(name)
        if actor is None:
            try:
                actor = ray.get_actor(name, namespace=self._ns)
            except ValueError:
                if standby_of is None:
                    raise ConnectionError(f"{name}: no such actor") from None
                actor = start_sources(self._config, self._job, self._ns, self._cwd,
                                      standby_of, standby=True)
            with self._lock:
                self._handles[name] = actor
        return actor

    def plan(self, step: int, buckets: List[int]) -> Tuple[np.ndarray, str, str]:
        try:
            plan = ray.get(self._handle(f"{self._job}.planner").plan.remote(
                step, self._timeout, buckets), timeout=self._timeout + 5)
        except Exception as exc:  # raised in C++ as the role's own error
            kind, message = braid_error(exc)
            raise {"ConfigError": _core.ConfigError, "DataError": _core.DataError,
                   "StorageError": _core.StorageError, "TimeoutError": TimeoutError,
                   "ConnectionError": ConnectionError}.get(kind, RuntimeError)(
                       message) from None
        return plan["plan"], plan["state_before"], plan["state_after"]

    def send(self, host: int, replica: int, requests: Dict[int, np.ndarray]) -> int:
        if replica == 0:
            actor = self._handle(self._hosts[host])
        else:
            actor = self._handle(f"{self._job}.sources.{host}.shadow", standby_of=host)
        ref = actor.fetch.remote(requests)
        with self._lock:
            self._next += 1
            self._calls[self._next] = (ref, list(requests))
            return self._next

    def wait(self, calls: List[int], timeout_s: float):
        with self._lock:
            pending = [(i, self._calls[i]) for i in calls if i in self._calls]
        if not pending:
            return None
        refs = [ref for _, (ref, _) in pending]
        ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, timeout_s))
        if not ready:
            return None
        call, (ref, sources) = pending[refs.index(ready[0])]
        with self._lock:
            self._calls.pop(call, None)
        try:
            replies = ray.get(ref, timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - the constructor service decides
            kind, message = braid_error(exc)
            return call, kind, message, None
        return call, None, None, [replies[s] for s in sources]

    def forget(self, calls: List[int]) -> None:
        with self._lock:
            for call in calls:
                self._calls.pop(call, None)


class NodeHost(_Serving):
    """A node's host process: its constructor service (``_core.ConstructorService``),
    the sources placed on the node, and the delivery of views to the node's trainer
    ranks, each view written once (a shared-memory file, or an object-store object) for
    every rank that receives it (TP peers)."""

    def __init__(self, config: "_core.Config", job: str, namespace: str, cwd: str) -> None:
        os.chdir(cwd)
        self._config, self._job, self._ns = config, job, namespace
        self._timeout = float(config.runtime["timeout_s"])
        me = ray.get_runtime_context().get_actor_name()
        planner = ray.get_actor(f"{job}.planner", namespace=namespace)
        hosts = ray.get(planner.source_hosts.remote(), timeout=self._timeout)
        placement = _core.placement(config)
        self._serve(config, [s for h, name in enumerate(hosts) if name == me
                             for s in placement["sources_of_host"][h]])
        transport = RayTransport(config, job, namespace, hosts, cwd)
        self._service = _core.make_constructor_service(
            config, transport.plan, transport.send, transport.wait, transport.forget,
            self._sources)
        self._delivered = 0  # views sent through node delivery
        self._socket_name = ""
        if config.runtime["delivery"] == "node":
            self._listen()

    def get(self, step: int, bucket: int, micro_batch: int, pp: int, cp: int,
            split_context: bool) -> Tuple[List[Any], str, str]:
        """``([ref to the view's arrays], state_before, state_after)`` of micro-batch
        ``micro_batch`` of bucket ``bucket`` at step ``step`` for pipeline stage ``pp``,
        context rank ``cp`` (the same for every TP rank): ``delivery: object_store``."""
        view = self._service.view(step, bucket, micro_batch, pp, cp, split_context)
        ref = view.attachment(lambda: ray.put(view.arrays()))
        return [ref], view.state_before, view.state_after

    # --- runtime.delivery: node (node_delivery.py) ---

    def socket_name(self) -> str:
        """The abstract socket name this node's trainer ranks connect to."""
        return self._socket_name

    def _listen(self) -> None:
        # The host's name for this job, or (taken by another simulated node's host on
        # this machine) this node's; a restarted host takes its name back once its dead
        # process released it.
        node = ray.get_runtime_context().get_node_id()
        candidates = [names.constructor_socket(self._ns, self._job),
                      names.node_constructor_socket(self._ns, self._job, node)]
        deadline = time.monotonic() + self._timeout
        while not self._socket_name:
            for name in candidates:
                try:
                    self._listener = node_delivery.listen(name)
                    self._socket_name = name
                    break
                except OSError:
                    continue
            else:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"constructor: socket names {candidates} stayed "
                                       f"taken for {self._timeout} s")
                time.sleep(0.05)
        threading.Thread(target=self._accept, name="braid-deliver-accept",
                         daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self._listener.accept()
            threading.Thread(target=self._serve_rank, args=(conn,), name="braid-deliver",
                             daemon=True).start()

    def _serve_rank(self, conn) -> None:
        # One trainer rank's connection: its requests answered in order.
        with conn:
            while True:
                try:
                    request, _ = node_delivery.receive(conn)
                except OSError:
                    return
                if request is None:
                    return
                fds: List[int] = []
                try:
                    if request["op"] == "get":
                        view = self._service.view(*request["key"])
                        held = view.attachment(lambda: node_delivery.ViewFile(
                            view.arrays(), view.state_before, view.state_after))
                        reply, fds = {"size": held.size}, [held.fd]
                        self._delivered += 1
                    elif request["op"] == "attach":
                        reply = {"clients": self._call_planner("attach", request["client"])}
                    else:  # detach; the last one stops the job, this actor last
                        reply = {"clients": self._call_planner("detach", request["client"])}
                        if reply["clients"] == 0:
                            self._stop_job(but_me=True)
                except Exception as exc:  # noqa: BLE001 - raised again in the trainer
                    kind, message = braid_error(exc)
                    reply = {"error": kind, "message": message}
                try:
                    node_delivery.send(conn, reply, fds)
                except OSError:
                    return
                if request["op"] == "detach" and reply.get("clients") == 0:
                    self._stop_job(but_me=False)  # the rank waits for the socket to close

    def _call_planner(self, method: str, client: str) -> int:
        # A rank attaching or detaching through node delivery (it runs no Ray driver).
        planner = ray.get_actor(f"{self._job}.planner", namespace=self._ns)
        return ray.get(getattr(planner, method).remote(client), timeout=self._timeout)

    def _stop_job(self, but_me: bool) -> None:
        # The last rank detached: every other actor of the job, then this one.
        me = ray.get_runtime_context().get_actor_name()
        if but_me:
            registry.stop(self._job, self._ns, skip=me)
        else:
            ray.kill(ray.get_actor(me, namespace=self._ns), no_restart=True)

    def status(self) -> Dict[str, Any]:
        return {**process_status("constructor"), **self._service.figures(),
                "delivered": self._delivered, **self._serving_status()}


# --- Starting the actors (job.py composes them) ---

_Planner = ray.remote(PlannerHost)
_Sources = ray.remote(SourcesHost)
_Node = ray.remote(NodeHost)


def _options(name: str, namespace: str, **extra: Any) -> Dict[str, Any]:
    opts = dict(name=name, namespace=namespace, lifetime="detached", get_if_exists=True,
                num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=16)
    opts.update(extra)
    return opts


def _placed(config: "_core.Config") -> Dict[str, Any]:
    # The planner and source actors go where Ray places them, on nodes with
    # runtime.actor_resources when given (and again there after a restart).
    resources = config.runtime["actor_resources"]
    return {"resources": dict(resources)} if resources else {}


def start_planner(config: "_core.Config", job: str, namespace: str, cwd: str,
                  state_json: str, source_hosts: List[str], sources: List[int]):
    """``JOB.planner`` (found if it runs): plans from ``state_json``; ``sources`` it
    serves itself (``runtime.source_actors: 0``)."""
    return _Planner.options(**_options(f"{job}.planner", namespace,
                                       **_placed(config))).remote(
        config, cwd, state_json, source_hosts, sources)


def start_sources(config: "_core.Config", job: str, namespace: str, cwd: str, host: int,
                  standby: bool = False):
    """Source host ``host``'s actor ``JOB.sources.K`` (or its standby, spread to another
    node), found if it runs."""
    name = f"{job}.sources.{host}" + (".shadow" if standby else "")
    extra = dict(_placed(config), **({"scheduling_strategy": "SPREAD"} if standby else {}))
    return _Sources.options(**_options(name, namespace, **extra)).remote(
        config, cwd, _core.placement(config)["sources_of_host"][host])


def node_host_name(job: str, node: str) -> str:
    return f"{job}.constructor.{node[:16]}"


def start_node_host(config: "_core.Config", job: str, namespace: str, cwd: str,
                    node: str):
    """Node ``node``'s host (``JOB.constructor.NODE``), pinned to it, found if it runs."""
    affinity = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    return _Node.options(**_options(node_host_name(job, node), namespace,
                                    scheduling_strategy=affinity(node_id=node, soft=False))
                         ).remote(config, job, namespace, cwd)
