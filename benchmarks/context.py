"""Context of a mix's documents: Braid's accountings against Megatron's GPTDataset's.

Generates four pre-tokenized sources with lognormal document lengths and a long tail
past seq_len (web, code, papers, books), weights 0.5 / 0.3 / 0.18 / 0.02, plans them at
dp=4 with `braid plan` semantics (metadata only) and prints, per source, the mean context
/ bound, the largest share drift and the imbalance:

- context of a token: its position inside its piece (attention never crosses a piece);
- bound: its offset in its document modulo seq_len (a document cut only every seq_len
  tokens from its start); mean context / bound = sum of contexts / sum of bounds;
- drift: tokens received less weight x tokens planned, largest |drift| over the steps, in
  units of seq_len.

Rows: Braid with `mix.exact: time` (the default: whole documents, shares exact over time),
the same with `balance.split: aligned` (long documents cut every seq_len from their
start), Braid with `mix.exact: step` (per-step quotas, the document that overflows a
quota cut),
and Megatron's GPTDataset semantics on the same documents, a reference written here from
its description: each source's documents, shuffled, concatenated and cut every seq_len
tokens, one source per sample, attention masked at document boundaries (so a token's
context restarts at its document's start inside the sample).

Two shapes with the same tokens per step: seq_len 4096 with 8 micro-batches per rank and
32768 with 1 micro-batch per rank.

    .venv/bin/python benchmarks/context.py [--steps 300] [--dir out/context]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from typing import Dict, List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from braid import _core

# name: (weight, median tokens, sigma, documents, seed)
SOURCES = {
    "web": (0.5, 600, 1.1, 8000, 11),
    "code": (0.3, 1500, 1.2, 4000, 12),
    "papers": (0.18, 9000, 0.9, 1500, 13),
    "books": (0.02, 60000, 0.9, 200, 14),
}
MAX_DOC_TOKENS = 1_000_000
DP = 4
SHAPES = ((4096, 8), (32768, 1))  # seq_len, micro-batches per rank


def write_sources(root: str) -> None:
    """Each source as one Parquet file of token lists (ids do not matter for planning)."""
    for name, (_, median, sigma, docs, seed) in SOURCES.items():
        path = os.path.join(root, name, "part-000.parquet")
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rng = np.random.default_rng(seed)
        lengths = rng.lognormal(np.log(median), sigma, size=docs).astype(np.int64)
        lengths = np.clip(lengths, 1, MAX_DOC_TOKENS)
        schema = pa.schema([("input_ids", pa.list_(pa.int32()))])
        with pq.ParquetWriter(path + ".partial", schema) as w:
            for at in range(0, docs, 256):  # a row group at a time: bounded memory
                part = lengths[at:at + 256]
                offsets = np.concatenate([[0], np.cumsum(part)]).astype(np.int32)
                values = pa.array(np.full(int(offsets[-1]), 7, dtype=np.int32))
                w.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(
                    pa.array(offsets), values)}))
        os.replace(path + ".partial", path)


def config(root: str, seq_len: int, micro_batches: int, exact: str,
           split: str = "boundary") -> "_core.Config":
    sources = [{"name": name, "path": os.path.join(root, name),
                "tokens_column": "input_ids", "weight": spec[0]}
               for name, spec in SOURCES.items()]
    text = {"seed": 5, "topology": {"dp": DP},
            "batch": {"global_tokens": DP * micro_batches * seq_len, "seq_len": seq_len},
            "balance": {"split": split}, "mix": {"exact": exact}, "sources": sources}
    return _core.parse_config(json.dumps(text), root)


def bound_prefix(end: int, seq_len: int) -> int:
    """Sum of (offset mod seq_len) over the offsets [0, end) of a document."""
    q, r = divmod(end, seq_len)
    return q * (seq_len * (seq_len - 1) // 2) + r * (r - 1) // 2


def piece_figures(start: int, length: int, seq_len: int) -> Tuple[int, int]:
    return (length * (length - 1) // 2,
            bound_prefix(start + length, seq_len) - bound_prefix(start, seq_len))


def plan(cfg, steps: int) -> Dict:
    """Plans `steps` steps; returns per source the context and bound sums, the largest
    |drift| / seq_len, the documents planned whole or in part (name -> {doc: tokens}),
    the mean imbalance and the planner's own context figures."""
    names = list(SOURCES)
    ctx = {n: 0 for n in names}
    bound = {n: 0 for n in names}
    reported_ctx = {n: 0.0 for n in names}
    drift = {n: 0.0 for n in names}
    docs: Dict[str, Dict[Tuple[int, int, int], int]] = {n: {} for n in names}
    lengths: Dict[str, Dict[Tuple[int, int, int], int]] = {n: {} for n in names}
    imbalance: List[float] = []

    def on_line(line: str) -> None:
        p = json.loads(line)
        seq_len = p["seq_len"]
        imbalance.append(p["imbalance"])
        for n in names:
            drift[n] = max(drift[n], abs(p["drift"][n]) / seq_len)
        for rank in p["ranks"]:
            for mb in rank["micro_batches"]:
                for d in mb["docs"]:
                    c, b = piece_figures(d["start"], d["len"], seq_len)
                    ctx[d["src"]] += c
                    bound[d["src"]] += b
                    key = (d["file"], d["row"], d["epoch"])
                    docs[d["src"]][key] = docs[d["src"]].get(key, 0) + d["len"]

    _core.plan_job(cfg, steps, "", on_line)
    return {"ratio": {n: ctx[n] / max(bound[n], 1) for n in names}, "drift": drift,
            "docs": docs, "imbalance": statistics.fmean(imbalance)}


