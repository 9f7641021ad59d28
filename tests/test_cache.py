"""runtime.cache (a local cache of remote files) smaller than the source, and shared by
several processes, against a real S3 server (moto's) on loopback.

Streams are compared with the same job read without a cache; downloads are counted on
the server's side (moto's request log: GETs from byte 0 of an object).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from remote_fixtures import (LOADER_PROGRAM, S3_BUCKET, check_clean_exit, fresh_env,
                             fresh_loader_digest, s3_server_running)

PREFIX = "cache4/"
FILES = 4
MICRO_BATCHES = 400
SMALL_CACHE = 6_000_000  # fewer than two of the ~3.5 MB files


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with s3_server_running(tmp_path_factory.mktemp("moto") / "requests.jsonl") as server:
        yield server


@pytest.fixture(scope="module")
def source(s3):
    """Four Parquet files of about 3.5 MB each (seeded, incompressible tokens) on S3."""
    rng = np.random.default_rng(2024)
    sizes = {}
    for f in range(FILES):
        lengths = rng.integers(200, 4000, size=280)
        docs = [rng.integers(0, 2**31 - 1, size=int(n), dtype=np.int32) for n in lengths]
        buf = io.BytesIO()
        pq.write_table(pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))}),
                       buf, row_group_size=40)
        key = f"{PREFIX}part-{f:05d}.parquet"
        s3.client.put_object(Bucket=S3_BUCKET, Key=key, Body=buf.getvalue())
        sizes[key] = len(buf.getvalue())
    assert all(3_000_000 < size < 4_200_000 for size in sizes.values()), sizes
    return sizes


def job(s3, cache=None, max_bytes=SMALL_CACHE) -> dict:
    config = {
        "seed": 5,
        "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 8192, "seq_len": 8192},
        "sources": [{"name": "web", "path": f"s3://{S3_BUCKET}/{PREFIX}*.parquet",
                     "tokens_column": "input_ids", "shuffle_window": 64,
                     "storage": {"endpoint": s3.url, "region": "us-east-1"}}],
    }
    if cache is not None:
        config["runtime"] = {"cache": {"dir": str(cache), "max_bytes": max_bytes}}
    return config


def copies(cache) -> dict:
    """Complete copies in the cache folder: name -> bytes."""
    return {p.name: p.stat().st_size for p in cache.iterdir() if p.is_file()}


def leftovers(cache) -> list:
    """Downloads in flight: none once every reader has finished."""
    partial = cache / ".partial"
    return sorted(p.name for p in partial.iterdir()) if partial.exists() else []


@pytest.fixture(scope="module")
def uncached(s3, source):
    """The digest of MICRO_BATCHES micro-batches read straight from S3."""
    return fresh_loader_digest(job(s3), MICRO_BATCHES)


@pytest.fixture(scope="module")
def one_small_cache(s3, source, uncached, tmp_path_factory):
    """One process through a cache smaller than the source: its digest and downloads."""
    cache = tmp_path_factory.mktemp("one") / "cache"
    s3.start_counting()
    digest = fresh_loader_digest(job(s3, cache), MICRO_BATCHES)
    return {"digest": digest, "downloads": s3.downloads(PREFIX), "cache": cache}


def test_a_cache_smaller_than_the_source_streams_like_no_cache(source, uncached,
                                                               one_small_cache):
    assert one_small_cache["digest"] == uncached
    # Every file was read through the cache (and some more than once: it cannot hold two).
    assert sorted(one_small_cache["downloads"]) == sorted(source)
    assert sum(one_small_cache["downloads"].values()) > FILES
    cache = one_small_cache["cache"]
    assert 0 < sum(copies(cache).values()) <= SMALL_CACHE
    assert leftovers(cache) == []


def run_four(config, n=MICRO_BATCHES):
    """Four fresh processes reading `config` at once; their digests."""
    procs = [subprocess.Popen([sys.executable, "-c", LOADER_PROGRAM, json.dumps(config),
                               str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=fresh_env()) for _ in range(4)]
    digests = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        check_clean_exit(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        count, digest = out.split()
        assert int(count) == n
        digests.append(digest)
    return digests


def test_four_processes_share_a_cache_that_holds_the_source(s3, source, uncached, tmp_path):
    cache = tmp_path / "cache"
    s3.start_counting()
    assert run_four(job(s3, cache, max_bytes=64 << 20)) == [uncached] * 4
    # One download per file in all: the others waited for it and read the same copy.
    assert s3.downloads(PREFIX) == {key: 1 for key in source}
    assert sorted(copies(cache).values()) == sorted(source.values())
    assert leftovers(cache) == []


def test_four_processes_share_a_cache_smaller_than_the_source(s3, source, uncached,
                                                              one_small_cache, tmp_path):
    cache = tmp_path / "cache"
    s3.start_counting()
    assert run_four(job(s3, cache)) == [uncached] * 4
    downloads = s3.downloads(PREFIX)
    assert sorted(downloads) == sorted(source)
    # Sharing never costs more downloads than four private caches would.
    assert sum(downloads.values()) <= 4 * sum(one_small_cache["downloads"].values())
    assert 0 < sum(copies(cache).values()) <= SMALL_CACHE
    assert leftovers(cache) == []
