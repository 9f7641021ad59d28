"""`benchmarks/bench.py` as a user runs it, and the per-rank baseline on the mixes it must read
(phases, weight schedules, text and image-caption sources)."""

from __future__ import annotations

import ast
import collections
import json
import random
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import BENCHMARKS, encoded_image, write_config, write_docs

from braid import _core
from harness import baseline, run

BENCH = BENCHMARKS / "bench.py"


def token_source(root: Path, name: str, seed: int, mean: float, weight) -> dict:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(mean), 0.8, size=400), 2, 4000).astype(int)
    docs = [[int(x) for x in rng.integers(3, 30000, size=n)] for n in lengths]
    write_docs(root / name / "part-000.parquet", docs, row_group_size=64)
    return {"name": name, "path": name, "tokens_column": "input_ids", "weight": weight}


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mix")
    sources = [token_source(root, "short", 1, 60, 0.5), token_source(root, "long", 2, 700,
                                                                    0.5)]
    return write_config(root / "job.json", {
        "seed": 9, "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 512, "seq_len": 512, "micro_batch_size": 1},
        "balance": {"cost": {"attn": 1.0, "linear": 512.0}},
        "sources": sources})


def test_braid_bench_runs_as_a_user_runs_it(mix: Path, tmp_path: Path):
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, str(BENCH), str(mix), "--ranks", "2",
         "--steps", "6", "--warmup", "2", "--step-ms", "40", "--imbalance-dp", "8",
         "--imbalance-micro-batches", "2", "--imbalance-steps", "3", "--sample-ms", "50",
         "--timeout", "240", "--out", str(out), "--against", "baseline,mosaic",
         "--mosaic-python", str(tmp_path / "no-venv" / "bin" / "python")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "%|" in result.stderr  # the progress bar
    figures = json.loads((out / "bench.json").read_text())
    assert set(figures["loaders"]) == {"braid", "baseline"}
    # Without MosaicML Streaming's environment its row is skipped, naming the fix.
    assert figures["skipped"]["mosaic"] == (
        f"no MosaicML Streaming environment at {tmp_path / 'no-venv' / 'bin' / 'python'}: "
        "create it with benchmarks/setup-mosaic-env (or name its python with "
        "--mosaic-python or $BRAID_MOSAIC_PYTHON)")
    assert "mosaic       skipped: no MosaicML Streaming environment" in result.stdout
    for name, f in figures["loaders"].items():
        assert f["tokens"] == 2 * 6 * 2 * 512, name  # every rank's share of every step
        assert f["added_pss_bytes"] > 0, name
        assert f["steps_per_s"] > 0 and f["ideal_steps_per_s"] > 0, name
        assert len(f["imbalance_per_step"]) == 6, name
        assert all(x >= 1.0 for x in f["imbalance_per_step"]), name
        assert 0 <= f["wait_fraction"] < 1, name
    # The costs the trainers received are the planner's, step for step.
    config = run._rebase(baseline.load_braid_config(str(mix)), str(mix.parent))
    planned = run.imbalance(run.braid_plan(run.with_ranks(config, 2), 6))
    assert figures["loaders"]["braid"]["imbalance_per_step"] == pytest.approx(planned,
                                                                              rel=1e-9)
    dp = figures["imbalance_dp"]
    assert dp["dp"] == 8 and set(dp["per_step"]) == {"braid", "baseline"}
    assert all(len(v) == 3 for v in dp["per_step"].values())
    assert figures["speedup_over_baseline"]["braid"] > 0
    assert figures["memory_ratio_baseline_over"]["braid"] > 0
    assert figures["speedup_balance_only_over_baseline"]["braid"] > 0
    for png in ("imbalance.png", "memory.png", "throughput.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "braid / baseline: end-to-end" in result.stdout


def bench(config: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), str(config), "--ranks", "2",
         "--warmup", "1", "--no-progress", "--out", str(cwd / "out"), *extra],
        capture_output=True, text=True, timeout=300, cwd=cwd)


def test_bad_data_and_a_stuck_run_are_clear_errors(mix: Path, tmp_path: Path):
    bad = tmp_path / "bad"
    bad.mkdir()
    ids = [list(range(3, 40))] * 30 + [None] + [list(range(5, 60))] * 30
    pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32()))}),
                   bad / "part-000.parquet", row_group_size=64)
    config = write_config(tmp_path / "job.json", {
        "seed": 1, "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 128, "seq_len": 128},
        "sources": [{"name": "bad", "path": "bad", "tokens_column": "input_ids"}]})
    result = bench(config, tmp_path, "--steps", "30")
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "part-000.parquet (row group 0, row 30)" in last and "Traceback" not in last
    # Trainers that do not finish in --timeout: the loader and rank are named.
    result = bench(mix, tmp_path, "--steps", "4", "--timeout", "1")
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("braid: error: ")
    assert last.endswith(": the trainers did not finish in 1 s (--timeout)"), last


