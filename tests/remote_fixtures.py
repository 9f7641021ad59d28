"""Shared pieces of the remote-storage tests (test_s3.py, test_gcs.py, test_cache.py): a
free loopback port, the published-dataset files both upload, the small job that reads
them, and Braid's entry points run in a fresh process."""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import io
import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from typing import Callable, Iterator, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import braid
from conftest import doc_tokens

DATASET_FILES = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parquet_bytes(docs) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))}), buf,
                   row_group_size=8)
    return buf.getvalue()


def dataset_files() -> Iterator[Tuple[str, bytes]]:
    """(name, Parquet bytes) of a two-file dataset in the published layout."""
    for f in range(DATASET_FILES):
        docs = [doc_tokens(0, 100 * f + i, 5 + (7 * i) % 40) for i in range(30)]
        yield f"data/train-{f:05d}-of-{DATASET_FILES:05d}.parquet", parquet_bytes(docs)


def write_dataset(local, upload: Callable[[str, bytes], None]):
    """Writes the dataset under `local` and passes every file to `upload(name, body)`."""
    (local / "data").mkdir()
    for name, body in dataset_files():
        upload(name, body)
        (local / name).write_bytes(body)
    return local


def config_for(path: str, **source_extra) -> dict:
    return {
        "seed": 3,
        "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 32, "seq_len": 32},
        "sources": [{"name": "web", "path": path, "tokens_column": "input_ids",
                     "shuffle_window": 16, **source_extra}],
    }


def batches(config, n=6):
    return list(itertools.islice(iter(braid.Loader(config, rank=1, world_size=2)), n))


# --- Entry points in a fresh process -------------------------------------------------
# Each runs in a new interpreter whose program imports nothing but braid (and what braid
# imports), so no filesystem is registered with Arrow unless Braid registers it.

# Reads `n` micro-batches of rank 1 of 2 through braid.Loader and prints a digest of
# them; fails if anything imported pyarrow.fs (which would register S3 behind Braid's
# back).
LOADER_PROGRAM = r"""
import hashlib, json, sys
import braid
assert "pyarrow.fs" not in sys.modules, "pyarrow.fs imported before the Loader"
config, n = json.loads(sys.argv[1]), int(sys.argv[2])
digest = hashlib.sha256()
count = 0
for batch in braid.Loader(config, rank=1, world_size=2):
    for name in sorted(batch):
        digest.update(name.encode())
        digest.update(batch[name].numpy().tobytes())
    count += 1
    if count == n:
        break
assert "pyarrow.fs" not in sys.modules, "the Loader imported pyarrow.fs"
print(count, digest.hexdigest())
"""


def fresh_env(**extra: str) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    return env


def check_clean_exit(result: subprocess.CompletedProcess) -> None:
    """Exit 0 and nothing on stderr that speaks of a crash, S3 finalization or a trace."""
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    for bad in ("Traceback", "FinalizeS3", "Segmentation", "Aborted", "terminate called"):
        assert bad not in result.stderr, result.stderr[-3000:]


def fresh_loader_digest(config: dict, n: int, env: Optional[dict] = None,
                        timeout: float = 300) -> str:
    """The digest of `n` micro-batches read by braid.Loader in a fresh process."""
    result = subprocess.run([sys.executable, "-c", LOADER_PROGRAM, json.dumps(config),
                             str(n)], capture_output=True, text=True,
                            env=env or fresh_env(), timeout=timeout)
    check_clean_exit(result)
    count, digest = result.stdout.split()
    assert int(count) == n
    return digest


