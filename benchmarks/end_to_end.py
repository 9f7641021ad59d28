"""`benchmarks/bench.py` on the four workloads (benchmarks/workloads.py), one after the other, and
the figures issue 12 asks for side by side: end-to-end speedup over the per-rank
baseline (and its average over the workloads), memory ratio, imbalance at dp=64.

    .venv/bin/python benchmarks/end_to_end.py [--ranks 8] [--dir out/workloads] \
        [--out out/bench] [--tokens 2000000] [--schedule-steps 12] [--runtime embedded] \
        [--names longtail,...] [--tp 1] [--pp 1] [-- BENCH OPTIONS...]

`--names heavy_vlm_photo` runs the heavy mix at real image cost (benchmarks/workloads.py);
`--tp T --pp P` puts the ranks in tp x pp groups (bench.py's options of the same name).

Prints one line per workload, then the average; the trainers' waits are over the timed
steps, as the speedup is (bench.json also has `wait_fraction`, start-up included). The
JSON of each run is OUT/NAME/bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ("longtail", "curriculum", "phases", "heavy_vlm")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="8")
    p.add_argument("--dir", default=os.path.join("out", "workloads"))
    p.add_argument("--out", default=os.path.join("out", "bench"))
    p.add_argument("--tokens", type=int, default=2_000_000, help="per source")
    p.add_argument("--schedule-steps", type=int, default=12,
                   help="where the curriculum's ramp and the short phase end (inside "
                   "the bench's steps)")
    p.add_argument("--runtime", default="embedded", choices=["embedded", "ray"])
    p.add_argument("--names", default=",".join(NAMES))
    p.add_argument("--tp", type=int, default=1, help="bench.py --tp")
    p.add_argument("--pp", type=int, default=1, help="bench.py --pp")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="after --: bench.py options")
    args = p.parse_args(argv)
    extra = [a for a in args.bench if a != "--"]
    names = [n for n in args.names.split(",") if n]
    subprocess.run([sys.executable, os.path.join(HERE, "workloads.py"), *names, "--dir",
                    args.dir, "--tokens", str(args.tokens), "--schedule-steps",
                    str(args.schedule_steps)], check=True,
                   stdout=subprocess.DEVNULL)
    rows = {}
    for name in names:
        out = os.path.join(args.out, name)
        subprocess.run([sys.executable, os.path.join(HERE, "bench.py"),
                        os.path.join(args.dir, name, f"{name}.json"), "--ranks", args.ranks,
                        "--runtime", args.runtime, "--tp", str(args.tp), "--pp",
                        str(args.pp), "--out", out, *extra], check=True)
        with open(os.path.join(out, "bench.json")) as f:
            rows[name] = json.load(f)
    braid = "braid" if args.runtime == "embedded" else "braid-ray"
    print(f"\n{'workload':<16} {'end-to-end':>11} {'costs alone':>12} {'balance':>8} "
          f"{'memory':>8} {'wait braid':>11} {'wait base':>10} {'dp=64 braid':>12} "
          f"{'dp=64 base':>11}")
    # The waits are over the timed steps (after bench.py's --warmup), the span the
    # speedup is measured over; start-up is in bench.json's `wait_fraction` only.
    speedups, alone, balance = [], [], []
    for name, r in rows.items():
        speedup = r["speedup_over_baseline"][braid]
        speedups.append(speedup)
        alone.append(r["speedup_costs_alone_over_baseline"][braid])
        balance.append(r["speedup_balance_only_over_baseline"][braid])
        dp = r["imbalance_dp"]["mean"]
        wait = {n: r["loaders"][n]["wait_fraction_timed"] for n in (braid, "baseline")}
        print(f"{name:<16} {speedup:>10.2f}x {alone[-1]:>11.2f}x {balance[-1]:>7.2f}x "
              f"{r['memory_ratio_baseline_over'][braid]:>7.2f}x {wait[braid]:>10.1%} "
              f"{wait['baseline']:>10.1%} {dp[braid]:>12.4f} {dp['baseline']:>11.4f}")
    print(f"{'average':<16} {statistics.fmean(speedups):>10.2f}x "
          f"{statistics.fmean(alone):>11.2f}x {statistics.fmean(balance):>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
