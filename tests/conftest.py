"""Shared fixtures: small Parquet token datasets written with pyarrow, and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
# The benchmark harness (benchmarks/harness, not in the wheel) is imported from here.
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def doc_tokens(source: int, doc: int, length: int) -> List[int]:
    """Tokens that say where they came from: source, document and offset."""
    base = source * 10_000_000 + doc * 1000
    return [base + k for k in range(length)]


def write_docs(path: Path, docs: List[List[int]], row_group_size: int = 8,
               column: str = "input_ids", value_type=pa.int32()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({column: pa.array(docs, type=pa.list_(value_type))})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def make_source(root: Path, name: str, source_index: int, lengths: List[int],
                files: int = 2, row_group_size: int = 8) -> Dict[int, List[int]]:
    """Writes a source as `files` Parquet files; returns {doc id: tokens}."""
    docs = {i: doc_tokens(source_index, i, n) for i, n in enumerate(lengths)}
    ids = sorted(docs)
    per_file = (len(ids) + files - 1) // files
    for f in range(files):
        chunk = ids[f * per_file:(f + 1) * per_file]
        write_docs(root / name / f"part-{f:03d}.parquet", [docs[i] for i in chunk],
                   row_group_size=row_group_size)
    return docs


@pytest.fixture
def small_dataset(tmp_path: Path):
    """Two sources with seeded lengths (some longer than seq_len=32) and a config dict."""
    rng = np.random.default_rng(7)
    web = make_source(tmp_path, "web", 0, [int(x) for x in rng.integers(1, 80, size=60)])
    code = make_source(tmp_path, "code", 1, [int(x) for x in rng.integers(1, 40, size=40)])
    config = {
        "seed": 11,
        "topology": {"dp": 2, "tp": 1, "pp": 1, "cp": 1},
        "batch": {"global_tokens": 2 * 2 * 32, "seq_len": 32, "micro_batch_size": 1},
        "balance": {"cost": {"attn": 1.0, "linear": 32}, "algorithm": "karmarkar_karp"},
        "sources": [
            {"name": "web", "path": str(tmp_path / "web" / "*.parquet"),
             "tokens_column": "input_ids", "weight": 0.7, "shuffle_window": 16},
            {"name": "code", "path": str(tmp_path / "code"),
             "tokens_column": "input_ids", "weight": 0.3, "shuffle_window": 16},
        ],
    }
    return {"root": tmp_path, "config": config, "docs": {0: web, 1: code}}


def encoded_image(rng, width: int, height: int, fmt: str = "PNG") -> bytes:
    """A seeded image of a few coloured shapes, as in icons and figures, encoded as `fmt`
    (PNG or JPEG)."""
    import io

    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1, y1 = min(width - 1, x0 + rng.randrange(1, 40)), min(height - 1, y0 + 20)
        draw.rectangle([x0, y0, max(x0, x1), max(y0, y1)],
                       fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    img.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def write_config(path: Path, config: dict) -> Path:
    path.write_text(json.dumps(config, indent=1))
    return path


def braid_cli(*args: str, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """Runs the `braid` command as a user would, capturing its output."""
    return subprocess.run([sys.executable, "-m", "braid.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def assert_plan_resumes(config_path: Path, state: Path, steps: int, split: int) -> str:
    """`braid plan` over `steps` equals its first `split` steps, then the rest from the
    state they wrote; returns the whole plan's output."""
    whole = braid_cli("plan", config_path, "--steps", steps)
    assert whole.returncode == 0, whole.stderr
    first = braid_cli("plan", config_path, "--steps", split, "--state-out", state)
    rest = braid_cli("plan", config_path, "--steps", steps - split, "--state-in", state)
    assert first.stdout + rest.stdout == whole.stdout
    return whole.stdout


def assert_loader_resumes(config: dict, rank: int, n: int, split: int) -> None:
    """`braid.Loader` resumed from its state after `split` micro-batches gives the next
    ones of an uninterrupted loader, up to `n` (input_ids compared)."""
    import braid
    import torch

    def take(loader, k):
        it = iter(loader)
        return [next(it) for _ in range(k)]

    reference = take(braid.Loader(config, rank=rank, world_size=2), n)
    loader = braid.Loader(config, rank=rank, world_size=2)
    take(loader, split)
    resumed = braid.Loader(config, rank=rank, world_size=2)
    resumed.load_state_dict(loader.state_dict())
    got = take(resumed, n - split)
    assert len(got) == n - split
    for a, b in zip(got, reference[split:]):
        assert torch.equal(a["input_ids"], b["input_ids"])


