"""Many sources on one pool: runtime.threads, runtime.memory_bytes and
sources[].shuffle_window_bytes change speed and memory, never the plans (issue 8)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import braid
from conftest import braid_cli, make_source, write_config


@pytest.fixture
def many_sources(tmp_path):
    """60 small sources (weights 1..4) at dp=4, seq_len 32."""
    rng = np.random.default_rng(3)
    sources = []
    for s in range(60):
        lengths = [int(x) for x in rng.integers(1, 90, size=int(rng.integers(10, 30)))]
        make_source(tmp_path, f"s{s}", s, lengths, files=2, row_group_size=4)
        sources.append({"name": f"s{s}", "path": str(tmp_path / f"s{s}"),
                        "tokens_column": "input_ids", "weight": 1 + s % 4,
                        "shuffle_window": 8})
    return {"seed": 5, "topology": {"dp": 4},
            "batch": {"global_tokens": 4 * 4 * 32, "seq_len": 32}, "sources": sources}


def plan(tmp_path, config, steps=15):
    path = write_config(tmp_path / "job.json", config)
    result = braid_cli("plan", path, "--steps", steps)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_plans_do_not_depend_on_threads_or_memory(many_sources, tmp_path):
    reference = plan(tmp_path, many_sources)
    assert len(reference.splitlines()) == 15
    for threads, memory in [(1, 1), (3, 1 << 30), (8, 4096)]:
        config = copy.deepcopy(many_sources)
        config["runtime"] = {"threads": threads, "memory_bytes": memory}
        assert plan(tmp_path, config) == reference, (threads, memory)


def test_window_bytes_cut_row_groups_and_keep_every_document(many_sources, tmp_path):
    config = copy.deepcopy(many_sources)
    for s in config["sources"]:
        s["shuffle_window_bytes"] = 64  # row groups of 4 documents are cut into blocks
    steps = [json.loads(line) for line in plan(tmp_path, config, steps=20).splitlines()]
    reference = [json.loads(line) for line in plan(tmp_path, many_sources, 20).splitlines()]
    # The order changed; every source stays within two sequences of its share.
    assert steps != reference
    for s in steps + reference:
        assert max(abs(d) for d in s["drift"].values()) <= 2 * 32
    # Per-step quotas (mix.exact: step) do not depend on the order.
    per_step = [json.loads(line) for line in
                plan(tmp_path, dict(config, mix={"exact": "step"}), 20).splitlines()]
    reference = [json.loads(line) for line in
                 plan(tmp_path, dict(many_sources, mix={"exact": "step"}), 20).splitlines()]
    assert [s["source_tokens"] for s in per_step] == [s["source_tokens"] for s in reference]
    # No document starts twice in one epoch of its source.
    starts = [(d["src"], d["epoch"], d["file"], d["row"])
              for s in steps for r in s["ranks"] for m in r["micro_batches"]
              for d in m["docs"] if d["start"] == 0]
    assert len(starts) > 100 and len(starts) == len(set(starts))


def test_bad_values_name_their_key(many_sources, tmp_path):
    for runtime, key in [({"threads": 0}, "runtime.threads"),
                         ({"memory_bytes": -5}, "runtime.memory_bytes")]:
        config = copy.deepcopy(many_sources)
        config["runtime"] = runtime
        result = braid_cli("plan", write_config(tmp_path / "bad.json", config),
                           "--steps", 1)
        assert result.returncode == 2 and key in result.stderr, result.stderr
    config = copy.deepcopy(many_sources)
    config["sources"][3]["shuffle_window_bytes"] = -1
    with pytest.raises(braid.ConfigError, match=r"sources\[3\].shuffle_window_bytes"):
        braid.load_config(config)
