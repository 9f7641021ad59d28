"""Python transforms through Braid's loader vs a plain Python loop over the same rows.

Braid: the rows of a text column pulled through a source loader (Parquet read, seeded
shuffle, the function called on the loader's pool threads, its ids read back into per-row
payloads), loader start included: `_core.read_source` with `transform: {python: ...}`,
called once per row, and with `batched: true`, called once per chunk of rows (a function
that maps the same per-row function over the list). Baseline: the same rows, already in
memory as Python strings (read and converted before the clock starts), passed one by one
to the same per-row function in a plain `for` loop that counts the ids.

Printed, per worker count: rows/s of each, and the ratios per-row / loop (target >= 0.8)
and batched / loop (target >= 0.9), each rate the best of --repeat runs, measured in the
same run. Functions (--function):

  words  a word-level tokenizer in pure Python (lower-case, split, a dict lookup per
         word): the kind of preprocessing a team writes in Python (default);
  bytes  the UTF-8 bytes of the text as ids, `list(text.encode())`: almost nothing but
         the call, the worst case for any caller.

    PYTHONPATH=build/<dir>/stage .venv/bin/python benchmarks/python_transform.py \\
        [--rows 20000] [--workers 1 2] [--repeat 5] [--function words]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import sys
import tempfile
import time
from typing import Callable, Dict, List

import pyarrow as pa
import pyarrow.parquet as pq


def make_texts(n: int, seed: int) -> List[str]:
    rng = random.Random(seed)
    letters = string.ascii_lowercase + "äöüßéèñ"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
             for _ in range(5000)] + ["東京", "データ", "数据", "3.14", "x=y+1;"]
    return [" ".join(rng.choice(vocab).capitalize() if rng.random() < 0.1
                     else rng.choice(vocab) for _ in range(rng.randint(20, 300))) + "."
            for _ in range(n)]


def make_functions(texts: List[str], which: str) -> Callable[[str], List[int]]:
    if which == "bytes":
        def encode(text: str) -> List[int]:
            return list(text.encode())
        return encode
    words = sorted({w for t in texts[:2000] for w in t.lower().split()})
    vocab: Dict[str, int] = {w: i + 1 for i, w in enumerate(words)}  # 0: unknown

    def encode(text: str) -> List[int]:
        return [vocab.get(w, 0) for w in text.lower().split()]
    return encode


def plain_loop(fn: Callable[[str], List[int]], texts: List[str]):
    """Ids and seconds of a plain loop calling fn on every text."""
    start = time.perf_counter()
    tokens = 0
    for text in texts:
        tokens += len(fn(text))
    return tokens, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--function", choices=["words", "bytes"], default="words")
    args = ap.parse_args()

    import braid
    from braid import _core

    texts = make_texts(args.rows, 1)
    encode = make_functions(texts, args.function)
    braid.register_transform("bench_encode", encode)
    braid.register_transform("bench_encode_batch", lambda ts: [encode(t) for t in ts])
    results = []
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "text.parquet")
        pq.write_table(pa.table({"text": texts}), path, row_group_size=1024)
        rows = pq.read_table(path).column("text").to_pylist()  # the loop's input
        expected, _ = plain_loop(encode, rows)

        def config(workers: int, batched: bool):
            spec = "bench_encode_batch" if batched else "bench_encode"
            return _core.parse_config(json.dumps({
                "seed": 1,
                "batch": {"global_tokens": 4096, "seq_len": 4096},
                "sources": [{"name": "s", "path": path, "workers": workers,
                             "shuffle_window": 4096,
                             "transform": {"python": spec, "columns": ["text"],
                                           "batched": batched}}],
            }), "/")

        for workers in args.workers:
            per_row, batched = config(workers, False), config(workers, True)
            loop_rate = row_rate = batch_rate = 0.0
            for _ in range(args.repeat):  # interleaved, so that load drifts hit all three
                tokens, s = plain_loop(encode, rows)
                loop_rate = max(loop_rate, len(rows) / s)
                for cfg, is_batched in ((per_row, False), (batched, True)):
                    r = _core.read_source(cfg, 0, len(rows))
                    if r["payload_tokens"] != expected or r["samples"] != len(rows):
                        raise SystemExit(f"wrong output: {r} (expected {expected} ids)")
                    rate = len(rows) / r["seconds"]
                    if is_batched:
                        batch_rate = max(batch_rate, rate)
                    else:
                        row_rate = max(row_rate, rate)
            results.append({
                "workers": workers, "function": args.function, "rows": len(rows),
                "loop_rows_per_s": round(loop_rate),
                "per_row_rows_per_s": round(row_rate),
                "batched_rows_per_s": round(batch_rate),
                "per_row_vs_loop": round(row_rate / loop_rate, 3),
                "batched_vs_loop": round(batch_rate / loop_rate, 3),
            })
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"targets": {"per_row_vs_loop": 0.8, "batched_vs_loop": 0.9},
                      "python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