def assert_resumes_batch_for_batch(config: dict, n: int, split: int, rank: int = 0,
                                   world_size: int = 1) -> None:
    """`braid.Loader` resumed from its state after `split` micro-batches gives the next
    ones of an uninterrupted loader, up to `n`, every tensor bit for bit."""
    import braid

    want = take_batches([braid.Loader(config, rank=rank, world_size=world_size)], n)[0]
    first = braid.Loader(config, rank=rank, world_size=world_size)
    take_batches([first], split)
    resumed = braid.Loader(config, rank=rank, world_size=world_size)
    resumed.load_state_dict(first.state_dict())
    assert_same_batches(take_batches([resumed], n - split)[0], want[split:])


def assert_every_token_once(config: dict, docs: Dict[int, List[int]], span: int,
                            seq_len: int = 256) -> None:
    """Two ranks' steps of `braid.Loader` (one sequence of `seq_len` per micro-batch)
    inside the first epoch hold every token at most once, each piece a run of its
    document as the format's own reader gave it: `docs[d]`, whose tokens are consecutive
    and start in `[d * span, (d + 1) * span)`."""
    import braid

    steps = sum(len(d) for d in docs.values()) // seq_len - 1

    seen: Dict[int, int] = {}
    for rank in (0, 1):
        loader = braid.Loader(config, rank=rank, world_size=2)
        it = iter(loader)
        for _ in range(steps * loader.micro_batches_per_step):
            batch = next(it)
            ids = batch["input_ids"][0].tolist()
            cu = batch["cu_seqlens"].tolist()
            for a, b in zip(cu, cu[1:]):
                doc = docs[ids[a] // span]
                first = ids[a] - doc[0]
                assert ids[a:b] == doc[first:first + b - a]
            for t in ids:
                seen[t] = seen.get(t, 0) + 1
    assert sum(seen.values()) == steps * seq_len and set(seen.values()) == {1}


def take_batches(loaders, n: int, on_micro_batch=None) -> List[List[Dict]]:
    """n micro-batches per loader (NumPy copies), taken in turn as trainer ranks in
    lockstep would; `on_micro_batch(i)` runs before the i-th round."""
    its = [iter(l) for l in loaders]
    out: List[List[Dict]] = [[] for _ in loaders]
    for i in range(n):
        if on_micro_batch is not None:
            on_micro_batch(i)
        for k, it in enumerate(its):
            out[k].append({name: t.numpy().copy() for name, t in next(it).items()})
    return out


def assert_same_batches(a: List[Dict], b: List[Dict]) -> None:
    """Every micro-batch holds the same tensors, bit for bit."""
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert sorted(x) == sorted(y), i
        for name in x:
            assert x[name].dtype == y[name].dtype, (i, name)
            np.testing.assert_array_equal(x[name], y[name], err_msg=f"{i} {name}")


# A trainer's loop in a fresh process: braid.Loader of one rank, the digest of each of its
# first n micro-batches, and the folders of the node's shared builds seen while it lived.
_RANK_SCRIPT = textwrap.dedent("""
    import glob, hashlib, json, os, sys
    import braid
    config = sys.argv[1]
    rank, world, n = (int(a) for a in sys.argv[2:5])
    loader = braid.Loader(config, rank=rank, world_size=world)
    digests = []
    for batch in loader:
        h = hashlib.sha256()
        for key in sorted(batch):
            h.update(key.encode() + batch[key].numpy().tobytes())
        digests.append(h.hexdigest())
        if len(digests) == n:
            break
    builds = glob.glob(f"/dev/shm/braid-builds-{os.getuid()}/*/*.build")
    loader.close()
    print(json.dumps({"digests": digests,
                      "build_folders": sorted({os.path.dirname(p) for p in builds})}))
""")


def start_ranks(config: Path, world: int, n: int,
                env: Optional[Dict[str, str]] = None) -> List[Dict]:
    """`world` rank processes started at once, as a launcher starts a node's ranks, each
    a fresh braid.Loader taking n micro-batches; per rank (in order) its digests,
    build_folders and stderr. `env` replaces the environment (default: this one's)."""
    procs = [subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, str(config), str(rank),
                               str(world), str(n)], text=True, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for rank in range(world)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    return [dict(json.loads(out), stderr=err) for out, err in outs]
