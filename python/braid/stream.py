"""A rank's stream of micro-batches: the one contract both runtimes implement.

``open_stream`` returns the stream of ``runtime.kind``: the embedded runtime's
(``_core.Engine``: every role in this process) or the Ray runtime's
(``braid.ray_runtime.client.RayStream``: the job's shared actors). ``braid.Loader`` only
ever talks to a ``RankStream``.
"""

from __future__ import annotations

from typing import Dict, Optional, Protocol, Tuple

import numpy as np

from braid import _core


class RankStream(Protocol):
    """One rank's micro-batches, in order, with their state."""

    def next(self) -> Dict[str, np.ndarray]:
        """The next micro-batch (blocks until it is there)."""

    def state(self) -> str:
        """The state (JSON) right after the last micro-batch ``next()`` returned."""

    def restore(self, state: str) -> None:
        """Continues the stream from ``state`` instead."""

    def close(self) -> None:
        """Stops the stream's work (threads, attachments). Idempotent."""


def open_stream(config: "_core.Config", bucket: int,
                coords: Optional[Tuple[int, int, int]], split_context: bool,
                state: str) -> RankStream:
    """The stream of bucket ``bucket`` for the rank at ``coords`` = (tp, pp, cp), from
    ``state``, on the config's runtime; ``coords=None``: the whole micro-batches, no
    rank's view."""
    if config.runtime["kind"] == "ray":
        # The job's shared actors build the batches (docs/distributed.md).
        from braid.ray_runtime.client import RayStream

        return RayStream(config, bucket, coords, split_context, state)
    return _core.make_engine(config, [bucket], state, view=coords,
                             split_context=split_context)
