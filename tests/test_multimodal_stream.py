"""Image-caption sources over many steps, the way a user runs them: real PNG and JPEG
files of many sizes with short captions, `braid.Loader` in a fresh process that imports
nothing else, and `braid run`. Regression for image documents cut by the step quota
(an image's placeholders split over two pieces, reported at step 3)."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from braid import _core

from conftest import encoded_image

IMAGE_TOKEN = 1000
PATCH = 14


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """200 rows (PNG and JPEG, 20..220 pixels a side, some rows with two images), short
    captions; two files with row groups of 50."""
    root = tmp_path_factory.mktemp("captions")
    rng = random.Random(11)
    words = "a diagram of the loader with icons arrows and boxes in many colours".split()
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "."
            for _ in range(300)]
    model = _core.train_tiny_sentencepiece(text, str(root / "tok"), 60)
    for f in range(2):
        images, captions = [], []
        for _ in range(100):
            n = 2 if rng.random() < 0.2 else 1
            images.append([encoded_image(rng, rng.randint(20, 220), rng.randint(20, 220),
                                  rng.choice(["PNG", "JPEG"])) for _ in range(n)])
            captions.append(rng.choice(text))
        pq.write_table(pa.table({"image": pa.array(images, pa.list_(pa.binary())),
                                 "caption": captions}),
                       root / f"part-{f}.parquet", row_group_size=50)
    return root, model


def _config(root: Path, model: str, **batch) -> dict:
    shape = {"global_tokens": 32768, "seq_len": 8192, "micro_batch_size": 1}
    shape.update(batch)
    return {
        "seed": 3,
        "topology": {"dp": 1, "tp": 1, "pp": 1, "cp": 1},
        "batch": shape,
        "balance": {"cost": {"attn": 1.0, "linear": 4096, "vision": 8}},
        "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
        "sources": [{"name": "captions", "path": str(root / "*.parquet"),
                     "image_column": "image", "text_column": "caption",
                     "oversize": "skip", "workers": 2,
                     "image": {"patch_size": PATCH, "image_token_id": IMAGE_TOKEN}}],
    }


# The user's program: nothing imported but braid; every micro-batch is checked, and a
# digest of the stream is printed for the determinism and resume checks.
PROGRAM = textwrap.dedent("""
    import hashlib, json, sys
    import braid
    assert "pyarrow.fs" not in sys.modules
    config = json.load(open(sys.argv[1]))
    count, resume_at = int(sys.argv[2]), int(sys.argv[3])
    image_token = config["sources"][0]["image"]["image_token_id"]
    loader = braid.Loader(config, rank=0, world_size=1)
    digest = hashlib.sha256()
    images = 0
    it = iter(loader)
    for k in range(count):
        if resume_at and k == resume_at:  # a new process would do the same
            state = json.loads(json.dumps(loader.state_dict()))
            loader = braid.Loader(config, rank=0, world_size=1)
            loader.load_state_dict(state)
            it = iter(loader)
        b = next(it)
        ids = b["input_ids"].reshape(-1).tolist()
        cu = b["cu_seqlens"].tolist()
        # A micro-batch without images (text only) has no image tensors.
        grid = b["image_grid"].tolist() if "image_grid" in b else []
        placeholders = sum(1 for t in ids if t == image_token)
        assert (b["pixel_values"].shape[0] if grid else 0) == placeholders, k
        assert sum(h * w for h, w in grid) == placeholders
        # Every image's placeholders lie inside one document (one cu_seqlens segment),
        # and the runs of placeholders split into whole images in grid order.
        sizes = [h * w for h, w in grid]
        g = 0
        for a, e in zip(cu, cu[1:]):
            run = 0
            for t in ids[a:e] + [None]:
                if t == image_token:
                    run += 1
                elif run:
                    while run > 0:
                        assert g < len(sizes) and sizes[g] <= run, ("split", k, a, run)
                        run -= sizes[g]
                        g += 1
                    assert run == 0, ("an image was split", k, a)
        assert g == len(sizes)
        images += len(grid)
        for key in sorted(b):
            digest.update(key.encode())
            digest.update(b[key].numpy().tobytes())
    print(json.dumps({"digest": digest.hexdigest(), "images": images}))
