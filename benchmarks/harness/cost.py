"""The cost model of a micro-batch, as the simulated trainers pay it and the harness
replays it: the planner's (docs/planner.md), `attn * len^2 + linear * len` per piece of
`cu_seqlens` plus `vision * image tokens` (`image_tokens`, else rows of
`pixel_values`). A loader that cannot report document boundaries (one segment per row)
pays full-row attention, as its trainer would. Stateless; thread-safe."""

from __future__ import annotations

from typing import Dict


def cost_model(config: dict) -> Dict[str, float]:
    """The config's `balance.cost` coefficients: attn, linear and vision."""
    cost = config.get("balance", {}).get("cost", {})
    return {"attn": float(cost.get("attn", 1.0)), "linear": float(cost.get("linear", 0.0)),
            "vision": float(cost.get("vision", 0.0))}


def batch_cost(batch: Dict, attn: float, linear: float, vision: float) -> float:
    """The cost of one micro-batch (see the module's docstring)."""
    import torch

    cu = batch["cu_seqlens"].to(torch.float64)
    lens = cu[1:] - cu[:-1]
    cost = float(attn * (lens * lens).sum() + linear * lens.sum())
    if "image_tokens" in batch:
        cost += vision * float(batch["image_tokens"].sum())
    elif "pixel_values" in batch:
        cost += vision * batch["pixel_values"].shape[0]
    return cost


def batch_tokens(batch: Dict) -> int:
    """The tokens of one micro-batch: its `input_ids`, else the end of `cu_seqlens`."""
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    return int(batch["cu_seqlens"][-1])
