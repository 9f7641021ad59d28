"""The `braid` command line: the contracts of docs/plan-format.md for plan, run and demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

import braid
from conftest import braid_cli, write_config


@pytest.fixture
def config_path(small_dataset, tmp_path):
    return write_config(tmp_path / "job.yaml", small_dataset["config"])


def plan_lines(*args):
    result = braid_cli("plan", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_plan_prints_one_json_object_per_step(config_path, small_dataset):
    lines = plan_lines(config_path, "--steps", 5)
    assert len(lines) == 5
    # conftest's make_source: 2 files per source, documents in id order, so file f row r
    # is document f * per_file + r.
    docs = {"web": small_dataset["docs"][0], "code": small_dataset["docs"][1]}
    per_file = {name: (len(d) + 1) // 2 for name, d in docs.items()}
    attn, linear = 1.0, 32  # the fixture's balance.cost
    for i, line in enumerate(lines):
        step = json.loads(line)
        assert step["step"] == i and step["seq_len"] == 32
        assert sum(step["source_tokens"].values()) == 128
        assert [r["dp"] for r in step["ranks"]] == [0, 1]
        source_tokens = Counter()
        for rank in step["ranks"]:
            assert len(rank["micro_batches"]) == 2
            assert rank["tokens"] == sum(m["tokens"] for m in rank["micro_batches"])
            for mb in rank["micro_batches"]:
                assert mb["tokens"] == 32 == sum(d["len"] for d in mb["docs"])
                assert mb["cost"] == pytest.approx(
                    sum(attn * d["len"] ** 2 + linear * d["len"] for d in mb["docs"]))
                for d in mb["docs"]:
                    assert set(d) == {"src", "file", "row", "epoch", "start", "len"}
                    tokens = docs[d["src"]][d["file"] * per_file[d["src"]] + d["row"]]
                    assert 0 <= d["start"] and 0 < d["len"]
                    assert d["start"] + d["len"] <= len(tokens)
                    source_tokens[d["src"]] += d["len"]
            assert rank["cost"] == pytest.approx(sum(m["cost"] for m in rank["micro_batches"]))
        assert dict(source_tokens) == {k: v for k, v in step["source_tokens"].items() if v}
        costs = [r["cost"] for r in step["ranks"]]
        assert step["imbalance"] == pytest.approx(max(costs) / (sum(costs) / len(costs)),
                                                  rel=1e-6)


def test_plan_is_deterministic_byte_for_byte(config_path):
    a = braid_cli("plan", config_path, "--steps", 12)
    b = braid_cli("plan", config_path, "--steps", 12)
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout


def test_plan_resumes_exactly_from_state_out(config_path, tmp_path):
    whole = plan_lines(config_path, "--steps", 30)
    state = tmp_path / "s.json"
    first = plan_lines(config_path, "--steps", 20, "--state-out", state)
    rest = plan_lines(config_path, "--steps", 10, "--state-in", state)
    assert first + rest == whole
    assert json.loads(state.read_text())["step"] == 20


def test_documents_of_a_step_do_not_depend_on_dp(config_path):
    def docs_per_step(dp):
        out = []
        for line in plan_lines(config_path, "--steps", 8, "--dp", dp):
            step = json.loads(line)
            assert len(step["ranks"]) == dp
            out.append(Counter(
                (d["src"], d["file"], d["row"], d["epoch"], d["start"], d["len"])
                for r in step["ranks"] for m in r["micro_batches"] for d in m["docs"]))
        return out

    assert docs_per_step(1) == docs_per_step(2) == docs_per_step(4)


def test_run_writes_the_report(config_path, tmp_path):
    report = tmp_path / "report"
    result = braid_cli("run", config_path, "--steps", 6, "--report", report)
    assert result.returncode == 0, result.stderr
    assert "tokens/s" in result.stdout and "imbalance" in result.stdout
    data = json.loads((report / "report.json").read_text())
    for key in ("steps", "tokens", "tokens_per_s", "imbalance_mean", "imbalance_max",
                "loader_peak_rss_bytes", "source_tokens", "source_share", "target_share",
                "skipped"):
        assert key in data, key
    assert data["steps"] == 6 and data["tokens"] == 6 * 128
    assert data["target_share"] == pytest.approx({"web": 0.7, "code": 0.3})
    # Shares exact over time: within two sequences of 32 tokens of the share.
    assert data["source_share"]["web"] == pytest.approx(0.7, abs=2 * 32 / (6 * 128))
    assert data["source_drift_max"]["web"] <= 2 * 32 and data["max_seq_len"] == 32
    assert 0 < data["source_context"]["web"] <= 1.0
    assert "context          mean context / bound" in result.stdout
    assert data["loader_peak_rss_bytes"] > 0
    assert (report / "imbalance.png").stat().st_size > 0
    assert data["padding_tokens"] == 0 and data["multimodal_cut"] == 0
    # Start-up excluded: the rate after the first step is over the last 5 steps' tokens.
    assert data["steady_tokens_per_s"] > 0
    after_first = data["seconds"] - data["step_seconds"][0]
    assert data["steady_tokens_per_s"] == pytest.approx(5 * 128 / after_first, rel=1e-6)
    assert data["blanked"] == {"web": 0, "code": 0}

    # With token slack a quarter of every sequence is padding, reported as such; the
    # shares are of document tokens.
    config = json.loads(config_path.read_text())
    config["balance"] = dict(config.get("balance", {}), slack=0.25)
    slack = write_config(tmp_path / "slack.yaml", config)
    result = braid_cli("run", slack, "--steps", 6, "--report", tmp_path / "slack")
    assert result.returncode == 0, result.stderr
    assert "padding          192 tokens (25.00% of slots)" in result.stdout
    data = json.loads((tmp_path / "slack" / "report.json").read_text())
    assert data["padding_tokens"] == 6 * 128 // 4
    assert sum(data["source_share"].values()) == pytest.approx(1.0)


def test_run_report_without_matplotlib_is_report_json_and_one_line(config_path, tmp_path):
    # matplotlib is braid[plots], not a dependency: a shim first on the path makes it
    # unimportable, as in an environment without it.
    shim = tmp_path / "no-matplotlib"
    shim.mkdir()
    (shim / "matplotlib.py").write_text(
        "raise ImportError('No module named matplotlib', name='matplotlib')\n")
    report = tmp_path / "report"
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(shim),
                                                       os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "braid.cli", "run", str(config_path),
                             "--steps", "3", "--report", str(report)],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "braid: no plots in the report: they need matplotlib "
        "(pip install 'braid[plots]')"]
    assert json.loads((report / "report.json").read_text())["steps"] == 3
    assert sorted(p.name for p in report.iterdir()) == ["report.json"]
    assert f"report: {report / 'report.json'}\n" in result.stdout


def test_demo_runs_and_prints_its_summary(tmp_path):
    result = braid_cli("demo", "--dir", tmp_path / "demo", "--steps", 3, "--seq-len", 1024)
    assert result.returncode == 0, result.stderr
    assert "summary:" in result.stdout
    assert "tokens/s" in result.stdout and "peak memory" in result.stdout
    assert (tmp_path / "demo" / "report" / "report.json").exists()


# --- bad input: one line naming the file or key, exit 2 (config) or 3 (data) -----------

def check_error(result, code, *needles):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def with_source(config, **changes):
    sources = [dict(s) for s in config["sources"]]
    sources[0].update(changes)
    return dict(config, sources=sources)


def test_missing_path(small_dataset, tmp_path):
    missing = str(tmp_path / "nowhere" / "x.parquet")
    path = write_config(tmp_path / "c.yaml", with_source(small_dataset["config"], path=missing))
    check_error(braid_cli("plan", path, "--steps", 1), 3, "sources[0].path", missing)


def test_empty_glob(small_dataset, tmp_path):
    pattern = str(tmp_path / "web" / "*.nothing")
    path = write_config(tmp_path / "c.yaml", with_source(small_dataset["config"], path=pattern))
    check_error(braid_cli("plan", path, "--steps", 1), 3, "sources[0].path", "matches no files")


def test_missing_column(small_dataset, tmp_path):
    path = write_config(tmp_path / "c.yaml",
                        with_source(small_dataset["config"], tokens_column="ids"))
    check_error(braid_cli("plan", path, "--steps", 1), 3, "part-000.parquet", "'ids'")


def test_wrong_column_type(small_dataset, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad" / "strings.parquet"
    bad.parent.mkdir()
    pq.write_table(pa.table({"input_ids": ["a", "b"]}), bad)
    path = write_config(tmp_path / "c.yaml", with_source(small_dataset["config"], path=str(bad)))
    check_error(braid_cli("plan", path, "--steps", 1), 3, str(bad), "string")


def test_corrupt_file(small_dataset, tmp_path):
    bad = tmp_path / "bad" / "corrupt.parquet"
    bad.parent.mkdir()
    bad.write_bytes(b"PAR1 this is not parquet at all PAR1")
    path = write_config(tmp_path / "c.yaml", with_source(small_dataset["config"], path=str(bad)))
    check_error(braid_cli("plan", path, "--steps", 1), 3, str(bad))


def test_negative_weight(small_dataset, tmp_path):
    path = write_config(tmp_path / "c.yaml", with_source(small_dataset["config"], weight=-1))
    check_error(braid_cli("plan", path, "--steps", 1), 2, "sources[0].weight")


def test_unknown_key(small_dataset, tmp_path):
    config = dict(small_dataset["config"])
    config["batch"] = dict(config["batch"], seqlen=4)
    path = write_config(tmp_path / "c.yaml", config)
    check_error(braid_cli("plan", path, "--steps", 1), 2, "batch.seqlen", "unknown key")


def test_bad_dp_override(config_path):
    check_error(braid_cli("plan", config_path, "--steps", 1, "--dp", 3), 2,
                "batch.global_tokens")


def test_missing_config_file(tmp_path):
    check_error(braid_cli("plan", tmp_path / "none.yaml", "--steps", 1), 2, "none.yaml")


def test_state_from_another_config(config_path, small_dataset, tmp_path):
    state = tmp_path / "s.json"
    plan_lines(config_path, "--steps", 2, "--state-out", state)
    other = write_config(tmp_path / "other.yaml", dict(small_dataset["config"], seed=99))
    check_error(braid_cli("plan", other, "--steps", 1, "--state-in", state), 2,
                "state.fingerprint")


def test_relative_source_paths_resolve_against_the_config_folder(small_dataset, tmp_path):
    config = small_dataset["config"]
    sources = [dict(config["sources"][0], path="web/*.parquet"),
               dict(config["sources"][1], path="code")]
    write_config(small_dataset["root"] / "rel.yaml", dict(config, sources=sources))
    absolute = plan_lines(write_config(tmp_path / "abs.yaml", config), "--steps", 3)
    # Run from elsewhere, naming the config by a relative path.
    result = braid_cli("plan", "rel.yaml", "--steps", 3, cwd=small_dataset["root"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == absolute


def test_inspect_reports_files_rows_and_lengths(small_dataset):
    root = small_dataset["root"]
    result = braid_cli("inspect", root / "web", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    web = small_dataset["docs"][0]
    assert info["rows"] == len(web) and len(info["files"]) == 2
    assert info["column"] == "input_ids"
    assert info["tokens"] == sum(len(t) for t in web.values())
    assert sum(info["buckets"]) == len(web)
    assert info["max_tokens"] == max(len(t) for t in web.values())
    human = braid_cli("inspect", root / "web" / "*.parquet")
    assert human.returncode == 0 and "median" in human.stdout and "part-001" in human.stdout


@pytest.mark.parametrize("relative", ["web", "web/*.parquet", "web/part-000.parquet"])
def test_inspect_takes_paths_relative_to_the_current_folder(small_dataset, relative):
    result = braid_cli("inspect", relative, "--json", cwd=small_dataset["root"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == (60 if "000" not in relative else 30)


def test_inspect_missing_path_is_a_data_error(tmp_path):
    check_error(braid_cli("inspect", tmp_path / "none"), 3, "none")


def test_skipped_rows_are_counted_and_leave_other_sources_unchanged(small_dataset, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # A third source whose every fourth row is null, read with on_error: skip.
    rows = [None if i % 4 == 0 else [9_000_000 + 1000 * i + k for k in range(1 + i % 30)]
            for i in range(80)]
    (tmp_path / "noisy").mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))}),
                   tmp_path / "noisy" / "a.parquet", row_group_size=16)
    config = dict(small_dataset["config"])
    noisy = {"name": "noisy", "path": str(tmp_path / "noisy"), "tokens_column": "input_ids",
             "weight": 0.2, "on_error": "skip"}
    with_noisy = write_config(tmp_path / "with.yaml",
                              dict(config, sources=config["sources"] + [noisy]))
    report = tmp_path / "report"
    result = braid_cli("run", with_noisy, "--steps", 8, "--report", report)
    assert result.returncode == 0, result.stderr
    skipped = json.loads((report / "report.json").read_text())["skipped"]
    assert skipped["noisy"] > 0 and skipped["web"] == 0 and skipped["code"] == 0

    # The same job where the noisy source has its nulls fail instead: a clear data error.
    failing = write_config(tmp_path / "fail.yaml", dict(
        config, sources=config["sources"] + [dict(noisy, on_error="fail")]))
    check_error(braid_cli("plan", failing, "--steps", 3), 3, "a.parquet", "(row group ",
                ", row ", "null")

    # Skips in one source never change another source's stream: its tokens are a prefix
    # of the same order; under per-step quotas (mix.exact: step), also what it
    # contributes to each step.
    def web_docs(path):
        # The web tokens of each step (where sequence boundaries cut them may differ).
        return [sorted((d["file"], d["row"], t)
                       for r in json.loads(line)["ranks"] for m in r["micro_batches"]
                       for d in m["docs"] if d["src"] == "web"
                       for t in range(d["start"], d["start"] + d["len"]))
                for line in plan_lines(path, "--steps", 8)]


    clean = [r if r is not None else [1] for r in rows]
    (tmp_path / "clean").mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(clean, type=pa.list_(pa.int32()))}),
                   tmp_path / "clean" / "a.parquet", row_group_size=16)
    clean_source = dict(noisy, path=str(tmp_path / "clean"))
    without = write_config(tmp_path / "without.yaml", dict(
        config, sources=config["sources"] + [clean_source]))
    a, b = ({t for step in web_docs(p) for t in step} for p in (with_noisy, without))
    assert a <= b or b <= a  # one a prefix of the other in the web source's order
    step = dict(config, mix={"exact": "step"})
    with_noisy = write_config(tmp_path / "with_step.yaml",
                              dict(step, sources=config["sources"] + [noisy]))
    without = write_config(tmp_path / "without_step.yaml",
                           dict(step, sources=config["sources"] + [clean_source]))
    assert web_docs(with_noisy) == web_docs(without)


def test_schema_that_differs_between_files_names_the_file(small_dataset, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "mixed"
    folder.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2, 3]], type=pa.list_(pa.int32()))}),
                   folder / "a.parquet")
    pq.write_table(pa.table({"input_ids": pa.array(["not tokens"])}), folder / "b.parquet")
    path = write_config(tmp_path / "c.yaml", dict(small_dataset["config"], sources=[
        {"name": "mixed", "path": str(folder), "tokens_column": "input_ids"}]))
    check_error(braid_cli("plan", path, "--steps", 1), 3, "b.parquet", "string")


# --- every exception the CLI can meet: exit code and one line --------------------------

@pytest.mark.parametrize("exc, code, line", [
    (braid.ConfigError("sources[0].weight: must be >= 0"), 2,
     "braid: error: sources[0].weight: must be >= 0"),
    (braid.DataError("/d/a.parquet (row group 2): bad"), 3,
     "braid: error: /d/a.parquet (row group 2): bad"),
    (braid.StorageError("s3://b/a.parquet: timed out"), 3,
     "braid: error: s3://b/a.parquet: timed out"),
    (FileNotFoundError(2, "No such file or directory", "out/s.json"), 3,
     "braid: error: [Errno 2] No such file or directory: 'out/s.json'"),
    (ValueError("two\nlines"), 2, "braid: error: two lines"),
    (MemoryError(), 3, "braid: error: out of memory"),
    (KeyboardInterrupt(), 130, "braid: interrupted"),
])
def test_each_exception_is_one_line_and_an_exit_code(monkeypatch, capsys, exc, code, line):
    from braid import cli

    def fail(args):
        raise exc

    monkeypatch.setattr(cli, "_cmd_plan", fail)
    assert cli.main(["plan", "job.yaml", "--steps", "1"]) == code
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [line] and captured.out == ""


def test_a_closed_stdout_is_exit_141_and_silent(monkeypatch, capsys):
    from braid import cli

    def fail(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_cmd_plan", fail)
    monkeypatch.setattr(cli, "_silence_stdout", lambda: None)  # keep pytest's stdout
    assert cli.main(["plan", "job.yaml", "--steps", "1"]) == 141
    assert capsys.readouterr().err == ""


def test_an_internal_error_prints_its_traceback_and_says_it_is_a_bug(monkeypatch, capsys):
    from braid import cli

    def fail(args):
        raise KeyError("oops")

    monkeypatch.setattr(cli, "_cmd_plan", fail)
    assert cli.main(["plan", "job.yaml", "--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.splitlines()[-1].startswith("braid: internal error (a bug in braid")


def test_main_restores_the_sigterm_handler(monkeypatch, config_path):
    import signal

    from braid import cli

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "_cmd_plan", lambda args: 0)
    assert cli.main(["plan", str(config_path), "--steps", "1"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before


def test_usage_errors_are_argparse_one_liners(config_path):
    result = braid_cli("plan", config_path)  # --steps missing
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("braid plan: error:")


def test_bench_is_not_a_braid_command_and_says_where_the_harness_is(config_path):
    result = braid_cli("bench", config_path, "--ranks", 8, "--against", "baseline")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "braid: error: there is no 'braid bench': the benchmark harness lives in the "
        "repository's benchmarks/bench.py (a checkout, not the wheel), with the same "
        "options"]


def test_more_errors_map_to_their_codes_before_the_table(capsys):
    from braid import cli

    class LoaderFailed(RuntimeError):
        pass

    def fail():
        raise LoaderFailed("litdata: the trainer of rank 1 exited with 1")

    assert cli.run_with_exit_codes(fail, errors={LoaderFailed: cli.EXIT_DATA}) == 3
    assert capsys.readouterr().err.splitlines() == [
        "braid: error: litdata: the trainer of rank 1 exited with 1"]
    assert cli.run_with_exit_codes(lambda: int("x")) == cli.EXIT_USAGE  # the table


@pytest.mark.parametrize("field, value, needle", [
    ("window", 1000, "lies outside the source"),
    ("offset", 10**6, "lies outside the source"),
])
def test_a_state_outside_the_source_is_a_config_error(config_path, tmp_path, field, value,
                                                      needle):
    state_path = tmp_path / "s.json"
    plan_lines(config_path, "--steps", 2, "--state-out", state_path)
    state = json.loads(state_path.read_text())
    state["sources"][0][field] = value
    state_path.write_text(json.dumps(state))
    check_error(braid_cli("plan", config_path, "--steps", 1, "--state-in", state_path), 2,
                "sources[0]", needle)
