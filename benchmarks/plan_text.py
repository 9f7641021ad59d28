"""What planning costs on a source that Braid tokenizes, against a pre-tokenized copy.

Planning needs each row's token count. For a text source the metadata-only pass (what
`braid plan` and the Ray runtime's planner read) has no count but the encode itself, so
it tokenizes every row; a pre-tokenized copy of the same rows gives the counts from the
token column's Parquet levels, or from a length column alone (docs/sources.md). This
prints, on the same texts and the same Hugging Face tokenizer (byte-level BPE with a
regex pre-tokenizer, trained at start; no download), the time of:

  plan (text)        metadata only over the text source: one full encode
  run (text)         payloads over the text source: the same encode, plus the payloads
  plan (tokens)      metadata only over the pre-tokenized copy (Parquet levels)
  plan (length)      the same with a length column
  plan (cache, cold) metadata only over the text source with `runtime.length_cache` on
                     an empty folder: the encode, plus keeping every row group's counts
  plan (cache, warm) the same once the folder holds them: no encode (the next
                     `braid plan`, or a restarted Ray planner, on the same files)

Best of --repeat runs each, through `_core.read_source` on one source with --workers.

    .venv/bin/python benchmarks/plan_text.py [--rows 20000] [--workers 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import string

import pyarrow as pa
import pyarrow.parquet as pq

from braid import _core


def make_texts(n: int, seed: int):
    rng = random.Random(seed)
    letters = string.ascii_lowercase + "äöüßéèñ"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
             for _ in range(3000)]
    return [" ".join(rng.choice(vocab) for _ in range(int(rng.lognormvariate(4.5, 0.8))))
            for _ in range(n)]


def train(path: str, texts) -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+"),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts[:5000], trainers.BpeTrainer(
        vocab_size=8000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.save(path)
    return path


def config(source: dict, tokenizer: str, workers: int, length_cache: str = ""):
    c = {"seed": 1, "batch": {"global_tokens": 4096, "seq_len": 4096},
         "tokenizer": {"type": "huggingface", "file": tokenizer,
                       "add_special_tokens": False},
         "sources": [dict({"name": "s", "workers": workers}, **source)]}
    if length_cache:
        c["runtime"] = {"length_cache": length_cache}
    return _core.parse_config(json.dumps(c), "/")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="out/plan_text")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer

    os.makedirs(args.dir, exist_ok=True)
    texts = make_texts(args.rows, 3)
    tok_path = train(os.path.abspath(os.path.join(args.dir, "tokenizer.json")), texts)
    ids = [e.ids for e in Tokenizer.from_file(tok_path).encode_batch(
        texts, add_special_tokens=False)]
    text_dir = os.path.abspath(os.path.join(args.dir, "text"))
    tok_dir = os.path.abspath(os.path.join(args.dir, "tokens"))
    os.makedirs(text_dir, exist_ok=True)
    os.makedirs(tok_dir, exist_ok=True)
    per = -(-args.rows // args.files)
    for f in range(args.files):
        part = slice(f * per, (f + 1) * per)
        pq.write_table(pa.table({"text": texts[part]}),
                       os.path.join(text_dir, f"part-{f}.parquet"), row_group_size=1024)
        pq.write_table(pa.table({"input_ids": pa.array(ids[part], pa.list_(pa.int32())),
                                 "n_tokens": [len(x) for x in ids[part]]}),
                       os.path.join(tok_dir, f"part-{f}.parquet"), row_group_size=1024)
    total = sum(len(x) for x in ids)
    text = {"path": text_dir, "text_column": "text"}
    cache = os.path.abspath(os.path.join(args.dir, "lens"))
    cases = [
        ("plan (text)", text, False, ""),
        ("run (text)", text, True, ""),
        ("plan (tokens)", {"path": tok_dir, "tokens_column": "input_ids"}, False, ""),
        ("plan (length)", {"path": tok_dir, "tokens_column": "input_ids",
                           "length_column": "n_tokens"}, False, ""),
        ("plan (cache, cold)", text, False, "cold"),
        ("plan (cache, warm)", text, False, "warm"),
    ]
    print(f"{args.rows} rows, {total:,} tokens, {args.files} files, "
          f"workers={args.workers}, best of {args.repeat}")
    seconds = {}
    for name, source, payloads, cached in cases:
        cfg = config(source, tok_path, args.workers, cache if cached else "")
        runs = []
        for _ in range(args.repeat):
            if cached == "cold" or (cached == "warm" and not os.path.isdir(cache)):
                shutil.rmtree(cache, ignore_errors=True)
                if cached == "warm":  # a first pass keeps the counts
                    _core.read_source(cfg, 0, args.rows, payloads)
            r = _core.read_source(cfg, 0, args.rows, payloads)
            assert r["samples"] == args.rows and r["tokens"] == total, (name, r)
            runs.append(r["seconds"])
        seconds[name] = min(runs)
        print(f"  {name:<15}{1e3 * seconds[name]:9.1f} ms {total / seconds[name] / 1e6:8.2f} "
              f"M tokens/s")
    out = {"rows": args.rows, "tokens": total, "workers": args.workers,
           "seconds": seconds,
           "plan_text_over_run_text": seconds["plan (text)"] / seconds["run (text)"],
           "plan_length_over_plan_text": seconds["plan (length)"] / seconds["plan (text)"],
           "cold_cache_over_plan_text":
               seconds["plan (cache, cold)"] / seconds["plan (text)"],
           "warm_cache_over_plan_text":
               seconds["plan (cache, warm)"] / seconds["plan (text)"]}
    print(f"plan (text) / run (text): {out['plan_text_over_run_text']:.2f}; "
          f"plan (length) / plan (text): {out['plan_length_over_plan_text']:.4f}; "
          f"cache cold / plan (text): {out['cold_cache_over_plan_text']:.2f}; "
          f"cache warm / plan (text): {out['warm_cache_over_plan_text']:.4f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