def test_bench_refuses_what_a_peer_cannot_express(mix: Path, tmp_path: Path):
    config = run._rebase(baseline.load_braid_config(str(mix)), str(mix.parent))
    assert run.cannot_express("litdata", config) is None
    config["sources"][0]["weight"] = {"schedule": [[0, 0.1], [10, 0.5]]}
    assert "sources[0].weight" in run.cannot_express("litdata", config)
    result = subprocess.run([sys.executable, str(BENCH), str(mix),
                             "--against", "webdataset"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 2 and "webdataset" in result.stderr


def test_bench_refuses_what_energon_cannot_express(mix: Path):
    # Runs without Megatron-Energon installed: only the refusals, not the loader.
    config = run._rebase(baseline.load_braid_config(str(mix)), str(mix.parent))
    assert "energon" in run.PEERS
    assert run.cannot_express("energon", config) is None
    scheduled = json.loads(json.dumps(config))
    scheduled["sources"][1]["weight"] = {"steps": [[0, 0.2], [5, 0.8]]}
    assert run.cannot_express("energon", scheduled) == (
        "sources[1].weight: energon takes constant weights only")
    text = json.loads(json.dumps(config))
    del text["sources"][0]["tokens_column"]
    text["sources"][0]["text_column"] = "text"
    assert run.cannot_express("energon", text) == (
        "sources[0]: energon reads pre-tokenized token lists only")
    phased = dict(config, phases=[{"until_step": 4, "seq_len": 256}])
    assert run.cannot_express("energon", phased).startswith("phases: energon")
    assert run.cannot_express("baseline", phased) is None


def test_bench_refuses_what_mosaic_cannot_express(mix: Path):
    config = run._rebase(baseline.load_braid_config(str(mix)), str(mix.parent))
    assert "mosaic" in run.PEERS
    assert run.cannot_express("mosaic", config) is None
    scheduled = json.loads(json.dumps(config))
    scheduled["sources"][0]["weight"] = {"schedule": [[0, 0.1], [10, 0.5]]}
    assert run.cannot_express("mosaic", scheduled) == (
        "sources[0].weight: mosaic takes constant weights only")
    text = json.loads(json.dumps(config))
    del text["sources"][1]["tokens_column"]
    text["sources"][1]["text_column"] = "text"
    assert run.cannot_express("mosaic", text) == (
        "sources[1]: mosaic reads pre-tokenized token lists only")
    phased = dict(config, phases=[{"until_step": 4, "seq_len": 256}])
    assert run.cannot_express("mosaic", phased) == (
        "phases: mosaic has one sequence length and one mix")


def test_mosaic_is_unavailable_without_its_environment(tmp_path: Path):
    import argparse

    from harness import modes, procs

    missing = tmp_path / "venv" / "bin" / "python"
    why = modes.mosaic_unavailable(argparse.Namespace(mosaic_python=str(missing)))
    assert why.startswith(f"no MosaicML Streaming environment at {missing}: ")
    assert "benchmarks/setup-mosaic-env" in why
    # An interpreter without mosaicml-streaming (Braid's own: the tests run without it).
    why = modes.mosaic_unavailable(argparse.Namespace(mosaic_python=sys.executable))
    assert why.startswith(f"{sys.executable} has no mosaicml-streaming: create it with "
                          "benchmarks/setup-mosaic-env")
    # The option wins over the variable, which wins over the default place.
    env = procs.python_env({"BRAID_MOSAIC_PYTHON": str(missing)})
    probe = ("import argparse; from harness import modes; "
             "print(modes.mosaic_python(argparse.Namespace(mosaic_python=None))); "
             "print(modes.mosaic_python(argparse.Namespace(mosaic_python='/x/python')))")
    lines = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env=env, check=True).stdout.split()
    assert lines == [str(missing), "/x/python"]


def test_document_weights_are_token_shares_per_document():
    from harness import peers

    stats = [{"documents": 100, "tokens": 10_000},  # mean 100 tokens
             {"documents": 10, "tokens": 10_000},  # mean 1,000
             {"documents": 5, "tokens": 50}]  # weight 0: left out
    proportions = peers.document_weights([1.0, 3.0, 0.0], stats)
    assert [i for i, _ in proportions] == [0, 1]
    # Documents by 1/100 : 3/1000, so tokens by 1 : 3.
    assert [p for _, p in proportions] == pytest.approx([10 / 13, 3 / 13])
    tokens = [p * stats[i]["tokens"] / stats[i]["documents"] for i, p in proportions]
    assert tokens[1] / tokens[0] == pytest.approx(3.0)
    # The mix's mean document is 10/13 * 100 + 3/13 * 1000 = 300 tokens.
    assert peers.mosaic_documents_per_batch(proportions, stats, 3000) == 10
    assert peers.mosaic_documents_per_batch(proportions, stats, 100) == 1
    with pytest.raises(ValueError, match="every weight is 0"):
        peers.document_weights([0.0, 0.0], stats[:2])


def test_mosaic_collate_packs_as_the_baseline_and_carries_over():
    from harness import peers

    rng = np.random.default_rng(4)
    docs = [(np.arange(1000 * d, 1000 * d + n, dtype=np.int32), d % 3)
            for d, n in enumerate(rng.integers(1, 30, size=24))]
    reference = baseline._Packer(2, 16)
    expected = [b for ids, src in docs
                for b in reference.add(baseline.Document(ids=ids), src)]
    pack = peers.MosaicPack(rows=2, seq_len=16)
    got, counted = [], []
    for k in range(0, len(docs), 5):  # batches of 5 documents, the last of 4
        out = pack(docs[k:k + 5])
        assert list(out) == ["documents", "micro_batches"]  # StreamingDataLoader counts
        counted += out["documents"]  # the first value's entries: one per document
        got += out["micro_batches"]
    assert counted == [len(ids) for ids, _ in docs]
    assert len(got) == len(expected) == sum(counted) // 32
    for a, b in zip(got, expected):
        assert set(a) == set(b) == {"input_ids", "labels", "loss_mask", "position_ids",
                                    "cu_seqlens", "source_ids"}
        for key in a:
            assert (a[key] == b[key]).all(), key
        assert tuple(a["input_ids"].shape) == (2, 16) and int(a["cu_seqlens"][-1]) == 32
    # A document that does not fit is split: its tokens stay in order across the cut.
    flat = np.concatenate([b["input_ids"].reshape(-1).numpy() for b in got])
    assert (flat == np.concatenate([ids for ids, _ in docs])[:len(flat)]).all()
    # Fewer tokens than a micro-batch: nothing yet, carried to the next batch.
    small = peers.MosaicPack(rows=2, seq_len=16)
    assert small([(np.arange(5, dtype=np.int32), 0)])["micro_batches"] == []
    out = small([(np.arange(100, 140, dtype=np.int32), 1)])["micro_batches"]
    assert len(out) == 1 and out[0]["cu_seqlens"].tolist() == [0, 5, 16, 32]


def test_bench_says_what_the_baseline_cannot_read(mix: Path):
    config = run._rebase(baseline.load_braid_config(str(mix)), str(mix.parent))
    assert run.cannot_express("baseline", config) is None
    chat = dict(config, sources=config["sources"] + [
        {"name": "chat", "path": config["sources"][0]["path"], "chat_column": "c"}])
    assert "sources[2]" in run.cannot_express("baseline", chat)
    gone = dict(config, sources=[dict(config["sources"][0], path=str(mix.parent / "no"))])
    assert "no Parquet files" in run.cannot_express("baseline", gone)


def test_with_ranks_keeps_each_ranks_share(mix: Path):
    config = baseline.load_braid_config(str(mix))
    big = run.with_ranks(config, 64)
    assert big["topology"]["dp"] == 64 and big["batch"]["global_tokens"] == 64 * 2 * 512
    assert run.with_ranks(config, 64, 8)["batch"]["global_tokens"] == 64 * 8 * 512
    # The config's runtime settings stay; its runtime kind is the bench's to choose.
    ray = dict(config, runtime={"kind": "ray", "threads": 3})
    assert run.with_ranks(ray, 4)["runtime"] == {"threads": 3}
    assert "runtime" not in run.with_ranks(config, 4)


def test_with_ranks_puts_ranks_in_tp_pp_groups_at_the_same_global_batch(mix: Path):
    config = run._rebase(baseline.load_braid_config(str(mix)), str(mix.parent))
    flat = run.with_ranks(config, 8)
    grouped = run.with_ranks(config, 8, tp=4)
    assert grouped["topology"] == {"dp": 2, "tp": 4, "pp": 1}
    assert grouped["batch"]["global_tokens"] == flat["batch"]["global_tokens"]
    assert run.with_ranks(config, 8, tp=2, pp=2)["topology"] == {"dp": 2, "tp": 2, "pp": 2}
    with pytest.raises(ValueError, match="not a multiple of --tp 3"):
        run.with_ranks(config, 8, tp=3)
    # The peers that run DP ranks only are listed as skipped with the reason.
    assert "--tp/--pp" in run.cannot_express("litdata", grouped)
    assert run.cannot_express("baseline", grouped) is None


def test_baseline_tp_peers_load_the_same_data_and_dp_ranks_their_own(mix: Path,
                                                                     tmp_path: Path):
    from harness.modes import MODES

    config = run.with_ranks(run._rebase(baseline.load_braid_config(str(mix)),
                                        str(mix.parent)), 4, tp=2)
    path = write_config(tmp_path / "tp.json", config)

    class Args:
        workers, shuffle_buffer, tp, pp = 0, 8, 2, 1

    def first(rank: int, n: int = 3):
        it, close = MODES["baseline"].start(str(path), rank, 4, Args())
        try:
            return [next(it)["input_ids"].tolist() for _ in range(n)]
        finally:
            close()

    # Ranks 0 and 1 form DP group 0 (tp fastest), 2 and 3 group 1.
    assert first(0) == first(1)
    assert first(2) == first(3)
    assert first(0) != first(2)


def test_bench_runs_tp_groups(mix: Path, tmp_path: Path):
    result = bench(mix, tmp_path, "--ranks", "4", "--tp", "2", "--steps", "4",
                   "--workers", "1", "--step-ms", "40", "--imbalance-dp", "4",
                   "--imbalance-steps", "2", "--sample-ms", "50")
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert figures["layout"] == {"dp": 2, "tp": 2, "pp": 1}
    for name, f in figures["loaders"].items():
        # The global batch of 4 DP ranks (2 micro-batches each): each DP group, and so
        # each of its 2 TP ranks, receives 4 micro-batches of 512 per step; 4 steps.
        assert f["tokens"] == 4 * 4 * (4 * 512), name
    # Braid's trainers received the plan at dp=2, its TP peers the same micro-batches.
    config = run._rebase(baseline.load_braid_config(str(mix)), str(mix.parent))
    planned = run.imbalance(run.braid_plan(run.with_ranks(config, 4, tp=2), 4))
    assert figures["loaders"]["braid"]["imbalance_per_step"] == pytest.approx(planned,
                                                                              rel=1e-9)
    assert "dp=2 x tp=2 x pp=1" in result.stdout


def baseline_items(config, n: int, rank: int = 0, world: int = 2, metadata=False):
    data = baseline.BaselineDataset.from_braid_config(config, rank=rank, world_size=world,
                                                      shuffle_buffer=8, metadata=metadata)
    it = data.worker_stream(0, 1)
    return [next(it) for _ in range(n)]


def test_baseline_follows_phases_and_schedules(tmp_path: Path):
    sources = [token_source(tmp_path, "a", 3, 50, {"schedule": [[0, 0.9], [6, 0.1]]}),
               token_source(tmp_path, "b", 4, 50, {"schedule": [[0, 0.1], [6, 0.9]]})]
    config = write_config(tmp_path / "job.json", {
        "seed": 1, "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 256, "seq_len": 256},
        "phases": [{"until_step": 3, "seq_len": 128}],
        "sources": sources})
    items = baseline_items(str(config), 4 * 3 + 2 * 9)
    # Steps 0-2: 4 micro-batches of 128 per rank; then 2 of 256.
    shapes = [tuple(b["input_ids"].shape) for b in items]
    assert shapes == [(1, 128)] * 12 + [(1, 256)] * 18
    def share_b(batches):
        src = np.concatenate([b["source_ids"].numpy().ravel() for b in batches])
        return float((src == 1).mean())

    # The schedule moves the token share from a to b (b: 0.1 .. 0.37 in steps 0-2, 0.9
    # from step 6 on; drawn per document, so not exact per step).
    assert share_b(items[:12]) < 0.45
    assert share_b(items[18:]) > 0.7


def test_baseline_sizes_images_as_braid_does(tmp_path: Path):
    rng = random.Random(3)
    sizes = [(700, 500), (1000, 30), (15, 15), (13, 40), (300, 301), (1024, 1024),
             (29, 27), (640, 480)]
    images = [encoded_image(rng, w, h) for w, h in sizes]
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()),
                             "caption": [""] * len(images)}),
                   tmp_path / "c.parquet", row_group_size=4)
    captions = ["a b c d e f g h", "loader planner constructor"] * 50
    model = _core.train_tiny_sentencepiece(captions, str(tmp_path / "tok"), 40)
    config = {"seed": 2, "topology": {"dp": 1},
              "batch": {"global_tokens": 2048, "seq_len": 2048},
              "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
              "sources": [{"name": "c", "path": str(tmp_path / "c.parquet"),
                           "image_column": "image", "text_column": "caption",
                           "image": {"patch_size": 14, "image_token_id": 500}}]}
    import braid

    loader = braid.Loader(config, rank=0, world_size=1)
    grids = []
    for batch in loader:
        if "image_grid" in batch:
            grids += [tuple(g) for g in batch["image_grid"].tolist()]
        if len(grids) >= len(sizes):
            break
    loader.close()
    expected = [baseline.image_grid(h, w, 14, 262144) for w, h in sizes]
    assert collections.Counter(grids[:len(sizes)]) == collections.Counter(expected)
    # The baseline's documents: placeholders then EOS; pixel rows follow placeholders.
    items = baseline_items(config, 6, world=1)
    for b in items:
        placeholders = int((b["input_ids"] == 500).sum())
        rows = b["pixel_values"].shape[0] if "pixel_values" in b else 0
        assert rows == placeholders
        if rows:
            assert b["pixel_values"].shape[1] == 3 * 14 * 14
            assert float(b["pixel_values"].abs().max()) <= 1.0
    meta = baseline_items(config, 6, world=1, metadata=True)
    assert [int(m["image_tokens"].sum()) for m in meta] == [
        int((b["input_ids"] == 500).sum()) for b in items]


