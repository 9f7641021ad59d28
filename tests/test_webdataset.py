"""WebDataset tar shards: shards written by the webdataset package's TarWriter, read
through Braid and checked against the webdataset package's own reader on the same files:
the samples each delivers, resume at (shard, sample), loaders, an image-caption source,
`braid inspect`, and errors naming the shard, the sample's key and the member. Folders
prepared by Megatron-Energon (`energon prepare`, run here in-process) give the stream of
the same shards without the index, open and resume without reading the samples before,
and a stale index is a warning naming the shard."""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import tarfile
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
if importlib.util.find_spec("megatron.energon") is None:  # writes the Energon indexes
    pytest.fail("megatron-energon is not installed (requirements-nodeps.txt)",
                pytrace=False)

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


def test_a_user_transform_gets_the_members_bytes(corpus):
    """A user transform over WebDataset members gets each named member's bytes (a JSON
    member's too, undecoded, as the webdataset package gives it): token lists taken from
    the JSON bytes give the batches of `tokens_column: json:input_ids`, and the text
    member beside them is the same sample's."""
    from conftest import assert_same_batches, take_batches

    folder, _ = corpus
    calls = []

    def ids_of(txt, raw):
        assert isinstance(txt, bytes) and isinstance(raw, bytes), (txt, raw)
        ids = json.loads(raw)["input_ids"]
        _, row, _, _, shard = txt.decode().split()  # "sample R of shard S"
        assert ids[0] == (int(shard) * 1000 + int(row)) * SPAN, (txt, ids[:2])
        calls.append(row)
        return ids

    config = config_for(folder)
    del config["sources"][0]["tokens_column"]
    config["sources"][0]["transform"] = {"python": "wds_ids", "columns": ["txt", "json"]}
    braid.register_transform("wds_ids", ids_of)
    try:
        got = take_batches([braid.Loader(config, r, 2) for r in range(2)], 8)
    finally:
        braid.unregister_transform("wds_ids")
    want = take_batches([braid.Loader(config_for(folder), r, 2) for r in range(2)], 8)
    for rank in range(2):
        assert_same_batches(got[rank], want[rank])
    assert calls


def test_a_user_transforms_json_fields_arrive_as_json_gives_them(corpus, tmp_path):
    """A field of a JSON member named as a transform's column (`json:input_ids`) is typed
    by the first samples, as a JSON Lines field is, and arrives as json.loads gives it:
    a list of ints, a dict; the batches are those of `tokens_column: json:input_ids`."""
    from conftest import assert_same_batches, take_batches

    folder, _ = corpus
    seen = []

    def ids_of(ids, meta):
        assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), ids
        assert isinstance(meta, dict) and isinstance(meta["score"], float), meta
        seen.append(len(ids))
        return ids

    config = config_for(folder)
    del config["sources"][0]["tokens_column"]
    config["sources"][0]["transform"] = {"python": "wds_fields",
                                         "columns": ["json:input_ids", "json:meta"]}
    braid.register_transform("wds_fields", ids_of)
    try:
        got = take_batches([braid.Loader(config, r, 2) for r in range(2)], 8)
    finally:
        braid.unregister_transform("wds_fields")
    want = take_batches([braid.Loader(config_for(folder), r, 2) for r in range(2)], 8)
    for rank in range(2):
        assert_same_batches(got[rank], want[rank])
    assert seen
    # A field no first sample holds: a config error naming the key, from the CLI.
    config["sources"][0]["transform"]["columns"] = ["json:missing"]
    config["sources"][0]["transform"]["python"] = "json:dumps"
    result = braid_cli("plan", write_config(tmp_path / "c.json", config), "--steps", "1")
    assert result.returncode == 2, result.stderr
    assert "sources[0].transform.columns[0]" in result.stderr, result.stderr
    assert "field 'missing' has no value in the first records" in result.stderr


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
    bad.write_bytes(bad.read_bytes()[:12000])  # truncated inside a member of sample 2
    result = braid_cli("plan", write_config(tmp_path / "c.json", config_for(tmp_path / "d")),
                       "--steps", 2)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert str(bad) in result.stderr and "not a readable tar" in result.stderr
    assert "on_error: skip" in result.stderr
    skipping = write_config(tmp_path / "s.json", config_for(tmp_path / "d", on_error="skip"))
    result = braid_cli("plan", skipping, "--steps", 6)
    assert result.returncode == 0, result.stderr
    # Under skip the cut shard yields its whole samples before the cut, each ended by the
    # next sample's header (as Python's tarfile lists the members), and no other.
    keys = []
    try:
        with tarfile.open(bad, mode="r|") as tar:
            for member in tar:
                key = member.name.split(".")[0]
                if not keys or keys[-1] != key:
                    keys.append(key)
    except (tarfile.TarError, EOFError, OSError):
        pass
    whole = len(keys) - 1
    assert whole >= 1, keys
    rows = {d["row"] for line in result.stdout.splitlines()
            for r in json.loads(line)["ranks"] for m in r["micro_batches"]
            for d in m["docs"] if d["file"] == 1}
    assert rows <= set(range(whole)), (rows, whole)
    assert str(bad) in result.stderr, result.stderr
    assert f"the {whole} rows before the damage" in result.stderr, result.stderr


