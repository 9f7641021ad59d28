"""Sources on S3, read through Arrow's S3 filesystem from a real S3 server on loopback.

The server is moto's (an S3-compatible server in Python), started by this module on a
free loopback port; fixtures are uploaded with boto3, the ordinary S3 client.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import torch

import braid
from remote_fixtures import batches, config_for, free_port, parquet_bytes, write_dataset

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

BUCKET = "braid-data"


@pytest.fixture(scope="module")
def s3_server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the S3 server did not start")
            time.sleep(0.1)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                             "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED")}
    os.environ.update(AWS_ACCESS_KEY_ID="braid-test", AWS_SECRET_ACCESS_KEY="braid-test",
                      AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    url = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    yield {"url": url, "client": client}
    proc.terminate()
    proc.wait(timeout=10)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def s3_dataset(s3_server, tmp_path_factory):
    """The same two files on S3 (published-dataset layout) and on local disk."""
    client = s3_server["client"]
    return write_dataset(tmp_path_factory.mktemp("local"),
                         lambda name, body: client.put_object(Bucket=BUCKET,
                                                              Key=f"corpus/{name}", Body=body))


def test_s3_source_streams_exactly_like_the_local_copy(s3_server, s3_dataset):
    storage = {"endpoint": s3_server["url"], "region": "us-east-1"}
    remote = batches(config_for(f"s3://{BUCKET}/corpus/data/*.parquet", storage=storage))
    local = batches(config_for(str(s3_dataset / "data" / "*.parquet")))
    assert len(remote) == len(local) == 6
    for r, l in zip(remote, local):
        for name in r:
            assert torch.equal(r[name], l[name]), name


def test_s3_directory_of_a_published_dataset(s3_server, s3_dataset):
    storage = {"endpoint": s3_server["url"], "region": "us-east-1"}
    remote = batches(config_for(f"s3://{BUCKET}/corpus", storage=storage), n=2)
    local = batches(config_for(str(s3_dataset)), n=2)
    assert all(torch.equal(r["input_ids"], l["input_ids"]) for r, l in zip(remote, local))


def test_endpoint_from_the_uri_query(s3_server, s3_dataset):
    host = s3_server["url"].split("://")[1]
    path = f"s3://{BUCKET}/corpus/data/*.parquet?endpoint_override={host}&scheme=http"
    assert len(batches(config_for(path), n=2)) == 2


def test_missing_s3_prefix_names_the_path(s3_server):
    storage = {"endpoint": s3_server["url"], "region": "us-east-1"}
    path = f"s3://{BUCKET}/nothing/*.parquet"
    with pytest.raises(braid.DataError, match="nothing"):
        batches(config_for(path, storage=storage), n=1)


def test_storage_key_needs_a_uri(tmp_path):
    with pytest.raises(braid.ConfigError, match=r"sources\[0\]\.storage"):
        braid.Loader(config_for(str(tmp_path / "*.parquet"),
                                storage={"endpoint": "http://127.0.0.1:1"}),
                     rank=0, world_size=2)


def test_local_cache_serves_remote_files_and_keeps_its_size(s3_server, s3_dataset, tmp_path):
    client = s3_server["client"]
    names = [f"data/train-{f:05d}-of-00002.parquet" for f in range(2)]
    for name in names:
        client.put_object(Bucket=BUCKET, Key=f"cached/{name}",
                          Body=(s3_dataset / name).read_bytes())
    storage = {"endpoint": s3_server["url"], "region": "us-east-1"}
    cache = tmp_path / "cache"
    config = config_for(f"s3://{BUCKET}/cached/data/*.parquet", storage=storage)
    config["runtime"] = {"cache": {"dir": str(cache), "max_bytes": 10 << 20}}
    first = batches(config, n=4)
    local = batches(config_for(str(s3_dataset / "data" / "*.parquet")), n=4)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, local))
    copies = {p.name: p.stat().st_ino for p in cache.iterdir()}
    assert sorted(n.split("-", 1)[1] for n in copies) == [n.split("/")[1] for n in names]

    # A second job reuses the copies (same files, not copied again).
    batches(config, n=4)
    assert {p.name: p.stat().st_ino for p in cache.iterdir()} == copies

    # A changed object gets a fresh copy; the stream follows the new content.
    docs = [[7_000_000 + 1000 * i + k for k in range(20)] for i in range(30)]
    client.put_object(Bucket=BUCKET, Key=f"cached/{names[1]}", Body=parquet_bytes(docs))
    changed = batches(config, n=8)
    assert len(list(cache.iterdir())) == 3
    seen = {int(t) // 1_000_000 for b in changed for t in b["input_ids"].flatten()}
    assert 7 in seen

    # A cache too small for two files keeps the most recent copy only.
    one_file = (s3_dataset / names[0]).stat().st_size
    small = tmp_path / "small"
    config["runtime"] = {"cache": {"dir": str(small), "max_bytes": one_file + 16}}
    batches(config, n=1)
    assert sum(p.stat().st_size for p in small.iterdir()) <= one_file + 16
