"""Megatron indexed datasets (.bin + .idx) through Braid, against Megatron-Core's own
IndexedDataset on the same files written by its own builder (megatron-core, a dev
dependency).

(a) Planning: an index of --docs documents (default 10 million) written by Megatron-Core's
    _IndexWriter beside a sparse .bin of the size its lengths say (planning reads no token,
    so the .bin's bytes never need to exist on disk), at two mean document lengths 100x
    apart. Each plan runs in a fresh process: seconds from the call to the first step's
    plan, what the process's RSS grew by over the plan, and its peak RSS. Targets: first
    plan <= 2 s; memory independent of the token count. For reference, the seconds
    IndexedDataset takes to open the same index.
(b) Read rate: --read-docs documents (uint16 ids, lognormal lengths) written with
    IndexedDatasetBuilder; Braid's source loader (one worker, its payloads as int32, in its
    seeded order) against IndexedDataset reading every document and converting it to
    int32 (the same widening copy Braid makes), one thread each. Target >= 1.0.

    .venv/bin/python benchmarks/formats_megatron.py [--docs 10000000] [--read-docs 200000]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

PLAN_CHILD = r"""
import json, sys, time
from braid import _core
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
config = _core.parse_config(sys.argv[1], "/")
before = status("VmRSS")
start = time.perf_counter()
first = []
def emit(line):
    if not first:
        first.append(time.perf_counter() - start)
_core.plan_job(config, 1, "", emit)
print(json.dumps({"first_plan_s": first[0], "rss_before_kb": before,
                  "rss_after_kb": status("VmRSS"), "rss_peak_kb": status("VmHWM")}))
"""


def write_index(prefix: str, docs: int, mean_tokens: float, seed: int) -> int:
    """An index of `docs` one-sequence documents via Megatron-Core's _IndexWriter, and a
    sparse .bin of the size it describes (uint16). Returns the token count."""
    from megatron.core.datasets.indexed_dataset import _IndexWriter

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(mean_tokens), 0.5, size=docs), 1, 2**31 - 1)
    lengths = lengths.astype(np.int32)
    with _IndexWriter(prefix + ".idx", np.uint16) as w:
        # (_IndexWriter computes the pointers in a Python loop: minutes for 10M; the same
        # bytes, computed with NumPy, are written by patching its helper.)
        w._sequence_pointers = lambda ls: np.concatenate(
            [[0], np.cumsum(np.asarray(ls, dtype=np.int64) * 2)[:-1]])
        w.write(lengths, None, np.arange(docs + 1, dtype=np.int64))
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(lengths.astype(np.int64).sum()) * 2)
    return int(lengths.astype(np.int64).sum())


def plan_once(prefix: str) -> dict:
    config = {"seed": 1, "batch": {"global_tokens": 8 * 8192, "seq_len": 8192},
              "topology": {"dp": 8}, "runtime": {"threads": 1},
              "sources": [{"name": "meg", "path": prefix}]}
    out = subprocess.run([sys.executable, "-c", PLAN_CHILD, json.dumps(config)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def open_reference(prefix: str) -> float:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    start = time.perf_counter()
    ds = IndexedDataset(prefix)
    _ = len(ds), ds.document_indices[-1]
    return time.perf_counter() - start


def write_read_dataset(prefix: str, docs: int, seed: int) -> int:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(500), 1.0, size=docs), 1, 16384).astype(np.int64)
    values = rng.integers(0, 50000, size=int(lengths.sum()), dtype=np.int64)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    at = 0
    for n in lengths:
        builder.add_document(torch.from_numpy(values[at:at + n]), [int(n)])
        at += n
    builder.finalize(prefix + ".idx")
    return int(lengths.sum())


def best(fn, repeat: int):
    return min((fn() for _ in range(repeat)), key=lambda r: r[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--read-docs", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from braid import _core

    with tempfile.TemporaryDirectory(prefix="braid-megatron-") as root:
        # (a) planning.
        print(f"(a) first plan of a Megatron dataset of {args.docs:,} documents "
              "(fresh process each, runtime.threads 1)")
        for mean in (64, 6400):
            prefix = os.path.join(root, f"plan{mean}")
            tokens = write_index(prefix, args.docs, mean, seed=mean)
            runs = [plan_once(prefix) for _ in range(args.repeat)]
            first = min(r["first_plan_s"] for r in runs)
            grown = min(r["rss_after_kb"] - r["rss_before_kb"] for r in runs) / 1024
            peak = min(r["rss_peak_kb"] for r in runs) / 1024
            ref = min(open_reference(prefix) for _ in range(args.repeat))
            print(f"    mean {mean:>5} tokens/doc, {tokens / 1e9:7.2f} G tokens: first plan "
                  f"{first:6.3f} s (target <= 2), RSS +{grown:5.1f} MiB over the plan, "
                  f"peak {peak:6.1f} MiB; "
                  f"IndexedDataset open {ref:6.3f} s")
            os.remove(prefix + ".bin")
            os.remove(prefix + ".idx")
        # (b) read rate.
        prefix = os.path.join(root, "read")
        tokens = write_read_dataset(prefix, args.read_docs, seed=9)
        cfg = _core.parse_config(json.dumps({
            "seed": 1, "batch": {"global_tokens": 4096, "seq_len": 4096},
            "sources": [{"name": "meg", "path": prefix, "workers": 1,
                         "shuffle_window": 4096}]}), "/")

        def braid_read():
            r = _core.read_source(cfg, 0, args.read_docs)
            assert r["samples"] == args.read_docs and r["payload_tokens"] == tokens
            return r["payload_tokens"], r["seconds"]

        def reference_read():
            from megatron.core.datasets.indexed_dataset import IndexedDataset

            start = time.perf_counter()
            ds = IndexedDataset(prefix)
            n = 0
            for i in range(len(ds)):
                n += ds[i].astype(np.int32).size
            return n, time.perf_counter() - start

        ref_tok, ref_s = best(reference_read, args.repeat)
        br_tok, br_s = best(braid_read, args.repeat)
        assert ref_tok == br_tok == tokens
        print(f"(b) read rate, {args.read_docs:,} documents, {tokens / 1e6:.1f}M uint16 "
              "tokens, one thread")
        print(f"    {'IndexedDataset':<18}{ref_tok / ref_s / 1e6:8.2f} M tokens/s")
        print(f"    {'Braid loader':<18}{br_tok / br_s / 1e6:8.2f} M tokens/s")
        print(f"    {'ratio':<18}{(br_tok / br_s) / (ref_tok / ref_s):8.3f}   "
              "(target >= 1.0)")


if __name__ == "__main__":
    main()
