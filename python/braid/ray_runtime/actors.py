"""The actors that host Braid's roles. Each wraps one C++ service; requests are keyed and
idempotent (a retried call returns the same bytes), so Ray may re-run a call on a
restarted actor (``max_task_retries=-1``).

Threaded actors (``max_concurrency``): the C++ calls release the GIL, so requests for
different sources, buckets and steps overlap.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from braid import _core
from braid.ray_runtime import names
from braid.ray_runtime import node_delivery
from braid.ray_runtime._ray import ray
# Ray's internal key-value store (private API of the pinned Ray version): the only
# state of a job that outlives its actors' restarts (clients_key).
from ray.experimental import internal_kv


# The planner keeps the state before every _CHECKPOINT_EVERY-th step (the last
# _CHECKPOINTS of them, and the job's start) to replay a dropped step from.
_CHECKPOINT_EVERY = 16
_CHECKPOINTS = 64
# Of them, the newest committed to Ray's key-value store (checkpoints_key).
_COMMITTED = 4


def clients_key(namespace: str, job: str) -> str:
    """The key, in Ray's internal key-value store (kept by the GCS), of the ids of the
    ranks attached to job ``job``: a restarted planner still knows them, so the last rank
    to detach, and only it, stops the job."""
    return f"braid/{namespace}/{job}/clients"


def checkpoints_key(namespace: str, job: str) -> str:
    """The key of job ``job``'s committed planner states (the start's and the newest
    _COMMITTED checkpoints): a restarted planner resumes from the newest one."""
    return f"braid/{namespace}/{job}/checkpoints"


def job_keys(namespace: str, job: str) -> List[str]:
    """Every key a job keeps in Ray's key-value store (removed when it stops)."""
    return [clients_key(namespace, job), checkpoints_key(namespace, job)]


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PayloadHost:
    """Serves the payloads of the sources it hosts (``_core.PayloadService`` each)."""

    def _host(self, config: "_core.Config", sources: List[int]) -> None:
        self._services = {i: _core.make_payload_service(config, i) for i in sources}
        self._requests = 0

    def fetch(self, requests: Dict[int, np.ndarray]) -> Dict[int, Tuple]:
        """Per source, ``(tokens, offsets, loss_mask, images, image_bytes, paths)`` (None
        where a source has none) for its piece requests; images stay encoded."""
        self._requests += 1
        return {i: self._services[i].fetch(r) for i, r in requests.items()}

    def _payload_status(self) -> Dict[str, Any]:
        return {"sources": sorted(self._services), "requests": self._requests,
                "cached_bytes": sum(s.cached_bytes for s in self._services.values())}


