"""`braid plan` for issue 4: phases, stepwise schedules, elastic and changed-mix resume."""

from __future__ import annotations

import copy
import json
from collections import Counter, defaultdict

import pytest

from conftest import braid_cli, write_config


def plan_lines(*args):
    result = braid_cli("plan", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def pieces(step):
    return Counter((d["src"], d["file"], d["row"], d["epoch"], d["start"], d["len"])
                   for r in step["ranks"] for m in r["micro_batches"] for d in m["docs"])


@pytest.fixture
def wide_config(small_dataset):
    """small_dataset at dp=8 (global_tokens 8 * 2 * 32), for elastic resume."""
    config = copy.deepcopy(small_dataset["config"])
    config["topology"]["dp"] = 8
    config["batch"]["global_tokens"] = 8 * 2 * 32
    return config


def test_phase_sets_seq_len_and_mix_then_batch_shape(small_dataset, tmp_path):
    config = copy.deepcopy(small_dataset["config"])
    config["phases"] = [{"until_step": 4, "seq_len": 16, "weights": {"web": 0}}]
    path = write_config(tmp_path / "job.yaml", config)
    steps = [json.loads(line) for line in plan_lines(path, "--steps", 8)]
    for step in steps[:4]:
        assert step["seq_len"] == 16
        assert step["source_tokens"] == {"web": 0, "code": 128}
        for rank in step["ranks"]:
            assert len(rank["micro_batches"]) == 4  # 128 tokens / (2 ranks * 16)
            for mb in rank["micro_batches"]:
                assert mb["tokens"] == 16
    for step in steps[4:]:
        assert step["seq_len"] == 32
        assert step["source_tokens"]["web"] > 0
        assert all(len(r["micro_batches"]) == 2 for r in step["ranks"])


def test_resume_across_a_phase_boundary(small_dataset, tmp_path):
    config = copy.deepcopy(small_dataset["config"])
    config["phases"] = [{"until_step": 10, "seq_len": 16,
                         "weights": {"code": {"steps": [[0, 0.1], [5, 0.9]]}}}]
    path = write_config(tmp_path / "job.yaml", config)
    whole = plan_lines(path, "--steps", 20)
    state = tmp_path / "s.json"
    first = plan_lines(path, "--steps", 8, "--state-out", state)
    rest = plan_lines(path, "--steps", 12, "--state-in", state)
    assert first + rest == whole
    code = [json.loads(line)["source_tokens"]["code"] for line in whole]
    assert code[4] < code[5]  # stepwise: jumps at step 5


def test_bad_phase_names_its_key(small_dataset, tmp_path):
    config = copy.deepcopy(small_dataset["config"])
    config["phases"] = [{"until_step": 4, "seq_len": 48}]
    path = write_config(tmp_path / "job.yaml", config)
    result = braid_cli("plan", path, "--steps", 1)
    assert result.returncode == 2
    assert "phases[0].seq_len" in result.stderr


@pytest.mark.parametrize("dp", [4, 16])
def test_state_saved_at_dp8_resumes_at_other_dp(wide_config, tmp_path, dp):
    path = write_config(tmp_path / "job.yaml", wide_config)
    whole = [json.loads(line) for line in plan_lines(path, "--steps", 12)]
    state = tmp_path / "s.json"
    plan_lines(path, "--steps", 5, "--state-out", state)
    rest = [json.loads(line) for line in
            plan_lines(path, "--steps", 7, "--state-in", state, "--dp", dp)]
    for a, b in zip(rest, whole[5:]):
        assert len(a["ranks"]) == dp
        assert a["step"] == b["step"]
        assert pieces(a) == pieces(b)


def test_changed_weights_continue_every_source_from_its_cursor(small_dataset, tmp_path):
    before = small_dataset["config"]
    after = copy.deepcopy(before)
    after["sources"][0]["weight"] = 0.2
    after["sources"][1]["weight"] = 0.8
    path_before = write_config(tmp_path / "before.yaml", before)
    path_after = write_config(tmp_path / "after.yaml", after)
    state = tmp_path / "s.json"
    first = [json.loads(line) for line in
             plan_lines(path_before, "--steps", 6, "--state-out", state)]
    rest = [json.loads(line) for line in
            plan_lines(path_after, "--steps", 20, "--state-in", state)]
    # The new weights hold from the resumed step on.
    web = sum(s["source_tokens"]["web"] for s in rest)
    code = sum(s["source_tokens"]["code"] for s in rest)
    assert web / (web + code) == pytest.approx(0.2, abs=0.01)
    # Every document's tokens are covered once, without gaps, across the two runs: nothing
    # replayed, nothing skipped (each doc starts at 0 and its pieces are contiguous).
    covered = defaultdict(list)
    for step in first + rest:
        for (src, f, row, epoch, start, n), count in pieces(step).items():
            assert count == 1
            covered[(src, f, row, epoch)].append((start, n))
    for key, spans in covered.items():
        spans.sort()
        at = 0
        for start, n in spans:
            assert start == at, key
            at = start + n


def with_lengths(root, config, name="n_tokens", wrong_row=None):
    """The config's sources rewritten with a length column (row `wrong_row` of the first
    file of the first source off by one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    config = copy.deepcopy(config)
    for s, source in enumerate(config["sources"]):
        folder = root / "with_lengths" / source["name"]
        folder.mkdir(parents=True)
        files = sorted((root / source["name"]).glob("*.parquet"))
        for f, path in enumerate(files):
            table = pq.read_table(path)
            counts = [len(t) for t in table.column("input_ids").to_pylist()]
            if wrong_row is not None and s == 0 and f == 0:
                counts[wrong_row] += 1
            table = table.append_column(name, pa.array(counts, type=pa.int32()))
            pq.write_table(table, folder / path.name, row_group_size=8)
        source["path"] = str(folder)
        source["length_column"] = name
    return config


def test_plan_reads_lengths_and_plans_what_the_run_reads(small_dataset, tmp_path):
    plain = write_config(tmp_path / "plain.yaml", small_dataset["config"])
    config = with_lengths(small_dataset["root"], small_dataset["config"])
    lengths = write_config(tmp_path / "lengths.yaml", config)
    # The same plans, read from the length column or from the token lists' levels.
    assert plan_lines(lengths, "--steps", 12) == plan_lines(plain, "--steps", 12)
    # And a run over the length-column files reads the tokens the plan placed.
    result = braid_cli("run", lengths, "--steps", 4)
    assert result.returncode == 0, result.stderr


def test_a_wrong_length_fails_the_run_and_a_missing_column_the_config(small_dataset,
                                                                      tmp_path):
    config = with_lengths(small_dataset["root"], small_dataset["config"], wrong_row=3)
    path = write_config(tmp_path / "wrong.yaml", config)
    result = braid_cli("run", path, "--steps", 80)  # past every document of the source
    assert result.returncode == 3, result.stderr
    assert "part-000.parquet (row group 0, row 3)" in result.stderr
    assert "length column 'n_tokens'" in result.stderr
    assert "sources[0].length_column" in result.stderr
    config["sources"][1]["length_column"] = "count"
    missing = write_config(tmp_path / "missing.yaml", config)
    result = braid_cli("plan", missing, "--steps", 1)
    assert result.returncode == 2, result.stderr
    assert "sources[1].length_column" in result.stderr
    assert "no column 'count'" in result.stderr
