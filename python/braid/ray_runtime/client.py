"""The trainer side of the Ray runtime: one rank's micro-batches from its node's
constructor, in the embedded runtime's order, with the same state protocol.

Two channels carry them (``runtime.delivery``): ``NodeChannel`` (a Unix socket and
shared-memory files from the node's constructor; the trainer runs no Ray driver) and
``ObjectStoreChannel`` (Ray's object store; the trainer joins Ray). This module imports
Ray only for the second.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Deque, Dict, Optional, Tuple

import numpy as np

from braid import _core
from braid.ray_runtime import names, node_delivery

# Requests of one micro-batch before its error is raised: each retry follows the loss of
# the constructor that held it (ray.exceptions.ObjectLostError).
_ATTEMPTS = 4
# How long a closing rank waits for a restarting constructor to take its detach.
_DETACH_WAIT_S = 30.0
# What the attach helper process prints before its answer (Ray may log to stdout too).
ATTACH_MARK = "BRAID-ATTACH "

# step, bucket, micro-batch, pp, cp, split, whole (the micro-batch itself: no stage view)
Key = Tuple[int, int, int, int, int, bool, bool]


@dataclass(frozen=True)
class JobRef:
    """Which job a stream belongs to."""
    name: str
    namespace: str


def _error(kind: str, message: str) -> BaseException:
    # An error raised in another process, raised here as the same Braid error type.
    cls = {"ConfigError": _core.ConfigError, "DataError": _core.DataError,
           "StorageError": _core.StorageError, "TimeoutError": TimeoutError,
           "ConnectionError": ConnectionError}.get(kind, RuntimeError)
    return cls(message)


def _ray_in_process() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


class ObjectStoreChannel:
    """``runtime.delivery: object_store``: this process is a Ray driver and fetches each
    view from the object store (zero-copy on the constructor's node)."""

    def __init__(self, config: "_core.Config", state_json: str, client: str,
                 start_local: bool) -> None:
        from braid.ray_runtime import job as jobs
        from braid.ray_runtime._ray import ray
        self._ray, self._jobs = ray, jobs
        self._timeout = float(config.runtime["timeout_s"])
        jobs.connect(config, start_local=start_local)
        self._client = client
        self._job = jobs.attach(config, state_json, client)
        self.job = JobRef(self._job.name, self._job.namespace)

    def request(self, key: Key):
        return self._job.constructor.get.remote(*key)

    def fetch(self, key: Key, ref) -> Tuple[Dict[str, np.ndarray], str, str]:
        ray = self._ray
        for attempt in range(_ATTEMPTS):
            (inner,), before, after = ray.get(ref, timeout=self._timeout)
            try:
                arrays = ray.get(inner, timeout=self._timeout)
                break
            except ray.exceptions.ObjectLostError:
                # The constructor that put it died (its objects went with it): ask the
                # restarted one, which builds the same bytes again.
                if attempt + 1 == _ATTEMPTS:
                    raise
                ref = self.request(key)
        # Copies: the stored view is shared by the group's TP ranks and read-only.
        return {name: np.array(a) for name, a in arrays.items()}, before, after

    def close(self) -> None:
        self._jobs.detach(self._job, self._client)


def _cause(stderr: str) -> str:
    """What a helper that died printed, from a little before the first line that reads as
    the cause (a Ray check or fatal log, a Python traceback) when there is one, else its
    last lines: the native stack Ray prints after a fatal error says nothing alone."""
    lines = stderr.strip().splitlines()
    for i, line in enumerate(lines):
        if any(m in line for m in ("Check failed", "Traceback", "Error", "*** ")) or \
                line[:1] == "F" and line[1:5].isdigit():
            return "\n".join(lines[max(0, i - 3):i + 25])
    return "\n".join(lines[-20:])


def attach_in_helper(config: "_core.Config", state_json: str, client: str,
                     timeout_s: float) -> Dict[str, str]:
    """Attaches ``client`` from a short-lived helper process that joins Ray, creates or
    finds the job's actors and prints the node constructor's socket name; this process
    never imports Ray. Returns ``{"job", "namespace", "socket"}``."""
    payload = pickle.dumps({"config": config, "state": state_json, "client": client,
                            "timeout_s": timeout_s})
    try:
        done = subprocess.run([sys.executable, "-m", "braid.ray_runtime.attach"],
                              input=payload, capture_output=True, timeout=timeout_s + 60,
                              cwd=os.getcwd())
    except subprocess.TimeoutExpired as exc:
        said = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-20:]
        raise TimeoutError(f"runtime: attaching to the Ray job took over "
                           f"{timeout_s + 60:.0f} s; the helper's last words:\n"
                           + "\n".join(said)) from exc
    for line in done.stdout.decode(errors="replace").splitlines():
        if line.startswith(ATTACH_MARK):
            answer = json.loads(line[len(ATTACH_MARK):])
            if "error" in answer:
                raise _error(answer["error"], answer["message"])
            return answer
    raise RuntimeError("runtime: the Ray attach helper exited with status "
                       f"{done.returncode} and no answer:\n"
                       + _cause(done.stderr.decode(errors="replace")))


