"""What planning reads: token counts of real-shaped files, three ways, one source.

Writes --files Parquet files of documents shaped as in many_sources.py (lognormal lengths,
median 12K tokens, a list<int32> token column written by pyarrow with its defaults:
dictionary-encoded ids, snappy) plus an int32 length column "n_tokens", in two layouts:
`large` (each file one row group of ~180 documents, ~4.5M tokens) and `small` (row groups
of --small-rows rows). For each layout it reads every document of the source once
through Braid's source loader (`_core.read_source`, the default shuffle windows: large row
groups are read in blocks) and prints the seconds and the rate in M tokens/s of:

  plan             without payloads: what `braid plan` reads for a token source (since
                   docs/decisions.md 30, the token column's levels alone)
  plan (length)    without payloads, with `length_column: n_tokens`
  run              with payloads (the tokens), for scale
  arrow scan       pyarrow reading the token column row group by row group (one thread)

Every figure is the best of --repeat runs. Run it against a build without the length path
to see what planning read before (`plan (length)` then prints n/a: the key is unknown).

    .venv/bin/python benchmarks/plan_read.py \
        [--files 4] [--tokens-per-file 4500000] [--small-rows 8] [--repeat 3] \
        [--dir out/plan_read]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from braid import _core

MEAN_LOG = np.log(12000.0)  # as many_sources.py
SIGMA = 1.2


def write_file(path: str, tokens: int, rows_per_group: int, seed: int) -> int:
    """One file of about `tokens` tokens; returns its number of documents."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(MEAN_LOG, SIGMA, size=tokens // 1000 + 16)
                         .astype(np.int64))
    lengths = lengths[np.cumsum(lengths) <= tokens]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 32000, size=int(offsets[-1]), dtype=np.int32)
    table = pa.table({
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
        "n_tokens": pa.array(lengths.astype(np.int32)),
    })
    tmp = path + ".partial"
    pq.write_table(table, tmp, row_group_size=rows_per_group or len(lengths))
    os.replace(tmp, path)
    return len(lengths)


def make_layout(root: str, layout: str, files: int, tokens: int, small_rows: int) -> tuple:
    folder = os.path.join(root, f"{layout}-t{tokens}-f{files}" +
                          (f"-r{small_rows}" if layout == "small" else ""))
    os.makedirs(folder, exist_ok=True)
    docs = 0
    for f in range(files):
        path = os.path.join(folder, f"part-{f:03d}.parquet")
        if os.path.exists(path):
            docs += pq.ParquetFile(path).metadata.num_rows
        else:
            docs += write_file(path, tokens, small_rows if layout == "small" else 0, f + 1)
    return folder, docs


def config(path: str, length_column: str = ""):
    source = {"name": "s", "path": path, "tokens_column": "input_ids"}
    if length_column:
        source["length_column"] = length_column
    c = {"seed": 1, "batch": {"global_tokens": 2048, "seq_len": 2048}, "sources": [source]}
    return _core.parse_config(json.dumps(c), "/")


def best(fn, repeat: int):
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r[1])


def loader_read(cfg, docs: int, payloads: bool):
    r = _core.read_source(cfg, 0, docs, payloads)
    assert r["samples"] == docs
    return r["tokens"], r["seconds"]


def arrow_scan(folder: str):
    start = time.perf_counter()
    tokens = 0
    for name in sorted(os.listdir(folder)):
        f = pq.ParquetFile(os.path.join(folder, name))
        for rg in range(f.num_row_groups):
            t = f.read_row_group(rg, columns=["input_ids"], use_threads=False)
            tokens += len(t.column(0).combine_chunks().values)
    return tokens, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--tokens-per-file", type=int, default=4_500_000)
    ap.add_argument("--small-rows", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="out/plan_read")
    args = ap.parse_args()
    for layout in ("large", "small"):
        folder, docs = make_layout(args.dir, layout, args.files, args.tokens_per_file,
                                   args.small_rows)
        groups = sum(pq.ParquetFile(os.path.join(folder, n)).num_row_groups
                     for n in os.listdir(folder))
        print(f"{layout}: {args.files} files, {docs} documents, {groups} row groups")
        rows = [("plan", lambda: loader_read(config(folder), docs, False))]
        try:
            with_lengths = config(folder, "n_tokens")
            rows.append(("plan (length)", lambda: loader_read(with_lengths, docs, False)))
        except Exception as e:  # a build without length_column
            print(f"    {'plan (length)':<16}n/a ({str(e).splitlines()[0]})")
        rows.append(("run", lambda: loader_read(config(folder), docs, True)))
        rows.append(("arrow scan", lambda: arrow_scan(folder)))
        for name, fn in rows:
            tokens, seconds = best(fn, args.repeat)
            print(f"    {name:<16}{seconds * 1e3:9.1f} ms {tokens / seconds / 1e6:9.1f} "
                  f"M tokens/s  ({tokens} tokens)")


if __name__ == "__main__":
    main()
