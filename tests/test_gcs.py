"""Sources on Google Cloud Storage (gs://), read through Arrow's GCS filesystem from a GCS
emulator on loopback.

The server is gcp-storage-emulator (the GCS JSON API in Python, from PyPI), started by this
module on a free loopback port; fixtures are uploaded with pyarrow's GCS client.
Braid reaches it with `storage: {endpoint: http://127.0.0.1:PORT, anonymous: true}`.
Every entry point that takes a config (the CLI's plan and run, braid.Loader) is also run in
a fresh process that imports nothing but braid.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import torch

import braid
from remote_fixtures import (batches, config_for, free_port, fresh_cli, fresh_loader_digest,
                             job_file, plan_lines, rewrite_under_a_run, run_report,
                             store_down_under_a_run, streaming_config, write_dataset)

BUCKET = "braid-gcs"


@contextlib.contextmanager
def gcs_emulator():
    """A GCS emulator on a free loopback port with the bucket made: {url, client, proc}."""
    exe = Path(sys.executable).with_name("gcp-storage-emulator")
    if not exe.exists():
        pytest.fail("gcp-storage-emulator is not installed (requirements-dev.txt)")
    port = free_port()
    proc = subprocess.Popen([str(exe), "start", "--host", "127.0.0.1", "--port", str(port),
                             "--in-memory"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            req = urllib.request.Request(
                f"{url}/storage/v1/b?project=braid", data=json.dumps({"name": BUCKET}).encode(),
                headers={"Content-Type": "application/json"}, method="POST")
            urllib.request.urlopen(req, timeout=2).read()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the GCS emulator did not start")
            time.sleep(0.2)
    client = pafs.GcsFileSystem(anonymous=True, endpoint_override=f"127.0.0.1:{port}",
                                scheme="http", project_id="braid",
                                retry_time_limit=datetime.timedelta(seconds=5))
    try:
        yield {"url": url, "client": client, "proc": proc}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def gcs_server():
    with gcs_emulator() as server:
        yield server


@pytest.fixture(scope="module")
def gcs_dataset(gcs_server, tmp_path_factory):
    """The same two files on GCS (published-dataset layout) and on local disk."""
    def upload(name, body):
        with gcs_server["client"].open_output_stream(f"{BUCKET}/corpus/{name}") as out:
            out.write(body)
    return write_dataset(tmp_path_factory.mktemp("local"), upload)


def test_gcs_source_streams_exactly_like_the_local_copy(gcs_server, gcs_dataset):
    storage = {"endpoint": gcs_server["url"], "anonymous": True}
    for path in (f"gs://{BUCKET}/corpus/data/*.parquet", f"gs://{BUCKET}/corpus"):
        remote = batches(config_for(path, storage=storage))
        local = batches(config_for(str(gcs_dataset / "data" / "*.parquet")))
        assert len(remote) == len(local) == 6
        for r, l in zip(remote, local):
            for name in r:
                assert torch.equal(r[name], l[name]), (path, name)


def test_missing_gcs_prefix_names_the_path(gcs_server, gcs_dataset):
    storage = {"endpoint": gcs_server["url"], "anonymous": True}
    with pytest.raises(braid.DataError, match="nothing"):
        batches(config_for(f"gs://{BUCKET}/nothing/*.parquet", storage=storage), n=1)


def test_anonymous_must_be_a_bool(tmp_path):
    with pytest.raises(braid.ConfigError, match=r"sources\[0\]\.storage\.anonymous"):
        braid.Loader(config_for(f"gs://{BUCKET}/x", storage={"anonymous": "maybe"}),
                     rank=0, world_size=2)
    with pytest.raises(braid.ConfigError, match=r"storage\.anonymous: applies to gs://"):
        braid.Loader(config_for("s3://bucket/x", storage={"anonymous": True}),
                     rank=0, world_size=2)


# --- Every entry point in a fresh process (nothing imported but braid) ---

def remote_and_local(gcs_server, gcs_dataset):
    storage = {"endpoint": gcs_server["url"], "anonymous": True}
    return (config_for(f"gs://{BUCKET}/corpus/data/*.parquet", storage=storage),
            config_for(str(gcs_dataset / "data" / "*.parquet")))


def test_loader_in_a_fresh_process(gcs_server, gcs_dataset):
    remote, local = remote_and_local(gcs_server, gcs_dataset)
    assert fresh_loader_digest(remote, 6) == fresh_loader_digest(local, 6)


def test_cli_plan_and_run_in_a_fresh_process(gcs_server, gcs_dataset, tmp_path):
    remote, local = remote_and_local(gcs_server, gcs_dataset)
    assert (plan_lines(fresh_cli("plan", job_file(tmp_path / "gs", remote), "--steps", 4))
            == plan_lines(fresh_cli("plan", job_file(tmp_path / "local", local),
                                    "--steps", 4)))
    report = run_report(remote, tmp_path / "gs-run")
    assert report == run_report(local, tmp_path / "local-run")
    assert report["tokens"] > 0


# --- Storage that changes or goes down under a run (remote_fixtures.py)

def gcs_streaming_config(url: str, prefix: str) -> dict:
    return streaming_config(f"gs://{BUCKET}/{prefix}/*.parquet",
                            {"endpoint": url, "anonymous": True})


def put_into(server, prefix: str):
    def put(name: str, body: bytes) -> None:
        with server["client"].open_output_stream(f"{BUCKET}/{prefix}/{name}") as out:
            out.write(body)
    return put


def test_an_object_rewritten_under_a_run_is_never_misread(gcs_server):
    error = rewrite_under_a_run(gcs_streaming_config(gcs_server["url"], "changing"),
                                put_into(gcs_server, "changing"))
    assert f"{BUCKET}/changing/part-1.parquet" in error, error


def test_a_store_that_stays_down_is_one_line_naming_the_object_within_a_minute():
    """GCS's client would retry a request for 15 minutes; Braid gives it 5 s a try
    (io/source_paths.cc), so 4 tries end within a minute (measured here: about 40 s)."""
    with gcs_emulator() as server:
        message, waited = store_down_under_a_run(
            gcs_streaming_config(server["url"], "down"), put_into(server, "down"),
            server["proc"].kill)
    assert f"{BUCKET}/down/part-" in message, message
    assert waited < 60, waited