""")


def _run_program(tmp_path: Path, config: dict, count: int, resume_at: int = 0) -> dict:
    """Runs the user's program on `count` micro-batches (a new Loader restored from the
    state after `resume_at` of them, when > 0) in a fresh interpreter."""
    cfg = tmp_path / f"job-{resume_at}.json"
    cfg.write_text(json.dumps(config))
    prog = tmp_path / "user.py"
    prog.write_text(PROGRAM)
    proc = subprocess.run([sys.executable, str(prog), str(cfg), str(count), str(resume_at)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_image_captions_run_many_steps_and_resume(tmp_path: Path, dataset):
    root, model = dataset
    config = _config(root, model)
    count = 14 * 4  # 14 steps of 4 micro-batches; the failure came at steps 3 and 11
    full = _run_program(tmp_path, config, count)
    assert full["images"] > 2000  # ~300 documents a step, every image whole
    assert _run_program(tmp_path, config, count) == full
    assert _run_program(tmp_path, config, count, resume_at=21) == full  # mid-step


def test_image_captions_mixed_with_text_and_phases(tmp_path: Path, dataset):
    root, model = dataset
    text = tmp_path / "text.parquet"
    rng = np.random.default_rng(4)
    lengths = np.minimum(rng.lognormal(6.0, 1.2, size=400), 6000).astype(int) + 1
    docs = [rng.integers(3, 60, size=int(n)).astype(np.int32).tolist() for n in lengths]
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), text,
                   row_group_size=100)
    # Steps 0-3 at seq_len 1024 (8 micro-batches of 2), later 2048 (4 of 2).
    config = _config(root, model, global_tokens=16384, seq_len=2048, micro_batch_size=2)
    config["phases"] = [{"until_step": 4, "seq_len": 1024}]
    config["balance"]["max_piece"] = 512
    config["sources"][0]["weight"] = 0.4
    config["sources"].append({"name": "web", "path": str(text),
                              "tokens_column": "input_ids", "weight": 0.6})
    count = 4 * 8 + 6 * 4
    full = _run_program(tmp_path, config, count)
    assert full["images"] > 300
    assert _run_program(tmp_path, config, count, resume_at=30) == full  # across the phase


def test_braid_run_reports_deferred_documents(tmp_path: Path, dataset):
    root, model = dataset
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps(_config(root, model)))
    proc = subprocess.run([sys.executable, "-m", "braid.cli", "run", str(cfg), "--steps",
                           "6", "--report", str(tmp_path / "report")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    # Every step ends with a document its quota or the rooms left cannot hold whole.
    assert report["multimodal_deferred"] >= 6
    assert 0 < report["padding_tokens"] < 0.02 * report["tokens"]
    assert "deferred to a later step" in proc.stdout


RANK_PROGRAM = textwrap.dedent("""
    import hashlib, json, sys
    import braid
    config = json.load(open(sys.argv[1]))
    rank, count = int(sys.argv[2]), int(sys.argv[3])
    loader = braid.Loader(config, rank=rank, world_size=2)
    digests = []
    for _, b in zip(range(count), loader):
        d = hashlib.sha256()
        for key in sorted(b):
            d.update(key.encode())
            d.update(b[key].numpy().tobytes())
        digests.append(d.hexdigest())
    print(json.dumps(digests))
""")


def test_each_trainer_process_builds_its_own_ranks_images_and_they_add_up(tmp_path: Path,
                                                                          dataset):
    # Two trainer processes (dp=2) as torchrun starts them: each decodes only the images
    # of its own micro-batches (docs/decisions.md 38), and together they give exactly
    # what one engine building both ranks gives.
    root, model = dataset
    config = _config(root, model)
    config["topology"]["dp"] = 2  # 2 micro-batches per rank per step
    cfg = tmp_path / "dp2.json"
    cfg.write_text(json.dumps(config))
    prog = tmp_path / "rank.py"
    prog.write_text(RANK_PROGRAM)
    count = 12
    procs = [subprocess.Popen([sys.executable, str(prog), str(cfg), str(r), str(count)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    ranks = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        ranks.append(json.loads(out.strip().splitlines()[-1]))
    engine = _core.make_engine(_core.parse_config(json.dumps(config), "/"), [0, 1])
    both = []
    for _ in range(2 * count):  # (step, rank, micro-batch) order
        b = engine.next()
        d = hashlib.sha256()
        for key in sorted(b):
            d.update(key.encode())
            d.update(np.ascontiguousarray(b[key]).tobytes())
        both.append(d.hexdigest())
    engine.stop()
    for r in range(2):
        expected = [both[4 * s + 2 * r + m] for s in range(count // 2) for m in range(2)]
        assert ranks[r] == expected, f"rank {r}"
    assert len(set(ranks[0]) | set(ranks[1])) == 2 * count  # no micro-batch twice


def test_plan_with_a_length_cache_reads_no_image_the_second_time(tmp_path: Path, dataset):
    # `braid plan` on the image-caption source twice with runtime.length_cache: the same
    # plan (image tokens included), and the second pass writes no entry (it read every
    # one instead of the images' headers and the captions).
    root, model = dataset
    config = _config(root, model)
    config["runtime"] = {"length_cache": str(tmp_path / "lens")}
    cfg = tmp_path / "job.json"
    cfg.write_text(json.dumps(config))

    def plan() -> str:
        proc = subprocess.run([sys.executable, "-m", "braid.cli", "plan", str(cfg),
                               "--steps", "8"], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    first = plan()
    kept = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "lens").glob("*.lens")}
    assert len(kept) == 4  # two files of two row groups
    assert plan() == first
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "lens").glob("*.lens")} == kept
    del config["runtime"]
    cfg.write_text(json.dumps(config))
    assert plan() == first
    assert '"img"' in first
