"""Attention masks from a micro-batch's ``cu_seqlens``, named by their convention.

Two conventions exist and they are opposite:

- ``attend_mask``: ``True`` where a token *may attend* (PyTorch's
  ``F.scaled_dot_product_attention`` bool masks, Hugging Face 4-D masks).
- ``masked_out_mask``: ``True`` where attention is *not allowed* (Megatron-LM's
  ``attention_mask``, ``megatron.causal_block_mask``).

Both are bool ``[mbs, 1, seq, seq]``, block-diagonal and causal: token i of a row may
attend to token j of the same row iff j <= i and both lie in the same ``cu_seqlens``
piece. ``cu_seqlens`` runs over the flattened ``mbs * seq`` tokens (Braid's layout). They
cost ``mbs * seq^2`` bytes: for long sequences use ``cu_seqlens`` with a varlen kernel.
"""

from __future__ import annotations

import torch

__all__ = ["attend_mask", "masked_out_mask"]


def attend_mask(cu_seqlens: torch.Tensor, mbs: int, seq_len: int) -> torch.Tensor:
    """Bool ``[mbs, 1, seq, seq]``, ``True`` where attention is allowed (PyTorch, HF)."""
    flat = torch.arange(mbs * seq_len, dtype=torch.int64)
    cu = cu_seqlens.reshape(-1).to(torch.int64)
    piece = torch.searchsorted(cu[1:], flat, right=True).view(mbs, seq_len)
    same = piece.unsqueeze(2) == piece.unsqueeze(1)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    return (same & causal).unsqueeze(1)


def masked_out_mask(cu_seqlens: torch.Tensor, mbs: int, seq_len: int) -> torch.Tensor:
    """Bool ``[mbs, 1, seq, seq]``, ``True`` where attention is not allowed (Megatron)."""
    return ~attend_mask(cu_seqlens, mbs, seq_len)
