"""The PyTorch face of Braid: an iterable of micro-batches for one trainer rank."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import weakref
from typing import Any, Dict, Iterator, Optional

import torch

from braid import _core
from braid.config import ConfigLike, load_config
from braid.stream import RankStream, open_stream

# Loaders with a running engine, for the SIGTERM handler.
_running: "weakref.WeakSet[Loader]" = weakref.WeakSet()
_sigterm_handler_installed = False


def _stop_on_sigterm(signum, frame) -> None:
    # Runs on the main thread between two Python lines (the trainer's, or right after a
    # next() returns): stop and join every engine's threads, then exit "terminated".
    for loader in list(_running):
        loader.close()
    print("braid: SIGTERM: loader threads stopped; exiting with status 143",
          file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def _install_sigterm_handler() -> None:
    """On SIGTERM (what torchrun and other launchers send to stop a job), stop the
    engines cleanly and exit with status 143, unless the program handles SIGTERM itself.
    """
    global _sigterm_handler_installed
    if (_sigterm_handler_installed
            or threading.current_thread() is not threading.main_thread()):
        return
    _sigterm_handler_installed = True
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _stop_on_sigterm)


class Loader(torch.utils.data.IterableDataset):
    """Micro-batches for one trainer rank, as dicts of ``torch.Tensor``.

    ``Loader(config, rank=None, world_size=None)``: ``config`` is a YAML/JSON path or a
    dict; ``rank`` and ``world_size`` default to the ``RANK`` and ``WORLD_SIZE``
    environment variables (torchrun sets them), else rank 0 of the whole topology.
    ``world_size`` must equal ``dp * tp * pp * cp``. Ranks of one DP group (same dp
    coordinate) receive views of the same micro-batches (docs/parallelism.md): TP ranks
    the same tensors; with ``pp > 1`` the first stage ``input_ids`` and ``source_ids``,
    the last stage ``labels`` and ``loss_mask``, every stage ``position_ids``,
    ``cu_seqlens`` and ``max_seqlen``; with ``cp > 1`` each CP rank its zigzag part of every sequence
    (``split_context=False`` keeps whole sequences, for trainers that split themselves).
    ``topology.distribute`` may give finer buckets than DP ranks (per CP rank, or per
    rank of the world); ``self.bucket`` is the one this rank receives.
    ``stage_view=False`` gives every pipeline stage every tensor of the micro-batch, whole
    sequences (for trainers whose stages read every key, as Megatron-LM's ``get_batch``
    does; it splits for CP itself, so it needs ``split_context=False`` when ``cp > 1``),
    on either runtime.

    Each item (with ``pp == 1``) holds ``input_ids``, ``labels`` (``-100`` where there is
    no target), ``loss_mask``, ``position_ids``, ``cu_seqlens``, ``max_seqlen`` (``[1]``,
    the longest piece) and ``source_ids`` (and ``cu_seqlens_unpadded`` when the job sets
    ``batch.pad_to_multiple_of``); the
    tensors share memory with the C++ buffers (no copy). Iteration never ends by itself: stop after
    the steps you train. The C++ engine starts on the first ``iter()``, not in the
    constructor, so a Loader can be created before a ``fork``.

    On SIGTERM (torchrun and other launchers stop jobs with it) a Loader that started an
    engine on the main thread stops every engine's threads and exits with status 143
    (``SystemExit``, no traceback), unless the program installed its own SIGTERM handler
    first. Ctrl-C raises ``KeyboardInterrupt`` in the trainer as usual; ``close()`` stops
    the threads at any time.

    ``state_dict()`` / ``load_state_dict()`` follow PyTorch's convention; the state is
    plain JSON-able values and resumes the stream exactly after the last micro-batch
    received. A Loader is a ``torch.utils.data.IterableDataset``: it can be the dataset
    of a ``DataLoader(batch_size=None, num_workers=0)`` or of torchdata's
    ``StatefulDataLoader``, whose ``state_dict()`` then includes this Loader's state.
    """

    def __init__(self, config: ConfigLike, rank: Optional[int] = None,
                 world_size: Optional[int] = None, *, split_context: bool = True,
                 stage_view: bool = True) -> None:
        self._config = load_config(config)
        topo = self._config.topology
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        if world_size is None:
            env = os.environ.get("WORLD_SIZE")
            world_size = int(env) if env is not None else (
                topo["dp"] * topo["tp"] * topo["pp"] * topo["cp"])
        self.rank = rank
        self.world_size = world_size
        self.dp_rank, self.tp_rank, self.pp_rank, self.cp_rank = _core.rank_coords(
            self._config, rank, world_size)
        # The bucket this rank receives: its DP rank unless topology.distribute says
        # otherwise (docs/parallelism.md).
        self.bucket = _core.rank_bucket(self._config, rank)
        self.split_context = split_context
        self.stage_view = stage_view
        if not stage_view:
            if topo["cp"] > 1 and split_context:
                raise ValueError("stage_view=False gives whole sequences: make the Loader "
                                 "with split_context=False too")
        self._engine: Optional[RankStream] = None  # the rank's stream, from iter()
        self._state_json = _core.initial_state_json(self._config)

    @property
    def topology(self) -> Dict[str, int]:
        """The parallel sizes ``{"dp", "tp", "pp", "cp"}`` of the config."""
        topo = self._config.topology
        return {k: int(topo[k]) for k in ("dp", "tp", "pp", "cp")}

    @property
    def micro_batches_per_step(self) -> int:
        """Micro-batches this rank receives per global step at ``batch.seq_len``.

        A phase with another ``seq_len`` changes it (``global_tokens`` is constant): see
        ``micro_batches_at(step)``.
        """
        return self._config.micro_batches_per_rank

    def micro_batches_at(self, step: int) -> int:
        """Micro-batches this rank receives at global step ``step``."""
        return self._config.micro_batches_per_rank_at(step)

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        # The engine starts here (at iter(), not at the first next()), so state_dict()
        # always describes the newest iterator; a new iterator continues the stream where
        # the previous one stopped (the stream has no epochs to restart).
        self.close()
        _install_sigterm_handler()
        coords = (self.tp_rank, self.pp_rank, self.cp_rank) if self.stage_view else None
        self._engine = open_stream(self._config, self.bucket, coords,
                                   self.split_context, self._state_json)
        _running.add(self)
        return self._batches(self._engine)

    def _batches(self, stream: RankStream) -> Iterator[Dict[str, torch.Tensor]]:
        # Ends when close() or a newer iter() replaced this iterator's stream.
        while self._engine is stream:
            try:
                arrays = stream.next()
            except Exception:
                if self._engine is stream:
                    raise
                return  # close() from another thread stopped this next(): the end
            yield {name: torch.from_numpy(array) for name, array in arrays.items()}

    def close(self) -> None:
        """Stops and joins the engine's threads now (freeing the Loader does too).

        The iterators of this Loader end; ``state_dict()`` still holds the position after
        the last micro-batch yielded, and a new ``iter()`` continues from there.
        """
        stream, self._engine = self._engine, None
        _running.discard(self)
        if stream is not None:
            stream.close()
            self._state_json = stream.state()

    def state_dict(self) -> Dict[str, Any]:
        """The position right after the last micro-batch this Loader yielded."""
        if self._engine is not None:
            self._state_json = self._engine.state()
        return json.loads(self._state_json)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes from ``state_dict()`` output; the next ``iter()`` continues there.

        Raises ``braid.ConfigError`` if the state belongs to another config (seed,
        sources or batch shape).
        """
        text = json.dumps(state)
        _core.check_state(self._config, text)
        self.close()
        self._state_json = text
