"""Sources on S3, read through Arrow's S3 filesystem from a real S3 server on loopback.

The server is moto's (an S3-compatible server in Python, a declared dev dependency: the
tests fail without it), started by this module on a free loopback port; fixtures are
uploaded with boto3, the ordinary S3 client. Every entry point (the CLI's plan, run and
inspect, braid.Loader) is also run in a fresh process that imports nothing but braid.
"""

from __future__ import annotations

import pytest
import torch

import braid
from remote_fixtures import (S3_BUCKET, batches, change_under_a_run, config_for, fresh_cli,
                             fresh_env, fresh_loader_digest, inspect_summary, job_file,
                             parquet_bytes, plan_lines, rewrite_under_a_run, run_report,
                             s3_server_running, store_down_under_a_run, streaming_config,
                             write_dataset)

BUCKET = S3_BUCKET


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    with s3_server_running(tmp_path_factory.mktemp("moto") / "requests.jsonl") as server:
        yield {"url": server.url, "client": server.client, "server": server}


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


# --- Every entry point in a fresh process (nothing imported but braid) ---

def remote_job(s3_server, how: str):
    """The job on S3 with its endpoint in `sources[].storage` or in AWS_ENDPOINT_URL, and
    the environment of the fresh process that runs it."""
    path = f"s3://{BUCKET}/corpus/data/*.parquet"
    if how == "storage":
        storage = {"endpoint": s3_server["url"], "region": "us-east-1"}
        return config_for(path, storage=storage), fresh_env()
    return config_for(path), fresh_env(AWS_ENDPOINT_URL=s3_server["url"])


def local_job(s3_dataset):
    return config_for(str(s3_dataset / "data" / "*.parquet"))


@pytest.mark.parametrize("how", ["storage", "env"])
def test_loader_in_a_fresh_process(s3_server, s3_dataset, how):
    config, env = remote_job(s3_server, how)
    assert fresh_loader_digest(config, 6, env) == fresh_loader_digest(local_job(s3_dataset), 6)


@pytest.mark.parametrize("how", ["storage", "env"])
def test_cli_plan_in_a_fresh_process(s3_server, s3_dataset, tmp_path, how):
    config, env = remote_job(s3_server, how)
    remote = plan_lines(fresh_cli("plan", job_file(tmp_path / "s3", config), "--steps", 4,
                                  env=env))
    local = plan_lines(fresh_cli("plan", job_file(tmp_path / "local", local_job(s3_dataset)),
                                 "--steps", 4))
    assert remote == local


@pytest.mark.parametrize("how", ["storage", "env"])
def test_cli_run_in_a_fresh_process(s3_server, s3_dataset, tmp_path, how):
    config, env = remote_job(s3_server, how)
    remote = run_report(config, tmp_path / "s3", env=env)
    assert remote == run_report(local_job(s3_dataset), tmp_path / "local")
    assert remote["tokens"] > 0


@pytest.mark.parametrize("how", ["env", "query"])
def test_cli_inspect_in_a_fresh_process(s3_server, s3_dataset, how):
    path = f"s3://{BUCKET}/corpus/data/*.parquet"
    if how == "env":
        env = fresh_env(AWS_ENDPOINT_URL=s3_server["url"])
    else:
        path += f"?endpoint_override={s3_server['url'].split('://')[1]}&scheme=http"
        env = fresh_env()
    remote = inspect_summary(fresh_cli("inspect", path, "--json", env=env))
    local = inspect_summary(fresh_cli("inspect", s3_dataset / "data" / "*.parquet", "--json"))
    assert remote == local
    assert remote[0] == 60


def test_unreachable_s3_endpoint_is_one_line_naming_the_path(s3_dataset, tmp_path):
    config = config_for(f"s3://{BUCKET}/corpus/data/*.parquet",
                        storage={"endpoint": "http://127.0.0.1:1", "region": "us-east-1"})
    result = fresh_cli("plan", job_file(tmp_path, config), "--steps", 1)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"s3://{BUCKET}/corpus/data/*.parquet" in lines[0], lines
    assert "Unrecognized" not in lines[0]


