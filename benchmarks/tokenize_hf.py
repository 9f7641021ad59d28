"""Hugging Face tokenization through Braid's loader vs the `tokenizers` library alone.

Braid: text rows pulled through a source loader (Parquet read, seeded shuffle, the
tokenizer.json encoded a chunk of rows at a time on `workers` threads, per-row payloads,
bounded queue), loader start included: `_core.read_source`. Baseline: the same texts,
already in memory, encoded by `Tokenizer.encode_batch` on the same number of Python
threads (the library releases the GIL inside), ids read back; the faster of one call per
thread over its share and calls of 64 texts (Braid's chunk) counts.
Target: Braid / encode_batch >= 0.9 at 1 and 2 workers. The ratio to `encode_batch_fast`
(the call Braid makes: the same ids without character offsets) is printed too.

The library's own thread pool is off by default here (TOKENIZERS_PARALLELISM=false), so
that `workers` is the number of threads encoding on both sides; `--parallelism` leaves it
on for both. Every rate is the best of --repeat runs; the tokenizer is a byte-level BPE
with a regex pre-tokenizer trained on the texts at start (no download).

    .venv/bin/python benchmarks/tokenize_hf.py \\
        [--texts 20000] [--workers 1 2] [--repeat 3] [--parallelism]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import sys
import tempfile
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq


def make_texts(n: int, seed: int):
    rng = random.Random(seed)
    letters = string.ascii_lowercase + "äöüßéèñ"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
             for _ in range(3000)] + ["東京", "データ", "数据", "🙂", "3.14", "x=y+1;"]
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(10, 300))) + "."
            for _ in range(n)]


def train_tokenizer(texts, path: str, vocab_size: int) -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers
    split = r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin|>", "<|end|>"]
    tok.train_from_iterator(texts[:5000], trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin|> $A <|end|>",
        special_tokens=[(s, tok.token_to_id(s)) for s in specials])
    tok.save(path)
    return path


def baseline(tok, texts, threads: int, method: str, chunk: int = 0):
    """Tokens and seconds of `method` over the texts on `threads` Python threads, each
    encoding its share in one call (chunk 0) or in calls of `chunk` texts."""
    share = (len(texts) + threads - 1) // threads
    counts = [0] * threads
    encode = getattr(tok, method)

    def work(t: int):
        mine = texts[t * share:(t + 1) * share]
        step = chunk or len(mine)
        for k in range(0, len(mine), step):
            counts[t] += sum(len(e.ids) for e in encode(mine[k:k + step]))

    start = time.perf_counter()
    pool = [threading.Thread(target=work, args=(t,)) for t in range(1, threads)]
    for p in pool:
        p.start()
    work(0)
    for p in pool:
        p.join()
    return sum(counts), time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=20000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--parallelism", action="store_true",
                    help="leave the library's own thread pool on (both sides)")
    args = ap.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.parallelism else "false"
    from tokenizers import Tokenizer  # after the environment is set

    from braid import _core

    texts = make_texts(args.texts, 1)
    results = []
    with tempfile.TemporaryDirectory() as root:
        tok_file = train_tokenizer(texts, os.path.join(root, "tokenizer.json"), args.vocab)
        os.makedirs(os.path.join(root, "text"))
        per = (len(texts) + 3) // 4
        for f in range(4):
            pq.write_table(pa.table({"text": texts[f * per:(f + 1) * per]}),
                           os.path.join(root, "text", f"part-{f}.parquet"),
                           row_group_size=1024)
        tok = Tokenizer.from_file(tok_file)
        for workers in args.workers:
            cfg = _core.parse_config(json.dumps({
                "seed": 1,
                "batch": {"global_tokens": 4096, "seq_len": 4096},
                "tokenizer": {"type": "huggingface", "file": tok_file},
                "sources": [{"name": "s", "path": os.path.join(root, "text"),
                             "text_column": "text", "workers": workers,
                             "shuffle_window": 4096}],
            }), "/")
            braid_rate = batch_rate = fast_rate = 0.0
            braid_tokens = batch_tokens = 0
            for _ in range(args.repeat):
                r = _core.read_source(cfg, 0, len(texts))
                braid_tokens = r["payload_tokens"]
                braid_rate = max(braid_rate, braid_tokens / r["seconds"])
                # The library's best: one call per thread, or Braid's calls of 64 texts.
                for chunk in (0, 64):
                    batch_tokens, s = baseline(tok, texts, workers, "encode_batch", chunk)
                    batch_rate = max(batch_rate, batch_tokens / s)
                    n, s = baseline(tok, texts, workers, "encode_batch_fast", chunk)
                    fast_rate = max(fast_rate, n / s)
            assert braid_tokens == batch_tokens, (braid_tokens, batch_tokens)
            results.append({
                "workers": workers,
                "texts": len(texts),
                "tokens": braid_tokens,
                "braid_tokens_per_s": round(braid_rate),
                "encode_batch_tokens_per_s": round(batch_rate),
                "encode_batch_fast_tokens_per_s": round(fast_rate),
                "ratio_vs_encode_batch": round(braid_rate / batch_rate, 3),
                "ratio_vs_encode_batch_fast": round(braid_rate / fast_rate, 3),
            })
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"parallelism": args.parallelism, "cpus": os.cpu_count(),
                      "python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