class PlannerActor(_PayloadHost):
    """The planner over metadata-only source loaders (``_core.PlannerService``).

    Plans whole steps in order, ``steps_in_flight`` ahead of the newest step asked for,
    and keeps the last ``keep_steps`` plans for constructors that ask again. An older
    step is planned again from the nearest checkpoint state before it (a restarted
    constructor, a rank far behind). Every checkpoint is committed to Ray's key-value
    store, so a restarted planner resumes from the newest committed one (not from the
    job's start). Either way the plan is a pure function of config, seed and state, so
    a step comes back identical.
    """

    def __init__(self, config: "_core.Config", cwd: str, state_json: str,
                 keep_steps: int, sources: List[int]) -> None:
        os.chdir(cwd)  # relative source paths resolve as in the job's first rank
        self._host(config, sources)  # runtime.source_actors: 0 serves them here
        self._config = config
        self._keep = keep_steps
        self._ahead = int(config.runtime["steps_in_flight"]) + 1
        self._first = _core.state_position(config, state_json)[0]
        self._plans: Dict[int, Dict[str, Any]] = {}
        # States to replay dropped steps from: the start's and every
        # _CHECKPOINT_EVERY-th step's (the last _CHECKPOINTS of them).
        self._checkpoints: Dict[int, str] = {self._first: state_json}
        context = ray.get_runtime_context()
        job = context.get_actor_name().rsplit(".planner", 1)[0]
        self._clients_key = clients_key(context.namespace, job)
        self._checkpoints_key = checkpoints_key(context.namespace, job)
        # What the kept entries belong to: this job (config, topology, start), not an
        # earlier one of the same name whose actors were removed without `braid stop`.
        self._tag = names.job_tag(config, state_json)
        self._clients: set = set(self._load(self._clients_key) or [])
        committed = self._load(self._checkpoints_key)
        if committed:  # a restart: resume from the newest committed state
            self._checkpoints.update({int(k): v for k, v in committed.items()})
        self._restored_from = max(self._checkpoints)
        self._service = _core.make_planner_service(
            config, self._checkpoints[self._restored_from])
        self._replays = 0
        self._next = self._restored_from
        self._horizon = self._next + self._ahead
        self._error: Optional[BaseException] = None
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="braid-planner",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopped and self._next >= self._horizon:
                    self._cv.wait()
                if self._stopped:
                    return
            try:
                plan = self._service.next()
            except BaseException as exc:  # reported to every waiter, in order
                with self._cv:
                    self._error = exc
                    self._cv.notify_all()
                return
            with self._cv:
                self._plans[plan["step"]] = plan
                if plan["step"] % _CHECKPOINT_EVERY == 0:
                    self._checkpoints[plan["step"]] = plan["state_before"]
                    for old in sorted(self._checkpoints)[1:-_CHECKPOINTS]:
                        del self._checkpoints[old]  # the start stays
                    kept = sorted(self._checkpoints)
                    self._store(self._checkpoints_key,
                                {k: self._checkpoints[k]
                                 for k in kept[:1] + kept[1:][-_COMMITTED:]})
                self._next = plan["step"] + 1
                for old in [s for s in self._plans if s < self._next - self._keep]:
                    del self._plans[old]
                self._cv.notify_all()

    def plan(self, step: int, timeout_s: float,
             buckets: Optional[List[int]] = None) -> Dict[str, Any]:
        """Step ``step``'s plan (wire message and states), of ``buckets`` only when given
        (a node's constructor: ``_core.slice_step_plan``); waits while it is planned."""
        whole = self._whole_plan(step, timeout_s)
        if buckets is None:
            return whole
        return dict(whole, plan=_core.slice_step_plan(whole["plan"], buckets))

    def _whole_plan(self, step: int, timeout_s: float) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._horizon = max(self._horizon, step + self._ahead)
            self._cv.notify_all()
            while step not in self._plans:
                if step < self._first:
                    raise _core.ConfigError(
                        f"step {step}: before the job's first step {self._first}")
                if step < self._next:
                    break  # dropped (or before a restore): replayed below
                if self._error is not None:
                    raise self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"step {step}: not planned within {timeout_s} s "
                                       "(runtime.timeout_s)")
                self._cv.wait(left)
            if step in self._plans:
                return self._plans[step]
            start = max(k for k in self._checkpoints if k <= step)
            state = self._checkpoints[start]
        return self._replay(state, step)

    def _replay(self, state_json: str, step: int) -> Dict[str, Any]:
        # A step older than the held ones (a constructor far behind, or restarted): plan
        # again from the newest checkpoint before it. The plan is a pure function of
        # (config, state), so it is the one sent before.
        service = _core.make_planner_service(self._config, state_json)
        while True:
            plan = service.next()
            if plan["step"] == step:
                self._replays += 1
                return plan
    def attach(self, client: str) -> int:
        with self._cv:
            self._clients.add(client)
            self._save_clients()
            return len(self._clients)

    def detach(self, client: str) -> int:
        with self._cv:
            self._clients.discard(client)
            self._save_clients()
            return len(self._clients)

    def _load(self, key: str) -> Any:
        held = internal_kv._internal_kv_get(key)
        if not held:
            return None
        entry = json.loads(held)
        return entry["value"] if entry.get("job") == self._tag else None

    def _store(self, key: str, value: Any) -> None:
        internal_kv._internal_kv_put(key, json.dumps({"job": self._tag, "value": value}))

    def _save_clients(self) -> None:
        if self._clients:
            self._store(self._clients_key, sorted(self._clients))
        else:  # the job ends
            for key in (self._clients_key, self._checkpoints_key):
                internal_kv._internal_kv_del(key)

    def status(self) -> Dict[str, Any]:
        with self._cv:
            return {"role": "planner", "pid": os.getpid(), "rss_bytes": _rss_bytes(),
                    "node": ray.get_runtime_context().get_node_id(),
                    "planned_through": self._next - 1, "held_steps": len(self._plans),
                    "replayed_steps": self._replays, "restored_from": self._restored_from,
                    "clients": len(self._clients),
                    **(self._payload_status() if self._services else {})}


