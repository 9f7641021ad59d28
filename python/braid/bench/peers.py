"""The loaders people use, on the benchmarks' data, set up the way their docs recommend.

Each peer converts the sources with its own writer (once, cached under the output folder)
and builds a per-rank loader with forked workers. A loader yields what
`braid bench`'s and `benchmarks/loader_memory.py`'s trainers take: dicts with `input_ids` [batch, seq_len]
and `cu_seqlens` (here one segment per row: the peers pack blocks of tokens across
document boundaries and do not report them).

- LitData (`litdata`): `litdata.optimize` writes each source's token lists as
  pre-tokenized chunks (`TokensLoader`, the form its docs recommend for LLM pre-training,
  and its smallest-memory mode); per rank, a `StreamingDataset` per source with
  `TokensLoader(block_size=seq_len + 1)`, a `CombinedStreamingDataset` with the sources'
  weights, and a `StreamingDataLoader` with forked workers. The rank and world size come
  from the `GLOBAL_RANK` / `WORLD_SIZE` variables it reads.

Install (into the benchmark environment, not Braid's dependencies; `--no-deps` keeps the
pinned torch):

    .venv/bin/pip install --no-deps -r benchmarks/requirements-peers.txt
"""

from __future__ import annotations

import glob
import json
import os
from typing import Callable, Dict, Iterator, List, Tuple


def _source_files(source: dict) -> List[str]:
    path = source["path"]
    if os.path.isdir(path):
        return sorted(glob.glob(os.path.join(path, "*.parquet")))
    return sorted(glob.glob(path))


def _litdata_rows(path: str):
    # One item per document: its token ids (optimize's worker calls this per file).
    import pyarrow.parquet as pq
    import torch

    table = pq.read_table(path, columns=["input_ids"])
    for ids in table.column("input_ids").to_pylist():
        yield torch.tensor(ids, dtype=torch.int32)


def litdata_convert(config: dict, root: str) -> List[str]:
    """Each source of a Braid config as a LitData pre-tokenized dataset under `root`;
    returns their folders (a folder with an index.json is reused)."""
    from litdata import TokensLoader, optimize

    out = []
    for source in config["sources"]:
        folder = os.path.join(os.path.abspath(root), source["name"])
        index = os.path.join(folder, "index.json")
        if not os.path.exists(index) or not json.load(open(index)).get("chunks"):
            optimize(fn=_litdata_rows, inputs=_source_files(source), output_dir=folder,
                     chunk_bytes="64MB", item_loader=TokensLoader(), num_workers=1,
                     mode="overwrite", verbose=False)
        out.append(folder)
    return out


def litdata_loader(config: dict, folders: List[str], rank: int, world_size: int,
                   workers: int) -> Tuple[Iterator[Dict], Callable[[], None]]:
    """Rank `rank`'s LitData loader over `folders` (litdata_convert's), mixing the
    sources by the config's weights; returns (iterator, close)."""
    import torch
    from litdata import (CombinedStreamingDataset, StreamingDataLoader, StreamingDataset,
                         TokensLoader)

    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["GLOBAL_RANK"] = str(rank)
    seq_len = int(config["batch"]["seq_len"])
    batch = int(config["batch"].get("micro_batch_size", 1))
    seed = int(config.get("seed", 0))
    datasets = [StreamingDataset(folder, item_loader=TokensLoader(block_size=seq_len + 1),
                                 shuffle=True, seed=seed, drop_last=True)
                for folder in folders]
    weights = [float(s.get("weight", 1.0)) for s in config["sources"]]
    total = sum(weights)
    combined = CombinedStreamingDataset(datasets, seed=seed,
                                        weights=[w / total for w in weights],
                                        iterate_over_all=False)
    loader = StreamingDataLoader(combined, batch_size=batch, num_workers=workers)
    blocks = iter(loader)

    def batches() -> Iterator[Dict]:
        bounds = torch.arange(0, batch + 1, dtype=torch.int32) * seq_len
        for block in blocks:
            yield {"input_ids": block[:, :seq_len], "cu_seqlens": bounds}

    def close() -> None:
        shutdown = getattr(blocks, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    return batches(), close


def main() -> int:  # convert only: `python -m braid.bench.peers CONFIG.json OUT_DIR`
    import sys

    with open(sys.argv[1]) as f:
        config = json.load(f)
    folders = litdata_convert(config, sys.argv[2])
    print(json.dumps(folders), flush=True)  # the last line: the harness reads it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
