"""Python transforms through Braid's loader vs a plain Python loop over the same rows.

Braid: the rows of a text column pulled through a source loader (Parquet read, seeded
shuffle, the rows converted to Python strings and passed to the function on the loader's
pool threads, its ids read back into per-row payloads), loader start included:
`_core.read_source` with `transform: {python: ...}`, called once per row, and with
`batched: true`, called once per chunk of rows (a function that maps the same per-row
function over the list). Two plain loops call the same per-row function on every row and
count the ids:

  file    reads the same Parquet file with pyarrow (`iter_batches`, `to_pylist`) as it
          goes: the plain-Python pipeline over the same data, which, like Braid, pays for
          turning the rows into Python strings;
  memory  over the rows already in memory as Python strings (read and converted before
          the clock starts): the function calls alone, the strictest baseline.

A third pair of Braid runs, `index`, reads an integer column `i` and calls
`encode(rows[i])` on the memory loop's strings: no text is decoded, so against the memory
loop it measures the cost of the calls alone (the thread states, GIL holds, conversions).

Printed, per worker count: rows/s of each, and the ratios per-row / loop (target >= 0.8)
and batched / loop (target >= 0.9) against both loops, each rate the best of --repeat
runs, all measured in the same run, interleaved; and the same ratios by CPU time of the
process (loop's / Braid's, every thread counted), which a busy machine disturbs less. Functions (--function):

  words  a word-level tokenizer in pure Python (lower-case, split, a dict lookup per
         word): the kind of preprocessing a team writes in Python (default);
  bytes  the UTF-8 bytes of the text as ids, `list(text.encode())`: little but the
         call, the worst case for any caller.

The texts (about 1.2 KB each) are multilingual (accented Latin, CJK) unless --ascii:
decoding them to Python strings costs several times what ASCII does, a cost the `memory`
loop does not pay.

    .venv/bin/python benchmarks/python_transform.py \\
        [--rows 20000] [--workers 1 2] [--repeat 5] [--function words] [--ascii]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import string
import sys
import tempfile
import time
from typing import Callable, Dict, List

import pyarrow as pa
import pyarrow.parquet as pq


def make_texts(n: int, seed: int, ascii: bool = False) -> List[str]:
    rng = random.Random(seed)
    letters = string.ascii_lowercase + ("" if ascii else "äöüßéèñ")
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
             for _ in range(5000)] + ["3.14", "x=y+1;"]
    if not ascii:
        vocab += ["東京", "データ", "数据"]
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


def cpu_seconds() -> float:
    """CPU time of the process so far, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def memory_loop(fn: Callable[[str], List[int]], texts: List[str]):
    """Ids and seconds of a plain loop calling fn on every text."""
    start = time.perf_counter()
    tokens = 0
    for text in texts:
        tokens += len(fn(text))
    return tokens, time.perf_counter() - start


def file_loop(fn: Callable[[str], List[int]], path: str):
    """Ids and seconds of a plain loop calling fn on every text of the file as read."""
    start = time.perf_counter()
    tokens = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=["text"]):
        for text in batch.column(0).to_pylist():
            tokens += len(fn(text))
    return tokens, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--function", choices=["words", "bytes"], default="words")
    ap.add_argument("--ascii", action="store_true", help="ASCII texts only")
    args = ap.parse_args()

    import braid
    from braid import _core

    texts = make_texts(args.rows, 1, args.ascii)
    encode = make_functions(texts, args.function)
    braid.register_transform("bench_encode", encode)
    braid.register_transform("bench_encode_batch", lambda ts: [encode(t) for t in ts])
    rows: List[str] = []  # the memory loop's input, filled below
    braid.register_transform("bench_index", lambda i: encode(rows[i]))
    braid.register_transform("bench_index_batch", lambda ids: [encode(rows[i]) for i in ids])
    results = []
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "text.parquet")
        pq.write_table(pa.table({"text": texts, "i": list(range(len(texts)))}), path,
                       row_group_size=1024)
        rows.extend(pq.read_table(path).column("text").to_pylist())
        expected, _ = memory_loop(encode, rows)

        def config(workers: int, batched: bool, index: bool = False):
            spec = ("bench_index" if index else "bench_encode") + (
                "_batch" if batched else "")
            return _core.parse_config(json.dumps({
                "seed": 1,
                "batch": {"global_tokens": 4096, "seq_len": 4096},
                "sources": [{"name": "s", "path": path, "workers": workers,
                             "shuffle_window": 4096,
                             "transform": {"python": spec,
                                           "columns": ["i" if index else "text"],
                                           "batched": batched}}],
            }), "/")

        for workers in args.workers:
            braid_runs = (("per_row", config(workers, False)),
                          ("batched", config(workers, True)),
                          ("index_per_row", config(workers, False, index=True)),
                          ("index_batched", config(workers, True, index=True)))
            best = {"memory": 0.0, "file": 0.0}
            best.update({name: 0.0 for name, _ in braid_runs})
            cpu = {k: float("inf") for k in best}  # CPU seconds, every thread
            for _ in range(args.repeat):  # interleaved, so that load drifts hit them all
                for name, run in (("memory", lambda: memory_loop(encode, rows)),
                                  ("file", lambda: file_loop(encode, path))):
                    c = cpu_seconds()
                    tokens, s = run()
                    cpu[name] = min(cpu[name], cpu_seconds() - c)
                    if tokens != expected:
                        raise SystemExit(f"{name} loop: {tokens} ids, not {expected}")
                    best[name] = max(best[name], len(rows) / s)
                for name, cfg in braid_runs:
                    c = cpu_seconds()
                    r = _core.read_source(cfg, 0, len(rows))
                    cpu[name] = min(cpu[name], cpu_seconds() - c)
                    if r["payload_tokens"] != expected or r["samples"] != len(rows):
                        raise SystemExit(f"wrong output: {r} (expected {expected} ids)")
                    best[name] = max(best[name], len(rows) / r["seconds"])
            result = {"workers": workers, "function": args.function, "rows": len(rows),
                      "ascii": args.ascii}
            result.update({f"{k}_rows_per_s": round(v) for k, v in best.items()})
            pairs = [(form, loop) for form in ("per_row", "batched")
                     for loop in ("file", "memory")]
            pairs += [("index_per_row", "memory"), ("index_batched", "memory")]
            for form, loop in pairs:
                result[f"{form}_vs_{loop}_loop"] = round(best[form] / best[loop], 3)
            # The same ratios by CPU time (loop's / Braid's), which a busy machine
            # disturbs less than wall time.
            for form, loop in pairs:
                result[f"cpu_{form}_vs_{loop}_loop"] = round(cpu[loop] / cpu[form], 3)
            results.append(result)
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"targets": {"per_row_vs_loop": 0.8, "batched_vs_loop": 0.9},
                      "load_average": round(os.getloadavg()[0], 1),
                      "python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