def fresh_cli(*args, env: Optional[dict] = None, cwd=None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """`braid ARGS` in a fresh process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "braid.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env or fresh_env(),
                          timeout=timeout)


def plan_lines(result: subprocess.CompletedProcess) -> list:
    check_clean_exit(result)
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("{") for line in lines), result.stdout[:500]
    return lines


def run_report(config: dict, folder, steps: int = 3, env: Optional[dict] = None) -> dict:
    """`braid run` of `config` in a fresh process; the report's deterministic figures."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.json"
    path.write_text(json.dumps(config))
    result = fresh_cli("run", path, "--steps", steps, "--report", folder / "report", env=env)
    check_clean_exit(result)
    report = json.loads((folder / "report" / "report.json").read_text())
    return {k: report[k] for k in ("steps", "tokens", "padding_tokens", "skipped")}


def inspect_summary(result: subprocess.CompletedProcess) -> tuple:
    """(rows, [(file name, rows, row groups, bytes)]) of `braid inspect --json`."""
    check_clean_exit(result)
    info = json.loads(result.stdout)
    return info["rows"], [(f["path"].rsplit("/", 1)[-1], f["rows"], f["row_groups"],
                           f["bytes"]) for f in info["files"]]


def job_file(folder, config: dict):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.json"
    path.write_text(json.dumps(config))
    return path


# --- moto's S3 server -------------------------------------------------------------------

S3_BUCKET = "braid-data"


class S3Server:
    """moto's S3 server on loopback: `url`, a boto3 `client`, and its request log."""

    def __init__(self, url: str, client, log_path, proc=None) -> None:
        self.url, self.client, self.log_path, self.proc = url, client, log_path, proc

    def upload_tree(self, root, prefix: str) -> None:
        """Every file under local folder `root` as an object `prefix/RELATIVE/PATH`."""
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.client.put_object(Bucket=S3_BUCKET,
                                       Key=f"{prefix}/{path.relative_to(root)}",
                                       Body=path.read_bytes())

    def kill(self) -> None:
        """Stops the server at once (a store that goes down and stays down)."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def _post(self, action: str) -> None:
        urllib.request.urlopen(urllib.request.Request(
            f"{self.url}/moto-api/recorder/{action}", data=b"", method="POST"),
            timeout=10).read()

    def start_counting(self) -> None:
        """Forgets the requests so far and records the ones that follow."""
        self._post("reset-recording")
        self._post("start-recording")

    def _entries(self) -> list:
        """The recorded requests. moto writes a request's record as it finishes it, so
        a read right after the last response can meet a record cut short (or not yet
        there): read when the log ends a line and has stopped growing for 100 ms."""
        if not self.log_path.exists():
            return []
        text, deadline = None, time.monotonic() + 10
        while time.monotonic() < deadline:
            now = self.log_path.read_text()
            if now == text and (not now or now.endswith("\n")):
                break
            text = now
            time.sleep(0.1)
        return [json.loads(line) for line in (text or "").splitlines()]

    def downloads(self, prefix: str) -> collections.Counter:
        """Whole-file reads per object key under `prefix` since start_counting: GETs whose
        range starts at byte 0 (a Parquet footer is read from the end of the file)."""
        counts: collections.Counter = collections.Counter()
        for entry in self._entries():
            path = urllib.parse.urlparse(entry["url"]).path.lstrip("/")
            headers = {k.lower(): v for k, v in entry["headers"].items()}
            if (entry["method"] == "GET" and path.startswith(f"{S3_BUCKET}/{prefix}")
                    and headers.get("range", "bytes=0-").startswith("bytes=0-")):
                counts[path.split("/", 1)[1]] += 1
        return counts

    def gets(self, prefix: str) -> int:
        """GET requests (whole or ranged) for object keys under `prefix` since
        start_counting."""
        n = 0
        for entry in self._entries():
            path = urllib.parse.urlparse(entry["url"]).path.lstrip("/")
            n += entry["method"] == "GET" and path.startswith(f"{S3_BUCKET}/{prefix}")
        return n


@contextlib.contextmanager
def s3_server_running(log_path) -> Iterator[S3Server]:
    """moto's server (a declared dev dependency: its absence fails the tests) on a free
    loopback port (benchmarks/harness/s3.py), the bucket S3_BUCKET, and test credentials
    in os.environ meanwhile; its requests recorded in `log_path`."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("boto3") is None:
        pytest.fail("moto[server] and boto3 are not installed (requirements-dev.txt)")
    from harness import s3

    with contextlib.ExitStack() as stack:
        try:
            url, client, proc = stack.enter_context(
                s3.moto(S3_BUCKET, key="braid-test", recorder_path=log_path))
        except RuntimeError as e:
            pytest.fail(str(e))
        yield S3Server(url, client, log_path, proc)


def with_and_without_cache(server: "S3Server", files, make_config: Callable[[str], dict],
                           cache_dir, n: int) -> None:
    """Uploads `files` (local paths) under the prefixes plain/ and cached/ of S3_BUCKET,
    takes `n` batches of rank 0 of 2 of make_config(url of the prefix) in this process,
    without and with runtime.cache in `cache_dir`, and checks they are the same and that
    the cache took each object across the network once (one GET each, where without it
    there are more)."""
    import torch

    batches, gets = {}, {}
    for prefix in ("plain", "cached"):
        for path in files:
            server.client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/{path.name}",
                                     Body=path.read_bytes())
        config = make_config(f"s3://{S3_BUCKET}/{prefix}")
        if prefix == "cached":
            config["runtime"] = {"cache": {"dir": str(cache_dir), "max_bytes": 1 << 30}}
        server.start_counting()
        it = iter(braid.Loader(config, rank=0, world_size=2))
        batches[prefix] = [next(it) for _ in range(n)]
        gets[prefix] = server.gets(f"{prefix}/")
    for x, y in zip(batches["plain"], batches["cached"], strict=True):
        assert torch.equal(x["input_ids"], y["input_ids"])
    assert gets["cached"] == len(files), gets
    assert gets["plain"] > len(files), gets


