"""Many real-shaped sources in one job: start time, step time, memory and threads.

Generates N sources x F files of documents shaped like published corpora (lognormal
lengths with a long tail past seq_len, a list<int32> token column) and runs
`braid plan CONFIG --steps K` and `braid run CONFIG --steps K` on them in subprocesses
(dp=1024, seq_len 2048, global_tokens = dp * seq_len), printing per N:

  first    seconds from the process start to its first step line (plan JSON / run progress)
  step     steady milliseconds per step (between the first and the last step line)
  rss      peak resident set size of the process (VmHWM, /proc/PID/status)
  threads  most threads the process had at once (polled from /proc/PID/status)

Layouts: `large` writes each file as one row group (about 180 documents of 25K tokens at
the default 4.5M tokens per file, the shape of many published corpora); `small` writes the
same documents in row groups of --small-rows rows. Data is generated once per
(layout, tokens per file, files per source) under --dir and reused; at most --distinct
files are generated, further sources hard-link them (their orders still differ: the seed
is per source). Memory and thread figures are of the whole `braid` process (Python,
Arrow, Braid).

    .venv/bin/python benchmarks/many_sources.py \
        [--sources 16,64,306,1000] [--files 1] [--tokens-per-file 4500000] \
        [--layout large|small|both] [--steps 5] [--modes plan,run] [--dir out/many] \
        [--distinct 64] [--set runtime.threads=2 ...] [--timeout 600]

`--set KEY=VALUE` overrides a config key (a JSON value); `sources.KEY` sets it on every
source (`--set sources.shuffle_window_bytes=0`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# The harness package, from this script's folder (sys.path[0]).
from harness.overrides import apply_overrides, parse_set
from harness.procs import proc_fields

SEQ_LEN = 2048
DP = 1024
MEAN_LOG = np.log(12000.0)  # median document length; mean ~25K tokens
SIGMA = 1.2


def write_file(path: str, tokens: int, layout: str, small_rows: int, seed: int,
               mean_log: float = MEAN_LOG, sigma: float = SIGMA) -> None:
    """About `tokens` tokens of documents with lognormal lengths (median exp(mean_log)),
    random ids, in one row group (`large`) or row groups of `small_rows` rows."""
    rng = np.random.default_rng(seed)
    median = float(np.exp(mean_log))
    draws = max(tokens // 1000, int(tokens / median) * 4) + 16  # enough for `tokens`
    lengths = np.maximum(1, rng.lognormal(mean_log, sigma, size=draws).astype(np.int64))
    lengths = lengths[np.cumsum(lengths) <= tokens]
    if len(lengths) == 0:
        lengths = np.array([tokens], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 32000, size=int(offsets[-1]), dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    rows = len(lengths) if layout == "large" else small_rows
    tmp = path + ".partial"
    pq.write_table(pa.table({"input_ids": column}), tmp, row_group_size=rows)
    os.replace(tmp, path)


def make_data(root: str, sources: int, files: int, tokens: int, layout: str,
              small_rows: int, distinct: int) -> str:
    """The folder of the data set; source s is root/.../s{s:04d}/."""
    base = os.path.join(os.path.abspath(root), f"{layout}-t{tokens}-f{files}" +
                        (f"-r{small_rows}" if layout == "small" else ""))
    made = 0
    t0 = time.time()
    for s in range(sources):
        folder = os.path.join(base, f"s{s:04d}")
        os.makedirs(folder, exist_ok=True)
        for f in range(files):
            path = os.path.join(folder, f"part-{f:03d}.parquet")
            if os.path.exists(path):
                continue
            k = s % distinct
            origin = os.path.join(base, f"s{k:04d}", f"part-{f:03d}.parquet")
            if k != s and os.path.exists(origin):
                os.link(origin, path)
            else:
                write_file(path, tokens, layout, small_rows, seed=1000003 * s + f)
                made += 1
    if made:
        print(f"  generated {made} files in {time.time() - t0:.1f} s under {base}",
              flush=True)
    return base


def write_config(path: str, base: str, sources: int, extra: dict) -> None:
    config = {
        "seed": 7,
        "topology": {"dp": DP},
        "batch": {"global_tokens": DP * SEQ_LEN, "seq_len": SEQ_LEN},
        "sources": [{"name": f"s{s:04d}", "path": os.path.join(base, f"s{s:04d}"),
                     "tokens_column": "input_ids",
                     "weight": float(1 + (s % 7))} for s in range(sources)],
    }
    apply_overrides(config, extra)
    with open(path, "w") as f:
        json.dump(config, f, indent=1)


def measure(cmd, timeout: float):
    """Runs cmd; returns (line times from start, peak RSS bytes, max threads, rc, tail)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    times, lines, err = [], [], []
    peak = {"rss": 0, "threads": 0}
    done = threading.Event()

    def poll():
        while not done.is_set():
            st = proc_fields(proc.pid, "status")
            if st:
                hwm = int(st.get("VmHWM", "0 kB").split()[0]) * 1024
                peak["rss"] = max(peak["rss"], hwm)
                peak["threads"] = max(peak["threads"], int(st.get("Threads", "0")))
            done.wait(0.02)

    def read_err():
        for line in proc.stderr:
            err.append(line)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    errs = threading.Thread(target=read_err, daemon=True)
    errs.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    for line in proc.stdout:
        now = time.monotonic() - start
        if line.startswith("{") or line.startswith("step "):
            times.append(now)
        lines.append(line)
    rc = proc.wait()
    killer.cancel()
    done.set()
    poller.join()
    errs.join()
    return times, peak["rss"], peak["threads"], rc, "".join(err[-5:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sources", default="16,64,306,1000")
    p.add_argument("--files", type=int, default=1, help="files per source")
    p.add_argument("--tokens-per-file", type=int, default=4_500_000)
    p.add_argument("--layout", choices=["large", "small", "both"], default="large")
    p.add_argument("--small-rows", type=int, default=16, help="rows per row group (small)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--modes", default="plan,run")
    p.add_argument("--dir", default=os.path.join("out", "many_sources"))
    p.add_argument("--distinct", type=int, default=64,
                   help="at most this many distinct files; more sources hard-link them")
    p.add_argument("--set", action="append", help="config override KEY=VALUE (JSON value)")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    extra = parse_set(args.set)
    layouts = ["large", "small"] if args.layout == "both" else [args.layout]
    braid = [sys.executable, "-c", "import sys; from braid.cli import main; "
             "sys.exit(main())"]
    print(f"dp={DP} seq_len={SEQ_LEN} global_tokens={DP * SEQ_LEN} steps={args.steps} "
          f"files/source={args.files} tokens/file={args.tokens_per_file:,} "
          f"overrides={extra or '-'}", flush=True)
    print(f"{'layout':<6} {'N':>5} {'mode':<4} {'first s':>8} {'step ms':>8} "
          f"{'peak RSS':>9} {'threads':>7}", flush=True)
    for layout in layouts:
        for n in [int(x) for x in args.sources.split(",")]:
            base = make_data(args.dir, n, args.files, args.tokens_per_file, layout,
                             args.small_rows, max(1, args.distinct))
            config = os.path.join(args.dir, f"config-{layout}-{n}.json")
            write_config(config, base, n, extra)
            for mode in args.modes.split(","):
                cmd = braid + [mode, config, "--steps", str(args.steps)]
                times, rss, threads, rc, tail = measure(cmd, args.timeout)
                first = f"{times[0]:.2f}" if times else "-"
                step = (f"{1000 * (times[-1] - times[0]) / (len(times) - 1):.1f}"
                        if len(times) > 1 else "-")
                print(f"{layout:<6} {n:>5} {mode:<4} {first:>8} {step:>8} "
                      f"{rss / 2**30:>7.2f}GB {threads:>7}"
                      + ("" if rc == 0 else f"  (exit {rc}: {tail.strip()[-300:]})"),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
