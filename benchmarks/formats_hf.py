"""Hugging Face save_to_disk folders through Braid against the `datasets` library on the
same folder, one thread each.

A folder of --rows rows {"input_ids": [token ids], "text"} written by
Dataset.save_to_disk (a dev dependency) in --shards shards; Braid reads the token lists
through its source loader (one worker, one row's ids at a time in its seeded order, its
opening walk of every file included); `datasets` opens the folder with load_from_disk
and is read two ways: row by row as NumPy arrays (what a map-style Dataset gives a
PyTorch DataLoader; the target >= 1.0 is against this one) and in Arrow batches of 1000
rows (its fastest path, with no per-row work and no copy of the ids at all).

    .venv/bin/python benchmarks/formats_hf.py [--rows 200000] [--shards 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from braid import _core


def main() -> None:
    import datasets
    import pyarrow as pa

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    datasets.disable_progress_bars()
    rng = np.random.default_rng(5)
    lengths = np.clip(rng.lognormal(np.log(300), 0.8, size=args.rows), 1, 4096).astype(int)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 50000, size=int(offsets[-1]), dtype=np.int32)
    table = pa.table({
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
        "text": pa.array(["lorem ipsum"] * args.rows),
    })
    tokens = int(offsets[-1])
    with tempfile.TemporaryDirectory(prefix="braid-hf-") as root:
        folder = os.path.join(root, "saved")
        datasets.Dataset(table).save_to_disk(folder, num_shards=args.shards)
        cfg = _core.parse_config(json.dumps({
            "seed": 1, "batch": {"global_tokens": 4096, "seq_len": 4096},
            "sources": [{"name": "hf", "path": folder, "tokens_column": "input_ids",
                         "workers": 1}]}), "/")

        def braid_read():
            r = _core.read_source(cfg, 0, args.rows)
            assert r["samples"] == args.rows and r["payload_tokens"] == tokens
            return r["payload_tokens"], r["seconds"]

        def per_row():
            # What a map-style PyTorch Dataset over it does: one row at a time, its ids
            # as a NumPy array.
            start = time.perf_counter()
            ds = datasets.load_from_disk(folder).with_format("numpy", columns=["input_ids"])
            n = 0
            for row in ds:
                n += row["input_ids"].size
            return n, time.perf_counter() - start

        def arrow_batches():
            # The library's fastest path: Arrow batches of 1000 rows, nothing per row.
            # Each batch's ids as views (flatten() of each chunk), as Braid's payloads
            # are: combine_chunks() would copy them, even for one chunk.
            start = time.perf_counter()
            ds = datasets.load_from_disk(folder).with_format("arrow")
            n = 0
            for batch in ds.iter(batch_size=1000):
                n += sum(len(chunk.flatten()) for chunk in batch.column("input_ids").chunks)
            return n, time.perf_counter() - start

        # The readers take turns, so a change in the machine's load falls on all of
        # them; each keeps its best run.
        runs = {"braid": [], "rows": [], "batches": []}
        for _ in range(args.repeat):
            runs["braid"].append(braid_read())
            runs["rows"].append(per_row())
            runs["batches"].append(arrow_batches())
        br_tok, br_s = min(runs["braid"], key=lambda r: r[1])
        print(f"save_to_disk folder: {args.rows:,} rows, {tokens / 1e6:.1f}M tokens, "
              f"{args.shards} shards, one thread")
        print(f"    {'Braid loader':<28}{br_tok / br_s / 1e6:8.2f} M tokens/s")
        for name, key in (("datasets, rows as NumPy", "rows"),
                          ("datasets, Arrow batches", "batches")):
            ref_tok, ref_s = min(runs[key], key=lambda r: r[1])
            assert ref_tok == br_tok == tokens
            print(f"    {name:<28}{ref_tok / ref_s / 1e6:8.2f} M tokens/s   Braid / it "
                  f"{(br_tok / br_s) / (ref_tok / ref_s):6.3f}")
        print("    (target >= 1.0 against the per-row reader, which gives what Braid's "
              "loader gives: one row's ids at a time)")


if __name__ == "__main__":
    main()
