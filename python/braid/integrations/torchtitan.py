"""torchtitan's data loader over a ``braid.Loader``.

torchtitan builds its loader from the job config's ``dataloader`` section:
``config.dataloader.build(dp_world_size=..., dp_rank=..., tokenizer=..., seq_len=...,
local_batch_size=..., snapshot_every_n_steps=...)``, iterates it for ``(input_dict,
labels)`` and checkpoints it with DCP under ``dataloader`` (``state_dict()`` /
``load_state_dict()``, the ``Stateful`` protocol). ``BraidDataLoader`` is such a loader
(a ``torchtitan.components.dataloader.BaseDataLoader`` when torchtitan is installed):

    from braid.integrations.torchtitan import BraidDataLoader
    job_config.dataloader = BraidDataLoader.Config(config="braid_job.yaml")

- Each item is ``({"input": tokens, "positions": positions}, labels)``: int64
  ``[local_batch_size, seq_len]`` (one Braid micro-batch, rows of 1-D ``[T]`` sequences as
  torchtitan's own datasets yield them), ``labels`` already next-token with ``-100``
  (torchtitan's ``IGNORE_INDEX``) where there is no target, ``positions`` restarting at
  every document (what torchtitan's block-causal / varlen masks are built from).
- torchtitan splits for TP, PP and CP itself and gives every rank of a DP group the same
  batch, so Braid's topology here is data-parallel only: ``topology.dp`` is set to
  ``dp_world_size`` (Braid's sample stream does not depend on it) and ``tp``, ``pp``,
  ``cp`` must be 1. ``seq_len`` must be Braid's ``batch.seq_len`` and
  ``local_batch_size`` its ``micro_batch_size``; torchtitan's gradient accumulation
  steps (times its pipeline micro-batches) should be ``micro_batches_per_step``. The
  ``tokenizer`` is not used: Braid tokenizes as its config says.
- State: ``{"dp_rank_{r}": state, "world_size": dp_world_size}`` per DP rank, as
  torchtitan's own loaders save it; the state is Braid's (JSON text), so resuming reads
  nothing to fast-forward. Braid can resume a step's state at another DP size
  (``load_state_dict`` takes any rank's entry when its own is absent, checked against the
  config's fingerprint by the Loader), where torchtitan's own loaders refuse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

from braid.config import load_config
from braid.loader import Loader

try:
    from torchtitan.components.dataloader import BaseDataLoader as _Base
except ImportError:  # the protocol only: Stateful's two methods and a Config dataclass
    class _Base:  # type: ignore[no-redef]
        @dataclass(kw_only=True, slots=True)
        class Config:
            dataset: str = ""
            dataset_path: Optional[str] = None

            def build(self, **kwargs: Any) -> "BraidDataLoader":
                return BraidDataLoader(self, **kwargs)

__all__ = ["BraidDataLoader"]

Item = Tuple[Dict[str, torch.Tensor], torch.Tensor]


class BraidDataLoader(_Base):
    """torchtitan's ``BaseDataLoader`` over Braid (see the module docs)."""

    @dataclass(kw_only=True, slots=True)
    class Config(_Base.Config):
        config: str = ""
        """The Braid job config (a YAML or JSON path)."""

    def __init__(self, config: "BraidDataLoader.Config", *, dp_world_size: int,
                 dp_rank: int, tokenizer: Any = None, seq_len: Optional[int] = None,
                 local_batch_size: Optional[int] = None,
                 max_context_length: Optional[int] = None, **kwargs: Any) -> None:
        if not config.config:
            raise ValueError("BraidDataLoader.Config.config: the Braid job config path")
        job = load_config(config.config)
        topo = job.topology
        if (topo["tp"], topo["pp"], topo["cp"]) != (1, 1, 1):
            raise ValueError(
                f"{config.config}: topology tp/pp/cp are {topo['tp']}/{topo['pp']}/"
                f"{topo['cp']}; torchtitan splits for them itself: set them to 1")
        if topo["dp"] != dp_world_size:
            job = job.with_dp(dp_world_size)
        context = seq_len if seq_len is not None else max_context_length
        if context is not None and context != job.seq_len:
            raise ValueError(f"torchtitan's seq_len is {context}, Braid's batch.seq_len "
                             f"{job.seq_len}: make them equal")
        micro_batch_size = job.global_tokens // (
            dp_world_size * job.seq_len * job.micro_batches_per_rank)
        if local_batch_size is not None and local_batch_size != micro_batch_size:
            raise ValueError(f"torchtitan's local batch size is {local_batch_size}, "
                             f"Braid's micro_batch_size {micro_batch_size}: make them equal")
        self.config = config
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.micro_batch_size = micro_batch_size
        self._rank_id = f"dp_rank_{dp_rank}"
        self.loader = Loader(job, rank=dp_rank, world_size=dp_world_size)

    @property
    def micro_batches_per_step(self) -> int:
        return self.loader.micro_batches_per_step

    def __iter__(self) -> Iterator[Item]:
        for batch in self.loader:
            inputs = {"input": batch["input_ids"].to(torch.int64),
                      "positions": batch["position_ids"].to(torch.int64)}
            yield inputs, batch["labels"].to(torch.int64)

    def state_dict(self) -> Dict[str, Any]:
        return {self._rank_id: json.dumps(self.loader.state_dict()),
                "world_size": self.dp_world_size}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if not state_dict:  # nothing saved yet: start at the beginning
            return
        text = state_dict.get(self._rank_id)
        if text is None:  # another DP size: a step's state resumes at any DP size
            saved = sorted(k for k in state_dict if k.startswith("dp_rank_"))
            if not saved:
                raise ValueError(f"no Braid loader state in {sorted(state_dict)}")
            text = state_dict[saved[0]]
        self.loader.load_state_dict(json.loads(text))
