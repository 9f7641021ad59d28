"""The trainer side of the Ray runtime: one rank's micro-batches from its node's
constructor, in the embedded runtime's order, with the same state protocol."""

from __future__ import annotations

import atexit
import queue
import threading
import uuid
from typing import Any, Dict, Optional, Tuple

import numpy as np

from braid import _core
from braid.ray_runtime import job as jobs
from braid.ray_runtime._ray import ray

# Requests of one micro-batch before its error is raised: each retry follows the loss of
# the constructor that held it (ray.exceptions.ObjectLostError).
_ATTEMPTS = 4


class RayStream:
    """Micro-batches of bucket ``bucket`` for the trainer rank at ``(tp, pp, cp)``.

    Duck-types ``_core.Engine`` for ``braid.Loader``: ``next()``, ``state_json()``,
    ``stop()``. A receiver thread keeps about two steps of micro-batches requested and
    fetched ahead, so ``next()`` only takes a ready one (the trainer's compute overlaps
    the transfers). Arrays are copied out of the object store, writable, as the
    embedded runtime's are (the stored view is shared by the group's TP ranks).
    """

    def __init__(self, config: "_core.Config", bucket: int, coords: Tuple[int, int, int],
                 split_context: bool, state_json: str, start_local: bool = False) -> None:
        self._config = config
        self._bucket = bucket
        self._tp, self._pp, self._cp = coords
        self._split = split_context
        self._state_json = state_json
        self._received: Optional[Tuple[str, str, int, int]] = None
        self._timeout = float(config.runtime["timeout_s"])
        jobs.connect(config, start_local=start_local)
        self._client = uuid.uuid4().hex
        self._job = jobs.attach(config, state_json, self._client)
        atexit.register(self.stop)
        step, index = _core.state_position(config, state_json)
        depth = max(4, 2 * config.micro_batches_per_rank_at(step))
        self._ready: "queue.Queue[Tuple[Any, ...]]" = queue.Queue(maxsize=depth)
        self._stopped = threading.Event()
        self._low = threading.Event()  # next() has taken 3/4 of the ready ones
        self._receiver = threading.Thread(target=self._receive, args=(step, index, depth),
                                          name="braid-ray-receiver", daemon=True)
        self._receiver.start()

    @property
    def job(self) -> "jobs.Job":
        return self._job

    def _request(self, step: int, index: int):
        return self._job.constructor.get.remote(step, self._bucket, index, self._pp,
                                                self._cp, self._split)

    def _fetch(self, step: int, index: int, ref) -> Tuple[Any, ...]:
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
                ref = self._request(step, index)
        out = {name: np.array(a) for name, a in arrays.items()}
        return step, index, out, before, after

    def _put(self, item: Tuple[Any, ...]) -> bool:
        while not self._stopped.is_set():
            try:
                self._ready.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _receive(self, step: int, index: int, depth: int) -> None:
        # Requests `depth` micro-batches ahead, in order; fetches the oldest and hands it
        # to next(). Any error is handed over in its place, and the thread ends.
        pending = []
        try:
            while not self._stopped.is_set():
                while len(pending) < depth:
                    pending.append((step, index, self._request(step, index)))
                    index += 1
                    if index >= self._config.micro_batches_per_rank_at(step):
                        step, index = step + 1, 0
                if not self._put(self._fetch(*pending.pop(0))):
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
        self._received = (before, after, index + 1, step)  # state_json() makes the JSON
        return arrays

    def state_json(self) -> str:
        if self._received is not None:
            before, after, consumed, step = self._received
            self._state_json = _core.client_state_json(
                self._config, before, after, consumed,
                self._config.micro_batches_per_rank_at(step))
            self._received = None
        return self._state_json

    def stop(self) -> None:
        """Detaches from the job (the last rank to detach stops it). Idempotent."""
        if self._stopped.is_set() and not self._receiver.is_alive() and \
                self._client is None:
            return
        self._stopped.set()
        self._receiver.join(timeout=self._timeout)
        atexit.unregister(self.stop)
        if self._client is not None:
            client, self._client = self._client, None
            jobs.detach(self._job, client)
