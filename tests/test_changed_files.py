"""Files that change under a run (docs/sources.md, "Files that change"): a Parquet file
rewritten in place, or deleted, after `braid.Loader` opened its source is never misread. Under
`on_error: fail` the run stops with one line naming the file; under `on_error: skip` its
rows not yet read are skipped and no batch carries a token of the new file.

The trainer is a fresh process that imports nothing but braid; the test rewrites the files
(the same writer and lengths, other token ids: the same sizes, so the old footers' offsets
still point at pages), or deletes them, between its first batch and the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

FILES = 4
ROWS = 1500
NEW = 1_000_000  # the rewritten files' ids start here; the originals' stay below

TRAINER = textwrap.dedent("""
    import json
    import sys

    import braid

    loader = braid.Loader(sys.argv[1], rank=0, world_size=2)
    it = iter(loader)
    next(it)
    print("ready", flush=True)
    sys.stdin.readline()  # the files are rewritten meanwhile
    for step in range(int(sys.argv[2])):
        try:
            batch = next(it)
        except Exception as e:  # noqa: BLE001 - the message is what the test checks
            print(json.dumps({"error": str(e), "type": type(e).__name__}), flush=True)
            break
        print(json.dumps({"max_id": int(batch["input_ids"].max())}), flush=True)
    job = getattr(loader._engine, "job", None)
    if job is not None:  # Ray: the test asks the job's services what they skipped
        print(json.dumps({"job": job.name, "namespace": job.namespace}), flush=True)
        sys.stdin.readline()
    loader.close()
""")


def write_file(path: Path, rng_seed: int, offset: int) -> None:
    rng = np.random.default_rng(rng_seed)
    docs = [(rng.integers(1, 30000, size=int(n)) + offset).astype(np.int32).tolist()
            for n in rng.integers(20, 400, size=ROWS)]
    pq.write_table(pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))}),
                   path, row_group_size=100, compression="none", use_dictionary=False)


def backdate(path: Path) -> None:
    """An hour old, as files written before a run are (mtime granularity aside)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 3600 * 10**9))


@pytest.fixture(scope="module")
def ray_address():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, object_store_memory=256 * 2**20,
             include_dashboard=False, log_to_driver=False,
             namespace="braid-test", configure_logging=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.mark.parametrize("runtime", ["local", "ray"])
@pytest.mark.parametrize("on_error", ["fail", "skip"])
@pytest.mark.parametrize("change", ["rewritten", "deleted"])
def test_a_file_rewritten_in_place_or_deleted_is_never_misread(tmp_path: Path, change,
                                                               on_error, runtime, request):
    data = tmp_path / "web"
    data.mkdir()
    paths = [data / f"part-{f}.parquet" for f in range(FILES)]
    for f, path in enumerate(paths):
        write_file(path, f, 0)
        backdate(path)
    config = {
        "seed": 5,
        "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 256, "seq_len": 256},
        "runtime": {"memory_bytes": 1 << 20, "read_ahead_bytes": 1 << 18},
        "sources": [{"name": "web", "path": str(data / "*.parquet"),
                     "tokens_column": "input_ids", "shuffle_window": 100,
                     "on_error": on_error}],
    }
    if runtime == "ray":
        config["runtime"].update(kind="ray", address=request.getfixturevalue("ray_address"),
                                 namespace="braid-test", timeout_s=60)
    changed = paths[1::2]  # two of the four: under skip the others carry the run
    (tmp_path / "job.json").write_text(json.dumps(config))
    (tmp_path / "trainer.py").write_text(TRAINER)
    # A deleted file is read through the descriptors opened before, until it has to be
    # opened again: in the next epoch (4 files of ~1.26 M tokens, 1,024 tokens a step).
    steps = 400 if change == "rewritten" else 1400
    proc = subprocess.Popen([sys.executable, str(tmp_path / "trainer.py"),
                             str(tmp_path / "job.json"), str(steps)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        if change == "rewritten":
            sizes = [p.stat().st_size for p in changed]
            for path in changed:  # in place: the same inode, truncated and rewritten
                write_file(path, paths.index(path), NEW)
            assert [p.stat().st_size for p in changed] == sizes
        else:  # a descriptor the loader holds still reads the old inode
            for path in changed:
                path.unlink()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        lines, roles = [], []
        for line in proc.stdout:
            lines.append(json.loads(line))
            if "job" in lines[-1]:
                from braid.ray_runtime import registry
                roles = registry.status(lines[-1]["job"], lines[-1]["namespace"])
                proc.stdin.write("done\n")
                proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    batches = [line for line in lines if "max_id" in line]
    errors = [line for line in lines if "error" in line]
    # Nothing of a new file reaches a trainer, whatever was read before the rewrite.
    assert all(b["max_id"] < NEW for b in batches), batches
    # A rewritten file is caught by its stamp after a read; a deleted one when it has to
    # be opened again.
    why = "changed since the source opened it" if change == "rewritten" else "Failed to open"
    if on_error == "fail":
        assert len(errors) == 1, lines[-3:]
        message = errors[0]["error"]
        assert why in message, message
        assert any(str(p) in message for p in changed), message
        assert "set on_error: skip" in message and "\n" not in message
    else:
        assert not errors and len(batches) == steps, lines[-3:]
        if runtime == "local":
            assert why in err, err[-2000:]
            assert any(str(p) in err for p in changed), err[-2000:]
            assert "lost for the rest of the run" in err
        else:  # the log is the planner's (its actor's stderr); its figures count the file
            planner = [r for r in roles if r.get("role") == "planner"]
            assert planner, roles
            assert 1 <= planner[0]["skipped_files"]["web"] <= len(changed), planner[0]