# --- Storage that changes or goes down under a run (docs/sources.md, "Files that change",
# "Unreadable files"): the same checks on every remote store

NEW_IDS = 1_000_000  # a rewritten object's ids start here; the originals' stay below


def sized_parquet(seed: int, offset: int) -> bytes:
    """1,500 rows of seeded lengths; the same seed gives the same size at any offset
    (plain encoding, no compression)."""
    rng = np.random.default_rng(seed)
    docs = [(rng.integers(1, 30000, size=int(n)) + offset).astype(np.int32).tolist()
            for n in rng.integers(20, 400, size=1500)]
    buf = io.BytesIO()
    pq.write_table(pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))}), buf,
                   row_group_size=100, compression="none", use_dictionary=False)
    return buf.getvalue()


def streaming_config(path: str, storage: dict) -> dict:
    """Reads a little ahead of the trainer (the objects are read while it trains)."""
    return {
        "seed": 5,
        "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 256, "seq_len": 256},
        "runtime": {"memory_bytes": 1 << 20, "read_ahead_bytes": 1 << 18},
        "sources": [{"name": "web", "path": path, "tokens_column": "input_ids",
                     "shuffle_window": 100, "storage": storage}],
    }


def first_batch_of_two_parts(config: dict, put: Callable[[str, bytes], None]):
    """Puts part-0 and part-1 (`put(name, body)`), opens `config` over them and takes the
    first batch; returns the loader and its iterator."""
    for f in range(2):
        put(f"part-{f}.parquet", sized_parquet(f, 0))
    loader = braid.Loader(config, rank=0, world_size=2)
    it = iter(loader)
    next(it)
    return loader, it


def change_under_a_run(config: dict, put: Callable[[str, bytes], None],
                       change: Callable[[], None]) -> Exception:
    """After the first batch of part-0 and part-1 (first_batch_of_two_parts), calls
    `change()` (it rewrites or deletes part-1) and reads on: no
    batch may carry an id of a rewritten object. Returns the one-line error (DataError or
    StorageError) the run ends with."""
    loader, it = first_batch_of_two_parts(config, put)
    change()
    error = None
    try:
        for _ in range(400):
            assert int(next(it)["input_ids"].max()) < NEW_IDS, "a row of the new object"
    except (braid.DataError, braid.StorageError) as e:
        error = e
    finally:
        loader.close()
    assert error is not None, "the run read all of part-1 before the change"
    assert "\n" not in str(error), error
    return error


def rewrite_part_1(put: Callable[[str, bytes], None]) -> None:
    """Rewrites part-1 with other ids and the same size."""
    time.sleep(1.1)  # stores keep modification times to the second
    new = sized_parquet(1, NEW_IDS)
    assert len(new) == len(sized_parquet(1, 0))
    put("part-1.parquet", new)


def rewrite_under_a_run(config: dict, put: Callable[[str, bytes], None]) -> str:
    """change_under_a_run with part-1 rewritten: the error says it changed."""
    error = change_under_a_run(config, put, lambda: rewrite_part_1(put))
    assert isinstance(error, braid.DataError), error
    assert "changed since the source opened it" in str(error), error
    return str(error)


def store_down_under_a_run(config: dict, put: Callable[[str, bytes], None],
                           kill: Callable[[], None]) -> Tuple[str, float]:
    """After the first batch of part-0 and part-1 (first_batch_of_two_parts), stops the
    store (`kill()`) and reads on: the run must end with one StorageError line that
    says how many tries were made. Returns it and the seconds from the kill to it."""
    loader, it = first_batch_of_two_parts(config, put)
    kill()
    t0 = time.monotonic()
    try:
        with pytest.raises(braid.StorageError) as raised:
            for _ in range(400):
                next(it)
    finally:
        loader.close()
    message = str(raised.value)
    assert "\n" not in message and "tries)" in message, message
    return message, time.monotonic() - t0