class NodeChannel:
    """``runtime.delivery: node``: micro-batches from the node's constructor through a
    Unix socket, each view in a shared-memory file (``node_delivery``).

    Requests go out as soon as they are made; replies come back in order. When the
    constructor dies, the channel connects to its restarted process (same socket name)
    and sends the unanswered requests again: they are keyed, so the bytes are the same.
    """

    def __init__(self, config: "_core.Config", state_json: str, client: str,
                 start_local: bool) -> None:
        self._timeout = float(config.runtime["timeout_s"])
        self._client = client
        if _ray_in_process() or start_local:
            # This process already is (or must be) a Ray driver: attach from here.
            from braid.ray_runtime import job as jobs
            from braid.ray_runtime._ray import ray
            jobs.connect(config, start_local=start_local)
            job = jobs.attach(config, state_json, client)
            answer = {"job": job.name, "namespace": job.namespace,
                      "socket": ray.get(job.constructor.socket_name.remote(),
                                        timeout=self._timeout),
                      "host": ray.get(job.constructor.host_identity.remote(),
                                      timeout=self._timeout)}
        else:
            answer = self._attach_without_ray(config, state_json)
        self.job = JobRef(answer["job"], answer["namespace"])
        if answer.get("host", node_delivery.host_identity()) != node_delivery.host_identity():
            # The Ray driver that attached joined another node's raylet (nodes sharing one
            # /tmp/ray, say): that node's constructor cannot be reached from here.
            raise _core.ConfigError(
                f"runtime: job {self.job.name}'s constructor for this rank runs on another "
                f"host or network namespace ({answer['host']}, this process "
                f"{node_delivery.host_identity()}): the Ray driver that attached it joined "
                "another node's raylet (do two nodes share /tmp/ray?); run each trainer "
                "in the host, container or network namespace of its node's raylet, or "
                "use runtime.delivery: object_store")
        self._name = answer["socket"]
        self._unanswered: Deque[Key] = collections.deque()
        self._sock = self._connect()

    def _attach_without_ray(self, config: "_core.Config", state_json: str) -> Dict[str, str]:
        # Through the job's constructor on this host when it runs; else one rank of the
        # host (the one that binds the attach lock) starts the job from a helper process
        # while the others wait for the constructor's socket.
        ns, job = config.runtime["namespace"], names.job_name(config, state_json)
        name = names.constructor_socket(ns, job)
        deadline = time.monotonic() + self._timeout + 60
        while True:
            answer = self._attach_through(name, ns, job)
            if answer is not None:
                return answer
            try:
                lock = node_delivery.bind(names.attach_lock(ns, job))
            except OSError:  # another rank is starting the job
                if time.monotonic() > deadline:
                    raise TimeoutError(f"runtime: job {job} did not start on this host "
                                       f"within {self._timeout + 60:.0f} s") from None
                time.sleep(0.05)
                continue
            with lock:
                return (self._attach_through(name, ns, job)
                        or attach_in_helper(config, state_json, self._client,
                                            self._timeout))

    def _attach_through(self, name: str, ns: str, job: str) -> Optional[Dict[str, str]]:
        try:
            sock = node_delivery.connect(name, self._timeout)
        except OSError:
            return None
        with sock:
            try:
                node_delivery.send(sock, {"op": "attach", "client": self._client})
                reply, _ = node_delivery.receive(sock)
            except OSError:  # a job ending as its last rank left: start it again
                reply = None
        if reply is None:
            return None  # the constructor died meanwhile
        if reply.get("error") == "ConnectionError":
            return None  # the job ended (its last rank left) and is stopping: start anew
        if "error" in reply:
            raise _error(reply["error"], reply["message"])
        return {"job": job, "namespace": ns, "socket": name}

    def _connect(self):
        # The constructor may be restarting: try until runtime.timeout_s.
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                return node_delivery.connect(self._name, self._timeout)
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"runtime: no constructor of job {self.job.name} on this node "
                        f"answered within {self._timeout} s ({exc})") from exc
                time.sleep(0.05)

    def _reconnect(self) -> None:
        # The constructor may die again while the requests go out (killed twice in a
        # row): connect and send them again until runtime.timeout_s.
        deadline = time.monotonic() + self._timeout
        while True:
            self._sock.close()
            self._sock = self._connect()
            try:
                for key in self._unanswered:
                    node_delivery.send(self._sock, {"op": "get", "key": list(key)})
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def request(self, key: Key) -> None:
        self._unanswered.append(key)
        try:
            node_delivery.send(self._sock, {"op": "get", "key": list(key)})
        except OSError:
            self._reconnect()

    def fetch(self, key: Key, _handle: None) -> Tuple[Dict[str, np.ndarray], str, str]:
        assert self._unanswered[0] == key, "replies come in request order"
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                reply, fds = node_delivery.receive(self._sock)
            except TimeoutError as exc:  # socket.timeout
                raise TimeoutError(f"runtime: step {key[0]} micro-batch {key[2]}: no "
                                   f"answer within {self._timeout} s") from exc
            except ConnectionError:
                reply, fds = None, []
            if reply is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"runtime: step {key[0]}: the constructor kept "
                                   f"closing the connection for {self._timeout} s")
            self._reconnect()  # the constructor died: ask its restarted process
        self._unanswered.popleft()
        if "error" in reply:
            raise _error(reply["error"], reply["message"])
        return node_delivery.read_view(fds, int(reply["size"]))

    def close(self) -> None:
        # Detached through the constructor (the last rank to detach stops the job). A
        # constructor that is restarting takes its socket back within a few seconds;
        # one that does not is gone with its job (`braid stop`, a stopped job).
        deadline = time.monotonic() + min(self._timeout, _DETACH_WAIT_S)
        while True:
            try:
                sock = node_delivery.connect(self._name, self._timeout)
                with sock:
                    node_delivery.send(sock, {"op": "detach", "client": self._client})
                    reply, _ = node_delivery.receive(sock)
                    if reply is not None and reply.get("clients") == 0:
                        # The last rank: the constructor stopped the job's other actors
                        # and now ends itself; its socket closes when it is gone.
                        node_delivery.receive(sock)
                if reply is not None:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self._sock.close()