def megatron(root: str, consumed: Dict[str, Dict[Tuple[int, int, int], int]],
             seq_len: int, seeds: int = 8) -> Dict[str, float]:
    """GPTDataset semantics on the documents Braid planned in full: per source, the
    documents in a seeded random order, concatenated, cut every seq_len tokens; a
    token's context is its position inside its document's part of the sample. Sums over
    `seeds` orders (the figure is an expectation over where the cuts fall)."""
    out = {}
    for n in SOURCES:
        table = pq.read_table(os.path.join(root, n, "part-000.parquet"))
        lengths = pa.compute.list_value_length(table.column("input_ids")).to_numpy()
        whole = sorted(key for key, tokens in consumed[n].items()
                       if tokens == int(lengths[key[1]]))
        ctx = bound = 0
        for seed in range(seeds):
            order = list(whole)
            random.Random(seed).shuffle(order)
            pos = 0
            for key in order:
                d = int(lengths[key[1]])
                start = 0
                while start < d:
                    take = min(seq_len - pos % seq_len, d - start)
                    c, b = piece_figures(start, take, seq_len)
                    ctx += c
                    bound += b
                    start += take
                    pos += take
        out[n] = ctx / max(bound, 1)
    return out


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join("out", "context"))
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    root = os.path.abspath(args.dir)
    write_sources(root)
    names = list(SOURCES)
    print(f"weights {' / '.join(str(SOURCES[n][0]) for n in names)}, dp={DP}, "
          f"{args.steps} steps of {DP * SHAPES[0][0] * SHAPES[0][1]} tokens; mean "
          f"context "
          f"/ bound per source (largest |drift| / seq_len), mean imbalance")
    header = f"{'':>42}" + "".join(f"{n:>16}" for n in names) + f"{'imbalance':>11}"
    print(header)
    for seq_len, mb in SHAPES:
        results = {}
        for exact in ("time", "step"):
            results[exact] = plan(config(root, seq_len, mb, exact), args.steps)
        results["aligned"] = plan(config(root, seq_len, mb, "time", "aligned"),
                                  args.steps)
        ref = megatron(root, results["time"]["docs"], seq_len)
        for label, key in (("time", "Braid, mix.exact: time"),
                           ("aligned", "Braid, time, split: aligned"),
                           ("step", "Braid, mix.exact: step")):
            r = results[label]
            cells = "".join(f"{r['ratio'][n]:>9.3f} ({r['drift'][n]:.2f})" for n in names)
            print(f"{key + f', seq_len {seq_len}':>42}{cells}{r['imbalance']:>11.4f}")
        cells = "".join(f"{ref[n]:>16.3f}" for n in names)
        print(f"{f'Megatron semantics, seq_len {seq_len}':>42}{cells}")
        ratios = {n: results["time"]["ratio"][n] / ref[n] for n in names}
        print(f"{'time / Megatron':>42}" + "".join(f"{ratios[n]:>16.3f}" for n in names))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
