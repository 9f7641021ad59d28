"""The per-rank baseline (benchmarks/harness/baseline.py) and the loader memory harness
(benchmarks/loader_memory.py) at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BENCHMARKS, write_config, write_docs


def load_baseline():
    from harness import baseline

    return baseline


@pytest.fixture
def token_sources(tmp_path):
    """Two sources whose tokens say (source, document, offset): 1000 * doc + offset,
    plus 10**6 for source 1; lengths up to 3x seq_len (32)."""
    rng = np.random.default_rng(5)
    sources = []
    for s in range(2):
        lengths = [int(x) for x in rng.integers(1, 100, size=40)]
        docs = [[s * 10**6 + d * 1000 + k for k in range(n)]
                for d, n in enumerate(lengths)]
        write_docs(tmp_path / f"s{s}" / "part-000.parquet", docs, row_group_size=16)
        sources.append({"name": f"s{s}", "path": str(tmp_path / f"s{s}"),
                        "tokens_column": "input_ids", "weight": float(1 + 2 * s)})
    config = {"seed": 3, "topology": {"dp": 2},
              "batch": {"global_tokens": 2 * 2 * 32, "seq_len": 32,
                        "micro_batch_size": 2},
              "sources": sources}
    return write_config(tmp_path / "job.json", config)


def test_baseline_packs_whole_documents_with_targets(token_sources):
    baseline = load_baseline()
    loader = baseline.make_loader(str(token_sources), rank=1, world_size=2, workers=0,
                                  shuffle_buffer=8)
    seen = {}
    it = iter(loader)
    for _ in range(40):
        batch = next(it)
        ids = batch["input_ids"].numpy().reshape(-1)
        labels = batch["labels"].numpy().reshape(-1)
        pos = batch["position_ids"].numpy().reshape(-1)
        src = batch["source_ids"].numpy().reshape(-1)
        cu = batch["cu_seqlens"].numpy()
        assert batch["input_ids"].shape == (2, 32)
        assert cu[0] == 0 and cu[-1] == ids.size and (np.diff(cu) > 0).all()
        # No piece crosses a sequence boundary.
        assert set(range(0, ids.size + 1, 32)) <= set(cu.tolist())
        for a, b in zip(cu[:-1], cu[1:]):
            piece = ids[a:b]
            source, offset = divmod(int(piece[0]), 10**6)
            assert (src[a:b] == source).all()
            assert (piece == piece[0] + np.arange(b - a)).all()  # consecutive tokens
            assert (pos[a:b] == np.arange(b - a)).all()  # positions restart per piece
            doc = offset // 1000
            seen.setdefault((source, doc), []).append(int(piece[-1]) % 1000)
            # The target is the next token of the document, -100 at its end.
            assert (labels[a:b - 1] == piece[1:]).all()
            assert labels[b - 1] in (piece[-1] + 1, -100)
        assert batch["loss_mask"].numpy().reshape(-1).tolist() == [
            float(x != -100) for x in labels]
    assert {s for s, _ in seen} == {0, 1}


def test_baseline_streams_differ_by_rank_and_repeat_by_seed(token_sources):
    baseline = load_baseline()

    def first(rank):
        it = iter(baseline.make_loader(str(token_sources), rank=rank, world_size=2,
                                       workers=0))
        return [next(it)["input_ids"].numpy().copy() for _ in range(3)]

    a, b, again = first(0), first(1), first(0)
    assert all((x == y).all() for x, y in zip(a, again))
    assert not all((x == y).all() for x, y in zip(a, b))


def test_harness_measures_baseline_and_braid(tmp_path):
    out = tmp_path / "memory.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(BENCHMARKS / "loader_memory.py"), "--ranks", "2",
           "--sources", "2", "--tokens-per-file", "60000", "--micro-batches", "6",
           "--interval-ms", "0", "--seq-len", "256", "--micro-batch-size", "2",
           "--sample-ms", "50", "--timeout", "120", "--dir", str(tmp_path / "data"),
           "--json", str(out), "--loaders", "baseline,braid,mosaic",
           "--mosaic-python", str(tmp_path / "no-venv" / "bin" / "python")]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert json.loads(result.stdout.strip().splitlines()[-1]) == figures
    assert figures["ranks"] == 2 and figures["none_peak_pss_bytes"] > 0
    modes = figures["modes"]
    assert set(modes) == {"baseline", "braid"}
    # Without MosaicML Streaming's environment the mode is skipped, naming the fix.
    assert set(figures["skipped"]) == {"mosaic"}
    assert "benchmarks/setup-mosaic-env" in figures["skipped"]["mosaic"]
    assert "mosaic     skipped: no MosaicML Streaming environment at " in result.stdout
    for name, m in modes.items():
        assert m["tokens"] == 2 * 6 * 2 * 256, name
        assert m["tokens_per_s"] > 0, name
        assert m["peak_pss_bytes"] > figures["none_peak_pss_bytes"] / 2, name
        assert m["added_vs_own_idle_bytes"] > 0, name
        assert len(m["trainer_self"]) == 2, name
    # Both fill seq_len sequences: the same tokens per micro-batch, hence per step.
    assert modes["baseline"]["tokens_per_micro_batch"] == [2 * 256]
    assert modes["braid"]["tokens_per_micro_batch"] == [2 * 256]
    # Forked workers are counted.
    assert modes["baseline"]["peak_processes"] == 2 * 3
    assert modes["baseline"]["peak_workers_bytes"] > 0
    assert modes["braid"]["peak_processes"] == 2
    assert modes["baseline"]["added_pss_bytes"] > 0
    assert figures["ratio_baseline_over_braid"] > 0
