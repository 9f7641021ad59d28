"""One job mixing a source of every format (Parquet, a Megatron dataset written by
Megatron-Core's builder, gzip JSON Lines, a save_to_disk folder written by `datasets`,
WebDataset shards written by the webdataset package's TarWriter),
on local disk and on a loopback S3 server: it runs, resumes exactly, and gives every rank
the same tensors on the embedded and the Ray runtime."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import braid
from conftest import assert_same_batches, doc_tokens, make_source, take_batches

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

try:
    import datasets
    import webdataset
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
except ImportError:  # declared dev dependencies: their absence fails the tests
    pytest.fail("megatron-core, datasets and webdataset are dev dependencies "
                "(requirements-dev.txt)", pytrace=False)


def write_sources(root: Path) -> dict:
    """The five sources' files under `root`; {name: path relative to root}."""
    rng = np.random.default_rng(21)
    make_source(root, "pq", 0, [int(x) for x in rng.integers(1, 70, size=60)])
    (root / "meg").mkdir()
    builder = IndexedDatasetBuilder(str(root / "meg" / "c.bin"), dtype=np.int32)
    for d, n in enumerate(rng.integers(1, 70, size=60)):
        builder.add_document(torch.tensor(doc_tokens(1, d, int(n))), [int(n)])
    builder.finalize(str(root / "meg" / "c.idx"))
    (root / "jl").mkdir()
    for f in range(2):
        lines = [json.dumps({"input_ids": doc_tokens(2, 100 * f + r, int(n)), "x": r})
                 for r, n in enumerate(rng.integers(1, 70, size=30))]
        (root / "jl" / f"p{f}.jsonl.gz").write_bytes(gzip.compress(
            ("\n".join(lines) + "\n").encode()))
    rows = [doc_tokens(3, r, int(n)) for r, n in enumerate(rng.integers(1, 70, size=60))]
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(root / "hf"),
                                                                 num_shards=2)
    (root / "wd").mkdir()
    for s in range(2):
        with webdataset.TarWriter(str(root / "wd" / f"shard-{s:03d}.tar")) as sink:
            for r, n in enumerate(rng.integers(1, 70, size=30)):
                sink.write({"__key__": f"{s}-{r:04d}", "txt": f"sample {r}",
                            "json": {"input_ids": doc_tokens(4, 100 * s + r, int(n))}})
    return {"pq": "pq", "meg": "meg/c", "jl": "jl", "hf": "hf", "wd": "wd"}


def config_for(paths: dict, **source_extra) -> dict:
    weights = {"pq": 0.3, "meg": 0.25, "jl": 0.2, "hf": 0.1, "wd": 0.15}
    sources = []
    for name, path in paths.items():
        s = {"name": name, "path": path, "weight": weights[name], "shuffle_window": 16,
             **source_extra}
        if name == "wd":
            s["tokens_column"] = "json:input_ids"
        elif name != "meg":
            s["tokens_column"] = "input_ids"
        sources.append(s)
    return {"seed": 17, "topology": {"dp": 2},
            "batch": {"global_tokens": 2 * 2 * 64, "seq_len": 64}, "sources": sources}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    rel = write_sources(root)
    return root, rel, config_for({k: str(root / v) for k, v in rel.items()})


def test_a_mixed_job_runs_and_resumes_exactly(mixed):
    _, _, config = mixed
    whole = take_batches([braid.Loader(config, r, 2) for r in range(2)], 16)
    seen = {int(t) // 10_000_000 for b in whole[0] + whole[1] for t in b["input_ids"][0]}
    assert seen == {0, 1, 2, 3, 4}, "every format delivered"
    first = [braid.Loader(config, r, 2) for r in range(2)]
    take_batches(first, 7)
    resumed = [braid.Loader(config, r, 2) for r in range(2)]
    for a, b in zip(resumed, first):
        a.load_state_dict(b.state_dict())
    rest = take_batches(resumed, 9)
    for r in range(2):
        assert_same_batches(rest[r], whole[r][7:])


def test_the_mixed_job_on_s3_gives_the_local_tensors(mixed, tmp_path):
    from remote_fixtures import S3_BUCKET, s3_server_running

    root, rel, config = mixed
    with s3_server_running(tmp_path / "requests.jsonl") as server:
        server.upload_tree(root, "mixed")
        remote = config_for({k: f"s3://{S3_BUCKET}/mixed/{v}" for k, v in rel.items()},
                            storage={"endpoint": server.url, "region": "us-east-1"})
        got = take_batches([braid.Loader(remote, r, 2) for r in range(2)], 8)
    local = take_batches([braid.Loader(config, r, 2) for r in range(2)], 8)
    for r in range(2):
        assert_same_batches(got[r], local[r])


def test_the_mixed_job_on_ray_gives_the_embedded_tensors(mixed):
    import ray

    _, _, config = mixed
    embedded = take_batches([braid.Loader(config, r, 2) for r in range(2)], 8)
    ray.init(address="local", num_cpus=2, object_store_memory=256 * 2**20,
             include_dashboard=False, log_to_driver=False,
             namespace="braid-test-formats", configure_logging=False)
    try:
        on_ray = copy.deepcopy(config)
        on_ray["runtime"] = {"kind": "ray", "namespace": "braid-test-formats",
                             "timeout_s": 60}
        loaders = [braid.Loader(on_ray, r, 2) for r in range(2)]
        got = take_batches(loaders, 8)
        for l in loaders:
            l.close()
    finally:
        ray.shutdown()
    for r in range(2):
        assert_same_batches(got[r], embedded[r])
