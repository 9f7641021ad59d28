"""Opening a source of many files, to its first sample: Parquet footers, JSON Lines
(gzip) record counts and WebDataset sample counts, read side by side on Arrow's I/O
threads (the default, ARROW_IO_THREADS unset: 8) against one file at a time
(ARROW_IO_THREADS=1), on local disk and on a loopback S3 server (moto, a test
dependency), reached directly and through a proxy that delays each request by
--latency-ms, as a remote store's round trip does (moto alone answers in about a
millisecond, one request at a time).

Each format: --files files of --rows token-list rows (lognormal lengths around 300). Each
open runs in a fresh process (a process keeps the counts it took), `_core.read_source`
to the first sample with payloads off (what the planner's streams open), its own timing;
the two settings take turns, each keeps its best of --repeat. Prints both times and
their ratio per format and store.

    .venv/bin/python benchmarks/open_files.py [--files 64] [--rows 200] [--repeat 3]
        [--latency-ms 20] [--no-s3]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import tarfile
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness import format_reads, s3


def write_sources(root: str, files: int, rows: int, seed: int) -> dict:
    """root/{parquet,jsonl,wds}/ with `files` files each; returns {format: tokens_column}."""
    rng = np.random.default_rng(seed)
    for name in ("parquet", "jsonl", "wds"):
        os.makedirs(os.path.join(root, name))
    for f in range(files):
        docs = [rng.integers(0, 50000, size=int(np.clip(rng.lognormal(np.log(300), 0.8),
                                                        1, 4096))).tolist()
                for _ in range(rows)]
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}),
                       os.path.join(root, "parquet", f"part-{f:04d}.parquet"),
                       row_group_size=64)
        lines = "".join(json.dumps({"input_ids": d}) + "\n" for d in docs).encode()
        with open(os.path.join(root, "jsonl", f"part-{f:04d}.jsonl.gz"), "wb") as out:
            out.write(gzip.compress(lines, compresslevel=6))
        with tarfile.open(os.path.join(root, "wds", f"shard-{f:04d}.tar"), "w") as tar:
            for r, d in enumerate(docs):
                body = json.dumps({"input_ids": d}).encode()
                info = tarfile.TarInfo(f"{f:04d}{r:06d}.json")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return {"parquet": "input_ids", "jsonl": "input_ids", "wds": "json:input_ids"}


def compare(where: str, base: str, columns: dict, repeat: int,
            storage: dict | None) -> None:
    for name, column in columns.items():
        source = {"name": "s", "path": f"{base}/{name}", "tokens_column": column}
        if storage:
            source["storage"] = storage
        config = {"seed": 1, "batch": {"global_tokens": 8192, "seq_len": 4096},
                  "sources": [source]}
        best = {"one at a time": float("inf"), "side by side": float("inf")}
        for _ in range(repeat):
            for label, env in (("one at a time", {"ARROW_IO_THREADS": "1"}),
                               ("side by side", {})):
                r = format_reads.read_in_fresh_process(config, 1, payloads=False, env=env)
                best[label] = min(best[label], r["seconds"])
        one, side = best["one at a time"], best["side by side"]
        print(f"{where:<20} {name:<8} one file at a time {one:7.3f} s   side by side "
              f"{side:7.3f} s   {one / side:5.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20)
    ap.add_argument("--no-s3", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="braid-open-") as root:
        columns = write_sources(root, args.files, args.rows, seed=6)
        print(f"{args.files} files per format, {args.rows} rows each; "
              f"best of {args.repeat}, fresh processes")
        compare("local", root, columns, args.repeat, None)
        if args.no_s3:
            return
        bucket = "braid-bench"
        for latency in (0, args.latency_ms):
            with s3.server(bucket, latency_ms=latency) as (url, client):
                for dirpath, _, names in os.walk(root):
                    for name in names:
                        path = os.path.join(dirpath, name)
                        client.upload_file(path, bucket, os.path.relpath(path, root))
                where = f"S3 +{latency:g} ms" if latency else "S3 (moto, loopback)"
                compare(where, f"s3://{bucket}", columns, args.repeat,
                        {"endpoint": url, "region": "us-east-1"})

if __name__ == "__main__":
    main()
