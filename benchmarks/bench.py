"""Braid against the per-rank baseline and peers on one config: memory, tokens/s, trainer
wait, imbalance per step, end-to-end steps/s with simulated synchronous-DP trainers
(harness/run.py; docs/benchmarks.md).

    .venv/bin/python benchmarks/bench.py CONFIG [--ranks 8] [--runtime embedded|ray] \
        [--against baseline,litdata,energon,mosaic] [--steps 24] [--out DIR] ...

Needs `pip install 'braid[bench]'` (matplotlib, tqdm, Pillow, sentencepiece). Exit codes
as `braid`'s (0 done, 2 a bad flag or config, 3 bad data or a loader that failed in its
trainers), with one line on stderr.
"""

from __future__ import annotations

import sys

from braid.cli import EXIT_DATA, run_with_exit_codes
from harness import run  # this script's folder is on sys.path

if __name__ == "__main__":
    args = run.parser().parse_args()
    sys.exit(run_with_exit_codes(lambda: run.main(args), errors={run.BenchError: EXIT_DATA}))
