"""Imbalance of the two mix accountings on the bench workloads, in one run.

Plans each of `benchmarks/workloads.py`'s workloads (longtail, curriculum, phases,
heavy_vlm; made with `--dp 64`: 4 micro-batches per rank, 2 for heavy_vlm) under
`mix.exact: time` (the default: whole documents, shares exact over time) and `mix.exact:
step` (per-step quotas, the document that overflows a quota cut: the planner before
`time`), metadata only, as `braid plan --dp 64` does, and prints per workload the mean and
max imbalance (max rank cost / mean rank cost), the padding (token slots no document
fills) and the mean context / bound over all sources' tokens.

    .venv/bin/python benchmarks/workloads.py --dp 64 --dir out/workloads
    .venv/bin/python benchmarks/mix_imbalance.py --dir out/workloads [--steps 300]
        [--split aligned]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List

from braid import _core

WORKLOADS = ("longtail", "curriculum", "phases", "heavy_vlm")


def measure(path: str, exact: str, steps: int, dp: int,
            split: str = "") -> Dict[str, float]:
    with open(path) as f:
        text = json.load(f)
    text["mix"] = {"exact": exact}
    if split:
        text["balance"] = dict(text.get("balance", {}), split=split)
    text["topology"]["dp"] = dp
    config = _core.parse_config(json.dumps(text), os.path.dirname(path))
    imbalance: List[float] = []
    padding = slots = 0
    context = bound = 0.0

    def on_line(line: str) -> None:
        nonlocal padding, slots, context, bound
        plan = json.loads(line)
        imbalance.append(plan["imbalance"])
        capacity = text["batch"]["global_tokens"]
        slots += capacity
        padding += capacity - sum(plan["source_tokens"].values())
        seq_len = plan["seq_len"]
        for rank in plan["ranks"]:
            for mb in rank["micro_batches"]:
                for d in mb["docs"]:
                    start, n = d["start"], d["len"]

                    def prefix(end: int) -> int:
                        q, r = divmod(end, seq_len)
                        return q * (seq_len * (seq_len - 1) // 2) + r * (r - 1) // 2

                    context += n * (n - 1) // 2
                    bound += prefix(start + n) - prefix(start)

    _core.plan_job(config, steps, "", on_line)
    return {"mean": statistics.fmean(imbalance), "max": max(imbalance),
            "padding": padding / slots, "context": context / max(bound, 1.0)}


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join("out", "workloads"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--dp", type=int, default=64)
    ap.add_argument("--split", default="", help="balance.split for both (default: the "
                    "workload's)")
    ap.add_argument("names", nargs="*", default=list(WORKLOADS))
    args = ap.parse_args(argv)
    print(f"dp={args.dp}, {args.steps} steps; mean / max imbalance, padding, mean "
          f"context / bound (all tokens)")
    print(f"{'workload':>12} {'mix.exact: time':>32} {'mix.exact: step':>32} "
          f"{'time - step':>12}")
    for name in args.names:
        path = os.path.join(args.dir, name, f"{name}.json")
        r = {e: measure(path, e, args.steps, args.dp, args.split)
             for e in ("time", "step")}
        cells = "".join(f"{r[e]['mean']:>9.5f} / {r[e]['max']:.4f} "
                        f"{r[e]['padding']:>6.4f} {r[e]['context']:.3f}"
                        for e in ("time", "step"))
        print(f"{name:>12} {cells} {r['time']['mean'] - r['step']['mean']:>+12.5f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
