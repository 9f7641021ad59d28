"""Imbalance of the planner's DP assignment: Karmarkar-Karp vs greedy LPT vs sequential.

Generates the demo dataset (long-tail document lengths, a few near and beyond seq_len),
then plans the same steps with each balance algorithm in one run and prints the mean and
max imbalance (max rank cost / mean rank cost) and the ratio to sequential assignment
(what per-rank loaders do). The documents of each step are identical across algorithms:
only the assignment differs.

    .venv/bin/python benchmarks/imbalance.py [--dp 64] [--micro-batches 8 2] [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from braid import _core

ALGORITHMS = ("karmarkar_karp", "greedy", "none")


def config_for(data_dir: str, dp: int, micro_batches: int, seq_len: int,
               algorithm: str) -> "_core.Config":
    sources = []
    for name, weight in (("web", 0.6), ("code", 0.3), ("math", 0.1)):
        sources.append({"name": name, "path": os.path.join(data_dir, name, "*.parquet"),
                        "tokens_column": "input_ids", "weight": weight})
    config = {
        "seed": 1234,
        "topology": {"dp": dp},
        "batch": {"global_tokens": dp * micro_batches * seq_len, "seq_len": seq_len},
        "balance": {"cost": {"attn": 1.0, "linear": float(seq_len)}, "algorithm": algorithm},
        "sources": sources,
    }
    return _core.parse_config(json.dumps(config), data_dir)


def measure(config, steps: int):
    imbalance = []
    started = time.perf_counter()
    _core.plan_job(config, steps, "", lambda line: imbalance.append(json.loads(line)["imbalance"]))
    return statistics.fmean(imbalance), max(imbalance), time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dp", type=int, default=64)
    p.add_argument("--micro-batches", type=int, nargs="+", default=[8, 2])
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--data", help="demo data folder (default: a temporary one)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data or tmp
        if not os.path.exists(os.path.join(data_dir, "demo.yaml")):
            _core.make_demo_dataset(data_dir, seed=1234, seq_len=args.seq_len)
        print(f"demo data, dp={args.dp}, seq_len={args.seq_len}, {args.steps} steps")
        print(f"{'mb/rank':>8} {'algorithm':>15} {'mean':>8} {'max':>8} "
              f"{'mean vs none':>13} {'plan s':>7}")
        for mb in args.micro_batches:
            results = {a: measure(config_for(data_dir, args.dp, mb, args.seq_len, a),
                                  args.steps) for a in ALGORITHMS}
            none_mean = results["none"][0]
            for a in ALGORITHMS:
                mean, worst, secs = results[a]
                print(f"{mb:>8} {a:>15} {mean:>8.4f} {worst:>8.4f} "
                      f"{(mean - 1) / (none_mean - 1):>12.3f}x {secs:>7.2f}")


if __name__ == "__main__":
    main()
