"""The actors that host Braid's services on Ray. Each method forwards to a C++ service
(``cpp/src/braid/service/``); what is decided (plans, checkpoints, replays, which plans
to ask for, builds ahead, hedging, what to keep) is decided there. This module moves
bytes: plans, piece requests and replies between the actors, views to the trainer ranks.

Every actor is a ``Host``: one process with the services placed in it
(service/hosting.h). By default a job has one per node with trainer ranks: the first
node's, ``JOB.planner``, hosts the planner, the sources and that node's constructor;
every other node's, ``JOB.constructor.NODE``, its constructor. With
``runtime.source_actors`` or ``runtime.actor_resources`` the planner, the sources
(``JOB.sources.K``) and each node's constructor get processes of their own; standbys
``JOB.sources.K.shadow`` serve a source host's payloads when it cannot.

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


class Host:
    """One process of a job on Ray: the services placed in it (service/hosting.h).

    ``planner``: the job's planner service (``JOB.planner``); its journal lives in Ray's
    key-value store, so a restarted planner resumes from the newest checkpoint it
    committed. ``sources``: the sources whose payloads this process serves by key.
    ``constructor``: this node's constructor service, which serves the node's trainer
    ranks their views, each written once (a shared-memory file, or an object-store
    object) for every rank that receives it (TP peers). With the planner beside it, the
    constructor builds from the plans themselves (payloads read by the planner's streams);
    else its plans and pieces come through ``RayTransport``.
    """

    def __init__(self, config: "_core.Config", job: str, namespace: str, cwd: str,
                 state_json: str = "", planner: bool = False, sources: List[int] = (),
                 constructor: bool = False, source_hosts: Optional[List[str]] = None
                 ) -> None:
        os.chdir(cwd)  # relative source paths resolve as in the job's first rank
        self._config, self._job, self._ns = config, job, namespace
        self._timeout = float(config.runtime["timeout_s"])
        self._me = ray.get_runtime_context().get_actor_name()
        self._source_hosts = source_hosts or []
        self._planner = None
        if planner:
            self._journal_key = registry.journal_key(namespace, job)
            # What the journal belongs to: this job (config, topology, start), not an
            # earlier one of the same name whose actors were removed without `braid stop`.
            self._tag = names.job_tag(config, state_json)
            self._planner = _core.make_planner_service(
                config, state_json, self._load(), self._commit,
                read_payloads=constructor)
        if constructor and not planner:  # the sources placed with this node's host
            planner_actor = ray.get_actor(f"{job}.planner", namespace=namespace)
            self._source_hosts = ray.get(planner_actor.source_hosts.remote(),
                                         timeout=self._timeout)
            placement = _core.placement(config)
            sources = [s for h, name in enumerate(self._source_hosts) if name == self._me
                       for s in placement["sources_of_host"][h]]
        self._sources = _core.make_source_host(config, list(sources)) if sources else None
        if self._sources is not None and self._planner is not None and constructor:
            # Its streams read the payloads: other nodes' pieces are in its plans.
            self._sources.serve_from_plans(self._planner)
        self._constructor = None
        self._delivered = 0  # views sent through node delivery
        self._socket_name = ""
        if constructor:
            transport = RayTransport(config, job, namespace, self._source_hosts, cwd)
            self._constructor = _core.make_constructor_service(
                config, transport.plan, transport.send, transport.wait, transport.forget,
                self._sources, self._planner)
            if config.runtime["delivery"] == "node":
                self._listen()

    # --- the planner ---

    def _load(self) -> str:
        held = internal_kv._internal_kv_get(self._journal_key)
        entry = json.loads(held) if held else {}
        return entry.get("value", "") if entry.get("job") == self._tag else ""

    def _commit(self, journal: str) -> None:
        if journal:
            internal_kv._internal_kv_put(self._journal_key,
                                         json.dumps({"job": self._tag, "value": journal}))
        else:  # every rank detached: the job ends
            internal_kv._internal_kv_del(self._journal_key)

    def plan(self, step: int, timeout_s: float,
             buckets: Optional[List[int]] = None) -> Dict[str, Any]:
        """Step ``step``'s plan (wire message and states), of ``buckets`` only when given."""
        return self._planner.plan(step, timeout_s, buckets)

    def attach(self, client: str) -> int:
        return self._planner.attach(client)

    def detach(self, client: str) -> int:
        return self._planner.detach(client)

    def source_hosts(self) -> List[str]:
        """The actor that serves each source host's payloads."""
        return self._source_hosts

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    # --- the sources ---

    def fetch(self, requests: Dict[int, np.ndarray]) -> Dict[int, Tuple]:
        """Per source, ``(tokens, offsets, loss_mask, images, image_bytes, paths)`` (None
        where a source has none) for its piece requests; images stay encoded."""
        if self._sources is None:
            raise _core.ConfigError(f"sources: {self._me} serves none")
        return self._sources.fetch(requests)

    # --- the constructor ---

    def get(self, step: int, bucket: int, micro_batch: int, pp: int, cp: int,
            split_context: bool, whole: bool = False) -> Tuple[List[Any], str, str]:
        """``([ref to the view's arrays], state_before, state_after)`` of micro-batch
        ``micro_batch`` of bucket ``bucket`` at step ``step`` for pipeline stage ``pp``,
        context rank ``cp`` (the same for every TP rank), or with ``whole`` the
        micro-batch itself: ``delivery: object_store``."""
        view = self._constructor.view(step, bucket, micro_batch, pp, cp, split_context,
                                      whole)
        ref = view.attachment(lambda: ray.put(view.arrays()))
        return [ref], view.state_before, view.state_after

    def socket_name(self) -> str:
        """The abstract socket name this node's trainer ranks connect to."""
        return self._socket_name

    def host_identity(self) -> str:
        """Where that socket can be reached from (``node_delivery.host_identity``)."""
        return node_delivery.host_identity()

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
                        view = self._constructor.view(*request["key"])
                        header, size, files = view.node_file()
                        reply, fds = {"size": size, "files": len(files)}, [header, *files]
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
        if self._planner is not None:
            return getattr(self._planner, method)(client)
        planner = ray.get_actor(f"{self._job}.planner", namespace=self._ns)
        return ray.get(getattr(planner, method).remote(client), timeout=self._timeout)

    def _stop_job(self, but_me: bool) -> None:
        # The last rank detached: every other actor of the job, then this one.
        if but_me:
            registry.stop(self._job, self._ns, skip=self._me)
        else:
            ray.kill(ray.get_actor(self._me, namespace=self._ns), no_restart=True)

    # --- what it reports ---

    def status(self) -> Dict[str, Any]:
        """``{"roles": [...]}``: one entry per service hosted here (role, pid, memory,
        node, its figures); the payloads served count with the planner, else with the
        constructor, else as the role ``sources``."""
        process = process_status("")
        serving = self._sources.status() if self._sources is not None else {}
        roles = []
        if self._planner is not None:
            roles.append({**process, "role": "planner", **self._planner.figures(),
                          **serving})
            serving = {}
        if self._constructor is not None:
            roles.append({**process, "role": "constructor", **self._constructor.figures(),
                          "delivered": self._delivered, **serving})
            serving = {}
        if serving or not roles:
            roles.append({**process, "role": "sources", **serving})
        return {"roles": roles}


# --- Starting the actors (job.py composes them) ---

_Host = ray.remote(Host)


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


# What a softly pinned actor asks for: Ray (2.60) places an actor that asks for no
# resource at all on any node, soft affinity or not (seen with nodes in namespaces: the
# planner's host landed on the node asked for 2 times in 6), while one that asks for a
# sliver of a CPU goes to that node whenever it lives.
_SOFT_PIN_CPUS = 0.001


def _pinned(node: str, soft: bool = False) -> Dict[str, Any]:
    # soft: on `node` while it lives; restarted on another node once it is gone.
    affinity = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    out: Dict[str, Any] = {"scheduling_strategy": affinity(node_id=node, soft=soft)}
    if soft:
        out["num_cpus"] = _SOFT_PIN_CPUS
    return out


def start_planner(config: "_core.Config", job: str, namespace: str, cwd: str,
                  state_json: str, source_hosts: List[str], sources: List[int],
                  node: Optional[str] = None):
    """``JOB.planner`` (found if it runs): plans from ``state_json``; serves ``sources``
    itself. With ``node`` (the default placement) it is that node's host, placed there,
    with its constructor beside the planner; when that node is lost, Ray restarts it on
    another (its constructor then serves nobody: that node's trainers are gone too)."""
    where = _pinned(node, soft=True) if node else _placed(config)
    return _Host.options(**_options(f"{job}.planner", namespace, **where)).remote(
        config, job, namespace, cwd, state_json=state_json, planner=True,
        sources=sources, constructor=node is not None, source_hosts=source_hosts)


def start_sources(config: "_core.Config", job: str, namespace: str, cwd: str, host: int,
                  standby: bool = False):
    """Source host ``host``'s actor ``JOB.sources.K`` (or its standby, spread to another
    node), found if it runs."""
    name = f"{job}.sources.{host}" + (".shadow" if standby else "")
    extra = dict(_placed(config), **({"scheduling_strategy": "SPREAD"} if standby else {}))
    return _Host.options(**_options(name, namespace, **extra)).remote(
        config, job, namespace, cwd, sources=_core.placement(config)["sources_of_host"][host])


def node_host_name(job: str, node: str) -> str:
    return f"{job}.constructor.{node[:16]}"


def start_node_host(config: "_core.Config", job: str, namespace: str, cwd: str,
                    node: str):
    """Node ``node``'s host (``JOB.constructor.NODE``), pinned to it, found if it runs."""
    return _Host.options(**_options(node_host_name(job, node), namespace,
                                    **_pinned(node))).remote(
        config, job, namespace, cwd, constructor=True)
