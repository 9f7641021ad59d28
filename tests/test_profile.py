"""The per-source profile (cpp/src/braid/source/profile.h): what loading each source cost,
measured in the C++ core while the job runs, in `braid run`'s summary and report.json.

No timing thresholds: each test compares two sources of the same run, whose costs differ
by two orders of magnitude or more, with a margin of 10x.
"""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path

import numpy as np
import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from braid import _core
from braid.config import load_config
from conftest import braid_cli, encoded_image, make_source, write_config

FIELDS = {"samples", "tokens", "rows_read", "bytes_read", "read_cpu_s",
          "payloads_finished", "finish_cpu_s", "cpu_s_per_sample", "cpu_s_per_token",
          "bytes_per_sample", "consumer_wait_s", "held_bytes", "peak_held_bytes"}

SLOW = textwrap.dedent('''
    def slow(text):
        total = 0
        for i in range(50000):  # measurable pure-Python work per row
            total += i
        return [int(word) for word in text.split()]
''')


def _two_source_config(tmp_path: Path, second: dict, seq_len: int = 256,
                       steps_tokens: int = 4) -> dict:
    rng = np.random.default_rng(3)
    make_source(tmp_path, "cheap", 0, [int(x) for x in rng.integers(20, 120, size=200)],
                files=1, row_group_size=32)
    return {
        "seed": 9,
        "topology": {"dp": 1},
        "batch": {"global_tokens": steps_tokens * seq_len, "seq_len": seq_len},
        "sources": [{"name": "cheap", "path": str(tmp_path / "cheap"),
                     "tokens_column": "input_ids", "weight": 0.5}, second],
    }


def _run(config: dict, steps: int) -> dict:
    summary = _core.run_job(load_config(config), steps, lambda s: None)
    return summary["source_profile"]


