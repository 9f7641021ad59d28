"""JSON Lines sources (.jsonl / .json, plain, gzip or zstd): files written with Python's
json and gzip and the zstandard package, read through Braid and checked against
pyarrow.json on the same files: the records each delivers, unexpected fields ignored,
resume at (file, record), loaders, and errors naming the file and record."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pytest
import torch

import braid
from conftest import (assert_every_token_once, assert_loader_resumes, assert_plan_resumes,
                      braid_cli, write_config)

try:
    import zstandard
except ImportError:  # a declared dev dependency: its absence fails the tests
    pytest.fail("zstandard is not installed (requirements-dev.txt)", pytrace=False)

SPAN = 1000


def records(file: int, n: int, rng) -> list:
    """Records whose token lists say where they came from, beside free-form fields."""
    out = []
    for r in range(n):
        length = int(rng.integers(1, 60))
        base = (file * 1000 + r) * SPAN
        out.append({"id": f"{file}-{r}", "input_ids": list(range(base, base + length)),
                    "metadata": {"source": "web", "score": float(rng.random())},
                    "text": f"record {r} of file {file}"})
    return out


def write(path: Path, recs: list) -> Path:
    body = "".join(json.dumps(r) + "\n" for r in recs).encode()
    if path.suffix == ".gz":
        body = gzip.compress(body)
    elif path.suffix == ".zst":
        body = zstandard.ZstdCompressor().compress(body)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return path


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(6)
    names = ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.json"]
    files = {}
    for f, name in enumerate(names):
        recs = records(f, int(rng.integers(20, 60)), rng)
        files[f] = (write(tmp_path / "data" / name, recs), recs)
    return tmp_path / "data", files


def config_for(path, **extra) -> dict:
    return {
        "seed": 5,
        "topology": {"dp": 2},
        "batch": {"global_tokens": 2 * 2 * 64, "seq_len": 64},
        "sources": [{"name": "j", "path": str(path), "tokens_column": "input_ids",
                     "shuffle_window": 16, **extra}],
    }


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def reference(path: Path) -> list:
    """The token lists pyarrow.json reads from one file."""
    opts = pj.ParseOptions(explicit_schema=pa.schema([("input_ids", pa.list_(pa.int32()))]),
                           unexpected_field_behavior="ignore")
    stream = pa.input_stream(str(path), compression="detect")
    return pj.read_json(stream, parse_options=opts).column("input_ids").to_pylist()


def test_every_record_arrives_once_as_pyarrow_json_reads_it(corpus):
    folder, files = corpus
    ref = {}
    for f, (path, recs) in files.items():
        lists = reference(path)
        assert lists == [r["input_ids"] for r in recs]
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
    glob = write_config(tmp_path / "g.json", config_for(str(folder / "*.json*")))
    assert braid_cli("plan", glob, "--steps", 20).stdout == whole
    # Small shuffle windows in bytes cut files into blocks of records; resuming inside a
    # file reopens it at (file, record).
    small = config_for(folder, shuffle_window_bytes=2048)
    assert_plan_resumes(write_config(tmp_path / "b.json", small), state, 20, 9)
    assert_loader_resumes(small, rank=0, n=10, split=3)


def test_a_missing_field_names_the_file_record_and_key(tmp_path):
    rng = np.random.default_rng(1)
    recs = records(0, 30, rng)
    del recs[17]["input_ids"]
    path = write(tmp_path / "x.jsonl", recs)
    failing = write_config(tmp_path / "f.json", config_for(path))
    result = braid_cli("run", failing, "--steps", 4)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert str(path) in result.stderr and "row 17" in result.stderr
    assert "column 'input_ids'" in result.stderr
    skipping = write_config(tmp_path / "s.json", config_for(path, on_error="skip"))
    report = tmp_path / "report"
    result = braid_cli("run", skipping, "--steps", 4, "--report", report)
    assert result.returncode == 0, result.stderr
    assert json.loads((report / "report.json").read_text())["skipped"]["j"] == 1


def test_a_bad_gzip_a_json_array_or_a_bad_line_names_the_file(tmp_path):
    rng = np.random.default_rng(2)
    good = write(tmp_path / "d" / "a.jsonl", records(0, 30, rng))
    bad = tmp_path / "d" / "b.jsonl.gz"
    bad.write_bytes(b"this is not gzip at all")
    result = braid_cli("plan", write_config(tmp_path / "c.json", config_for(tmp_path / "d")),
                       "--steps", 2)
    assert result.returncode == 3, result.stderr
    assert str(bad) in result.stderr and "on_error: skip" in result.stderr
    skipping = write_config(tmp_path / "s.json",
                            config_for(tmp_path / "d", on_error="skip"))
    result = braid_cli("plan", skipping, "--steps", 2)
    assert result.returncode == 0, result.stderr
    # A JSON array of records in a `.json` file (another format): named as one.
    array = tmp_path / "arr" / "rows.json"
    array.parent.mkdir()
    array.write_text(json.dumps([json.loads(line)
                                 for line in good.read_text().splitlines()[:3]]))
    result = braid_cli("plan", write_config(tmp_path / "a.json", config_for(array)),
                       "--steps", 1)
    assert result.returncode == 3, result.stderr
    assert f"{array}: holds a JSON array, not JSON Lines" in result.stderr, result.stderr
    # A line that is not JSON: a data error naming the file and the record; under skip
    # that record alone is skipped, in its place, and logged.
    broken = tmp_path / "e" / "c.jsonl"
    broken.parent.mkdir()
    lines = good.read_text().splitlines(keepends=True)
    broken.write_text("".join(lines[:7]) + "{not json\n" + "".join(lines[7:]))
    result = braid_cli("run", write_config(tmp_path / "e.json", config_for(broken)),
                       "--steps", 8)
    assert result.returncode == 3, result.stderr
    assert str(broken) in result.stderr and "(row 7)" in result.stderr
    assert "does not parse as JSON" in result.stderr
    # One hint, the record's: not a second one to skip the file.
    assert result.stderr.count("set on_error: skip") == 1, result.stderr
    report = tmp_path / "report"
    result = braid_cli("run", write_config(tmp_path / "f.json",
                                           config_for(broken, on_error="skip")),
                       "--steps", 8, "--report", report)
    assert result.returncode == 0, result.stderr
    # One line per skip, saying why (the reader's reason, not "null column").
    skips = [line for line in result.stderr.splitlines() if "skipped" in line]
    assert skips and all(f"{broken} (row 7): does not parse as JSON (" in line
                         for line in skips), skips
    assert json.loads((report / "report.json").read_text())["skipped"]["j"] >= 1
    # Every other record arrives, as pyarrow.json reads the good file.
    ref = {lst[0] // SPAN: lst for lst in reference(good)}
    assert_every_token_once(config_for(broken, on_error="skip"), ref, SPAN)


def test_gzip_as_tools_write_it_reads_every_record(tmp_path):
    """gzip is inflated by ISA-L, not zlib: files as other tools write them read whole. The
    gzip tool's (a file name in the header) and concatenated members (`cat a.gz b.gz`,
    bgzip's blocks, pigz --independent)."""
    rng = np.random.default_rng(9)
    folder = tmp_path / "g"
    folder.mkdir()
    named = write(folder / "named.jsonl", records(0, 40, rng))
    subprocess.run(["gzip", str(named)], check=True)  # named.jsonl.gz, FNAME in its header
    assert gzip.open(folder / "named.jsonl.gz").read()  # as Python reads it
    parts = [records(1, 25, rng), records(2, 1, rng), records(3, 30, rng)]
    (folder / "members.jsonl.gz").write_bytes(b"".join(
        gzip.compress("".join(json.dumps(r) + "\n" for r in recs).encode())
        for recs in parts))
    ref = {}
    for path in sorted(folder.iterdir()):
        for lst in reference(path):
            ref[lst[0] // SPAN] = lst
    assert len(ref) == 40 + 25 + 1 + 30
    assert_every_token_once(config_for(folder), ref, SPAN)


def test_text_records_are_tokenized_and_other_fields_ignored(tmp_path):
    from braid import _core

    rng = np.random.default_rng(8)
    recs = records(0, 40, rng)
    path = write(tmp_path / "t.jsonl.zst", recs)
    model = _core.train_tiny_sentencepiece([r["text"] for r in recs] * 20,
                                           str(tmp_path / "spm"), 60)
    config = config_for(path)
    del config["sources"][0]["tokens_column"]
    config["sources"][0]["text_column"] = "text"
    config["tokenizer"] = {"type": "sentencepiece", "model": model}
    cfg = _core.parse_config(json.dumps(config), "/")
    r = _core.read_source(cfg, 0, 40)
    assert r["samples"] == 40 and r["skipped"] == 0 and r["payload_tokens"] > 40


def sft_records(file: int, n: int, rng) -> list:
    """Records as an SFT set holds them: strings, a nested object, a list, a number, a
    date, and a field only some records have (ignored: not read)."""
    out = []
    for r in range(n):
        rec = {"id": f"{file}-{r}", "instruction": "say " * int(rng.integers(1, 9)),
               "meta": {"score": float(rng.random()), "tags": ["a", "b"][: r % 3]},
               "turn": int(rng.integers(0, 5)), "day": f"2024-05-{1 + r % 28:02d}"}
        if r % 4 == 0:
            rec["extra"] = [1, "two"]
        out.append(rec)
    return out


def test_a_user_transform_gets_each_field_as_json_gives_it(tmp_path):
    """A Python transform over JSON Lines fields gets each field's value as json.loads
    gives it (a string, a dict, a list, an int; a date its string), typed by the first
    file's first records and held; its batches equal those of the same records in
    Parquet files laid out alike, and the same from a fresh process (the CLI)."""
    from conftest import assert_resumes_batch_for_batch, assert_same_batches, take_batches
    import pyarrow.parquet as pq

    rng = np.random.default_rng(9)
    by_id = {}
    for f, name in enumerate(["a.jsonl.gz", "b.jsonl.zst", "c.jsonl"]):
        recs = sft_records(f, int(rng.integers(20, 40)), rng)
        write(tmp_path / "jsonl" / name, recs)
        columns = ["id", "instruction", "meta", "turn", "day"]
        (tmp_path / "pq").mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist([{k: r[k] for k in columns} for r in recs]),
                       tmp_path / "pq" / f"{name.split('.')[0]}.parquet")
        by_id.update({r["id"]: r for r in recs})
    calls = []

    def encode(rid, instruction, meta, turn, day):
        rec = by_id[rid]
        assert (instruction, meta, turn, day) == (rec["instruction"], rec["meta"],
                                                  rec["turn"], rec["day"]), rid
        assert type(turn) is int and type(meta["score"]) is float, (turn, meta)
        calls.append(rid)
        f, r = map(int, rid.split("-"))
        return [(f * 100 + r) * 8 + k for k in range(len(instruction) // 4 + turn)]

    def config(path):
        out = config_for(path)
        del out["sources"][0]["tokens_column"]
        out["sources"][0]["transform"] = {
            "python": "sft_encode",
            "columns": ["id", "instruction", "meta", "turn", "day"]}
        return out

    braid.register_transform("sft_encode", encode)
    try:
        got = take_batches([braid.Loader(config(tmp_path / "jsonl"), r, 2)
                            for r in range(2)], 6)
        want = take_batches([braid.Loader(config(tmp_path / "pq"), r, 2)
                             for r in range(2)], 6)
        # Resumed inside a file (small windows cut the files into blocks).
        small = config(tmp_path / "jsonl")
        small["sources"][0]["shuffle_window_bytes"] = 1024
        assert_resumes_batch_for_batch(small, n=8, split=3, rank=1, world_size=2)
    finally:
        braid.unregister_transform("sft_encode")
    for rank in range(2):
        assert_same_batches(got[rank], want[rank])
    assert len(set(calls)) > 20
    # A field no record of the first file's first block has: a config error naming it.
    missing = config(tmp_path / "jsonl")
    missing["sources"][0]["transform"]["columns"] = ["id", "nothing"]
    missing["sources"][0]["transform"]["python"] = "json:dumps"
    result = braid_cli("plan", write_config(tmp_path / "m.json", missing), "--steps", 2)
    assert result.returncode != 0
    assert "sources[0].transform.columns[1]" in result.stderr, result.stderr
    assert "'nothing'" in result.stderr and "a.jsonl.gz" in result.stderr


def test_s3_files_stream_like_the_local_copy(corpus, tmp_path):
    from remote_fixtures import S3_BUCKET, s3_server_running

    folder, files = corpus
    with s3_server_running(tmp_path / "requests.jsonl") as server:
        for path, _ in files.values():
            server.client.put_object(Bucket=S3_BUCKET, Key=f"jl/{path.name}",
                                     Body=path.read_bytes())
        storage = {"endpoint": server.url, "region": "us-east-1"}
        remote = config_for(f"s3://{S3_BUCKET}/jl", storage=storage)
        a = take(braid.Loader(remote, rank=1, world_size=2), 6)
        b = take(braid.Loader(config_for(folder), rank=1, world_size=2), 6)
        for x, y in zip(a, b):
            assert torch.equal(x["input_ids"], y["input_ids"])


def test_a_cache_takes_each_remote_file_across_the_network_once(corpus, tmp_path):
    """runtime.cache: counting at open downloads each file whole into the cache, and the
    reads that follow take the copy: one GET of each object, where without a cache the
    count and each read of a file download it again. The same batches either way."""
    from remote_fixtures import s3_server_running, with_and_without_cache

    folder, files = corpus
    paths = [path for path, _ in files.values()]
    with s3_server_running(tmp_path / "requests.jsonl") as server:
        storage = {"endpoint": server.url, "region": "us-east-1"}
        with_and_without_cache(server, paths, lambda url: config_for(url, storage=storage),
                               tmp_path / "cache", 12)
    assert len(list((tmp_path / "cache").glob("*-*.json*"))) == len(paths)


def test_inspect_counts_records_and_a_fields_lengths(corpus):
    folder, files = corpus
    result = braid_cli("inspect", folder, "--json", "--column", "input_ids")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["rows"] == sum(len(recs) for _, recs in files.values())
    assert info["tokens"] == sum(len(r["input_ids"]) for _, recs in files.values()
                                 for r in recs)
    assert len(info["files"]) == 4
    # Without --column: the first list of integers among the first records' fields, each
    # listed with the type a transform would get.
    result = braid_cli("inspect", folder, "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["column"] == "input_ids" and found["tokens"] == info["tokens"]
    for field in ("id: string", "input_ids: list<item: int64>", "text: string",
                  "metadata: struct<source: string, score: double>"):
        assert field in found["schema"], found["schema"]
