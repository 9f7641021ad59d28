"""The loaders people use, on the benchmarks' data, set up the way their docs recommend.

Each peer converts the sources with its own writer (once, cached under the output folder)
and builds a per-rank loader with forked workers. A loader yields what the trainers of
`braid bench` and `benchmarks/loader_memory.py` take: dicts with `input_ids`
[batch, seq_len] and `cu_seqlens` (LitData: one segment per row, it packs blocks of
tokens across document boundaries and does not report them; Energon: one per document
piece).

- LitData (`litdata`): `litdata.optimize` writes each source's token lists as
  pre-tokenized chunks (`TokensLoader`, the form its docs recommend for LLM pre-training,
  and its smallest-memory mode); per rank, a `StreamingDataset` per source with
  `TokensLoader(block_size=seq_len + 1)`, a `CombinedStreamingDataset` with the sources'
  weights, and a `StreamingDataLoader` with forked workers. The rank and world size come
  from the `GLOBAL_RANK` / `WORLD_SIZE` variables it reads.

'- Megatron-Energon (`energon`): each source written as WebDataset tar shards
  (`webdataset.ShardWriter`, one `.npy` int32 token array per document) and prepared by
  `energon prepare` (non-interactive, all of it the train split, a `CrudeWebdataset`);
  a `MetadatasetV2` YAML blends the sources (`blend`, one `weight` per source: the
  config's token share divided by the source's mean document length, since Energon draws
  documents, not tokens, by weight). Per rank, `get_train_dataset` with
  `WorkerConfig(rank, world_size, num_workers)`, a task encoder whose cooker turns a
  sample into its token array, cuts documents longer than seq_len into seq_len pieces,
  packs pieces into seq_len rows with Energon's packing (`select_samples_to_pack`:
  first fit decreasing over the packing buffer; `pack_selected_samples`: concatenation,
  the rest of the row padded) and batches micro_batch_size rows; `get_loader` runs it
  with forked workers. It keeps document boundaries: `cu_seqlens` holds one segment per
  document piece plus one for a row's padding.

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


# ----------------------------------------------------------------------------------------
# Megatron-Energon

_ENERGON_META = "metadataset.yaml"


def _energon_write(source: dict, folder: str) -> Dict[str, int]:
    """The source's documents as WebDataset shards under `folder` (one int32 `.npy` array
    per document); returns its document and token counts."""
    import numpy as np
    import pyarrow.parquet as pq
    import webdataset as wds

    column = source.get("tokens_column", "input_ids")
    documents = tokens = 0
    os.makedirs(folder, exist_ok=True)
    with wds.ShardWriter(os.path.join(folder, "shard-%06d.tar"), maxsize=256 << 20,
                         verbose=0) as sink:
        for f, path in enumerate(_source_files(source)):
            parquet = pq.ParquetFile(path)
            for g in range(parquet.num_row_groups):
                lists = parquet.read_row_group(g, columns=[column]).column(column)
                for chunk in lists.chunks:
                    offsets = chunk.offsets.to_numpy()
                    values = chunk.values.to_numpy(zero_copy_only=False).astype(np.int32,
                                                                               copy=False)
                    for i in range(len(chunk)):
                        doc = values[offsets[i]:offsets[i + 1]]
                        sink.write({"__key__": f"f{f:04d}g{g:05d}d{documents:09d}",
                                    "npy": np.ascontiguousarray(doc)})
                        documents += 1
                        tokens += len(doc)
    return {"documents": documents, "tokens": tokens}


def _energon_prepare(folder: str) -> None:
    """`energon prepare FOLDER`, non-interactive (its command, in this process): every
    shard in the train split, crude samples (the task encoder's cooker reads them)."""
    from megatron.energon.tools.prepare import command

    command.main([folder, "--non-interactive", "--split-ratio", "1,0,0", "--sample-type",
                  "CrudeWebdataset", "--num-workers", "1", "--no-progress",
                  "--force-overwrite"], prog_name="energon prepare",
                 standalone_mode=False)


def energon_convert(config: dict, root: str) -> List[str]:
    """Each source of a Braid config as an Energon dataset under `root` (WebDataset shards
    plus `energon prepare`'s metadata; a prepared folder is reused), and root's
    metadataset.yaml blending them; returns the source folders."""
    root = os.path.abspath(root)
    folders, blend = [], []
    for i, source in enumerate(config["sources"]):
        if "tokens_column" not in source:
            raise ValueError(f"sources[{i}]: energon reads pre-tokenized token lists "
                             "only")
        folder = os.path.join(root, source["name"])
        stats_path = os.path.join(root, source["name"] + ".stats.json")
        ready = (os.path.exists(stats_path) and
                 os.path.exists(os.path.join(folder, ".nv-meta", "dataset.yaml")))
        if not ready:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
            stats = _energon_write(source, folder)
            _energon_prepare(folder)
            with open(stats_path, "w") as f:
                json.dump(stats, f)
        with open(stats_path) as f:
            stats = json.load(f)
        # Energon draws documents by weight; Braid's weight is a share of tokens.
        mean_length = stats["tokens"] / max(1, stats["documents"])
        weight = float(source.get("weight", 1.0))
        if weight > 0:  # Energon's blend takes weights > 0: a source at 0 is left out
            blend.append((folder, weight / mean_length))
        folders.append(folder)
    if not blend:
        raise ValueError("sources: every weight is 0")
    total = sum(w for _, w in blend)
    lines = ["__module__: megatron.energon", "__class__: MetadatasetV2", "splits:",
             "  train:", "    blend:"]
    for folder, weight in blend:
        lines += [f"      - weight: {weight / total!r}",
                  f"        path: {json.dumps(folder)}"]
    with open(os.path.join(root, _ENERGON_META), "w") as f:
        f.write("\n".join(lines) + "\n")
    return folders


def _energon_task_encoder(seq_len: int):
    """A task encoder: cooks a crude sample into its token array, cuts it into pieces of
    at most seq_len tokens, packs pieces into seq_len rows (first fit decreasing over the
    packing buffer, the rest of a row padded with 0) and batches rows with their
    `cu_seqlens`."""
    import numpy as np
    import torch
    from megatron.energon import (Cooker, Sample, TaskEncoder, basic_sample_keys,
                                  edataclass, stateless)

    @edataclass
    class Tokens(Sample):
        tokens: np.ndarray
        lengths: tuple = ()

    @stateless
    def cook(sample: dict) -> Tokens:
        return Tokens(**basic_sample_keys(sample), tokens=sample["npy"])

    class Encoder(TaskEncoder):
        cookers = [Cooker(cook)]

        @stateless
        def encode_sample(self, sample: Tokens):
            for start in range(0, len(sample.tokens), seq_len):
                piece = sample.tokens[start:start + seq_len]
                yield Tokens.derive_from(sample, tokens=piece, lengths=(len(piece),))

        def select_samples_to_pack(self, samples):
            rows: List[list] = []  # [free, pieces]
            for s in sorted(samples, key=lambda s: -len(s.tokens)):
                for row in rows:
                    if row[0] >= len(s.tokens):
                        row[0] -= len(s.tokens)
                        row[1].append(s)
                        break
                else:
                    rows.append([seq_len - len(s.tokens), [s]])
            return [row[1] for row in rows]

        @stateless
        def pack_selected_samples(self, samples):
            row = np.zeros(seq_len, dtype=np.int32)
            at = 0
            for s in samples:
                row[at:at + len(s.tokens)] = s.tokens
                at += len(s.tokens)
            lengths = tuple(len(s.tokens) for s in samples)
            if at < seq_len:
                lengths += (seq_len - at,)  # the padding: a segment of its own
            return Tokens.derive_from(samples[0], __restore_key__=(), tokens=row,
                                      lengths=lengths)

        @stateless
        def batch(self, samples):
            ids = torch.from_numpy(np.stack([s.tokens for s in samples]))
            lengths = [n for s in samples for n in s.lengths]
            cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
            cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
            return {"input_ids": ids, "cu_seqlens": cu}

    return Encoder()


def energon_loader(config: dict, root: str, rank: int, world_size: int, workers: int,
                   shuffle_buffer: int = 64, packing_buffer: int = 64
                   ) -> Tuple[Iterator[Dict], Callable[[], None]]:
    """Rank `rank`'s Energon loader over root's metadataset (energon_convert's); returns
    (iterator, close)."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    seq_len = int(config["batch"]["seq_len"])
    batch = int(config["batch"].get("micro_batch_size", 1))
    worker_config = WorkerConfig(rank=rank, world_size=world_size, num_workers=workers,
                                 seed_offset=int(config.get("seed", 0)))
    dataset = get_train_dataset(os.path.join(os.path.abspath(root), _ENERGON_META),
                                worker_config=worker_config, batch_size=batch,
                                shuffle_buffer_size=shuffle_buffer,
                                max_samples_per_sequence=100,
                                packing_buffer_size=packing_buffer,
                                task_encoder=_energon_task_encoder(seq_len))
    loader = get_loader(dataset)
    blocks = iter(loader)

    def close() -> None:
        shutdown = getattr(blocks, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    return blocks, close


def main() -> int:
    """Convert only: `python -m braid.bench.peers [--energon] CONFIG.json OUT_DIR`
    (LitData unless --energon)."""
    import sys

    args = sys.argv[1:]
    convert = litdata_convert
    if args and args[0] == "--energon":
        convert = energon_convert
        args = args[1:]
    with open(args[0]) as f:
        config = json.load(f)
    folders = convert(config, args[1])
    print(json.dumps(folders), flush=True)  # the last line: the harness reads it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