def test_inspect_reads_the_shards(corpus):
    folder, shards = corpus
    result = braid_cli("inspect", folder, "--column", "json:input_ids", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["rows"] == sum(len(recs) for _, recs in shards.values())
    assert "cls, json, txt" in info["schema"]
    assert "no Megatron-Energon index" in info["schema"]
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


# --- Megatron-Energon's index (.nv-meta, *.tar.idx) -----------------------------------

def energon_prepare(folder: Path) -> None:
    """`energon prepare FOLDER`, non-interactive (its command, in this process): every
    shard in the train split."""
    from megatron.energon.tools.prepare import command

    command.main([str(folder), "--non-interactive", "--split-ratio", "1,0,0",
                  "--sample-type", "CrudeWebdataset", "--num-workers", "1",
                  "--no-progress", "--force-overwrite"], prog_name="energon prepare",
                 standalone_mode=False)


def index_config(path, **extra) -> dict:
    # Blocks of a few samples and windows of a few blocks: a shard's units depend on the
    # bytes the counts give.
    return config_for(path, shuffle_window=8, shuffle_window_bytes=8192, **extra)


@pytest.fixture
def prepared(tmp_path):
    """The same seeded shards in `plain` and in `prep`, which `energon prepare` indexed."""
    rng = np.random.default_rng(11)
    shards = [samples_of(s, int(rng.integers(40, 90)), rng) for s in range(3)]
    for name in ("plain", "prep"):
        for s, recs in enumerate(shards):
            write_shard(tmp_path / name / f"shard-{s:04d}.tar", recs)
    energon_prepare(tmp_path / "prep")
    assert (tmp_path / "prep" / ".nv-meta" / ".info.json").exists()
    return tmp_path / "plain", tmp_path / "prep", shards


def damage_headers(shard: Path, keys) -> None:
    """Overwrites the header checksum of every member of the samples `keys`: no tar reader
    gets past them."""
    data = bytearray(shard.read_bytes())
    for key in keys:
        at = data.find(f"{key}.".encode())
        assert at >= 0, key
        while at >= 0:
            start = at - at % 512
            data[start + 148:start + 155] = b"9999999"
            at = data.find(f"{key}.".encode(), at + 1)
    shard.write_bytes(bytes(data))


def test_an_energon_index_gives_the_stream_without_it(prepared, tmp_path):
    plain, prep, shards = prepared
    plans = [braid_cli("plan", write_config(tmp_path / f"{k}.json", index_config(folder)),
                       "--steps", 30) for k, folder in (("a", plain), ("b", prep))]
    assert plans[0].returncode == 0 and plans[1].returncode == 0, plans[1].stderr
    assert plans[1].stdout == plans[0].stdout
    assert "Energon" not in plans[1].stderr  # nothing disagreed
    inspected = braid_cli("inspect", prep, "--json", "--column", "json:input_ids")
    assert inspected.returncode == 0, inspected.stderr
    info = json.loads(inspected.stdout)
    assert "Megatron-Energon index: 3 of 3 shards listed in" in info["schema"], info
    assert info["rows"] == sum(len(recs) for recs in shards)
    for rank in (0, 1):
        a = list(itertools.islice(iter(braid.Loader(index_config(plain), rank=rank,
                                                    world_size=2)), 12))
        b = list(itertools.islice(iter(braid.Loader(index_config(prep), rank=rank,
                                                    world_size=2)), 12))
        for x, y in zip(a, b, strict=True):
            assert x["input_ids"].tolist() == y["input_ids"].tolist()
    assert_loader_resumes(index_config(prep), rank=1, n=10, split=4)
    # Every sample, as the webdataset package reads the shards.
    ref = {lst[0] // SPAN: lst for path in sorted(prep.glob("*.tar"))
           for lst in reference(path)}
    assert_every_token_once(config_for(prep, shuffle_window_bytes=8192), ref, SPAN)


def test_opening_and_resuming_inside_a_shard_read_no_sample_before(tmp_path):
    rng = np.random.default_rng(12)
    recs = samples_of(0, 240, rng)
    write_shard(tmp_path / "prep" / "shard-0000.tar", recs)
    energon_prepare(tmp_path / "prep")
    config = index_config(tmp_path / "prep")

    def take(loader, k):
        it = iter(loader)
        return [next(it)["input_ids"][0].tolist() for _ in range(k)]

    split, n = 24, 8
    reference = take(braid.Loader(config, rank=0, world_size=2), split + n)
    loader = braid.Loader(config, rank=0, world_size=2)
    take(loader, split)
    state = loader.state_dict()
    # The samples before the rest's first window (less a window and a block: what the
    # resumed loader may read, and the sample its block is entered at) lose their
    # member headers, so a pass over them would fail.
    rows = [t // SPAN % 1000 for ids in reference[split:] for t in ids if t > 0]
    assert max(rows) < len(recs) and all(r > 0 for r in rows)  # within the first epoch
    before = min(rows) - 3 * 8
    assert before >= 60, before
    damage_headers(tmp_path / "prep" / "shard-0000.tar",
                   [f"s00/{r:06d}" for r in range(before)])
    resumed = braid.Loader(config, rank=0, world_size=2)  # opens from the index alone
    resumed.load_state_dict(state)
    assert take(resumed, n) == reference[split:]
    # Without the index the damaged shard does not open.
    (tmp_path / "prep" / ".nv-meta").rename(tmp_path / "nv-meta-aside")
    unindexed = braid_cli("plan", write_config(tmp_path / "c.json", config), "--steps", 1)
    assert unindexed.returncode == 3 and "not a readable tar" in unindexed.stderr


def test_a_stale_energon_index_is_a_warning_naming_the_shard(prepared, tmp_path):
    plain, prep, shards = prepared
    rng = np.random.default_rng(13)
    # A shard added after `energon prepare`, one rewritten with more samples, and one
    # whose .tar.idx lost its last offsets.
    added, longer = samples_of(7, 25, rng), shards[1] + samples_of(8, 5, rng)
    for folder in (plain, prep):
        write_shard(folder / "shard-0007.tar", added)
        write_shard(folder / "shard-0001.tar", longer)
    idx = prep / "shard-0002.tar.idx"
    idx.write_bytes(idx.read_bytes()[:-16])
    plans = [braid_cli("plan", write_config(tmp_path / f"{k}.json", index_config(folder)),
                       "--steps", 20) for k, folder in (("a", plain), ("b", prep))]
    assert plans[1].returncode == 0, plans[1].stderr
    assert plans[1].stdout == plans[0].stdout
    log = plans[1].stderr
    assert (f"{prep}/.nv-meta/.info.json does not list 1 of the source's shards "
            f"({prep}/shard-0007.tar") in log
    assert f"{prep}/shard-0001.tar: its Energon index" in log
    assert "does not end at the last offset" in log
    assert f"{prep}/shard-0002.tar: its Energon index" in log
    assert f"{idx}: it holds {len(shards[2]) - 1} offsets" in log
    assert "shard-0000.tar" not in log


def test_an_energon_index_on_s3_is_read_there_and_gives_the_local_stream(prepared,
                                                                          tmp_path):
    """The prepared folder on the loopback S3 server: its index is read from there (its
    info file and the .tar.idx of a shard entered inside), and every rank's tokens,
    resumed inside a shard too, are those of the local folder without the index."""
    from remote_fixtures import S3_BUCKET, s3_server_running

    plain, prep, _ = prepared
    with s3_server_running(tmp_path / "requests.jsonl") as server:
        server.upload_tree(prep, "prep")
        server.start_counting()
        remote = index_config(f"s3://{S3_BUCKET}/prep",
                              storage={"endpoint": server.url, "region": "us-east-1"})
        for rank in (0, 1):
            a = list(itertools.islice(iter(braid.Loader(remote, rank=rank,
                                                        world_size=2)), 12))
            b = list(itertools.islice(iter(braid.Loader(index_config(plain), rank=rank,
                                                        world_size=2)), 12))
            for x, y in zip(a, b, strict=True):
                assert x["input_ids"].tolist() == y["input_ids"].tolist()
        assert server.gets("prep/.nv-meta/.info.json") > 0
        assert_loader_resumes(remote, rank=1, n=10, split=4)
        idx_reads = sum(server.gets(f"prep/shard-{s:04d}.tar.idx") for s in range(3))
        assert idx_reads > 0, "a resume inside a shard enters it through its .tar.idx"
