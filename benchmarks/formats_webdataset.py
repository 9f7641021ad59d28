"""WebDataset tar shards through Braid against the webdataset package on the same
shards, one thread each.

Shards written by the webdataset package's TarWriter (a test-only dependency), each
sample a `.json` member {"input_ids": [token ids], "meta": {...}}, a `.txt` caption and
a `.jpg` member of opaque bytes (an image neither reader decodes), as image-text corpora
lay samples out. Braid reads the token lists (`tokens_column: json:input_ids`) through
its source loader (one worker, the shards' samples in its seeded order; the opening pass
that counts every shard's samples included, or, with runtime.length_cache holding the
counts of an earlier open, without it). The webdataset package reads every shard in
order (`wds.WebDataset(shards, shardshuffle=False)`: its tar iterator and grouping into
samples), parses each `.json` member and takes its ids as an int32 NumPy array (what
Braid hands on). Target >= 1.0.

    .venv/bin/python benchmarks/formats_webdataset.py [--samples 40000] [--shards 4]
        [--image-bytes 8192] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from harness import format_reads


def write_shards(root: str, samples: int, shards: int, image_bytes: int, seed: int) -> int:
    import webdataset as wds

    rng = np.random.default_rng(seed)
    tokens = 0
    per = samples // shards
    for s in range(shards):
        with wds.TarWriter(os.path.join(root, f"shard-{s:05d}.tar")) as sink:
            for r in range(per):
                n = int(np.clip(rng.lognormal(np.log(300), 0.8), 1, 4096))
                tokens += n
                sink.write({"__key__": f"{s:05d}{r:06d}",
                            "json": {"input_ids": rng.integers(0, 50000, size=n).tolist(),
                                     "meta": {"url": f"https://e.x/{r}", "score": 0.5}},
                            "txt": "a caption of the image " * 4,
                            "jpg": rng.bytes(image_bytes)})
    return tokens


def reference(paths) -> tuple:
    import webdataset as wds

    start = time.perf_counter()
    tokens = 0
    for sample in wds.WebDataset(paths, shardshuffle=False):
        ids = np.asarray(json.loads(sample["json"])["input_ids"], dtype=np.int32)
        tokens += len(ids)
    return tokens, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=40_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--image-bytes", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="braid-wds-") as top:
        root = os.path.join(top, "data")
        os.makedirs(root)
        tokens = write_shards(root, args.samples, args.shards, args.image_bytes, seed=4)
        rows = args.samples // args.shards * args.shards
        format_reads.compare(top, root, "json:input_ids", rows, tokens, reference,
                             args.repeat, "webdataset", "webdataset package", "samples")

if __name__ == "__main__":
    main()