class RayStream:
    """Micro-batches of bucket ``bucket`` for the trainer rank at ``(tp, pp, cp)`` (or,
    with ``coords=None``, the whole micro-batches): a rank's stream
    (``braid.stream.RankStream``) on the Ray runtime.

    The rank's order and its states are the C++ client's (``_core.RankCursor``). A
    receiver thread keeps about two steps of micro-batches requested and fetched ahead,
    so ``next()`` only takes a ready one (the trainer's compute overlaps the transfers).
    Arrays are writable copies, as the embedded runtime's are.
    """

    def __init__(self, config: "_core.Config", bucket: int,
                 coords: Optional[Tuple[int, int, int]], split_context: bool,
                 state_json: str, start_local: bool = False) -> None:
        self._config = config
        self._bucket = bucket
        # coords None: the whole micro-batches (Loader(stage_view=False)), as embedded.
        self._whole = coords is None
        self._tp, self._pp, self._cp = (0, 0, 0) if coords is None else coords
        self._split = split_context
        self._start_local = start_local
        self._timeout = float(config.runtime["timeout_s"])
        self._client: Optional[str] = None
        self._open(state_json)

    def _open(self, state_json: str) -> None:
        self._cursor = _core.make_rank_cursor(self._config, state_json, [self._bucket])
        self._state_json = self._cursor.start_json
        self._received: Optional[Tuple[int, int, str, str]] = None
        self._client = uuid.uuid4().hex
        channel = NodeChannel if self._config.runtime["delivery"] == "node" \
            else ObjectStoreChannel
        self._channel = channel(self._config, state_json, self._client, self._start_local)
        atexit.register(self.close)
        step, _ = _core.state_position(self._config, state_json)
        depth = max(4, 2 * self._cursor.per_step(step))
        self._ready: "queue.Queue[Tuple[Any, ...]]" = queue.Queue(maxsize=depth)
        self._stopped = threading.Event()
        self._low = threading.Event()  # next() has taken 3/4 of the ready ones
        self._receiver = threading.Thread(target=self._receive, args=(depth,),
                                          name="braid-ray-receiver", daemon=True)
        self._receiver.start()

    @property
    def job(self) -> JobRef:
        return self._channel.job

    def _key(self, step: int, micro_batch: int) -> Key:
        return (step, self._bucket, micro_batch, self._pp, self._cp, self._split,
                self._whole)

    def _put(self, item: Tuple[Any, ...]) -> bool:
        while not self._stopped.is_set():
            try:
                self._ready.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _receive(self, depth: int) -> None:
        # Keeps `depth` micro-batches requested or ready ahead of next(), in the cursor's
        # order; fetches the oldest and hands it to next(). Any error is handed over in
        # its place, and the thread ends.
        pending = []
        try:
            while not self._stopped.is_set():
                while len(pending) + self._ready.qsize() < depth:
                    step, _, micro_batch, index = self._cursor.next()
                    key = self._key(step, micro_batch)
                    pending.append((key, index, self._channel.request(key)))
                if not pending:  # all `depth` of them ready: wait for next() to take some
                    self._low.clear()
                    self._low.wait(0.2)
                    continue
                key, index, handle = pending.pop(0)
                arrays, before, after = self._channel.fetch(key, handle)
                if not self._put((key[0], index, arrays, before, after)):
                    return
                if self._ready.full():
                    # Refill once next() has taken 3/4 of them: fewer wake-ups of this
                    # thread while the trainer runs Python (each one contends for the GIL).
                    self._low.clear()
                    while not self._stopped.is_set() and not self._low.wait(0.2):
                        pass
        except BaseException as exc:  # noqa: BLE001 - re-raised by next()
            self._put(("error", exc))

    def next(self) -> Dict[str, np.ndarray]:
        item: Optional[Tuple[Any, ...]] = None
        while item is None:
            if self._stopped.is_set():
                raise _core.ConfigError("the loader was closed")
            try:
                item = self._ready.get(timeout=0.2)
            except queue.Empty:
                if not self._receiver.is_alive() and self._ready.empty():
                    raise _core.DataError("the Ray receiver thread ended") from None
        if self._ready.qsize() <= self._ready.maxsize // 4:
            self._low.set()
        if item[0] == "error":
            self._stopped.set()
            raise item[1]
        step, index, arrays, before, after = item
        self._received = (step, index, before, after)  # state() makes the JSON
        return arrays

    def state(self) -> str:
        if self._received is not None:
            step, index, before, after = self._received
            self._state_json = self._cursor.state_after(self._config, step, index, before,
                                                        after)
            self._received = None
        return self._state_json

    def restore(self, state_json: str) -> None:
        """Continues from ``state_json``: a job of its own (the job's name follows its
        start state), attached afresh."""
        self.close()
        self._open(state_json)

    def close(self) -> None:
        """Detaches from the job (the last rank to detach stops it). Idempotent."""
        if self._client is None:
            return
        self.state()
        self._stopped.set()
        self._receiver.join(timeout=self._timeout)
        atexit.unregister(self.close)
        self._client = None
        self._channel.close()
