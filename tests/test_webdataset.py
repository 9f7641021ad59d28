"""WebDataset tar shards: shards written by the webdataset package's TarWriter, read
through Braid and checked against the webdataset package's own reader on the same files:
the samples each delivers, resume at (shard, sample), loaders, an image-caption source,
`braid inspect`, and errors naming the shard, the sample's key and the member."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

import braid
from braid import _core
from conftest import (assert_every_token_once, assert_loader_resumes, assert_plan_resumes,
                      braid_cli, write_config)

try:
    import webdataset as wds
except ImportError:  # a declared dev dependency: its absence fails the tests
    pytest.fail("webdataset is not installed (requirements-dev.txt)", pytrace=False)

SPAN = 1000


def write_shard(path: Path, samples: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as sink:
        for s in samples:
            sink.write(s)
    return path


def samples_of(shard: int, n: int, rng) -> list:
    """Samples whose token lists say where they came from, beside a caption and a class."""
    out = []
    for r in range(n):
        length = int(rng.integers(1, 60))
        base = (shard * 1000 + r) * SPAN
        out.append({"__key__": f"s{shard:02d}/{r:06d}",
                    "json": {"input_ids": list(range(base, base + length)),
                             "meta": {"score": float(rng.random())}},
                    "txt": f"sample {r} of shard {shard}", "cls": r % 7})
    return out


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(8)
    shards = {}
    for s in range(4):
        recs = samples_of(s, int(rng.integers(20, 60)), rng)
        shards[s] = (write_shard(tmp_path / "data" / f"shard-{s:04d}.tar", recs), recs)
    return tmp_path / "data", shards


def config_for(path, **extra) -> dict:
    return {
        "seed": 5,
        "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 64, "seq_len": 64},
        "sources": [{"name": "w", "path": str(path), "tokens_column": "json:input_ids",
                     "shuffle_window": 16, **extra}],
    }


def reference(path: Path) -> list:
    """The token lists the webdataset package reads from one shard, in order."""
    dataset = wds.WebDataset(str(path), shardshuffle=False).decode()
    return [s["json"]["input_ids"] for s in dataset]


def test_every_sample_arrives_once_as_webdataset_reads_it(corpus):
    folder, shards = corpus
    ref = {}
    for s, (path, recs) in shards.items():
        lists = reference(path)
        assert lists == [r["json"]["input_ids"] for r in recs]
        for lst in lists:
            ref[lst[0] // SPAN] = lst
    config = config_for(folder)
    assert_every_token_once(config, ref, SPAN)


def test_resume_loaders_and_a_glob_keep_the_plan(corpus, tmp_path):
    folder, _ = corpus
    path = write_config(tmp_path / "c.json", config_for(folder))
    state = tmp_path / "s.json"
    whole = assert_plan_resumes(path, state, 20, 12)
    sharded = write_config(tmp_path / "l.json", config_for(folder, loaders=2))
    assert braid_cli("plan", sharded, "--steps", 20).stdout == whole
    glob = write_config(tmp_path / "g.json", config_for(str(folder / "shard-*.tar")))
    assert braid_cli("plan", glob, "--steps", 20).stdout == whole
    named = write_config(tmp_path / "f.json", config_for(folder, format="webdataset"))
    assert braid_cli("plan", named, "--steps", 20).stdout == whole
    # The counts kept in runtime.length_cache give the same plan.
    kept = config_for(folder)
    kept["runtime"] = {"length_cache": str(tmp_path / "counts")}
    for _ in range(2):
        assert braid_cli("plan", write_config(tmp_path / "k.json", kept),
                         "--steps", 20).stdout == whole
    assert list((tmp_path / "counts").iterdir())
    # Small shuffle windows in bytes cut shards into blocks of samples; resuming inside a
    # shard reopens it at (shard, sample).
    small = config_for(folder, shuffle_window_bytes=2048)
    assert_plan_resumes(write_config(tmp_path / "b.json", small), state, 20, 9)
    assert_loader_resumes(small, rank=0, n=10, split=3)


def test_a_missing_member_names_the_shard_sample_and_member(tmp_path):
    rng = np.random.default_rng(1)
    recs = samples_of(0, 30, rng)
    del recs[17]["json"]
    path = write_shard(tmp_path / "x.tar", recs)
    failing = write_config(tmp_path / "f.json", config_for(path))
    result = braid_cli("run", failing, "--steps", 4)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert str(path) in result.stderr and "sample 's00/000017'" in result.stderr
    assert "no member 'json'" in result.stderr and "tokens_column" in result.stderr
    skipping = write_config(tmp_path / "s.json", config_for(path, on_error="skip"))
    report = tmp_path / "report"
    result = braid_cli("run", skipping, "--steps", 4, "--report", report)
    assert result.returncode == 0, result.stderr
    assert json.loads((report / "report.json").read_text())["skipped"]["w"] == 1


def test_a_corrupt_shard_fails_naming_it_or_is_skipped(tmp_path):
    rng = np.random.default_rng(2)
    write_shard(tmp_path / "d" / "a.tar", samples_of(0, 30, rng))
    bad = write_shard(tmp_path / "d" / "b.tar", samples_of(1, 30, rng))
    bad.write_bytes(bad.read_bytes()[:5000])  # truncated inside a member
    result = braid_cli("plan", write_config(tmp_path / "c.json", config_for(tmp_path / "d")),
                       "--steps", 2)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert str(bad) in result.stderr and "not a readable tar" in result.stderr
    assert "on_error: skip" in result.stderr
    skipping = write_config(tmp_path / "s.json", config_for(tmp_path / "d", on_error="skip"))
    result = braid_cli("plan", skipping, "--steps", 2)
    assert result.returncode == 0, result.stderr
    assert all(d["file"] == 0 for line in result.stdout.splitlines()
               for r in json.loads(line)["ranks"] for m in r["micro_batches"]
               for d in m["docs"])


def test_inspect_reads_the_shards(corpus):
    folder, shards = corpus
    result = braid_cli("inspect", folder, "--column", "json:input_ids", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["rows"] == sum(len(recs) for _, recs in shards.values())
    assert "cls, json, txt" in info["schema"]
    assert "WebDataset" in braid_cli("inspect", "--help").stdout


IMAGE_TOKEN = 1000
CAPTION = "the quick brown fox reads tar shards."


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    import random

    rng = random.Random(1)
    words = CAPTION.rstrip(".").split() + "data loader mixes many sources".split()
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) + "."
            for _ in range(300)]
    return _core.train_tiny_sentencepiece(text, str(tmp_path_factory.mktemp("spm") / "t"), 60)


def test_an_image_caption_shard_feeds_an_image_source(tmp_path, model):
    from PIL import Image

    def encoded(colour, fmt):
        out = io.BytesIO()
        Image.new("RGB", (28, 42), colour).save(out, format=fmt, quality=95)
        return out.getvalue()

    colours = [(200, 100, 50), (0, 0, 255), (255, 255, 255), (10, 20, 30)] * 3
    samples = []
    for i, c in enumerate(colours):
        # PNG and JPEG members, and one sample with both: the list's order decides.
        s = {"__key__": f"{i:04d}", "txt": CAPTION}
        if i % 2 == 0 or i == 3:
            s["png"] = encoded(c, "PNG")
        if i % 2 == 1:
            s["jpg"] = encoded(c, "JPEG")
        samples.append(s)
    write_shard(tmp_path / "img" / "000.tar", samples)
    caption = list(_core.sentencepiece_tokenize(model, CAPTION))
    doc = [IMAGE_TOKEN] * 6 + caption + [2]
    config = {
        "seed": 5, "topology": {"dp": 1},
        "batch": {"global_tokens": 2 * 2 * len(doc), "seq_len": 2 * len(doc)},
        "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
        "sources": [{"name": "captions", "path": str(tmp_path / "img"),
                     "image_column": ["png", "jpg"], "text_column": "txt",
                     "shuffle_window": 4,
                     "image": {"patch_size": 14, "image_token_id": IMAGE_TOKEN}}],
    }
    norm = [[(v / 255.0 - 0.5) / 0.5 for v in c] for c in colours]
    loader = braid.Loader(config, rank=0, world_size=1)
    found = set()
    for batch in itertools.islice(iter(loader), 6):
        assert batch["input_ids"][0].tolist() == doc + doc
        assert batch["image_grid"].tolist() == [[3, 2], [3, 2]]
        pixels = batch["pixel_values"].numpy().reshape(2, 6, 3, 14 * 14)
        for image in pixels:
            match = [k for k, c in enumerate(norm)
                     if np.allclose(image[:, :, 7], np.array(c)[None, :], atol=0.05)]
            assert match, image[0, :, 0]
            found.add(tuple(colours[match[0]]))
    assert found == set(colours)
