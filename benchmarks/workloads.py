"""The benchmark workloads (issue 12): data generators and Braid configs for four mixes.

  longtail     16 pre-tokenized sources with Zipf weights and document lengths from a few
               hundred to tens of thousands of tokens (a long tail past seq_len)
  curriculum   code (short documents) and text (long ones), the code share rising
               linearly from 0.1 to 0.5 over the first --schedule-steps steps
  phases       long/short context: seq_len 2048 for the first --schedule-steps steps, then
               8192 (global_tokens constant, so micro-batches per rank change)
  heavy_vlm    text plus an image-caption source (PNG images of many sizes, captions
               tokenized with a SentencePiece model trained here): the vision cost term
  hetero       a mix whose sources cost orders of magnitude apart (not one of end_to_end.py's
               four): two pre-tokenized sources and long raw-text books tokenized in the
               loader (>= 20x the CPU per sample), the books' weight rising from 0.1 to
               0.5 over --schedule-steps: what runtime.autoscale sizes threads for
  heavy_vlm_photo
               the heavy mix at real image cost (not one of end_to_end.py's four):
               photographic-like JPEGs of 512-1,024 px a side, decoded and resized to
               the patch grid, beside pre-tokenized text; the image weight rises from
               0.05 to 0.2 over --schedule-steps

Each is written under --dir/NAME (data reused when present) with NAME.json, a config any
`braid run`, `braid plan` or `braid.Loader` takes. Sizes scale with --tokens (per source).

    .venv/bin/python benchmarks/workloads.py [NAME ...] [--dir out/workloads]
        [--tokens 2000000] [--dp 8] [--schedule-steps 200]
    .venv/bin/braid run out/workloads/longtail/longtail.json --steps 50
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import random
import sys
from typing import Callable, Dict, List

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))


def _write_file():
    # many_sources.py's writer, loaded by path (this folder is not a package).
    spec = importlib.util.spec_from_file_location("braid_bench_many_sources",
                                                  os.path.join(HERE, "many_sources.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_file


def _tokens_source(root: str, name: str, tokens: int, median: float, seed: int,
                   weight) -> dict:
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "part-000.parquet")
    if not os.path.exists(path):
        _write_file()(path, tokens, "small", 64, seed, mean_log=float(np.log(median)),
                      sigma=1.0)
    return {"name": name, "path": folder, "tokens_column": "input_ids", "weight": weight}


def _batch(dp: int, seq_len: int, micro_batches: int) -> dict:
    return {"global_tokens": dp * micro_batches * seq_len, "seq_len": seq_len,
            "micro_batch_size": 1}


def longtail(root: str, args) -> dict:
    medians = np.geomspace(300, 30000, 16)
    sources = [_tokens_source(root, f"s{k:02d}", args.tokens, float(medians[k]), 100 + k,
                              round(1.0 / (k + 1), 4))
               for k in range(16)]
    return {"seed": 1, "topology": {"dp": args.dp}, "batch": _batch(args.dp, 4096, 4),
            "sources": sources}


def curriculum(root: str, args) -> dict:
    end = args.schedule_steps
    code = _tokens_source(root, "code", args.tokens, 800, 201,
                          {"schedule": [[0, 0.1], [end, 0.5]]})
    text = _tokens_source(root, "text", args.tokens, 6000, 202,
                          {"schedule": [[0, 0.9], [end, 0.5]]})
    return {"seed": 2, "topology": {"dp": args.dp}, "batch": _batch(args.dp, 4096, 4),
            "sources": [code, text]}


def phases(root: str, args) -> dict:
    web = _tokens_source(root, "web", args.tokens, 1500, 301, 0.7)
    books = _tokens_source(root, "books", args.tokens, 40000, 302, 0.3)
    # 16 micro-batches of 2048 per rank in the short phase, 4 of 8192 after it.
    return {"seed": 3, "topology": {"dp": args.dp}, "batch": _batch(args.dp, 8192, 4),
            "phases": [{"until_step": args.schedule_steps, "seq_len": 2048,
                        "weights": {"books": 0.1}}],
            "sources": [web, books]}


def _png(rng: random.Random) -> bytes:
    from PIL import Image, ImageDraw

    w, h = rng.randint(28, 448), rng.randint(28, 448)
    img = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        x, y = rng.randrange(w), rng.randrange(h)
        draw.rectangle([x, y, min(w - 1, x + 30), min(h - 1, y + 20)],
                       fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def _captions(root: str, rng: random.Random) -> tuple:
    """400 captions and a SentencePiece model trained on them (once) under `root`."""
    from braid import _core

    words = ("a photo of the loader planner constructor with arrows boxes colours and "
             "many small parts on a table").split()
    captions = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) + "."
                for _ in range(400)]
    model = os.path.join(root, "tok.model")
    if not os.path.exists(model):
        _core.train_tiny_sentencepiece(captions, os.path.join(root, "tok"), 200)
    return captions, model


def heavy_vlm(root: str, args) -> dict:
    rng = random.Random(7)
    captions, model = _captions(root, rng)
    images_dir = os.path.join(root, "captions")
    os.makedirs(images_dir, exist_ok=True)
    path = os.path.join(images_dir, "part-000.parquet")
    if not os.path.exists(path):
        rows = max(50, args.tokens // 2000)  # ~2K vision + caption tokens a row
        images = [[_png(rng) for _ in range(2 if rng.random() < 0.15 else 1)]
                  for _ in range(rows)]
        pq.write_table(pa.table({"image": pa.array(images, pa.list_(pa.binary())),
                                 "caption": [rng.choice(captions) for _ in images]}),
                       path, row_group_size=64)
    text = _tokens_source(root, "text", args.tokens, 3000, 401, 0.5)
    return {"seed": 4, "topology": {"dp": args.dp}, "batch": _batch(args.dp, 8192, 2),
            "balance": {"cost": {"attn": 1.0, "linear": 8192, "vision": 32}},
            "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
            "sources": [text, {"name": "captions", "path": images_dir, "weight": 0.5,
                               "image_column": "image", "text_column": "caption",
                               "oversize": "skip",
                               "image": {"patch_size": 14, "image_token_id": 200}}]}


def photo_jpeg(rng: np.random.Generator, quality: int = 90) -> bytes:
    """A photographic-like JPEG of 512-1,024 pixels a side: a smooth colour field (a
    coarse random grid upsampled bicubically), soft-edged shapes and sensor-like noise,
    so that it compresses (and decodes) like a photo rather than a flat drawing."""
    from PIL import Image, ImageDraw, ImageFilter

    w, h = (int(v) for v in rng.integers(512, 1025, size=2))
    coarse = rng.integers(0, 256, size=(int(rng.integers(3, 7)), int(rng.integers(3, 7)), 3),
                          dtype=np.uint8)
    img = Image.fromarray(coarse, "RGB").resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 12))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(20, w // 2)), y0 + int(rng.integers(20, h // 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        if rng.random() < 0.5:
            draw.ellipse([x0, y0, x1, y1], fill=colour)
        else:
            draw.rectangle([x0, y0, x1, y1], fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(1.0, 3.0))))
    pixels = np.asarray(img, dtype=np.int16)
    pixels = pixels + rng.normal(0.0, 6.0, size=pixels.shape).astype(np.int16)
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def heavy_vlm_photo(root: str, args) -> dict:
    """The heavy mix at the cost of real images (issue 21): one JPEG of 512-1,024 px per
    row (scaled to max_pixels 262,144 and cut into 14-px patches: up to 1,369 image
    tokens), a caption, beside pre-tokenized text; the image source's token weight
    rises from 0.05 to 0.2 over --schedule-steps. The vision term prices an image token
    at a tenth of a language token's linear cost (a vision tower a tenth of the language
    model per token)."""
    rng = random.Random(8)
    captions, model = _captions(root, rng)
    images_dir = os.path.join(root, "photos")
    os.makedirs(images_dir, exist_ok=True)
    path = os.path.join(images_dir, "part-000.parquet")
    if not os.path.exists(path):
        rows = max(100, args.tokens // 5000)
        gen = np.random.default_rng(21)
        writer = None
        for start in range(0, rows, 32):
            chunk = range(start, min(rows, start + 32))
            table = pa.table({
                "image": pa.array([[photo_jpeg(gen)] for _ in chunk],
                                  pa.list_(pa.binary())),
                "caption": [rng.choice(captions) for _ in chunk]})
            if writer is None:
                writer = pq.ParquetWriter(path + ".tmp", table.schema)
            writer.write_table(table, row_group_size=32)
        writer.close()
        os.replace(path + ".tmp", path)
    end = args.schedule_steps
    text = _tokens_source(root, "text", args.tokens, 3000, 411,
                          {"schedule": [[0, 0.95], [end, 0.8]]})
    linear = 8192
    return {"seed": 5, "topology": {"dp": args.dp}, "batch": _batch(args.dp, 8192, 2),
            "balance": {"cost": {"attn": 1.0, "linear": linear, "vision": linear // 10}},
            "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
            "sources": [text, {"name": "photos", "path": images_dir,
                               "weight": {"schedule": [[0, 0.05], [end, 0.2]]},
                               "image_column": "image", "text_column": "caption",
                               "oversize": "skip",
                               "image": {"patch_size": 14, "max_pixels": 262144,
                                         "image_token_id": 200}}]}


def hetero(root: str, args) -> dict:
    """Cheap and costly sources side by side (issue 21): `web` and `code` are token lists
    (microseconds a sample), `books` raw text of 2,000-40,000 characters that the loader
    tokenizes with a SentencePiece model trained here (milliseconds a sample); the books'
    weight rises from 0.1 to 0.5 over --schedule-steps."""
    from braid import _core

    rng = random.Random(12)
    words = [''.join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(3000)]
    folder = os.path.join(root, "books")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "part-000.parquet")
    model = os.path.join(root, "tok.model")
    if not os.path.exists(path):
        chars = 0
        texts = []
        while chars < args.tokens * 4:
            n = int(min(40_000, max(2_000, rng.lognormvariate(np.log(9_000), 0.8))))
            text = []
            size = 0
            while size < n:
                w = rng.choice(words)
                text.append(w)
                size += len(w) + 1
            texts.append(" ".join(text) + ".")
            chars += size
        if not os.path.exists(model):
            _core.train_tiny_sentencepiece(texts[:200], os.path.join(root, "tok"), 2000)
        pq.write_table(pa.table({"text": texts}), path + ".tmp", row_group_size=64)
        os.replace(path + ".tmp", path)
    end = args.schedule_steps
    web = _tokens_source(root, "web", args.tokens, 1500, 121,
                         {"schedule": [[0, 0.6], [end, 0.3]]})
    code = _tokens_source(root, "code", args.tokens, 400, 122,
                          {"schedule": [[0, 0.3], [end, 0.2]]})
    return {"seed": 9, "topology": {"dp": args.dp}, "batch": _batch(args.dp, 16384, 2),
            "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
            "sources": [web, code, {"name": "books", "path": folder, "text_column": "text",
                                    "weight": {"schedule": [[0, 0.1], [end, 0.5]]}}]}


WORKLOADS: Dict[str, Callable[[str, argparse.Namespace], dict]] = {
    "longtail": longtail, "curriculum": curriculum, "phases": phases,
    "heavy_vlm": heavy_vlm, "heavy_vlm_photo": heavy_vlm_photo, "hetero": hetero,
}
# What `workloads.py` with no names writes, and benchmarks/end_to_end.py runs.
DEFAULT = ("longtail", "curriculum", "phases", "heavy_vlm")


def make(name: str, args) -> str:
    """Writes workload `name`'s data (once) and config; returns the config's path."""
    root = os.path.abspath(os.path.join(args.dir, name))
    os.makedirs(root, exist_ok=True)
    config = WORKLOADS[name](root, args)
    path = os.path.join(root, f"{name}.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    return path


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"of {', '.join(WORKLOADS)} (default: {', '.join(DEFAULT)})")
    ap.add_argument("--dir", default=os.path.join("out", "workloads"))
    ap.add_argument("--tokens", type=int, default=2_000_000, help="per source")
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--schedule-steps", type=int, default=200,
                    help="where the curriculum's ramp and the short phase end")
    args = ap.parse_args(argv)
    for name in args.names:
        if name not in WORKLOADS:
            ap.error(f"unknown workload {name!r}")
    for name in args.names or list(DEFAULT):
        print(make(name, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
