"""The image-caption transform end to end through braid.Loader: placeholder tokens,
pixel_values / image_grid, loss mask, and undecodable images (fail or counted skip)."""

from __future__ import annotations

import itertools
import json
import os
import random
import struct
import uuid
import zlib
from pathlib import Path
from typing import Dict, List

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import braid
from braid import _core

IMAGE_TOKEN = 1000  # outside the tiny vocabulary, so it never collides with a caption id
CAPTION = "the quick brown fox reads parquet files."


def png(width: int, height: int, rgb) -> bytes:
    """A solid-colour 8-bit RGB PNG, written by hand (PNG is simple)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    row = b"\x00" + bytes(rgb) * width  # filter 0 per scanline
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(row * height))
            + chunk(b"IEND", b""))


def norm(v: int) -> float:
    return (v / 255.0 - 0.5) / 0.5


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    rng = random.Random(1)
    words = CAPTION.rstrip(".").split() + "data loader mixes many sources".split()
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) + "."
            for _ in range(300)]
    prefix = tmp_path_factory.mktemp("spm") / "tok"
    return _core.train_tiny_sentencepiece(text, str(prefix), 60)


def config(model: str, path: Path, seq_len: int, **source) -> Dict:
    src = {"name": "captions", "path": str(path), "image_column": "image",
           "text_column": "caption", "shuffle_window": 4, "workers": 2,
           "image": {"patch_size": 14, "image_token_id": IMAGE_TOKEN}}
    src.update(source)
    return {
        "seed": 5,
        "topology": {"dp": 1, "tp": 1, "pp": 1, "cp": 1},
        "batch": {"global_tokens": 2 * seq_len, "seq_len": seq_len, "micro_batch_size": 1},
        "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
        "sources": [src],
    }


def test_loader_batches_carry_whole_images(tmp_path: Path, model: str):
    # 28 wide x 42 high -> a 3 x 2 grid of 14-pixel patches. Every document has the same
    # length D and seq_len = 2 * D, so the planner never cuts one: images arrive whole.
    colours = [(200, 100, 50), (0, 0, 255), (255, 255, 255), (10, 20, 30)] * 4
    images = [png(28, 42, c) for c in colours]
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()),
                             "caption": [CAPTION] * len(images)}),
                   tmp_path / "c.parquet", row_group_size=4)
    caption = list(_core.sentencepiece_tokenize(model, CAPTION))
    doc = [IMAGE_TOKEN] * 6 + caption + [2]
    loader = braid.Loader(config(model, tmp_path / "c.parquet", 2 * len(doc)),
                          rank=0, world_size=1)
    expected = [[norm(v) for v in c] for c in colours]
    batches = 0
    for batch in itertools.islice(iter(loader), 6):
        batches += 1
        ids = batch["input_ids"][0].tolist()
        labels = batch["labels"][0].tolist()
        mask = batch["loss_mask"][0].tolist()
        assert ids == doc + doc  # placeholders, then the caption and EOS
        pixels = batch["pixel_values"].numpy()
        grid = batch["image_grid"].numpy()
        assert pixels.dtype == np.float32 and grid.dtype == np.int32
        assert pixels.shape == (ids.count(IMAGE_TOKEN), 3 * 14 * 14)
        assert grid.tolist() == [[3, 2], [3, 2]]
        assert int((grid[:, 0] * grid[:, 1]).sum()) == pixels.shape[0]
        for image in pixels.reshape(2, 6, 3, 14 * 14):  # [image][patch][channel][pixel]
            match = [c for c in expected if np.allclose(image[0, :, 0], c, atol=1e-5)]
            assert match, image[0, :, 0]
            assert np.allclose(image, np.array(match[0], np.float32)[None, :, None],
                               atol=1e-5)
        for t in range(len(ids)):  # no loss where the target is a placeholder
            if labels[t] == IMAGE_TOKEN:
                assert mask[t] == 0.0
            elif labels[t] != -100:
                assert mask[t] == 1.0
    assert batches == 6


def test_several_images_per_row_arrive_in_list_order(tmp_path: Path, model: str):
    # A list<binary> column: [28x42 red, 14x28 blue] per row -> 6 + 2 placeholders.
    red, blue = (255, 0, 0), (0, 0, 255)
    rows = [[png(28, 42, red), png(14, 28, blue)]] * 8
    pq.write_table(pa.table({"image": pa.array(rows, pa.list_(pa.binary())),
                             "caption": [CAPTION] * len(rows)}),
                   tmp_path / "m.parquet", row_group_size=4)
    caption = list(_core.sentencepiece_tokenize(model, CAPTION))
    doc = [IMAGE_TOKEN] * 8 + caption + [2]
    loader = braid.Loader(config(model, tmp_path / "m.parquet", 2 * len(doc)),
                          rank=0, world_size=1)
    for batch in itertools.islice(iter(loader), 3):
        assert batch["input_ids"][0].tolist() == doc + doc
        assert batch["image_grid"].tolist() == [[3, 2], [2, 1], [3, 2], [2, 1]]
        pixels = batch["pixel_values"].numpy().reshape(16, 3, 14 * 14)
        colours = [red] * 6 + [blue] * 2
        for patch, colour in zip(pixels, colours + colours):
            assert np.allclose(patch, np.array([norm(v) for v in colour],
                                               np.float32)[:, None], atol=1e-5)


def test_hugging_face_image_features_read_as_their_bytes(tmp_path: Path, model: str):
    """A column of the `datasets` library's Image feature (struct<bytes, path>), alone and
    in a Sequence, written by `datasets` to Parquet and by save_to_disk: the same batches
    as the same images in a plain binary column laid out alike. An Image that holds a
    path and no bytes is a null that says so."""
    datasets = pytest.importorskip("datasets")  # a dev dependency
    from conftest import assert_same_batches, take_batches

    sizes = [(28, 42), (14, 28), (42, 14), (28, 28)] * 4
    images = [png(w, h, (15 * i, 255 - 15 * i, 7 * i)) for i, (w, h) in enumerate(sizes)]
    captions = [" ".join(CAPTION.split()[:3 + i % 5]) for i in range(len(images))]
    image = datasets.Image()
    layouts = {
        "single": ({"image": images, "caption": captions}, image),
        "sequence": ({"image": [[im, images[-1 - i]] for i, im in enumerate(images)],
                      "caption": captions}, datasets.Sequence(image)),
    }
    for name, (columns, feature) in layouts.items():
        plain = datasets.Dataset.from_dict(columns)  # binary, or a list of binary
        hf = plain.cast_column("image", feature)
        assert "struct" in str(hf.data.schema.field("image").type), hf.data.schema
        got = {}
        for kind, ds in (("plain", plain), ("hf", hf)):
            ds.to_parquet(str(tmp_path / f"{name}-{kind}.parquet"), batch_size=4)
            ds.save_to_disk(str(tmp_path / f"{name}-{kind}"), max_shard_size="1MB")
            for where in (f"{name}-{kind}.parquet", f"{name}-{kind}"):
                cfg = config(model, tmp_path / where, 256)
                got[(kind, where.endswith(".parquet"))] = take_batches(
                    [braid.Loader(cfg, rank=0, world_size=1)], 6)[0]
        for parquet in (True, False):
            assert_same_batches(got[("hf", parquet)], got[("plain", parquet)])
        assert got[("hf", True)][0]["image_grid"].shape[0] >= (2 if name == "sequence"
                                                               else 1)
    # An Image kept as a path (as `datasets` holds files it has not embedded), its bytes
    # null: a null row naming why.
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = [{"bytes": images[0], "path": None}, {"bytes": None, "path": "x.png"}]
    pq.write_table(pa.table({"image": pa.array(rows, struct), "caption": captions[:2]}),
                   tmp_path / "path.parquet")
    with pytest.raises(braid.DataError, match="Image struct without bytes"):
        for _ in itertools.islice(iter(braid.Loader(
                config(model, tmp_path / "path.parquet", 256), rank=0, world_size=1)), 4):
            pass


def test_json_lines_images_by_path_or_data_uri_read_as_their_bytes(tmp_path: Path,
                                                                    model: str):
    """A JSON Lines image field names its images (LLaVA-style and caption sets): a path
    relative to the records' file or to `image.folder`, a data: URI, or a list of them;
    the batches equal those of the same images in a Parquet binary column laid out
    alike. An image that is not there is an error naming the file, the record and the
    path, or a skipped record under on_error: skip."""
    import base64
    import gzip
    from conftest import assert_same_batches, take_batches

    sizes = [(28, 42), (14, 28), (42, 14), (28, 28)] * 4
    images = [png(w, h, (15 * i, 255 - 15 * i, 7 * i)) for i, (w, h) in enumerate(sizes)]
    captions = [" ".join(CAPTION.split()[:3 + i % 5]) for i in range(len(images))]
    (tmp_path / "imgs").mkdir()
    for i, im in enumerate(images):
        (tmp_path / "imgs" / f"{i}.png").write_bytes(im)
    halves = {"a": range(0, 8), "b": range(8, 16)}

    def jsonl(folder: str, image_of) -> Path:
        root = tmp_path / folder
        root.mkdir()
        for name, rows in halves.items():
            records = [{"id": i, "image": image_of(i), "caption": captions[i],
                        "meta": {"w": sizes[i][0]}} for i in rows]
            body = "".join(json.dumps(r) + "\n" for r in records)
            if name == "a":
                (root / "a.jsonl.gz").write_bytes(gzip.compress(body.encode()))
            else:
                (root / "b.jsonl").write_text(body)
        return root

    def parquet(folder: str, column) -> Path:
        root = tmp_path / folder
        root.mkdir()
        for name, rows in halves.items():
            pq.write_table(pa.table({"image": column([images[i] for i in rows]),
                                     "caption": [captions[i] for i in rows]}),
                           root / f"{name}.parquet")
        return root

    def batches(path: Path, **source) -> list:
        cfg = config(model, path, 256, **source)
        return take_batches([braid.Loader(cfg, rank=0, world_size=1)], 6)[0]

    want = batches(parquet("pq", lambda ims: pa.array(ims, pa.binary())))
    relative = jsonl("rel", lambda i: f"../imgs/{i}.png")
    assert_same_batches(batches(relative), want)
    # The same on an object store: paths relative to the records' object, or to a folder
    # named by its URI.
    from remote_fixtures import S3_BUCKET, s3_server_running

    with s3_server_running(tmp_path / "requests.jsonl") as server:
        for path in [*(tmp_path / "imgs").iterdir(), *relative.iterdir()]:
            server.client.put_object(Bucket=S3_BUCKET,
                                     Key=f"{path.parent.name}/{path.name}",
                                     Body=path.read_bytes())
        storage = {"endpoint": server.url, "region": "us-east-1"}
        assert_same_batches(batches(f"s3://{S3_BUCKET}/rel", storage=storage), want)
        image = {"patch_size": 14, "image_token_id": IMAGE_TOKEN,
                 "folder": f"s3://{S3_BUCKET}/imgs"}
        remote = batches(f"s3://{S3_BUCKET}/rel", storage=storage, image=image)
        assert_same_batches(remote, want)
        # runtime.cache: each image crosses the network once; a second job reads the
        # copies (a stat of each image, no GET).
        cached = config(model, f"s3://{S3_BUCKET}/rel", 256, storage=storage)
        cached["runtime"] = {"cache": {"dir": str(tmp_path / "cache"),
                                       "max_bytes": 1 << 30}}
        for run in range(2):
            server.start_counting()
            got = take_batches([braid.Loader(cached, rank=0, world_size=1)], 6)[0]
            assert_same_batches(got, want)
            images_read = server.downloads("imgs/")
            assert (max(images_read.values()) == 1) if run == 0 else not images_read, (
                run, images_read)
    folder = jsonl("folder", lambda i: f"{i}.png")
    image = {"patch_size": 14, "image_token_id": IMAGE_TOKEN,
             "folder": str(tmp_path / "imgs")}
    assert_same_batches(batches(folder, image=image), want)
    uri = jsonl("uri", lambda i: "data:image/png;base64," + base64.b64encode(images[i])
                .decode())
    assert_same_batches(batches(uri), want)
    def pair(i):  # two images a row: its own and another
        return [i, 15 - i % 8]

    def two(ims):  # the rows of a half, in order: image i, then pair(i)'s other
        first = images.index(ims[0])
        return pa.array([[images[j] for j in pair(first + k)] for k in range(len(ims))],
                        pa.list_(pa.binary()))

    want_two = batches(parquet("pq2", two))
    listed = jsonl("list", lambda i: [f"../imgs/{j}.png" for j in pair(i)])
    assert_same_batches(batches(listed), want_two)
    # Resumed inside a file (windows of a few images cut the files into blocks).
    from conftest import assert_resumes_batch_for_batch

    assert_resumes_batch_for_batch(config(model, relative, 256, shuffle_window_bytes=512),
                                   n=6, split=2)
    # A missing image: the file, the record and the path; skipped under on_error: skip.
    (tmp_path / "imgs" / "9.png").unlink()
    with pytest.raises(braid.DataError,
                       match=r"b\.jsonl.*row 1\b.*'\.\./imgs/9\.png'.*no image file"):
        batches(relative)
    from conftest import braid_cli, write_config

    cfg = write_config(tmp_path / "skip.json",
                       config(model, relative, 256, on_error="skip"))
    result = braid_cli("run", cfg, "--steps", 4, "--report", tmp_path / "report")
    assert result.returncode == 0, result.stderr
    skips = {line.split(" (skip")[0] for line in result.stderr.splitlines()
             if "skipped" in line}
    assert skips == {f"braid: source 'captions' skipped {relative / 'b.jsonl'} (row 1): "
                     f"field 'image': image '../imgs/9.png': no image file "
                     f"{tmp_path / 'imgs' / '9.png'}"}, result.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["skipped"]["captions"] >= 1, report["skipped"]  # once an epoch


def test_jpeg_images_decode_within_tolerance(tmp_path: Path, model: str):
    if not hasattr(_core, "encode_test_jpeg"):
        pytest.skip("this build has no JPEG test encoder")
    jpeg = _core.encode_test_jpeg(bytes((200, 100, 50)) * (28 * 42), 28, 42)
    pq.write_table(pa.table({"image": pa.array([jpeg] * 8, pa.binary()),
                             "caption": [CAPTION] * 8}), tmp_path / "j.parquet")
    caption = list(_core.sentencepiece_tokenize(model, CAPTION))
    doc_len = 6 + len(caption) + 1
    loader = braid.Loader(config(model, tmp_path / "j.parquet", 2 * doc_len),
                          rank=0, world_size=1)
    batch = next(iter(loader))
    pixels = batch["pixel_values"].numpy().reshape(-1, 3, 14 * 14)
    assert pixels.shape[0] == 12
    for c, v in enumerate((200, 100, 50)):
        assert np.abs(pixels[:, c, :] - norm(v)).max() < 0.03


def test_undecodable_image_fails_naming_the_row_or_is_skipped(tmp_path: Path, model: str):
    images: List = [png(14, 14, (i, i, i)) for i in range(8)]
    images[3] = b"not an image at all"
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()),
                             "caption": [CAPTION] * 8}),
                   tmp_path / "bad.parquet", row_group_size=4)
    caption = list(_core.sentencepiece_tokenize(model, CAPTION))
    doc_len = 1 + len(caption) + 1
    cfg = config(model, tmp_path / "bad.parquet", 2 * doc_len)
    with pytest.raises(braid.DataError,
                       match=r"bad\.parquet.*row group 0.*row 3.*cannot decode image"):
        for _ in itertools.islice(iter(braid.Loader(cfg, rank=0, world_size=1)), 8):
            pass
    cfg["sources"][0]["on_error"] = "skip"
    for batch in itertools.islice(iter(braid.Loader(cfg, rank=0, world_size=1)), 8):
        assert batch["pixel_values"].shape[0] == batch["input_ids"].eq(IMAGE_TOKEN).sum()


def test_body_that_does_not_decode_is_found_after_its_metadata(tmp_path: Path, model: str):
    # Row 5's PNG keeps only its signature and IHDR: its token count is known from the
    # header (metadata first), its pixels are not.
    images: List = [png(14, 14, (i, i, i)) for i in range(8)]
    images[5] = images[5][:33]
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()),
                             "caption": [CAPTION] * 8}),
                   tmp_path / "body.parquet", row_group_size=4)
    caption = list(_core.sentencepiece_tokenize(model, CAPTION))
    doc_len = 1 + len(caption) + 1
    cfg = config(model, tmp_path / "body.parquet", 2 * doc_len)
    parsed = _core.parse_config(json.dumps(cfg), "/")
    # Metadata only: nothing is decoded, so nothing fails; the counts equal the full path's.
    meta = _core.read_source(parsed, 0, 8, payloads=False)
    assert meta["skipped"] == 0 and meta["tokens"] == 8 * doc_len
    with pytest.raises(braid.DataError,
                       match=r"body\.parquet.*row group 1.*row 5.*cannot decode image: PNG"):
        for _ in itertools.islice(iter(braid.Loader(cfg, rank=0, world_size=1)), 8):
            pass
    # on_error: skip: the published sample keeps its place with a blank, untrained image.
    cfg["sources"][0]["on_error"] = "skip"
    full = _core.read_source(_core.parse_config(json.dumps(cfg), "/"), 0, 8)
    assert full["tokens"] == meta["tokens"] and full["skipped"] == 0
    assert full["loss_mask_ones"] == 7 * (len(caption) + 1)


def test_image_config_errors(tmp_path: Path, model: str):
    cfg = config(model, tmp_path / "x.parquet", 64)
    del cfg["sources"][0]["image"]["image_token_id"]
    with pytest.raises(ValueError, match=r"sources\[0\]\.image\.image_token_id"):
        braid.Loader(cfg, rank=0, world_size=1)
    cfg = config(model, tmp_path / "x.parquet", 64)
    del cfg["sources"][0]["text_column"]
    with pytest.raises(ValueError, match="image_column"):
        braid.Loader(cfg, rank=0, world_size=1)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")
def test_tp_peers_of_a_node_build_each_micro_batch_once(tmp_path: Path, model: str):
    # Four fresh rank processes, dp=2 x tp=2, as torchrun starts them (a run id they
    # share): each DP group's two TP peers build its micro-batches once between them (a
    # shared-memory file the other maps) and get the same views as ranks that each
    # build their own (no run id); the files go with their writers.
    from conftest import start_ranks

    rng = np.random.default_rng(3)
    rows = [{"image": png(int(rng.integers(20, 60)), int(rng.integers(20, 60)),
                          tuple(int(v) for v in rng.integers(0, 255, 3))),
             "caption": CAPTION} for _ in range(48)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=8)
    cfg = config(model, tmp_path / "c.parquet", 256)
    cfg["topology"] = {"dp": 2, "tp": 2, "pp": 1, "cp": 1}
    cfg["batch"]["global_tokens"] = 2 * 2 * 256
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(cfg))

    def node(run_id):
        env = {k: v for k, v in os.environ.items()
               if k not in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                            "SLURM_JOB_ID")}
        if run_id:
            env["TORCHELASTIC_RUN_ID"] = run_id
        return start_ranks(path, world=4, n=12, env=env)

    alone = node(None)
    shared = node(f"test-{uuid.uuid4().hex}")
    assert [r["digests"] for r in shared] == [r["digests"] for r in alone]
    # The run's own folder, where its peers' builds were (other jobs' may be there too).
    folders = ({f for r in shared for f in r["build_folders"]}
               - {f for r in alone for f in r["build_folders"]})
    assert len(folders) == 1, folders
    assert not os.path.exists(folders.pop())  # gone with the ranks, locks and all
