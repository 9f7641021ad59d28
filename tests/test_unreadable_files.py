"""Unreadable files under `on_error` through the `braid` command line, in subprocesses.

A glob whose files include one truncated Parquet file (a failed upload: no footer): with
`on_error: skip` the job runs, the file is logged and counted in report.json, and the
stream stays a pure function of the seed and the state; with `on_error: fail` the job
stops with one line naming the file (exit 3).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import braid_cli, write_config


@pytest.fixture
def bad_glob(small_dataset, tmp_path):
    """The small dataset's web glob with a truncated file sorted between its two files."""
    bad = small_dataset["root"] / "web" / "part-000b.parquet"
    docs = [[5_000_000 + 1000 * i + k for k in range(1 + i % 20)] for i in range(40)]
    pq.write_table(pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))}), bad,
                   row_group_size=8)
    data = bad.read_bytes()
    bad.write_bytes(data[:len(data) // 2])

    def config_path(on_error: str):
        config = small_dataset["config"]
        sources = [dict(config["sources"][0], on_error=on_error), config["sources"][1]]
        return write_config(tmp_path / f"{on_error}.yaml", dict(config, sources=sources))

    return bad, config_path


def test_run_under_skip_counts_and_logs_the_truncated_file(bad_glob, tmp_path):
    bad, config_path = bad_glob
    report = tmp_path / "report"
    result = braid_cli("run", config_path("skip"), "--steps", 8, "--report", report)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    logged = [line for line in result.stderr.splitlines() if str(bad) in line]
    assert len(logged) == 1, result.stderr
    assert logged[0].startswith("braid: source 'web' skipped file ")
    assert "not a readable Parquet file" in logged[0] and "rows are unknown" in logged[0]
    data = json.loads((report / "report.json").read_text())
    assert data["skipped_files"] == {"web": 1, "code": 0}
    assert data["skipped_files_rows_unknown"] == {"web": 1, "code": 0}
    assert data["steps"] == 8
    assert "files skipped 1 (1 that did not open: rows unknown)" in result.stdout


def test_run_under_fail_is_one_line_naming_the_file(bad_glob):
    bad, config_path = bad_glob
    for command in ("run", "plan"):
        result = braid_cli(command, config_path("fail"), "--steps", 2)
        assert result.returncode == 3, (result.stdout, result.stderr)
        assert result.stdout == "" and "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert str(bad) in lines[0] and "not a readable Parquet file" in lines[0]
        assert "on_error: skip" in lines[0]


def plan_lines(*args):
    result = braid_cli("plan", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_resumed_plan_equals_the_uninterrupted_one_with_the_bad_file(bad_glob, tmp_path):
    _, config_path = bad_glob
    path = config_path("skip")
    whole = plan_lines(path, "--steps", 30)
    state = tmp_path / "s.json"
    first = plan_lines(path, "--steps", 20, "--state-out", state)
    rest = plan_lines(path, "--steps", 10, "--state-in", state)
    assert first + rest == whole
    # File indexes keep meaning "index in sorted path order": the bad file (index 1)
    # yields nothing, part-001 keeps index 2.
    web_files = {d["file"] for line in whole for r in json.loads(line)["ranks"]
                 for m in r["micro_batches"] for d in m["docs"] if d["src"] == "web"}
    assert web_files == {0, 2}


def test_a_source_with_no_readable_file_is_a_data_error(small_dataset, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"{name}.parquet").write_bytes(b"PAR1 half an upload")
    config = small_dataset["config"]
    broken = {"name": "broken", "path": str(folder / "*.parquet"),
              "tokens_column": "input_ids", "weight": 0.2, "on_error": "skip"}
    path = write_config(tmp_path / "c.yaml",
                        dict(config, sources=config["sources"] + [broken]))
    result = braid_cli("run", path, "--steps", 2)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "source 'broken'" in lines[0] and "no readable file left" in lines[0]
    assert str(folder / "*.parquet") in lines[0]
