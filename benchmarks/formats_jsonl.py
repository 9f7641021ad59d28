"""JSON Lines sources through Braid against pyarrow.json (Arrow's JSON reader from
Python) on the same files, one thread each.

Files of records {"id", "input_ids": [token ids], "text", "metadata": {...}} written with
Python's json, gzip and zstandard (a dev dependency); Braid reads the token lists through
its source loader (one worker, the files' records in its seeded order, the source's
opening pass that counts every file's records included, or, with runtime.length_cache
holding the counts of an earlier open, without it); pyarrow.json reads every file
with the same explicit schema (`input_ids` only, other fields ignored),
use_threads=False and its default block size, and takes the token column's values,
block by block. Target >= 1.0 per compression.

    .venv/bin/python benchmarks/formats_jsonl.py [--records 60000] [--files 4]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from harness import format_reads


def write_files(root: str, suffix: str, records: int, files: int, seed: int) -> int:
    import zstandard

    rng = np.random.default_rng(seed)
    tokens = 0
    per = records // files
    for f in range(files):
        lines = []
        for r in range(per):
            n = int(np.clip(rng.lognormal(np.log(300), 0.8), 1, 4096))
            ids = rng.integers(0, 50000, size=n).tolist()
            tokens += n
            lines.append(json.dumps({"id": f"{f}-{r}", "input_ids": ids,
                                     "text": "lorem ipsum " * 8,
                                     "metadata": {"url": f"https://e.x/{r}", "score": 0.5}}))
        body = ("\n".join(lines) + "\n").encode()
        if suffix == ".gz":
            body = gzip.compress(body, compresslevel=6)
        elif suffix == ".zst":
            body = zstandard.ZstdCompressor(level=3).compress(body)
        with open(os.path.join(root, f"part-{f:03d}.jsonl{suffix}"), "wb") as out:
            out.write(body)
    return tokens


def reference(paths) -> tuple:
    opts = pj.ParseOptions(explicit_schema=pa.schema([("input_ids", pa.list_(pa.int32()))]),
                           unexpected_field_behavior="ignore")
    read = pj.ReadOptions(use_threads=False)  # Arrow's default 1 MiB blocks, as Braid's
    start = time.perf_counter()
    tokens = 0
    for p in paths:
        table = pj.read_json(pa.input_stream(p, compression="detect"), read_options=read,
                             parse_options=opts)
        # Each block's ids as they are (flatten() is a view): no copy into one array,
        # as Braid makes none.
        tokens += sum(len(chunk.flatten()) for chunk in table.column(0).chunks)
    return tokens, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for suffix in ("", ".gz", ".zst"):
        with tempfile.TemporaryDirectory(prefix="braid-jsonl-") as top:
            root = os.path.join(top, "data")
            os.makedirs(root)
            tokens = write_files(root, suffix, args.records, args.files, seed=4)
            rows = args.records // args.files * args.files
            format_reads.compare(top, root, "input_ids", rows, tokens, reference,
                                 args.repeat, f"jsonl{suffix or ' (plain)'}",
                                 "pyarrow.json", "records")

if __name__ == "__main__":
    main()