class SourceActor(_PayloadHost):
    """Payloads of the sources it hosts, by key."""

    def __init__(self, config: "_core.Config", cwd: str, sources: List[int]) -> None:
        os.chdir(cwd)  # relative source paths resolve as in the job's first rank
        self._host(config, sources)

    def status(self) -> Dict[str, Any]:
        return {"role": "sources", "pid": os.getpid(), "rss_bytes": _rss_bytes(),
                "node": ray.get_runtime_context().get_node_id(), **self._payload_status()}


class ConstructorActor:
    """Builds the micro-batches of the buckets its node's trainer ranks ask for, once per
    (step, bucket), and serves every rank of a DP group its view from that one build.

    Each view is written once (a shared-memory file, or an object-store object); TP peers
    (same view) get the same one. Steps are built ``steps_in_flight`` ahead of the newest
    step asked for; builds and views older than ``keep_steps`` (``job.keep_builds``)
    behind it are dropped, and built again if a rank that far behind asks.
    """

    def __init__(self, config: "_core.Config", job: str, namespace: str,
                 source_actor_of: List[int], keep_steps: int) -> None:
        self._config = config
        self._job = job
        self._namespace = namespace
        self._source_actor_of = source_actor_of
        self._keep = keep_steps
        self._ahead = int(config.runtime["steps_in_flight"])
        self._timeout = float(config.runtime["timeout_s"])
        self._num_sources = len(config.source_names)
        # Builds wait on the planner and the source actors between their CPU parts
        # (image decoding, building; both without the GIL): four at a time keep a node's
        # cores busy through those waits (two left heavy_vlm waiting every third step).
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="braid-construct")
        self._lock = threading.Lock()
        # (step, bucket) -> the step's plan sliced to the node's buckets
        self._plans: Dict[Tuple[int, int], concurrent.futures.Future] = {}
        self._buckets: set = set()  # the buckets this node's ranks asked for
        self._plan_bytes = 0  # plan messages received
        self._builds: Dict[Tuple[int, int], concurrent.futures.Future] = {}
        self._views: Dict[Tuple, Any] = {}
        self._newest = -1
        self._built = 0
        self._planner = None
        self._sources: Dict[str, Any] = {}  # actor name -> handle
        self._shadow = bool(config.runtime["shadow"])
        self._failovers = 0  # requests also sent to a shadow
        self._blanked: Dict[int, int] = {}  # source -> pieces blanked (on_error: skip)
        self._fetch_s = 0.05  # a source actor's usual answer time (moving average)
        self._delivered = 0  # views sent through node delivery
        self._socket_name = ""
        if config.runtime["delivery"] == "node":
            self._listen()

    def _actor(self, name: str):
        return ray.get_actor(f"{self._job}.{name}", namespace=self._namespace)

    def _plan(self, step: int, bucket: int) -> Dict[str, Any]:
        # Step `step`'s plan, sliced to the buckets this node's ranks have asked for so
        # far (one request per step, not the whole plan to every node). Fetched by the
        # first thread that needs it (never through the pool, whose threads wait for
        # plans); the others wait for that one.
        with self._lock:
            self._buckets.add(bucket)
            fut = self._plans.get((step, bucket))
            owner = fut is None
            if owner:
                wanted = sorted(b for b in self._buckets if (step, b) not in self._plans)
                futs = {b: concurrent.futures.Future() for b in wanted}
                self._plans.update(((step, b), f) for b, f in futs.items())
                fut = futs[bucket]
        if owner:
            try:
                plan = self._fetch_plan(step, wanted)
            except BaseException as exc:
                with self._lock:  # a later request tries again
                    for b, f in futs.items():
                        if self._plans.get((step, b)) is f:
                            del self._plans[(step, b)]
                for f in futs.values():
                    f.set_exception(exc)
            else:
                for f in futs.values():
                    f.set_result(plan)
        return fut.result(timeout=self._timeout)

    def _fetch_plan(self, step: int, buckets: List[int]) -> Dict[str, Any]:
        if self._planner is None:
            self._planner = self._actor("planner")
        plan = ray.get(self._planner.plan.remote(step, self._timeout, buckets),
                       timeout=self._timeout + 5)
        self._plan_bytes += plan["plan"].nbytes
        return plan

    def _build(self, step: int, bucket: int) -> concurrent.futures.Future:
        with self._lock:
            fut = self._builds.get((step, bucket))
            if fut is None:
                fut = self._pool.submit(self._construct, step, bucket)
                self._builds[(step, bucket)] = fut
                fut.add_done_callback(lambda f: self._forget_failed((step, bucket), f))
            return fut

    def _forget_failed(self, key: Tuple[int, int], fut: concurrent.futures.Future) -> None:
        # A failed build is reported to its waiters, then forgotten so that a retried
        # request (after an actor restart) builds again.
        if fut.exception() is not None:
            with self._lock:
                if self._builds.get(key) is fut:
                    del self._builds[key]

    def _handle(self, name: str):
        with self._lock:
            actor = self._sources.get(name)
        if actor is None:
            actor = self._actor(name)
            with self._lock:
                self._sources[name] = actor
        return actor

    def _fetch(self, actor: int, reqs: Dict[int, np.ndarray]):
        # -1: the planner serves the payloads (runtime.source_actors: 0).
        return self._handle("planner" if actor < 0 else f"sources.{actor}").fetch.remote(reqs)

    def _hedged(self, actor: int, reqs: Dict[int, np.ndarray], call) -> Dict[int, Tuple]:
        # A hedged request: when the source actor has not answered within a few times its
        # usual time (dead, restarting, or slow), the same request goes to its shadow,
        # and the first good answer wins. Requests are keyed, so both answers are the
        # same bytes.
        start = time.monotonic()
        ready, _ = ray.wait([call], timeout=max(0.05, 4 * self._fetch_s))
        pending = [call]
        if not ready:
            self._failovers += 1
            pending.append(self._handle(f"sources.{actor}.shadow").fetch.remote(reqs))
        deadline = start + self._timeout
        error: Optional[BaseException] = None
        while pending:
            ready, pending = ray.wait(pending, num_returns=1,
                                      timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            try:
                replies = ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:
                error = exc
                continue
            if ready[0] == call:  # the usual time, from the primary's answers only
                self._fetch_s = 0.8 * self._fetch_s + 0.2 * (time.monotonic() - start)
            return replies
        raise error or TimeoutError(f"sources.{actor}: no answer within {self._timeout} s")

    def _construct(self, step: int, bucket: int) -> Tuple[Dict[str, Any], List[Any]]:
        plan = self._plan(step, bucket)
        part = _core.decode_bucket(plan["plan"], bucket)
        by_actor: Dict[int, Dict[int, np.ndarray]] = {}
        for source, req in enumerate(part.requests(self._num_sources)):
            if len(req):
                by_actor.setdefault(self._source_actor_of[source], {})[source] = req
        calls = [(actor, reqs, self._fetch(actor, reqs)) for actor, reqs in by_actor.items()]
        for actor, reqs, call in calls:
            if self._shadow and actor >= 0:
                replies = self._hedged(actor, reqs, call)
            else:
                replies = ray.get(call, timeout=self._timeout)
            for source, reply in replies.items():
                # tokens, offsets, mask, images, image bytes, paths: decoded here
                for why in part.attach(self._config, source, *reply):
                    self._log_blank(source, why)
        batches = [part.build(mb) for mb in range(part.micro_batches)]
        self._built += 1
        return plan, batches

    def _log_blank(self, source: int, why: str) -> None:
        # A piece whose row's images do not decode, under on_error: skip: logged and
        # counted as the embedded loader does (its metadata was planned already).
        with self._lock:
            self._blanked[source] = self._blanked.get(source, 0) + 1
            count = self._blanked[source]
        print(f"braid: source '{self._config.source_names[source]}' blanked a piece of "
              f"{why}; its metadata was already planned, so its payload is blank and its "
              f"loss mask 0 (blanked {count})", file=sys.stderr, flush=True)

    def _view(self, key: Tuple, make) -> Tuple[Any, str, str]:
        # (what `make` made of the view of `key`, state_before, state_after); the view
        # is made once per key, for every TP rank that asks.
        step, bucket, micro_batch, pp, cp, split_context = key
        with self._lock:
            if step > self._newest:
                self._newest = step
                for old in [k for k in self._builds if k[0] < step - self._keep]:
                    del self._builds[old]
                for old in [k for k in self._plans if k[0] < step - self._keep]:
                    del self._plans[old]
                for old in [k for k in self._views if k[0] < step - self._keep]:
                    self._release(self._views.pop(old))
        for ahead in range(1, self._ahead + 1):
            self._build(step + ahead, bucket)
        with self._lock:
            held = self._views.get(key)
        plan, batches = self._build(step, bucket).result(timeout=self._timeout)
        if held is None:
            made = make(batches[micro_batch].view(self._config, 0, pp, cp, split_context),
                        plan)
            with self._lock:
                held = self._views.setdefault(key, made)
            if held is not made:
                self._release(made)
        return held, plan["state_before"], plan["state_after"]

    @staticmethod
    def _release(held: Any) -> None:
        if isinstance(held, tuple):  # a view file of node delivery: (fd, size)
            os.close(held[0])

    def get(self, step: int, bucket: int, micro_batch: int, pp: int, cp: int,
            split_context: bool) -> Tuple[List[Any], str, str]:
        """``([ref to the view's arrays], state_before, state_after)`` of micro-batch
        ``micro_batch`` of bucket ``bucket`` at step ``step`` for pipeline stage ``pp``,
        context rank ``cp`` (the same for every TP rank): ``delivery: object_store``."""
        ref, before, after = self._view(
            (step, bucket, micro_batch, pp, cp, split_context),
            lambda view, plan: ray.put(view))
        return [ref], before, after

    # --- runtime.delivery: node (node_delivery.py) ---

    def socket_name(self) -> str:
        """The abstract socket name this node's trainer ranks connect to."""
        return self._socket_name

    def _listen(self) -> None:
        # The host's name for this job, or (taken by another simulated node's
        # constructor on this host) this node's; a restarted constructor takes its name
        # back once its dead process released it.
        node = ray.get_runtime_context().get_node_id()
        candidates = [names.constructor_socket(self._namespace, self._job),
                      names.node_constructor_socket(self._namespace, self._job, node)]
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
            threading.Thread(target=self._serve, args=(conn,), name="braid-deliver",
                             daemon=True).start()

    def _serve(self, conn) -> None:
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
                        (fd, size), _, _ = self._view(tuple(request["key"]), self._file)
                        reply, fds = {"size": size}, [fd]
                        self._delivered += 1
                    elif request["op"] == "attach":
                        reply = {"clients": self._call_planner("attach", request["client"])}
                    else:  # detach; the last one stops the job, this actor last
                        reply = {"clients": self._call_planner("detach", request["client"])}
                        if reply["clients"] == 0:
                            self._stop_job(but_me=True)
                except Exception as exc:  # noqa: BLE001 - raised again in the trainer
                    reply = {"error": type(exc).__name__, "message": str(exc)[:8000]}
                try:
                    node_delivery.send(conn, reply, fds)
                except OSError:
                    return
                if request["op"] == "detach" and reply.get("clients") == 0:
                    self._stop_job(but_me=False)  # the rank waits for the socket to close

    @staticmethod
    def _file(view: Dict[str, np.ndarray], plan: Dict[str, Any]) -> Tuple[int, int]:
        return node_delivery.write_view(view, plan["state_before"], plan["state_after"])

    def _call_planner(self, method: str, client: str) -> int:
        # A rank attaching or detaching through node delivery (it runs no Ray driver).
        return ray.get(getattr(self._actor("planner"), method).remote(client),
                       timeout=self._timeout)

    def _stop_job(self, but_me: bool) -> None:
        # The last rank detached: every other actor of the job, then this one.
        from braid.ray_runtime import job as jobs
        me = ray.get_runtime_context().get_actor_name()
        if but_me:
            jobs.stop(self._job, self._namespace, skip=me)
        else:
            ray.kill(ray.get_actor(me, namespace=self._namespace), no_restart=True)

    def status(self) -> Dict[str, Any]:
        with self._lock:
            return {"role": "constructor", "pid": os.getpid(), "rss_bytes": _rss_bytes(),
                    "node": ray.get_runtime_context().get_node_id(),
                    "newest_step": self._newest, "built_buckets": self._built,
                    "shadow_failovers": self._failovers,
                    "blanked_pieces": dict(self._blanked),
                    "held_builds": len(self._builds), "held_views": len(self._views),
                    "delivered": self._delivered, "plan_bytes": self._plan_bytes}