def _slow_python_config(tmp_path: Path, monkeypatch, seed: int) -> dict:
    """The cheap token source beside `slow`: 200 rows of numbers as text through a Python
    transform that costs 50,000 additions a row (tmp_path/mod on sys.path)."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "slow_transform.py").write_text(SLOW)
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    rng = random.Random(seed)
    texts = [" ".join(str(rng.randrange(1, 1000)) for _ in range(rng.randint(20, 120)))
             for _ in range(200)]
    (tmp_path / "slow").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "slow" / "part-0.parquet",
                   row_group_size=32)
    return _two_source_config(tmp_path, {
        "name": "slow", "path": str(tmp_path / "slow"), "weight": 0.5,
        "transform": {"python": "slow_transform:slow", "columns": ["text"]}})


def test_profile_separates_a_python_transform_from_a_token_column(tmp_path, monkeypatch):
    config = _slow_python_config(tmp_path, monkeypatch, seed=4)
    profile = _run(config, steps=6)
    assert set(profile) == {"cheap", "slow"}
    for name, p in profile.items():
        assert set(p) == FIELDS, name
        assert p["samples"] > 0 and p["tokens"] >= p["samples"], (name, p)
        assert p["rows_read"] >= p["samples"] and p["bytes_read"] > 0, (name, p)
        assert p["payloads_finished"] == 0 and p["finish_cpu_s"] == 0, (name, p)
        assert p["cpu_s_per_sample"] > 0 and p["cpu_s_per_token"] > 0, (name, p)
        assert p["consumer_wait_s"] >= 0, (name, p)
        # Something was read ahead, and what is held now was held at some point.
        assert 0 <= p["held_bytes"] <= p["peak_held_bytes"] and p["peak_held_bytes"] > 0
        assert p["cpu_s_per_token"] * p["tokens"] == \
            pytest.approx(p["read_cpu_s"])
    # 50,000 Python additions per row against a token list passed through: the Python
    # transform costs orders of magnitude more per sample and per token.
    ratio = profile["slow"]["cpu_s_per_sample"] / profile["cheap"]["cpu_s_per_sample"]
    assert ratio > 10, profile
    assert profile["slow"]["cpu_s_per_token"] > 10 * profile["cheap"]["cpu_s_per_token"]


def test_profile_counts_image_decodes_apart_and_reports_them(tmp_path):
    rng = random.Random(6)
    images = [encoded_image(rng, 448, 448, "JPEG") for _ in range(24)]
    (tmp_path / "photos").mkdir()
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()),
                             "caption": ["a picture"] * len(images)}),
                   tmp_path / "photos" / "part-0.parquet", row_group_size=8)
    words = "a picture of the loader with many parts".split()
    model = _core.train_tiny_sentencepiece(
        [" ".join(rng.choice(words) for _ in range(6)) for _ in range(200)],
        str(tmp_path / "tok"), 40)
    config = _two_source_config(tmp_path, {
        "name": "photos", "path": str(tmp_path / "photos"), "weight": 0.5,
        "image_column": "image", "text_column": "caption",
        "image": {"patch_size": 14, "max_pixels": 50176, "image_token_id": 3}},
        seq_len=1024)
    config["tokenizer"] = {"type": "sentencepiece", "model": model}
    path = write_config(tmp_path / "job.json", config)
    done = braid_cli("run", path, "--steps", "4", "--report", tmp_path / "report")
    assert done.returncode == 0, done.stderr
    assert "source cost" in done.stdout and "photos" in done.stdout
    profile = json.loads((tmp_path / "report" / "report.json").read_text())[
        "source_profile"]
    photos, cheap = profile["photos"], profile["cheap"]
    # Images are decoded on demand (the images of built micro-batches), counted apart.
    assert photos["payloads_finished"] > 0 and photos["finish_cpu_s"] > 0, photos
    assert cheap["payloads_finished"] == 0, cheap
    assert photos["payloads_finished"] <= photos["samples"], photos
    # A 448-px JPEG decoded and cut into 256 patches, against a token list.
    assert photos["cpu_s_per_sample"] > 10 * cheap["cpu_s_per_sample"], profile
    # The encoded images are the bytes read; a row of tokens is a few hundred bytes.
    assert photos["bytes_per_sample"] > 10 * cheap["bytes_per_sample"], profile


def test_timeline_spans_the_steps_and_shows_which_source_costs(tmp_path, monkeypatch):
    config = _slow_python_config(tmp_path, monkeypatch, seed=5)
    steps = 10
    summary = _core.run_job(load_config(config), steps, lambda s: None)
    timeline, profile = summary["source_timeline"], summary["source_profile"]
    # Contiguous spans from the first step to the last one planned.
    assert timeline[0]["steps"][0] == 0
    for a, b in zip(timeline, timeline[1:]):
        assert a["steps"][1] == b["steps"][0]
    # The planner plans up to prefetch_steps (2) ahead of what was taken.
    assert steps - 2 <= timeline[-1]["steps"][1] <= steps + 2 + 1
    totals = {}
    for name in ("cheap", "slow"):
        spans = [span["sources"][name] for span in timeline]
        assert all(s["cpu_s"] >= 0 and s["wait_s"] >= 0 and s["samples"] >= 0
                   for s in spans), spans
        totals[name] = {k: sum(s[k] for s in spans) for k in ("cpu_s", "wait_s", "samples")}
        # The spans hold what was spent by the last step's start: no more than the run's.
        p = profile[name]
        assert 0 < totals[name]["samples"] <= p["samples"], (totals, p)
        assert totals[name]["cpu_s"] <= p["read_cpu_s"] + p["finish_cpu_s"] + 1e-9
        assert totals[name]["wait_s"] <= p["consumer_wait_s"] + 1e-9
    per_sample = {name: t["cpu_s"] / t["samples"] for name, t in totals.items()}
    assert per_sample["slow"] > 10 * per_sample["cheap"], totals
    # Each span's wall time, and per source the time its threads (one at least) were
    # given and how much of it its read steps used: the slow source's were the busier.
    wall = sum(span["wall_s"] for span in timeline)
    assert wall > 0, timeline
    busy = {}
    for name in ("cheap", "slow"):
        spans = [span["sources"][name] for span in timeline]
        given = sum(s["thread_s"] for s in spans)
        assert given >= wall * (1 - 1e-9), (name, given, wall)
        assert all(s["busy"] is not None and s["busy"] >= 0 for s in spans), spans
        busy[name] = sum(s["busy"] * s["thread_s"] for s in spans) / given
    assert busy["slow"] > busy["cheap"], busy
    # The report draws them per step (matplotlib is a test requirement).
    path = write_config(tmp_path / "job.json", config)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mod"))
    done = braid_cli("run", path, "--steps", "6", "--report", tmp_path / "report")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, l in enumerate(lines) if l.strip().startswith("source time"))
    assert [l.split()[0] for l in lines[at + 1:at + 3]] == ["cheap", "slow"], lines[at:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["source_timeline"][0]["steps"][0] == 0
    assert set(report["source_timeline"][0]["sources"]) == {"cheap", "slow"}
    for plot in ("source_cpu.png", "source_wait.png", "source_busy.png"):
        assert (tmp_path / "report" / plot).stat().st_size > 0, plot
