"""Imbalance of the planner's DP assignment: Karmarkar-Karp vs greedy LPT vs sequential.

For each sequence length, generates the demo dataset with that seq_len (long-tail document
lengths, a few near and beyond seq_len), then plans the same steps with each balance
algorithm in one run and prints the mean and max imbalance (max rank cost / mean rank
cost) and the ratio to sequential assignment (what per-rank loaders do). The documents of
each step are identical across algorithms: only the assignment differs. Then the
splitting levers (balance.split / balance.max_piece, docs/planner.md) with Karmarkar-Karp:
they cut long documents differently (same documents and tokens per step); and the
token-slack lever (balance.slack): a step budget of (1 - slack) of the capacity, then
whole pieces moved between ranks into the room. `empty` is the fraction of token slots a step
leaves empty (padding: what slack costs in throughput).

    .venv/bin/python benchmarks/imbalance.py [--dp 64] [--micro-batches 8 2]
        [--seq-len 4096 16384] [--steps 50] [--no-levers] [--slack 0.02 0.05]
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


# (label, extra balance keys as a function of seq_len)
LEVERS = (
    ("split=even", lambda L: {"split": "even"}),
    ("max_piece=L/2", lambda L: {"max_piece": L // 2}),
    ("even,max_piece=L/2", lambda L: {"split": "even", "max_piece": L // 2}),
    ("even,max_piece=L/4", lambda L: {"split": "even", "max_piece": L // 4}),
)


def slack_levers(values):
    """Token slack alone and with the piece caps above."""
    out = []
    for v in values:
        out.append((f"slack={v:g}", lambda L, v=v: {"slack": v}))
    for v in values:
        out.append((f"max_piece=L/2,slack={v:g}", lambda L, v=v: {"max_piece": L // 2,
                                                                   "slack": v}))
    for v in values:
        out.append((f"even,L/4,slack={v:g}", lambda L, v=v: {"split": "even",
                                                             "max_piece": L // 4,
                                                             "slack": v}))
    return tuple(out)


def config_for(data_dir: str, dp: int, micro_batches: int, seq_len: int,
               algorithm: str, extra: dict | None = None) -> "_core.Config":
    sources = []
    for name, weight in (("web", 0.6), ("code", 0.3), ("math", 0.1)):
        sources.append({"name": name, "path": os.path.join(data_dir, name, "*.parquet"),
                        "tokens_column": "input_ids", "weight": weight})
    config = {
        "seed": 1234,
        "topology": {"dp": dp},
        "batch": {"global_tokens": dp * micro_batches * seq_len, "seq_len": seq_len},
        "balance": {"cost": {"attn": 1.0, "linear": float(seq_len)}, "algorithm": algorithm,
                    **(extra or {})},
        "sources": sources,
    }
    return _core.parse_config(json.dumps(config), data_dir)


def measure(config, steps: int, capacity: int):
    imbalance, empty = [], []

    def step(line: str) -> None:
        plan = json.loads(line)
        imbalance.append(plan["imbalance"])
        empty.append(1 - sum(plan["source_tokens"].values()) / capacity)

    started = time.perf_counter()
    _core.plan_job(config, steps, "", step)
    return (statistics.fmean(imbalance), max(imbalance), statistics.fmean(empty),
            time.perf_counter() - started)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dp", type=int, default=64)
    p.add_argument("--micro-batches", type=int, nargs="+", default=[8, 2])
    p.add_argument("--seq-len", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--no-levers", action="store_true", help="algorithms only")
    p.add_argument("--slack", type=float, nargs="*", default=[0.02, 0.05],
                   help="balance.slack values to try (none: skip the slack lever)")
    p.add_argument("--data", help="demo data folder per seq_len: DATA/L<seq_len> "
                   "(default: a temporary one)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        for seq_len in args.seq_len:
            data_dir = os.path.join(args.data or tmp, f"L{seq_len}")
            os.makedirs(data_dir, exist_ok=True)
            if not os.path.exists(os.path.join(data_dir, "demo.yaml")):
                _core.make_demo_dataset(data_dir, seed=1234, seq_len=seq_len)
            print(f"demo data, dp={args.dp}, seq_len={seq_len}, {args.steps} steps")
            print(f"{'mb/rank':>8} {'algorithm':>28} {'mean':>8} {'max':>8} {'empty':>7} "
                  f"{'mean vs none':>13} {'plan s':>7}")
            for mb in args.micro_batches:
                capacity = args.dp * mb * seq_len
                results = {a: measure(config_for(data_dir, args.dp, mb, seq_len, a),
                                      args.steps, capacity) for a in ALGORITHMS}
                if not args.no_levers:
                    for label, extra in LEVERS + slack_levers(args.slack):
                        results["kk " + label] = measure(
                            config_for(data_dir, args.dp, mb, seq_len, "karmarkar_karp",
                                       extra(seq_len)), args.steps, capacity)
                none_mean = results["none"][0]
                for a, (mean, worst, empty, secs) in results.items():
                    ratio = (mean - 1) / (none_mean - 1)
                    print(f"{mb:>8} {a:>28} {mean:>8.4f} {worst:>8.4f} {empty:>7.4f} "
                          f"{ratio:>12.3f}x {secs:>7.2f}", flush=True)
            print()


if __name__ == "__main__":
    main()
