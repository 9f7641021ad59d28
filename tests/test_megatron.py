"""Megatron indexed datasets (.bin + .idx) as sources, on files written by Megatron-Core's
own IndexedDatasetBuilder and checked against its IndexedDataset (a dev dependency,
requirements-dev.txt): the tokens each document delivers, the plan from the prefix or
either file, resume, loaders, inspect, errors under both policies, and S3."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import braid
from conftest import (assert_every_token_once, assert_loader_resumes, assert_plan_resumes,
                      braid_cli, write_config)

# Megatron-Core's builder warns about NumPy 2's copy keyword, and its import about
# Transformer Engine and Apex, which these tests do not use.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

try:
    from megatron.core.datasets import indexed_dataset
except ImportError:  # a declared dev dependency: its absence fails the tests
    pytest.fail("megatron-core is not installed (requirements-dev.txt)", pytrace=False)

# Token k of document d is d * SPAN + k, so a delivered token says where it came from
# (documents shorter than SPAN; uint16 holds ids of up to 300 documents).
SPAN = 200


def build(prefix: Path, lengths, dtype=np.uint16, sentences: int = 1) -> Path:
    """A dataset written by Megatron-Core's builder: each document as `sentences`
    sequences (add_item + end_document, as sentence-split corpora are), else one."""
    builder = indexed_dataset.IndexedDatasetBuilder(str(prefix) + ".bin", dtype=dtype)
    for d, n in enumerate(lengths):
        tokens = torch.arange(d * SPAN, d * SPAN + n, dtype=torch.int64)
        if sentences == 1:
            builder.add_document(tokens, [n])
        else:
            for piece in torch.tensor_split(tokens, sentences):
                builder.add_item(piece)
            builder.end_document()
    builder.finalize(str(prefix) + ".idx")
    return prefix


def reference_documents(prefix: Path):
    """{document: tokens} as Megatron-Core's IndexedDataset reads them."""
    ds = indexed_dataset.IndexedDataset(str(prefix))
    bounds = ds.document_indices
    out = {}
    for d in range(len(bounds) - 1):
        parts = [np.asarray(ds[s]) for s in range(bounds[d], bounds[d + 1])]
        out[d] = np.concatenate(parts).astype(np.int64).tolist() if parts else []
    return out


def config_for(path, **extra) -> dict:
    return {
        "seed": 5,
        "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 64, "seq_len": 64},
        "sources": [{"name": "meg", "path": str(path), "shuffle_window": 32, **extra}],
    }


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(3)
    lengths = [int(n) for n in rng.integers(1, SPAN, size=120)]
    lengths[7] = 0  # an empty document
    return build(tmp_path / "corpus_text_document", lengths), lengths


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("dtype,sentences", [(np.uint16, 1), (np.int32, 3)])
def test_every_token_arrives_once_as_indexed_dataset_reads_it(tmp_path, dtype, sentences):
    rng = np.random.default_rng(4)
    lengths = [int(n) for n in rng.integers(1, SPAN, size=150)]
    prefix = build(tmp_path / "c", lengths, dtype=dtype, sentences=sentences)
    ref = reference_documents(prefix)
    assert [len(ref[d]) for d in range(len(lengths))] == lengths
    config = config_for(prefix)
    assert_every_token_once(config, ref, SPAN)


def test_the_prefix_and_either_file_plan_alike_from_the_index(dataset, tmp_path):
    prefix, lengths = dataset
    outs = []
    for path in (prefix, str(prefix) + ".idx", str(prefix) + ".bin", prefix.parent):
        result = braid_cli("plan", write_config(tmp_path / "c.json", config_for(path)),
                           "--steps", 6)
        assert result.returncode == 0, result.stderr
        outs.append(result.stdout)
    assert len(set(outs)) == 1
    # Documents are Megatron's documents: a piece lies inside its document's length.
    for line in outs[0].splitlines():
        for rank in json.loads(line)["ranks"]:
            for mb in rank["micro_batches"]:
                for d in mb["docs"]:
                    assert d["file"] == 0
                    assert d["start"] + d["len"] <= lengths[d["row"]]


def test_planning_reads_no_token(dataset, tmp_path):
    prefix, _ = dataset
    path = write_config(tmp_path / "c.json", config_for(prefix))
    before = braid_cli("plan", path, "--steps", 6)
    assert before.returncode == 0, before.stderr
    # The tokens gone (an empty .bin of the same name): the plan is the same.
    Path(str(prefix) + ".bin").write_bytes(b"")
    after = braid_cli("plan", path, "--steps", 6)
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout


