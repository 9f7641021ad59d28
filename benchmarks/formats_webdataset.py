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

With --index, the same shards twice, one folder prepared by Megatron-Energon (`energon
prepare`: .nv-meta/.info.json and a .tar.idx beside each shard) and one not (the same
files, hard-linked), both read through Braid: opening the source and its first sample
(the counts from the index, or from every shard's member headers), and a resume inside a
shard (a braid.Loader restored from the state after --resume-batches batches, to its first
batch: the shard entered at the sample's offset, or reopened and the samples before passed
over), each the best of --repeat, each in a fresh process (a process keeps the counts it
took, as a restarted job has not), the resumed one after its first Loader on a small
folder; locally, then on a loopback S3 server (moto, a test dependency) unless --no-s3.
Prints each time and the ratio without / with the index.

    .venv/bin/python benchmarks/formats_webdataset.py --index [--samples 20000]
        [--shards 8] [--image-bytes 8192] [--resume-batches 150] [--repeat 3] [--no-s3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import tempfile
import time

import numpy as np

from harness import format_reads, s3


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


def index_ratios(prep: str, plain: str, repeat: int, resume_batches: int,
                 storage: dict | None, where: str, warm_folder: str) -> None:
    import braid

    def source(path):
        s = {"name": "s", "path": path, "tokens_column": "json:input_ids", "workers": 1}
        if storage:
            s["storage"] = storage
        return {"seed": 1, "batch": {"global_tokens": 8192, "seq_len": 4096},
                "sources": [s]}

    warm = {"seed": 1, "batch": {"global_tokens": 8192, "seq_len": 4096},
            "sources": [{"name": "s", "path": warm_folder,
                         "tokens_column": "json:input_ids", "workers": 1}]}

    # Each open and each resume in a fresh process, as a job starts or restarts: a
    # process keeps the counts it took, so a second open in it would count nothing.
    def open_seconds(path):
        return min(format_reads.read_in_fresh_process(source(path), 1, payloads=False)
                   ["seconds"] for _ in range(repeat))

    def resume_seconds(path):
        config = source(path)
        loader = braid.Loader(config, rank=0, world_size=1)
        it = iter(loader)
        for _ in range(resume_batches):
            next(it)
        with tempfile.NamedTemporaryFile(suffix=".pkl") as saved:
            pickle.dump(loader.state_dict(), saved)
            saved.flush()
            return min(format_reads.loader_in_fresh_process(config, state=saved.name,
                                                            warm=warm)["seconds"]
                       for _ in range(repeat))

    o_plain, o_prep = open_seconds(plain), open_seconds(prep)
    print(f"{where}: open + first sample: without the index {o_plain:.3f} s, with it "
          f"{o_prep:.3f} s: {o_plain / o_prep:.1f}x")
    r_plain, r_prep = resume_seconds(plain), resume_seconds(prep)
    print(f"{where}: resume after {resume_batches} batches to the first batch: without "
          f"the index {r_plain:.3f} s, with it {r_prep:.3f} s: {r_plain / r_prep:.1f}x")


def index_main(args) -> None:
    from harness.peers import _energon_prepare

    with tempfile.TemporaryDirectory(prefix="braid-wds-") as top:
        prep, plain = os.path.join(top, "prep"), os.path.join(top, "plain")
        os.makedirs(prep)
        os.makedirs(plain)
        write_shards(prep, args.samples, args.shards, args.image_bytes, seed=4)
        for name in os.listdir(prep):
            os.link(os.path.join(prep, name), os.path.join(plain, name))
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            _energon_prepare(prep)
        mb = sum(os.path.getsize(os.path.join(plain, n)) for n in os.listdir(plain)) / 1e6
        print(f"{args.shards} shards of {args.samples // args.shards:,} samples, "
              f"{mb:.0f} MB of tar")
        warm = os.path.join(top, "warm")  # pays a process's one-time costs
        os.makedirs(warm)
        write_shards(warm, 64, 1, args.image_bytes, seed=5)
        index_ratios(prep, plain, args.repeat, args.resume_batches, None, "local", warm)
        if args.no_s3:
            return
        bucket = "braid-bench"
        with s3.server(bucket) as (url, client):
            for folder in ("prep", "plain"):
                base = os.path.join(top, folder)
                for dirpath, _, names in os.walk(base):
                    for name in names:
                        path = os.path.join(dirpath, name)
                        key = f"{folder}/{os.path.relpath(path, base)}"
                        client.upload_file(path, bucket, key)
            storage = {"endpoint": url, "region": "us-east-1"}
            index_ratios(f"s3://{bucket}/prep", f"s3://{bucket}/plain", args.repeat,
                         args.resume_batches, storage, "S3 (moto, loopback)", warm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--shards", type=int, default=None)
    ap.add_argument("--image-bytes", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--index", action="store_true",
                    help="time opening and resuming with and without an Energon index")
    ap.add_argument("--resume-batches", type=int, default=150)
    ap.add_argument("--no-s3", action="store_true")
    args = ap.parse_args()
    if args.index:
        args.samples = args.samples or 20_000
        args.shards = args.shards or 8
        index_main(args)
        return
    args.samples = args.samples or 40_000
    args.shards = args.shards or 4
    with tempfile.TemporaryDirectory(prefix="braid-wds-") as top:
        root = os.path.join(top, "data")
        os.makedirs(root)
        tokens = write_shards(root, args.samples, args.shards, args.image_bytes, seed=4)
        rows = args.samples // args.shards * args.shards
        format_reads.compare(top, root, "json:input_ids", rows, tokens, reference,
                             args.repeat, "webdataset", "webdataset package", "samples")


if __name__ == "__main__":
    main()