def test_baseline_tokenizes_text_as_the_model_does(tmp_path: Path):
    texts = [f"row {i}: the loader reads many sources and packs them" * (1 + i % 3)
             for i in range(40)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet", row_group_size=40)
    model = _core.train_tiny_sentencepiece(texts, str(tmp_path / "tok"), 50)
    config = {"seed": 2, "topology": {"dp": 1},
              "batch": {"global_tokens": 4096, "seq_len": 4096},
              "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
              "sources": [{"name": "t", "path": str(tmp_path / "t.parquet"),
                           "text_column": "text"}]}
    data = baseline.BaselineDataset.from_braid_config(config, shuffle_buffer=1)
    ids = next(data.worker_stream(0, 1))["input_ids"].numpy().ravel()
    expected = set()
    for t in texts:
        expected.add(tuple(_core.sentencepiece_tokenize(model, t)) + (2,))
    cu = np.flatnonzero(ids == 2)
    first = tuple(ids[:cu[0] + 1])
    assert first in expected


def test_table_without_a_baseline_has_no_ratio_column_value():
    # `bench.py --against ''` measures Braid alone: its row says "-", not "nanx".
    from harness.run import table

    row = {"added_pss_bytes": 1.5e9, "tokens_per_s": 1000.0, "wait_fraction": 0.1,
           "mean_rank_cost": 2.0, "imbalance_per_step": [1.01, 1.03], "steps_per_s": 4.0}
    result = {"imbalance_dp": {"dp": 64, "mean": {"braid": 1.0002}},
              "loaders": {"braid": row}, "skipped": {}}
    text = table(result)
    assert "nanx" not in text
    line = next(l for l in text.splitlines() if l.startswith("braid "))
    assert line.split()[-2:] == ["-", "1.0002"], line
    with_base = dict(result, loaders={"braid": row,
                                      "baseline": dict(row, steps_per_s=2.0)})
    assert "2.00x" in table(with_base)


def _imports(path: Path) -> set:
    """Every module a file imports, at any depth (function-level imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_the_harness_modules_import_no_circle():
    harness = BENCHMARKS / "harness"
    modules = {p.stem for p in harness.glob("*.py")} - {"__init__"}
    graph = {m: {n.split(".")[1] for n in _imports(harness / f"{m}.py")
                 if n.startswith("harness.") and n.split(".")[1] in modules} - {m}
             for m in modules}
    assert {"modes", "procs"} <= graph["run"]  # the graph is read at all
    done: set = set()

    def visit(m: str, path: list) -> None:
        for d in sorted(graph[m]):
            assert d not in path, " -> ".join(path[path.index(d):] + [d])
            if d not in done:
                visit(d, path + [d])
        done.add(m)

    for m in sorted(modules):
        visit(m, [m])


def test_braid_never_imports_the_harness_and_no_benchmark_shadows_the_stdlib():
    package = BENCHMARKS.parent / "python" / "braid"
    for path in package.rglob("*.py"):
        assert not any(n == "harness" or n.startswith(("harness.", "braid.bench"))
                       for n in _imports(path)), path
    # benchmarks/ is first on the harness's processes' path: no file there may hide a
    # standard-library module.
    names = {p.stem for p in BENCHMARKS.glob("*.py")} | {"harness"}
    assert not names & set(sys.stdlib_module_names)