def test_resume_and_loaders_keep_the_stream(dataset, tmp_path):
    prefix, _ = dataset
    path = write_config(tmp_path / "c.json", config_for(prefix))
    whole = assert_plan_resumes(path, tmp_path / "s.json", 30, 20)
    sharded = write_config(tmp_path / "l.json", config_for(prefix, loaders=3))
    assert braid_cli("plan", sharded, "--steps", 30).stdout == whole
    # braid.Loader resumes exactly, too.
    assert_loader_resumes(config_for(prefix), rank=0, n=10, split=4)


def test_inspect_reads_the_index(dataset):
    prefix, lengths = dataset
    result = braid_cli("inspect", prefix, "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["rows"] == len(lengths)
    assert info["tokens"] == sum(lengths)
    assert info["empty"] == 1
    assert info["max_tokens"] == max(lengths)
    assert "uint16" in info["schema"] and "Megatron" in info["schema"]


def test_a_text_column_on_a_megatron_dataset_is_a_config_error(dataset, tmp_path):
    prefix, _ = dataset
    config = config_for(str(prefix) + ".idx", text_column="text")
    result = braid_cli("plan", write_config(tmp_path / "c.json", config), "--steps", 1)
    assert result.returncode == 2, result.stderr
    assert "sources[0].text_column" in result.stderr and "Megatron" in result.stderr


def test_a_truncated_bin_fails_naming_it_or_is_skipped(tmp_path):
    rng = np.random.default_rng(5)
    good = build(tmp_path / "a", [int(n) for n in rng.integers(1, SPAN, size=100)])
    bad = build(tmp_path / "b", [int(n) for n in rng.integers(1, SPAN, size=100)])
    data = Path(str(bad) + ".bin").read_bytes()
    Path(str(bad) + ".bin").write_bytes(data[:len(data) // 3])
    glob = str(tmp_path / "*.idx")
    failing = write_config(tmp_path / "f.json", config_for(glob))
    result = braid_cli("run", failing, "--steps", 20)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert str(bad) + ".bin" in result.stderr and "documents" in result.stderr
    # Under skip the unreadable documents are counted and the run goes on.
    report = tmp_path / "report"
    skipping = write_config(tmp_path / "s.json", config_for(glob, on_error="skip"))
    result = braid_cli("run", skipping, "--steps", 20, "--report", report)
    assert result.returncode == 0, result.stderr
    data = json.loads((report / "report.json").read_text())
    assert data["steps"] == 20 and data["skipped"]["meg"] > 0
    assert str(bad) + ".bin" in result.stderr
    del good


def test_a_bad_header_names_the_index(tmp_path):
    prefix = build(tmp_path / "h", [5, 6, 7])
    idx = Path(str(prefix) + ".idx")
    idx.write_bytes(b"NOTMEGA" + idx.read_bytes()[7:])
    result = braid_cli("plan", write_config(tmp_path / "c.json", config_for(prefix)),
                       "--steps", 1)
    assert result.returncode == 3, result.stderr
    assert str(idx) in result.stderr and "MMIDIDX" in result.stderr


def test_s3_dataset_streams_like_the_local_copy(dataset, tmp_path):
    """The index read with ranged GETs from a real S3 server on loopback (moto)."""
    from remote_fixtures import S3_BUCKET, s3_server_running

    prefix, _ = dataset
    with s3_server_running(tmp_path / "requests.jsonl") as server:
        for ext in (".idx", ".bin"):
            server.client.put_object(Bucket=S3_BUCKET, Key=f"meg/corpus{ext}",
                                     Body=Path(str(prefix) + ext).read_bytes())
        storage = {"endpoint": server.url, "region": "us-east-1"}
        remote = config_for(f"s3://{S3_BUCKET}/meg/corpus", storage=storage)
        local = config_for(prefix)
        for path_config in (remote, config_for(f"s3://{S3_BUCKET}/meg/corpus.idx",
                                               storage=storage)):
            a = take(braid.Loader(path_config, rank=1, world_size=2), 6)
            b = take(braid.Loader(local, rank=1, world_size=2), 6)
            for x, y in zip(a, b):
                assert torch.equal(x["input_ids"], y["input_ids"])
        plans = [braid_cli("plan", write_config(tmp_path / f"{k}.json", c), "--steps", 5)
                 for k, c in (("r", remote), ("l", local))]
        assert plans[0].returncode == 0, plans[0].stderr
        assert plans[0].stdout == plans[1].stdout
