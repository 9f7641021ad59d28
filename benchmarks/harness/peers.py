"""The loaders people use, on the benchmarks' data, set up the way their docs recommend.

Each peer converts the sources with its own writer (once, cached under the output folder)
and builds a per-rank loader with forked workers. A loader yields what the trainers of
`benchmarks/bench.py` and `benchmarks/loader_memory.py` take: dicts with `input_ids`
[batch, seq_len] and `cu_seqlens` (LitData: one segment per row, it packs blocks of
tokens across document boundaries and does not report them; Energon: one per document
piece).

- LitData (`litdata`): `litdata.optimize` writes each source's token lists as
  pre-tokenized chunks (`TokensLoader`, the form its docs recommend for LLM pre-training,
  and its smallest-memory mode); per rank, a `StreamingDataset` per source with
  `TokensLoader(block_size=seq_len + 1)`, a `CombinedStreamingDataset` with the sources'
  weights, and a `StreamingDataLoader` with forked workers. The rank and world size come
  from the `GLOBAL_RANK` / `WORLD_SIZE` variables it reads.

- Megatron-Energon (`energon`): each source written as WebDataset tar shards
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

- MosaicML Streaming (`mosaic`): each source written by Streaming's `MDSWriter` (one
  sample per document, its tokens an `ndarray:int32` column; shards of up to 64 MiB, the
  writer's default, uncompressed). Per rank, one `StreamingDataset` over a `Stream(local=...,
  proportion=...)` per source (Streaming draws samples, here documents, by proportion:
  each is the config's token share divided by the source's mean document length),
  `shuffle=True` with its default algorithm (py1e) and seed, `batch_size` documents per
  batch (about one micro-batch of tokens); a `StreamingDataLoader` with forked workers
  whose collate function packs each batch's documents into micro-batches as the baseline
  does (`mosaic_pack`). It keeps document boundaries. Streaming coordinates the ranks of
  a node through shared memory and reads RANK, WORLD_SIZE, LOCAL_RANK and
  LOCAL_WORLD_SIZE; it runs in an environment of its own (benchmarks/setup-mosaic-env:
  its numpy, torch and torchvision cannot share Braid's .venv).

Install LitData and Energon into the benchmark environment, not Braid's dependencies
(`--no-deps` keeps the pinned torch):

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


def document_weights(weights: List[float], stats: List[Dict[str, int]]
                     ) -> List[Tuple[int, float]]:
    """A peer's weight per source, from the config's weights (shares of tokens) and each
    source's {"documents", "tokens"}: Energon's blend and Streaming's proportions draw
    documents, so each weight is divided by the source's mean document length (a source
    at weight 0 is left out). Returns
    (source index, proportion) for the sources with a weight > 0, proportions summing
    to 1."""
    out = []
    for i, (weight, stat) in enumerate(zip(weights, stats)):
        if weight > 0:
            mean_length = stat["tokens"] / max(1, stat["documents"])
            out.append((i, weight / mean_length))
    if not out:
        raise ValueError("sources: every weight is 0")
    total = sum(p for _, p in out)
    return [(i, p / total) for i, p in out]


def _documents(source: dict) -> Iterator[Tuple[int, int, "np.ndarray"]]:
    """(file, row group, tokens) of every document of a token source, in file order: int32
    NumPy views of each row group's Arrow values, what the peers' writers convert."""
    import numpy as np
    import pyarrow.parquet as pq

    column = source.get("tokens_column", "input_ids")
    for f, path in enumerate(_source_files(source)):
        parquet = pq.ParquetFile(path)
        for g in range(parquet.num_row_groups):
            lists = parquet.read_row_group(g, columns=[column]).column(column)
            for chunk in lists.chunks:
                offsets = chunk.offsets.to_numpy()
                values = chunk.values.to_numpy(zero_copy_only=False).astype(np.int32,
                                                                           copy=False)
                for i in range(len(chunk)):
                    yield f, g, values[offsets[i]:offsets[i + 1]]


def _energon_write(source: dict, folder: str) -> Dict[str, int]:
    """The source's documents as WebDataset shards under `folder` (one int32 `.npy` array
    per document); returns its document and token counts."""
    import numpy as np
    import webdataset as wds

    documents = tokens = 0
    os.makedirs(folder, exist_ok=True)
    with wds.ShardWriter(os.path.join(folder, "shard-%06d.tar"), maxsize=256 << 20,
                         verbose=0) as sink:
        for f, g, doc in _documents(source):
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
    folders, stats = [], []
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
            written = _energon_write(source, folder)
            _energon_prepare(folder)
            with open(stats_path, "w") as f:
                json.dump(written, f)
        with open(stats_path) as f:
            stats.append(json.load(f))
        folders.append(folder)
    # Energon's blend takes weights > 0: a source at 0 is left out.
    blend = document_weights([float(s.get("weight", 1.0)) for s in config["sources"]],
                             stats)
    lines = ["__module__: megatron.energon", "__class__: MetadatasetV2", "splits:",
             "  train:", "    blend:"]
    for i, weight in blend:
        lines += [f"      - weight: {weight!r}",
                  f"        path: {json.dumps(folders[i])}"]
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


# ----------------------------------------------------------------------------------------
# MosaicML Streaming


def mosaic_documents_per_batch(proportions: List[Tuple[int, float]],
                               stats: List[Dict[str, int]], tokens: int) -> int:
    """Documents per Streaming batch: about `tokens` (one micro-batch) at the mix's mean
    document length, at least 1."""
    mean_length = sum(p * stats[i]["tokens"] / max(1, stats[i]["documents"])
                      for i, p in proportions)
    return max(1, round(tokens / mean_length))


class MosaicPack:
    """A DataLoader collate function: packs the documents of each batch, in order, into
    micro-batches of `rows` x `seq_len` tokens with the baseline's packer (a document that
    does not fit is split, its rest starts the next row; Braid's tensors: input_ids,
    labels, loss_mask, position_ids, cu_seqlens with one segment per piece, source_ids).
    A micro-batch not yet full carries over to the next batch (the worker's own copy:
    each forked worker packs its own stream, as LLM Foundry's packing collator does).

    Returns {"documents": their lengths, "micro_batches": the full ones}: the first value
    has one entry per sample, which is what StreamingDataLoader counts for its state."""

    def __init__(self, rows: int, seq_len: int):
        self.rows, self.seq_len = rows, seq_len
        self._packer = None

    def __call__(self, samples: List[Tuple]) -> Dict[str, list]:
        """`samples`: (token array, source index) per document."""
        from harness.baseline import Document, _Packer

        if self._packer is None:
            self._packer = _Packer(self.rows, self.seq_len)
        full = []
        for ids, source in samples:
            full += self._packer.add(Document(ids=ids), int(source))
        return {"documents": [len(ids) for ids, _ in samples], "micro_batches": full}


def _mosaic_write(source: dict, folder: str) -> Dict[str, int]:
    """The source's documents as an MDS dataset under `folder` (one sample per document,
    column `tokens`: ndarray:int32); returns its document and token counts."""
    import numpy as np
    from streaming import MDSWriter

    documents = tokens = 0
    with MDSWriter(out=folder, columns={"tokens": "ndarray:int32"},
                   size_limit=1 << 26) as sink:
        for _, _, doc in _documents(source):
            sink.write({"tokens": np.ascontiguousarray(doc)})
            documents += 1
            tokens += len(doc)
    return {"documents": documents, "tokens": tokens}


def mosaic_convert(config: dict, root: str) -> List[str]:
    """Each source of a Braid config as an MDS dataset under `root` (a folder with its
    stats file is reused); returns the folders."""
    import shutil

    root = os.path.abspath(root)
    folders = []
    for i, source in enumerate(config["sources"]):
        if "tokens_column" not in source:
            raise ValueError(f"sources[{i}]: mosaic reads pre-tokenized token lists only")
        folder = os.path.join(root, source["name"])
        stats_path = os.path.join(root, source["name"] + ".stats.json")
        if not (os.path.exists(stats_path) and
                os.path.exists(os.path.join(folder, "index.json"))):
            shutil.rmtree(folder, ignore_errors=True)
            stats = _mosaic_write(source, folder)
            with open(stats_path, "w") as f:
                json.dump(stats, f)
        folders.append(folder)
    return folders


def _mosaic_stats(folders: List[str]) -> List[Dict[str, int]]:
    out = []
    for folder in folders:
        with open(folder.rstrip("/") + ".stats.json") as f:
            out.append(json.load(f))
    return out


def mosaic_loader(config: dict, folders: List[str], rank: int, world_size: int,
                  workers: int, master_port: int = 0
                  ) -> Tuple[Iterator[Dict], Callable[[], None]]:
    """Rank `rank`'s Streaming loader over `folders` (mosaic_convert's), mixing the
    sources by the config's weights; returns (iterator, close). All `world_size` ranks
    run on this node (LOCAL_WORLD_SIZE = world_size) and must build theirs at the same
    time: StreamingDataset waits for the others at barriers (the trainers' process group
    if there is one, else one of its own on 127.0.0.1:`master_port`)."""
    import torch.distributed as dist

    for key, value in (("RANK", rank), ("WORLD_SIZE", world_size), ("LOCAL_RANK", rank),
                       ("LOCAL_WORLD_SIZE", world_size)):
        os.environ[key] = str(value)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(master_port)
    from streaming import Stream, StreamingDataLoader, StreamingDataset

    class Documents(StreamingDataset):
        """Each sample: (token array, source index in the config)."""

        def get_item(self, sample_id: int, retry: int = 7):
            sample = super().get_item(sample_id, retry)
            shard, _ = self.spanner[sample_id]
            return sample["tokens"], source_of_stream[self.stream_per_shard[shard]]

    seq_len = int(config["batch"]["seq_len"])
    rows = int(config["batch"].get("micro_batch_size", 1))
    stats = _mosaic_stats(folders)
    proportions = document_weights(
        [float(s.get("weight", 1.0)) for s in config["sources"]], stats)
    source_of_stream = [i for i, _ in proportions]
    batch = mosaic_documents_per_batch(proportions, stats, rows * seq_len)
    dataset = Documents(streams=[Stream(local=folders[i], proportion=p)
                                 for i, p in proportions],
                        shuffle=True, shuffle_seed=int(config.get("seed", 0)),
                        batch_size=batch)
    loader = StreamingDataLoader(dataset, batch_size=batch, num_workers=workers,
                                 collate_fn=MosaicPack(rows, seq_len),
                                 multiprocessing_context="fork" if workers else None)
    state = {"iterator": None}

    def batches() -> Iterator[Dict]:
        while True:  # epoch after epoch
            state["iterator"] = iter(loader)
            for packed in state["iterator"]:
                yield from packed["micro_batches"]

    def close() -> None:
        from streaming.base.util import clean_stale_shared_memory

        if state["iterator"] is not None:
            # Its DataLoader iterator goes with it, which stops and joins the workers.
            state["iterator"].close()
            state["iterator"] = None
        if dist.is_initialized():
            clean_stale_shared_memory()  # local rank 0 cleans, every rank waits
        elif rank == 0:
            os.environ["WORLD_SIZE"] = "1"  # no process group of its own for the cleanup
            clean_stale_shared_memory()

    return batches(), close


def main() -> int:
    """Convert only: `python -m harness.peers [--energon|--mosaic] CONFIG.json OUT_DIR`
    (LitData unless --energon or --mosaic)."""
    import sys

    args = sys.argv[1:]
    convert = litdata_convert
    if args and args[0] in ("--energon", "--mosaic"):
        convert = energon_convert if args[0] == "--energon" else mosaic_convert
        args = args[1:]
    with open(args[0]) as f:
        config = json.load(f)
    folders = convert(config, args[1])
    print(json.dumps(folders), flush=True)  # the last line: the harness reads it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
