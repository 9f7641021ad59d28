"""Hugging Face `datasets` save_to_disk folders (Arrow IPC stream files with state.json
and dataset_info.json) as sources: folders written by the `datasets` library itself (a
dev dependency) and checked against its load_from_disk: the rows each delivers, text
columns, resume, and errors naming the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

import braid
from conftest import (assert_every_token_once, assert_loader_resumes, assert_plan_resumes,
                      braid_cli, write_config)

try:
    import datasets
except ImportError:  # a declared dev dependency: its absence fails the tests
    pytest.fail("datasets is not installed (requirements-dev.txt)", pytrace=False)

SPAN = 1000


@pytest.fixture
def saved(tmp_path):
    rng = np.random.default_rng(12)
    n = 300
    lengths = [int(x) for x in rng.integers(1, 60, size=n)]
    ds = datasets.Dataset.from_dict({
        "input_ids": [list(range(r * SPAN, r * SPAN + k)) for r, k in enumerate(lengths)],
        "text": [f"row {r}" for r in range(n)],
        "meta": [{"score": float(x)} for x in rng.random(n)],
    })
    # Small batches and three shards: several files of several units each.
    folder = tmp_path / "saved"
    ds.save_to_disk(str(folder), num_shards=3)
    return folder


def config_for(path, **extra) -> dict:
    return {
        "seed": 9,
        "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 64, "seq_len": 64},
        "sources": [{"name": "hf", "path": str(path), "tokens_column": "input_ids",
                     "shuffle_window": 32, **extra}],
    }


def test_every_row_arrives_once_as_load_from_disk_reads_it(saved):
    ref = {row[0] // SPAN: row for row in datasets.load_from_disk(str(saved))["input_ids"]}
    config = config_for(saved)
    assert_every_token_once(config, ref, SPAN)


def test_resume_and_loaders_keep_the_plan(saved, tmp_path):
    path = write_config(tmp_path / "c.json", config_for(saved))
    whole = assert_plan_resumes(path, tmp_path / "s.json", 20, 13)
    sharded = write_config(tmp_path / "l.json", config_for(saved, loaders=2))
    assert braid_cli("plan", sharded, "--steps", 20).stdout == whole
    assert_loader_resumes(config_for(saved), rank=1, n=8, split=3)


def test_a_text_column_is_tokenized(saved, tmp_path):
    from braid import _core

    model = _core.train_tiny_sentencepiece([f"row {r}" for r in range(300)] * 10,
                                           str(tmp_path / "spm"), 40)
    config = config_for(saved)
    del config["sources"][0]["tokens_column"]
    config["sources"][0]["text_column"] = "text"
    config["tokenizer"] = {"type": "sentencepiece", "model": model}
    r = _core.read_source(_core.parse_config(json.dumps(config), "/"), 0, 300)
    assert r["samples"] == 300 and r["skipped"] == 0


def test_a_missing_column_or_a_broken_shard_names_the_file(saved, tmp_path):
    config = config_for(saved)
    config["sources"][0]["tokens_column"] = "ids"
    result = braid_cli("plan", write_config(tmp_path / "m.json", config), "--steps", 1)
    assert result.returncode == 3, result.stderr
    assert "no column 'ids'" in result.stderr and "data-00000-of-00003.arrow" in result.stderr
    assert "on_error" not in result.stderr  # skipping the file would not mend it
    shard = saved / "data-00001-of-00003.arrow"
    shard.write_bytes(shard.read_bytes()[:100])
    result = braid_cli("plan", write_config(tmp_path / "c.json", config_for(saved)),
                       "--steps", 1)
    assert result.returncode == 3, result.stderr
    assert str(shard) in result.stderr
    skipping = write_config(tmp_path / "s.json", config_for(saved, on_error="skip"))
    result = braid_cli("plan", skipping, "--steps", 4)
    assert result.returncode == 0, result.stderr


def test_a_dataset_dicts_folder_names_its_splits_and_one_split_reads(saved, tmp_path):
    """A DatasetDict saved whole (dataset_dict.json, a folder per split): its folder as a
    source is an error naming each split's folder (read as one source, the test split
    would be trained on), in `braid run` and the Loader alike; a split's folder reads
    its rows, and a glob of both splits' files reads them together on purpose."""
    whole = datasets.load_from_disk(str(saved))
    folder = tmp_path / "dict"
    splits = {"train": whole.select(range(250)), "test": whole.select(range(250, 300))}
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    result = braid_cli("run", write_config(tmp_path / "d.json", config_for(folder)),
                       "--steps", 1)
    assert result.returncode == 3, result.stderr
    assert "DatasetDict" in result.stderr and "sources[0].path" in result.stderr
    assert f"{folder}/test, {folder}/train" in result.stderr
    with pytest.raises(braid.DataError, match="name one split's folder"):
        next(iter(braid.Loader(config_for(folder), rank=0, world_size=2)))
    ref = {row[0] // SPAN: row for row in whole.select(range(250))["input_ids"]}
    assert_every_token_once(config_for(folder / "train"), ref, SPAN)
    both = braid_cli("plan", write_config(tmp_path / "g.json",
                                          config_for(f"{folder}/*/*.arrow")),
                     "--steps", 1)
    assert both.returncode == 0, both.stderr


def test_inspect_lists_the_shards_and_their_lengths(saved):
    result = braid_cli("inspect", saved, "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    loaded = datasets.load_from_disk(str(saved))
    assert info["rows"] == len(loaded) and len(info["files"]) == 3
    assert info["column"] == "input_ids"
    assert info["tokens"] == sum(len(r) for r in loaded["input_ids"])
    assert "input_ids" in info["schema"]


def test_a_remote_folder_through_the_cache_crosses_the_network_once(saved, tmp_path):
    """On S3 (the loopback server): without runtime.cache each shard is walked remotely
    and its batches read again by range; with it each shard is one GET, copied whole into
    the cache and mapped from there. The same batches either way."""
    from remote_fixtures import s3_server_running, with_and_without_cache

    shards = sorted(saved.glob("*.arrow"))
    assert len(shards) == 3
    with s3_server_running(tmp_path / "requests.jsonl") as server:
        storage = {"endpoint": server.url, "region": "us-east-1"}
        with_and_without_cache(server, shards, lambda url: config_for(url, storage=storage),
                               tmp_path / "cache", 12)
    assert len(list((tmp_path / "cache").glob("*-data-*.arrow"))) == len(shards)