@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_hdfs_is_recognized_and_names_the_path(tmp_path, command):
    # No Hadoop here: Arrow's HDFS filesystem cannot load libhdfs / a JVM, and says so.
    path = "hdfs://127.0.0.1:1/corpus/*.parquet"
    args = [path] if command == "inspect" else [job_file(tmp_path, config_for(path)),
                                                "--steps", 1]
    result = fresh_cli(command, *args)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and path in lines[0], lines
    assert "Unrecognized" not in lines[0]


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
    copies = {p.name: p.stat().st_ino for p in cache.iterdir() if p.is_file()}
    assert sorted(n.split("-", 1)[1] for n in copies) == [n.split("/")[1] for n in names]

    # A second job reuses the copies (same files, not copied again).
    batches(config, n=4)
    assert {p.name: p.stat().st_ino for p in cache.iterdir() if p.is_file()} == copies

    # A changed object gets a fresh copy; the stream follows the new content.
    docs = [[7_000_000 + 1000 * i + k for k in range(20)] for i in range(30)]
    client.put_object(Bucket=BUCKET, Key=f"cached/{names[1]}", Body=parquet_bytes(docs))
    changed = batches(config, n=8)
    assert len([p for p in cache.iterdir() if p.is_file()]) == 3
    seen = {int(t) // 1_000_000 for b in changed for t in b["input_ids"].flatten()}
    assert 7 in seen

    # A cache too small for two files keeps the most recent copy only.
    one_file = (s3_dataset / names[0]).stat().st_size
    small = tmp_path / "small"
    config["runtime"] = {"cache": {"dir": str(small), "max_bytes": one_file + 16}}
    batches(config, n=1)
    assert 0 < sum(p.stat().st_size for p in small.iterdir() if p.is_file()) <= one_file + 16


def test_length_cache_plans_an_s3_text_source_without_reading_its_rows(s3_server, tmp_path):
    # `braid plan` on a text source on S3, twice, as a user runs it: the first pass reads
    # and encodes every row group and keeps the counts in runtime.length_cache; the
    # second prints the same plan having fetched the footer alone.
    import io
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from braid import _core

    rng = random.Random(5)
    words = "the loader reads many sources and plans every step for the ranks".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))
             for _ in range(200)]
    model = _core.train_tiny_sentencepiece(texts, str(tmp_path / "tok"), 60)
    body = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), body, row_group_size=16)  # 13 row groups
    server = s3_server["server"]
    server.client.put_object(Bucket=BUCKET, Key="lens/text.parquet", Body=body.getvalue())
    config = {"seed": 2, "batch": {"global_tokens": 1024, "seq_len": 256},
              "tokenizer": {"type": "sentencepiece", "model": model},
              "sources": [{"name": "t", "path": f"s3://{BUCKET}/lens/*.parquet",
                           "storage": {"endpoint": s3_server["url"], "region": "us-east-1"},
                           "text_column": "text"}],
              "runtime": {"length_cache": str(tmp_path / "lens")}}
    job = job_file(tmp_path / "job", config)
    server.start_counting()
    cold = plan_lines(fresh_cli("plan", job, "--steps", 6))
    cold_gets = server.gets("lens/")
    assert len(list((tmp_path / "lens").glob("*.lens"))) == 13
    server.start_counting()
    warm = plan_lines(fresh_cli("plan", job, "--steps", 6))
    warm_gets = server.gets("lens/")
    assert warm == cold
    assert cold_gets >= 13, cold_gets  # the row groups' columns
    assert warm_gets <= 2, warm_gets  # the footer only


# --- Storage that changes or goes down under a run (remote_fixtures.py)

def s3_streaming_config(url: str, prefix: str) -> dict:
    return streaming_config(f"s3://{BUCKET}/{prefix}/*.parquet",
                            {"endpoint": url, "region": "us-east-1"})


def test_an_object_rewritten_under_a_run_is_never_misread(s3_server):
    def put(name: str, body: bytes) -> None:
        s3_server["client"].put_object(Bucket=BUCKET, Key=f"changing/{name}", Body=body)

    error = rewrite_under_a_run(s3_streaming_config(s3_server["url"], "changing"), put)
    assert f"{BUCKET}/changing/part-1.parquet" in error, error


def test_an_object_deleted_under_a_run_is_one_line_naming_it(s3_server):
    client = s3_server["client"]

    def put(name: str, body: bytes) -> None:
        client.put_object(Bucket=BUCKET, Key=f"deleting/{name}", Body=body)

    error = change_under_a_run(
        s3_streaming_config(s3_server["url"], "deleting"), put,
        lambda: client.delete_object(Bucket=BUCKET, Key="deleting/part-1.parquet"))
    # Read by range requests with no descriptor to hold it: the next read finds it gone.
    assert isinstance(error, braid.StorageError), error
    assert f"{BUCKET}/deleting/part-1.parquet" in str(error), error
    assert "does not exist" in str(error) and "tries)" in str(error), error


def test_a_store_that_stays_down_is_one_line_naming_the_object_within_seconds(tmp_path):
    with s3_server_running(tmp_path / "requests.jsonl") as server:
        def put(name: str, body: bytes) -> None:
            server.client.put_object(Bucket=BUCKET, Key=f"down/{name}", Body=body)

        message, waited = store_down_under_a_run(s3_streaming_config(server.url, "down"),
                                                 put, server.kill)
    assert f"{BUCKET}/down/part-" in message, message
    # docs/sources.md "Unreadable files": within a minute (measured here: about 25 s).
    assert waited < 60, waited
