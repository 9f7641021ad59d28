"""Source loader throughput against raw baselines measured in the same run.

(a) Token column: samples pulled through Braid's source loader (Parquet read, seeded
    shuffle, per-sample payloads, bounded queue) vs a raw Arrow scan of the same files
    (pyarrow.parquet reading the token column row group by row group). Target >= 0.85.
(b) Text column: text tokenized through the loader (Parquet read + SentencePiece on
    `workers` threads + EOS) vs raw SentencePiece encoding of the same strings, already in
    memory, on the same number of threads. Target >= 0.9.

Both sides use the same files and thread count; every rate is the best of --repeat runs.

    .venv/bin/python benchmarks/source_read.py \
        [--tokens 20000000] [--texts 200000] [--workers 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from braid import _core


def write_token_files(root: str, total_tokens: int, files: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(500), 1.0, size=total_tokens // 500 * 2), 1,
                      16384).astype(np.int64)
    lengths = lengths[np.cumsum(lengths) <= total_tokens]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 32000, size=int(offsets[-1]), dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    per = (len(lengths) + files - 1) // files
    for f in range(files):
        pq.write_table(pa.table({"input_ids": column[f * per:(f + 1) * per]}),
                       os.path.join(root, "tok", f"part-{f}.parquet"), row_group_size=1024)
    return len(lengths)


def make_texts(n: int, seed: int):
    rng = random.Random(seed)
    vocab = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
             for _ in range(3000)]
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(10, 300))) + "."
            for _ in range(n)]


def config(path: str, column_key: str, column: str, workers: int, model: str = ""):
    c = {
        "seed": 1,
        "batch": {"global_tokens": 4096, "seq_len": 4096},
        "sources": [{"name": "s", "path": path, column_key: column, "workers": workers,
                     "shuffle_window": 4096}],
    }
    if model:
        c["tokenizer"] = {"type": "sentencepiece", "model": model, "eos": True}
    return _core.parse_config(json.dumps(c), "/")


def arrow_scan(paths, column: str, threads: bool) -> tuple:
    start = time.perf_counter()
    tokens = 0
    for p in paths:
        f = pq.ParquetFile(p)
        for rg in range(f.num_row_groups):
            t = f.read_row_group(rg, columns=[column], use_threads=threads)
            tokens += len(t.column(0).combine_chunks().values)
    return tokens, time.perf_counter() - start


def best(fn, repeat: int):
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r[1])



def compare(title: str, baseline: str, raw, braid, workers: int, target: float) -> None:
    """Prints both rates of (tokens, seconds) pairs over the same tokens and their ratio."""
    (raw_tok, raw_s), (br_tok, br_s) = raw, braid
    assert raw_tok == br_tok, (raw_tok, br_tok)
    print(f"{title}, {raw_tok / 1e6:.1f}M tokens, workers={workers}")
    print(f"    {baseline:<18}{raw_tok / raw_s / 1e6:8.2f} M tokens/s")
    print(f"    {'Braid loader':<18}{br_tok / br_s / 1e6:8.2f} M tokens/s")
    print(f"    {'ratio':<18}{(br_tok / br_s) / (raw_tok / raw_s):8.3f}   "
          f"(target >= {target})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--texts", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="braid-bench-") as root:
        os.makedirs(os.path.join(root, "tok"))
        os.makedirs(os.path.join(root, "text"))
        # (a) token column.
        rows = write_token_files(root, args.tokens, args.files, seed=7)
        tok_dir = os.path.join(root, "tok")
        paths = sorted(os.path.join(tok_dir, p) for p in os.listdir(tok_dir))
        cfg = config(os.path.join(root, "tok"), "tokens_column", "input_ids", args.workers)

        def braid_tokens():
            r = _core.read_source(cfg, 0, rows)
            assert r["samples"] == rows
            return r["payload_tokens"], r["seconds"]

        # One thread for workers=1; with more, Arrow may use its CPU pool too.
        raw_tok, raw_s = best(lambda: arrow_scan(paths, "input_ids", args.workers > 1),
                              args.repeat)
        br_tok, br_s = best(braid_tokens, args.repeat)
        compare(f"(a) token column, {rows} docs", "raw Arrow scan", (raw_tok, raw_s),
                (br_tok, br_s), args.workers, target=0.85)

        # (b) text column.
        texts = make_texts(args.texts, seed=3)
        model = _core.train_tiny_sentencepiece(texts[:20000], os.path.join(root, "spm"), 2000)
        per = (len(texts) + args.files - 1) // args.files
        for f in range(args.files):
            pq.write_table(pa.table({"text": texts[f * per:(f + 1) * per]}),
                           os.path.join(root, "text", f"part-{f}.parquet"),
                           row_group_size=1024)
        tcfg = config(os.path.join(root, "text"), "text_column", "text", args.workers, model)

        def braid_text():
            r = _core.read_source(tcfg, 0, len(texts))
            assert r["samples"] == len(texts) and r["skipped"] == 0
            return r["payload_tokens"] - len(texts), r["seconds"]  # less the EOS ids

        def raw_text():
            r = _core.sentencepiece_encode(model, texts, args.workers)
            return r["tokens"], r["seconds"]

        raw_tok, raw_s = best(raw_text, args.repeat)
        br_tok, br_s = best(braid_text, args.repeat)
        compare(f"(b) text column, {len(texts)} docs", "raw SentencePiece",
                (raw_tok, raw_s), (br_tok, br_s), args.workers, target=0.9)


if __name__ == "__main__":
    main()
