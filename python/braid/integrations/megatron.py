"""Megatron-LM's external data iterator over a ``braid.Loader``.

Megatron with ``--dataloader-type external`` uses the iterator returned by the
``train_valid_test_datasets_provider`` as is and calls ``next()`` on it in ``get_batch``.
Only TP rank 0 of the first and last pipeline stages reads data; it broadcasts the batch
to the other TP ranks of its stage, and middle stages read nothing. So:

- ``data_iterator(loader)`` returns a ``MegatronBatches`` on those ranks and ``None`` on
  every other rank (the value Megatron's own providers give there). A rank that gets
  ``None`` never starts a Braid engine, so it costs no memory.
- ``MegatronBatches`` works on any rank if you want it anyway: it yields the keys of every
  stage, with ``None`` for tensors the stage does not receive (first stage: ``tokens``;
  last stage: ``labels`` and ``loss_mask``; every stage ``position_ids`` and
  ``cu_seqlens``), which is how Megatron's ``get_batch_on_this_tp_rank`` fills them.

Each item is a dict with Megatron's GPT keys:

- ``tokens`` int64 ``[mbs, seq]``: Braid's ``input_ids``.
- ``labels`` int64 ``[mbs, seq]``: Braid's ``labels`` with the ignore label (``-100``)
  replaced by ``ignore_fill`` (default 0), because Megatron's vocab-parallel cross entropy
  takes every label as an index; those positions have ``loss_mask == 0``.
- ``loss_mask`` float32 ``[mbs, seq]``.
- ``attention_mask``: ``None`` by default (use ``cu_seqlens`` with a varlen/THD attention,
  e.g. ``PackedSeqParams(qkv_format="thd")``), or with ``attention_mask="causal"`` a bool
  ``[mbs, 1, seq, seq]`` block-diagonal causal mask in Megatron's convention (``True``
  means masked out): a token attends to the earlier tokens of its own document only.
- ``position_ids`` int64 ``[mbs, seq]``, restarting at every document.
- ``cu_seqlens`` int32 ``[pieces + 1]`` over the flattened ``mbs * seq`` tokens and
  ``max_seqlen`` (0-d int32), passed through for packed-sequence attention.

Context parallelism: Megatron splits every sequence for CP itself
(``get_batch_on_this_cp_rank``, the same 2*cp-chunk zigzag as Braid). By default
(``cp_split="megatron"``) the Loader must therefore hand over whole sequences: build it
with ``split_context=False`` (``data_iterator`` does). With ``cp_split="braid"`` the batch
is Braid's CP view (for a ``get_batch`` that skips Megatron's split); then ``cu_seqlens``
is the rank's local one (docs/parallelism.md) and ``attention_mask="causal"`` is refused.

Checkpoints: Megatron does not save an external iterator's state. Save
``loader.state_dict()`` from TP rank 0 of the first stage with the model checkpoint and
``load_state_dict()`` it on every rank before the first ``next()``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import torch

from braid.config import ConfigLike
from braid.loader import Loader

__all__ = ["MegatronBatches", "data_iterator", "needs_data", "causal_block_mask"]


def needs_data(loader: Loader) -> bool:
    """Whether Megatron reads batches on this rank: TP rank 0 of the first or last stage."""
    last = loader.topology["pp"] - 1
    return loader.tp_rank == 0 and loader.pp_rank in (0, last)


def causal_block_mask(cu_seqlens: torch.Tensor, mbs: int, seq_len: int) -> torch.Tensor:
    """A bool ``[mbs, 1, seq, seq]`` mask, ``True`` where attention is not allowed.

    Token i may attend to token j of the same row iff j <= i and both lie in the same
    ``cu_seqlens`` piece. ``cu_seqlens`` runs over the flattened ``mbs * seq`` tokens.
    """
    flat = torch.arange(mbs * seq_len, dtype=torch.int64)
    piece = torch.searchsorted(cu_seqlens[1:].to(torch.int64), flat, right=True)
    piece = piece.view(mbs, seq_len)
    same = piece.unsqueeze(2) == piece.unsqueeze(1)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    return ~(same & causal).unsqueeze(1)


class MegatronBatches:
    """Iterator of Megatron GPT batch dicts over a ``braid.Loader`` (see module docs).

    ``state_dict()`` / ``load_state_dict()`` forward to the Loader.
    """

    def __init__(self, loader: Loader, *, attention_mask: Optional[str] = None,
                 ignore_fill: int = 0, cp_split: str = "megatron") -> None:
        if attention_mask not in (None, "causal"):
            raise ValueError(f"attention_mask must be None or 'causal', not {attention_mask!r}")
        if cp_split not in ("megatron", "braid"):
            raise ValueError(f"cp_split must be 'megatron' or 'braid', not {cp_split!r}")
        if loader.topology["cp"] > 1:
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
        labels = batch.get("labels")
        if labels is not None:
            labels = labels.masked_fill(labels < 0, self.ignore_fill)
        mask = None
        if self.attention_mask == "causal":
            mask = causal_block_mask(cu, mbs, seq_len)
        return {
            "tokens": batch.get("input_ids"),
            "labels": labels,
            "loss_mask": batch.get("loss_mask"),
            "attention_mask": mask,
            "position_ids": position_ids,
            "cu_seqlens": cu,
            "max_seqlen": (cu[1:] - cu[:-1]).max().to(torch.int32),
        }

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._it = None
        self.loader.load_state_dict(state)


def data_iterator(config: ConfigLike, rank: Optional[int] = None,
                  world_size: Optional[int] = None, *, attention_mask: Optional[str] = None,
                  ignore_fill: int = 0) -> Optional[MegatronBatches]:
    """The iterator to return from Megatron's ``train_valid_test_datasets_provider``.

    Makes ``braid.Loader(config, rank, world_size, split_context=False)`` (Megatron splits
    for CP) and returns ``MegatronBatches`` over it on ranks that read data
    (``needs_data``), else ``None``.
    """
    loader = Loader(config, rank, world_size, split_context=False)
    if not needs_data(loader):
        return None
    return MegatronBatches(loader, attention_mask=attention_mask, ignore_fill=ignore_fill)
