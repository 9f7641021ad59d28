"""Megatron-LM's external data iterator over a ``braid.Loader``.

Megatron with ``--dataloader-type external`` wraps the iterable that the
``train_valid_test_datasets_provider`` returns in its ``RerunDataIterator`` and calls
``next()`` on it in ``get_batch`` on TP rank 0 of a pipeline stage, which broadcasts the
batch to the stage's other TP ranks. Every stage's TP rank 0 reads every key:
``get_batch_on_this_tp_rank`` takes ``tokens``, ``labels``, ``loss_mask`` and
``position_ids`` on the first and the last stage alike, and from megatron-core 0.18 the
middle stages read ``cu_seqlens`` / ``max_seqlen`` too when sequences are packed. So:

- ``data_iterator(config, rank, world_size)`` returns a ``MegatronBatches`` on TP rank 0
  of every stage (``needs_data``) and ``None`` on the other TP ranks (which Megatron never
  lets read). Its Loader is made with ``split_context=False`` (Megatron splits for CP
  itself) and ``stage_view=False``: every stage receives every tensor, so no key Megatron
  reads is ``None``. A rank whose iterator is never advanced (a middle stage of a Megatron
  that does not read there) never starts a Braid engine and costs no memory.
- Each item is a dict with Megatron's GPT keys:

  - ``tokens`` int64 ``[mbs, seq]``: Braid's ``input_ids``.
  - ``labels`` int64 ``[mbs, seq]``: Braid's ``labels`` (already next-token) with the
    ignore label (``-100``) replaced by ``ignore_fill`` (default 0), because Megatron's
    vocab-parallel cross entropy takes every label as an index; those positions have
    ``loss_mask == 0``.
  - ``loss_mask`` float32 ``[mbs, seq]``.
  - ``attention_mask``: absent by default (use the packed keys with a THD attention), or
    with ``attention_mask="causal"`` a bool ``[mbs, 1, seq, seq]`` block-diagonal causal
    mask in Megatron's convention (``True`` means masked out, ``masks.masked_out_mask``).
  - ``position_ids`` int64 ``[mbs, seq]``, restarting at every document.
  - With ``packed=True`` (default; needs ``micro_batch_size`` 1, as Megatron's packed path
    does): ``cu_seqlens`` int32 ``[1, pieces + 1]`` (the cumulative real lengths),
    ``cu_seqlens_padded`` int32 ``[1, pieces + 1]`` (where each piece starts in the
    tokens, its padding included) and ``max_seqlen`` int32 ``[1]``, as Megatron's
    ``get_batch`` hands them to ``get_thd_batch_on_this_cp_rank`` and ``PackedSeqParams``.
    All three come from the core: Braid's ``cu_seqlens`` (the padded boundaries),
    ``cu_seqlens_unpadded`` (present when the job pads; else the two are equal) and
    ``max_seqlen``.

Context parallelism: Megatron splits whole sequences itself. Without the packed keys
(``packed=False``) its ``get_batch_on_this_cp_rank`` makes the same 2*cp-chunk zigzag as
Braid. With them (``packed=True``, THD format) Transformer Engine splits every piece into
2*cp chunks, which needs every piece to be a multiple of 2*cp tokens: set
``batch.pad_to_multiple_of: 2*cp`` in the job (docs/config.md), and Braid's planner
packs every document padded to that, the pad tokens without target. A batch with a piece
that is not a multiple raises ``ValueError`` naming that key. With ``cp_split="braid"``
the batch is Braid's own CP view (for a ``get_batch`` that skips Megatron's split); then
``cu_seqlens`` is the rank's local one (docs/parallelism.md).

Checkpoints (``--dataloader-save DIR``): Megatron's ``maybe_save_dataloader_state`` calls
``save_state()`` on TP rank 0 of the first stage of every DP rank and writes it to
``DIR/iter_{N:07d}/mp_rank_00[_000]/train_dataloader_dprank{dp:03d}.pt``. Braid's state
of a step is the same on every stage and TP rank of a DP rank, so every reading rank
restores from that file: ``restore_state(torch.load(path)["dataloader_state_dict"])``
before the first ``next()`` (``saved_state_path`` gives the path; ``data_iterator(...,
dataloader_save=DIR, iteration=N)`` does both).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional

import torch

from braid.config import ConfigLike
from braid.integrations.masks import masked_out_mask
from braid.loader import Loader

__all__ = ["MegatronBatches", "data_iterator", "needs_data", "causal_block_mask",
           "saved_state_path"]


def needs_data(loader: Loader) -> bool:
    """Whether Megatron reads batches on this rank: TP rank 0 of any pipeline stage."""
    return loader.tp_rank == 0


def causal_block_mask(cu_seqlens: torch.Tensor, mbs: int, seq_len: int) -> torch.Tensor:
    """A bool ``[mbs, 1, seq, seq]`` mask, ``True`` where attention is *not* allowed
    (Megatron's convention; ``masks.attend_mask`` is PyTorch's, the opposite).

    Token i may attend to token j of the same row iff j <= i and both lie in the same
    ``cu_seqlens`` piece. ``cu_seqlens`` runs over the flattened ``mbs * seq`` tokens.
    """
    return masked_out_mask(cu_seqlens, mbs, seq_len)


class MegatronBatches:
    """Iterator of Megatron GPT batch dicts over a ``braid.Loader`` (see module docs).

    ``save_state()`` / ``restore_state()`` are what Megatron's ``--dataloader-save``
    calls; ``state_dict()`` / ``load_state_dict()`` are the same, PyTorch's names.
    """

    def __init__(self, loader: Loader, *, attention_mask: Optional[str] = None,
                 ignore_fill: int = 0, cp_split: str = "megatron",
                 packed: bool = True) -> None:
        if attention_mask not in (None, "causal"):
            raise ValueError(f"attention_mask must be None or 'causal', not {attention_mask!r}")
        if cp_split not in ("megatron", "braid"):
            raise ValueError(f"cp_split must be 'megatron' or 'braid', not {cp_split!r}")
        self.cp = loader.topology["cp"]
        if self.cp > 1:
            if cp_split == "megatron" and loader.split_context:
                raise ValueError(
                    "Megatron splits sequences for context parallelism itself: make the "
                    "Loader with split_context=False, or pass cp_split='braid'")
            if cp_split == "braid" and not loader.split_context:
                raise ValueError("cp_split='braid' needs a Loader with split_context=True")
            if cp_split == "braid" and attention_mask == "causal":
                raise ValueError("attention_mask='causal' needs whole sequences; "
                                 "with cp_split='braid' use cu_seqlens")
        self.loader = loader
        self.attention_mask = attention_mask
        self.ignore_fill = ignore_fill
        self.packed = packed
        self.check_pieces = packed and self.cp > 1 and cp_split == "megatron"
        self._it: Optional[Iterator[Dict[str, torch.Tensor]]] = None

    def __iter__(self) -> "MegatronBatches":
        return self

    def __next__(self) -> Dict[str, Any]:
        if self._it is None:
            self._it = iter(self.loader)
        return self.convert(next(self._it))

    def convert(self, batch: Dict[str, torch.Tensor]) -> Dict[str, Any]:
        """Braid's micro-batch dict -> Megatron's GPT batch dict."""
        position_ids = batch["position_ids"]
        mbs, seq_len = position_ids.shape
        cu = batch["cu_seqlens"]
        out: Dict[str, Any] = {}
        if "input_ids" in batch:
            out["tokens"] = batch["input_ids"].to(torch.int64)
        if "labels" in batch:
            labels = batch["labels"].to(torch.int64)
            out["labels"] = labels.masked_fill(labels < 0, self.ignore_fill)
            out["loss_mask"] = batch["loss_mask"].to(torch.float32)
        out["position_ids"] = position_ids.to(torch.int64)
        if self.attention_mask == "causal":
            out["attention_mask"] = causal_block_mask(cu, mbs, seq_len)
        if self.packed:
            if mbs != 1:
                raise ValueError(
                    f"Megatron's packed path needs micro_batch_size 1 (this batch has "
                    f"{mbs}): set batch.micro_batch_size: 1, or packed=False")
            if self.check_pieces and bool((cu % (2 * self.cp)).any()):
                raise ValueError(
                    f"Megatron's THD split for cp={self.cp} needs every piece to be a "
                    f"multiple of {2 * self.cp} tokens; this batch has pieces of "
                    f"{(cu[1:] - cu[:-1]).tolist()}: set batch.pad_to_multiple_of: "
                    f"{2 * self.cp} in the job, or use packed=False (with "
                    f"attention_mask='causal')")
            padded = cu.to(torch.int32).reshape(1, -1)
            real = batch.get("cu_seqlens_unpadded")
            out["cu_seqlens"] = padded if real is None else \
                real.to(torch.int32).reshape(1, -1)
            out["cu_seqlens_padded"] = padded
            out["max_seqlen"] = batch["max_seqlen"].to(torch.int32).reshape(1)
        return out

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._it = None
        self.loader.load_state_dict(state)

    # Megatron's names (maybe_save_dataloader_state, Energon's loaders).
    def save_state(self) -> Dict[str, Any]:
        """The Loader state after the last batch returned (plain JSON-able values)."""
        return self.state_dict()

    def restore_state(self, state: Dict[str, Any]) -> None:
        """Continues after the batch ``save_state()`` was taken at; takes the state or
        the dict Megatron saved (``{"dataloader_state_dict": state}``)."""
        if "dataloader_state_dict" in state:
            state = state["dataloader_state_dict"]
        self.load_state_dict(state)


def saved_state_path(dataloader_save: str, iteration: int, dp_rank: int,
                     pipeline_parallel: bool) -> str:
    """Where Megatron's ``--dataloader-save`` put DP rank ``dp_rank``'s state at
    ``iteration`` (TP rank 0 of the first stage wrote it)."""
    mp = "mp_rank_00_000" if pipeline_parallel else "mp_rank_00"
    return os.path.join(dataloader_save, f"iter_{iteration:07d}", mp,
                        f"train_dataloader_dprank{dp_rank:03d}.pt")


def data_iterator(config: ConfigLike, rank: Optional[int] = None,
                  world_size: Optional[int] = None, *, attention_mask: Optional[str] = None,
                  ignore_fill: int = 0, packed: bool = True,
                  dataloader_save: Optional[str] = None,
                  iteration: Optional[int] = None) -> Optional[MegatronBatches]:
    """The iterator to return from Megatron's ``train_valid_test_datasets_provider``.

    Makes ``braid.Loader(config, rank, world_size, split_context=False,
    stage_view=False)`` and returns ``MegatronBatches`` over it on the ranks that read
    data (``needs_data``), else ``None``. With ``dataloader_save`` and ``iteration`` (a
    resumed run's ``args.dataloader_save`` and ``args.iteration``), restores the state
    saved there; raises ``FileNotFoundError`` if it is missing.
    """
    loader = Loader(config, rank, world_size, split_context=False, stage_view=False)
    if not needs_data(loader):
        return None
    batches = MegatronBatches(loader, attention_mask=attention_mask,
                              ignore_fill=ignore_fill, packed=packed)
    if dataloader_save and iteration:
        path = saved_state_path(dataloader_save, iteration, loader.dp_rank,
                                loader.topology["pp"] > 1)
        batches.restore_state(torch.load(path, map_location="cpu", weights_only=True))
    return batches
