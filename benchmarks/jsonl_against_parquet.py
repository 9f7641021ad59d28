"""JSON Lines sources that need more than a field read, against the same rows in Parquet,
through Braid's loader (one worker, each read in a fresh process, alternated):

- images: caption records (.jsonl.gz) whose `image` field names a JPEG file under an
  image folder, against a Parquet binary column holding the same JPEG bytes;
- transform: SFT records (.jsonl.gz: instruction, output, a metadata object) through a
  Python transform, against the same records in Parquet through the same function.

Each pair is laid out alike (one file per unit, windows large enough to hold a file), so
both read the same samples in the same order (checked: the same samples and tokens).
Prints each rate and the ratio JSON Lines / Parquet (what moving a corpus to Parquet
first would gain).

    .venv/bin/python benchmarks/jsonl_against_parquet.py [--images 240]
        [--records 12000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import statistics
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness.format_reads import read_in_fresh_process

TRANSFORM = '''
import zlib
def ids(instruction, output, meta):
    assert isinstance(meta, dict)
    text = "### instruction: " + instruction + " ### answer: " + output
    return [zlib.crc32(w.encode()) % 30000 + 10 for w in text.split()]
'''
WORDS = ("the model should answer every question with care and cite its sources when "
         "asked a photo of a dog on grass near a river").split()


def write_halves(root: str, name: str, rows: list, parquet_column_types) -> None:
    """`rows` as two .jsonl.gz files under root/name and two Parquet files under
    root/name_pq (the columns `parquet_column_types` names, with those types)."""
    os.makedirs(os.path.join(root, name))
    os.makedirs(os.path.join(root, name + "_pq"))
    half = len(rows) // 2
    for part, chunk in (("a", rows[:half]), ("b", rows[half:])):
        with gzip.open(os.path.join(root, name, f"{part}.jsonl.gz"), "wt") as f:
            for r in chunk:
                f.write(json.dumps(r["json"]) + "\n")
        table = pa.table({c: pa.array([r["parquet"][c] for r in chunk], t)
                          for c, t in parquet_column_types.items()})
        pq.write_table(table, os.path.join(root, name + "_pq", f"{part}.parquet"))


def image_rows(root: str, n: int, rng) -> list:
    from PIL import Image

    folder = os.path.join(root, "images")
    os.makedirs(folder)
    rows = []
    for i in range(n):
        w, h = int(rng.integers(384, 769)), int(rng.integers(384, 769))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * (i % 7 + 1)) % 256, (y * (i % 5 + 1)) % 256,
                         ((x + y) // 3) % 256], -1)
        noise = rng.normal(0, 25, size=(h, w, 3))
        pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG", quality=90)
        with open(os.path.join(folder, f"{i:05d}.jpg"), "wb") as f:
            f.write(out.getvalue())
        caption = " ".join(rng.choice(WORDS, size=int(rng.integers(8, 30))))
        rows.append({"json": {"id": i, "image": f"{i:05d}.jpg", "caption": caption,
                              "meta": {"source": "bench"}},
                     "parquet": {"image": out.getvalue(), "caption": caption}})
    return rows


def sft_rows(n: int, rng) -> list:
    rows = []
    for r in range(n):
        rec = {"instruction": " ".join(rng.choice(WORDS, size=int(rng.integers(5, 60)))),
               "output": " ".join(rng.choice(WORDS, size=int(rng.integers(50, 1500)))),
               "meta": {"lang": "en", "score": float(rng.random())}}
        rows.append({"json": {"id": r, **rec}, "parquet": rec})
    return rows


def tokenizer_model(root: str) -> str:
    from braid import _core

    texts = [" ".join(WORDS)] * 200
    return _core.train_tiny_sentencepiece(texts, os.path.join(root, "spm"), 40)


def compare(title: str, configs: dict, rows: int, repeat: int, env=None) -> None:
    runs = {name: [] for name in configs}
    for _ in range(repeat):
        for name, cfg in configs.items():
            runs[name].append(read_in_fresh_process(cfg, rows, env=env))
    first = {name: r[0] for name, r in runs.items()}
    samples = {(r["samples"], r["payload_tokens"]) for r in first.values()}
    assert len(samples) == 1, f"the two reads differ: {first}"
    samples_n, tokens = samples.pop()
    best = {name: min(r["seconds"] for r in rs) for name, rs in runs.items()}
    jsonl, parquet = configs
    rounds = [p["seconds"] / j["seconds"] for j, p in zip(runs[jsonl], runs[parquet])]
    print(f"{title}: {samples_n:,} samples, {tokens / 1e6:.2f}M tokens, one worker")
    for name in configs:
        print(f"    {name:<28}{tokens / best[name] / 1e6:8.2f} M tokens/s")
    print(f"    ratio JSON Lines / Parquet   {best[parquet] / best[jsonl]:6.3f}   "
          f"(median of rounds {statistics.median(rounds):.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=240)
    ap.add_argument("--records", type=int, default=12_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory(prefix="braid-jsonl-pq-") as root:
        write_halves(root, "captions", image_rows(root, args.images, rng),
                     {"image": pa.binary(), "caption": pa.string()})
        model = tokenizer_model(root)
        source = {"image_column": "image", "text_column": "caption", "workers": 1,
                  "shuffle_window_bytes": 1 << 40,
                  "image": {"patch_size": 14, "image_token_id": 3}}
        configs = {}
        for name, extra in (("JSON Lines, image paths", {"folder": f"{root}/images"}),
                            ("Parquet, image bytes", {})):
            path = f"{root}/captions" + ("" if extra else "_pq")
            configs[name] = {
                "seed": 1, "batch": {"global_tokens": 65536, "seq_len": 16384},
                "tokenizer": {"type": "sentencepiece", "model": model},
                "sources": [{"name": "s", "path": path, **source,
                             "image": {**source["image"], **extra}}]}
        compare("captions with images", configs, args.images, args.repeat)

        write_halves(root, "sft", sft_rows(args.records, rng),
                     {"instruction": pa.string(), "output": pa.string(),
                      "meta": pa.struct([("lang", pa.string()),
                                         ("score", pa.float64())])})
        with open(os.path.join(root, "bench_sft.py"), "w") as f:
            f.write(TRANSFORM)
        transform = {"python": "bench_sft:ids",
                     "columns": ["instruction", "output", "meta"]}
        configs = {
            name: {"seed": 1, "batch": {"global_tokens": 65536, "seq_len": 8192},
                   "sources": [{"name": "s", "path": f"{root}/{folder}", "workers": 1,
                                "shuffle_window_bytes": 1 << 40, "transform": transform}]}
            for name, folder in (("JSON Lines, Python transform", "sft"),
                                 ("Parquet, Python transform", "sft_pq"))}
        env = {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        compare("SFT records", configs, args.records // 2 * 2, args.repeat, env=env)


if __name__ == "__main__":
    main()
