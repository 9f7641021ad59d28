"""The trainer side of the Ray runtime: one rank's micro-batches from its node's
constructor, in the embedded runtime's order, with the same state protocol."""

from __future__ import annotations

import atexit
import collections
import uuid
from typing import Any, Deque, Dict, Tuple

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
    ``stop()``. Keeps the next micro-batches of about one step requested ahead. Arrays
    come back copied out of the object store, writable, as the embedded runtime's are
    (the stored view is shared by the group's TP ranks and must not change).
    """

    def __init__(self, config: "_core.Config", bucket: int, coords: Tuple[int, int, int],
                 split_context: bool, state_json: str, start_local: bool = False) -> None:
        self._config = config
        self._bucket = bucket
        self._tp, self._pp, self._cp = coords
        self._split = split_context
        self._state_json = state_json
        self._timeout = float(config.runtime["timeout_s"])
        jobs.connect(config, start_local=start_local)
        self._client = uuid.uuid4().hex
        self._job = jobs.attach(config, state_json, self._client)
        atexit.register(self.stop)
        self._step, self._index = _core.state_position(config, state_json)
        self._pending: Deque[Tuple[int, int, Any]] = collections.deque()
        self._depth = max(2, config.micro_batches_per_rank_at(self._step))
        self._stopped = False

    @property
    def job(self) -> "jobs.Job":
        return self._job

    def _request_ahead(self) -> None:
        while len(self._pending) < self._depth:
            step, index = self._step, self._index
            if self._pending:
                step, index = self._pending[-1][0], self._pending[-1][1] + 1
                if index >= self._config.micro_batches_per_rank_at(step):
                    step, index = step + 1, 0
            self._pending.append((step, index, self._request(step, index)))

    def _request(self, step: int, index: int):
        return self._job.constructor.get.remote(step, self._bucket, index, self._pp,
                                                self._cp, self._split)

    def next(self) -> Dict[str, np.ndarray]:
        if self._stopped:
            raise _core.ConfigError("the loader was closed")
        self._request_ahead()
        step, index, ref = self._pending.popleft()
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
        per_step = self._config.micro_batches_per_rank_at(step)
        self._state_json = _core.client_state_json(self._config, before, after, index + 1,
                                                   per_step)
        self._step, self._index = (step + 1, 0) if index + 1 >= per_step else (step,
                                                                              index + 1)
        return out

    def state_json(self) -> str:
        return self._state_json

    def stop(self) -> None:
        """Detaches from the job (the last rank to detach stops it). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._pending.clear()
        atexit.unregister(self.stop)
        jobs.detach(self._job, self._client)
