"""The per-rank baseline: what teams run today instead of Braid.

Every trainer rank builds its own PyTorch ``DataLoader`` over ``BaselineDataset``, an
``IterableDataset`` with worker processes (fork). Each worker opens every source's
Parquet files, draws sources by weight with its own seeded RNG (per rank and worker),
keeps a shuffle buffer per source and packs documents in the order drawn into
``seq_len`` sequences (a document that does not fit is split; the rest starts the next
sequence), ``micro_batch_size`` sequences per item, with the same tensors as
``braid.Loader``: ``input_ids``, ``labels`` (-100 where a document ends),
``loss_mask``, ``position_ids`` (restarting at every piece), ``cu_seqlens`` and
``source_ids``.

Lean as such a loader honestly is: a row group is read at a time with pyarrow (only the
token column), documents are NumPy views of the Arrow values buffer (no Python lists),
and a micro-batch is filled with slice copies. What it cannot do, and Braid does: exact
per-step shares (sources are drawn per document), one read of each source for the whole
job (every worker of every rank reads every source), cost-balanced ranks, a resumable
state.

    from baseline import make_loader
    loader = make_loader("job.json", rank=0, world_size=8, workers=2)
    for batch in loader: ...

    PYTHONPATH=build/dev/stage .venv/bin/python benchmarks/baseline.py job.json \
        [--rank 0] [--world-size 8] [--workers 2] [--micro-batches 16]

The config is a Braid config (JSON or YAML): its token sources (`path`,
`tokens_column`, a constant `weight`), `seed`, `batch.seq_len` and
`batch.micro_batch_size`.
"""

from __future__ import annotations

import os
import sys

# Never look up modules in this folder when this file runs as a script (a script there
# named like a standard module would shadow it).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import glob
import json
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import pyarrow.parquet as pq
import torch

IGNORE_LABEL = -100


@dataclass(frozen=True)
class Source:
    name: str
    paths: Sequence[str]  # Parquet files
    column: str  # list<int32> / list<int64> token ids
    weight: float


def resolve_paths(path: str) -> List[str]:
    """A file, a folder (every *.parquet below it) or a glob, sorted, as Braid does."""
    if os.path.isdir(path):
        found = [os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                 if f.endswith(".parquet")]
    elif any(c in path for c in "*?["):
        found = glob.glob(path, recursive=True)
    else:
        found = [path]
    if not found:
        raise FileNotFoundError(f"no Parquet files at {path}")
    return sorted(found)


def load_braid_config(config) -> dict:
    """A Braid config as a dict (a dict, or a JSON / YAML file)."""
    if isinstance(config, dict):
        return config
    with open(config) as f:
        text = f.read()
    if str(config).endswith((".yaml", ".yml")):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)


def sources_from_config(config: dict, base_dir: str = ".") -> List[Source]:
    out = []
    for i, s in enumerate(config["sources"]):
        if "tokens_column" not in s:
            raise ValueError(f"sources[{i}]: the baseline reads tokens_column sources only")
        weight = s.get("weight", 1.0)
        if not isinstance(weight, (int, float)):
            raise ValueError(f"sources[{i}].weight: the baseline takes constant weights")
        path = s["path"]
        if "://" not in path and not os.path.isabs(path):
            path = os.path.join(base_dir, path)
        out.append(Source(s["name"], resolve_paths(path), s["tokens_column"],
                          float(weight)))
    return out


class _SourceStream:
    """One source as seen by one worker: endless epochs of documents (NumPy views).

    Each epoch permutes the (file, row group) pairs; a row group is read whole (the token
    column only) and its rows pass through a shuffle buffer of `buffer_size` documents.
    A document is a view of its row group's values buffer, so a row group stays alive
    while the buffer holds one of its documents.
    """

    def __init__(self, source: Source, rng: np.random.Generator, buffer_size: int):
        self.source = source
        self.rng = rng
        self.buffer_size = max(1, buffer_size)
        self.files = [pq.ParquetFile(p) for p in source.paths]  # footers, kept open
        self.row_groups = [(f, g) for f, pf in enumerate(self.files)
                           for g in range(pf.metadata.num_row_groups)]
        self.order: List[int] = []
        self.buffer: List[np.ndarray] = []
        self.incoming: Iterator[np.ndarray] = iter(())

    def _read_next_row_group(self) -> Iterator[np.ndarray]:
        if not self.order:
            self.order = list(self.rng.permutation(len(self.row_groups)))
        f, g = self.row_groups[self.order.pop()]
        table = self.files[f].read_row_group(g, columns=[self.source.column])
        for chunk in table.column(0).chunks:
            if chunk.null_count:
                raise ValueError(f"{self.source.paths[f]}: null rows in row group {g}")
            offsets = np.asarray(chunk.offsets)  # honours the chunk's own offset
            values = chunk.values.to_numpy(zero_copy_only=True)
            for i in range(len(chunk)):
                if offsets[i + 1] > offsets[i]:
                    yield values[offsets[i]:offsets[i + 1]]

    def _pull(self) -> Optional[np.ndarray]:
        for _ in range(2):  # an empty row group, then a fresh one
            doc = next(self.incoming, None)
            if doc is not None:
                return doc
            self.incoming = self._read_next_row_group()
        return None

    def next_document(self) -> np.ndarray:
        while len(self.buffer) < self.buffer_size:
            doc = self._pull()
            if doc is None:
                break
            self.buffer.append(doc)
        if not self.buffer:
            raise ValueError(f"source {self.source.name}: no documents")
        k = int(self.rng.integers(len(self.buffer)))
        self.buffer[k], self.buffer[-1] = self.buffer[-1], self.buffer[k]
        return self.buffer.pop()


class _Packer:
    """Packs documents in order into micro-batches of `rows` x `seq_len` tokens."""

    def __init__(self, rows: int, seq_len: int):
        self.rows, self.seq_len = rows, seq_len
        self._new()

    def _new(self) -> None:
        shape = (self.rows, self.seq_len)
        self.ids = np.zeros(shape, np.int64)
        self.labels = np.full(shape, IGNORE_LABEL, np.int64)
        self.mask = np.zeros(shape, np.float32)
        self.pos = np.zeros(shape, np.int64)
        self.src = np.zeros(shape, np.int32)
        self.cu = [0]
        self.t = 0  # tokens placed in this micro-batch

    def add(self, doc: np.ndarray, source: int) -> List[Dict[str, torch.Tensor]]:
        """Places `doc` (split across sequences as needed); returns full micro-batches."""
        out = []
        ids, labels, mask = self.ids.reshape(-1), self.labels.reshape(-1), self.mask.reshape(-1)
        pos, src = self.pos.reshape(-1), self.src.reshape(-1)
        start, n = 0, len(doc)
        while start < n:
            room = self.seq_len - self.t % self.seq_len
            take = min(room, n - start)
            a, b = self.t, self.t + take
            ids[a:b] = doc[start:start + take]
            # The target of a token is the next token of its document, across pieces.
            has_next = min(take, n - start - 1)
            labels[a:a + has_next] = doc[start + 1:start + 1 + has_next]
            mask[a:a + has_next] = 1.0
            pos[a:b] = np.arange(take)
            src[a:b] = source
            self.t = b
            self.cu.append(b)
            start += take
            if self.t == self.rows * self.seq_len:
                out.append(self._emit())
                ids, labels, mask = (self.ids.reshape(-1), self.labels.reshape(-1),
                                     self.mask.reshape(-1))
                pos, src = self.pos.reshape(-1), self.src.reshape(-1)
        return out

    def _emit(self) -> Dict[str, torch.Tensor]:
        batch = {"input_ids": torch.from_numpy(self.ids),
                 "labels": torch.from_numpy(self.labels),
                 "loss_mask": torch.from_numpy(self.mask),
                 "position_ids": torch.from_numpy(self.pos),
                 "cu_seqlens": torch.from_numpy(np.asarray(self.cu, np.int32)),
                 "source_ids": torch.from_numpy(self.src)}
        self._new()
        return batch


class BaselineDataset(torch.utils.data.IterableDataset):
    """Micro-batches for one rank; each DataLoader worker makes its own stream.

    Nothing is opened before ``__iter__`` (which runs in the worker after the fork).
    The stream of worker `w` of rank `r` is a pure function of (seed, r, w); a
    DataLoader alternates between its workers.
    """

    def __init__(self, sources: Sequence[Source], seq_len: int, micro_batch_size: int = 1,
                 seed: int = 0, rank: int = 0, shuffle_buffer: int = 64):
        if not sources:
            raise ValueError("no sources")
        weights = np.array([s.weight for s in sources], dtype=np.float64)
        if (weights < 0).any() or weights.sum() <= 0:
            raise ValueError("weights must be >= 0 and not all 0")
        self.sources = list(sources)
        self.probs = weights / weights.sum()
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.seed = seed
        self.rank = rank
        self.shuffle_buffer = shuffle_buffer

    @classmethod
    def from_braid_config(cls, config, rank: int = 0, shuffle_buffer: int = 64
                          ) -> "BaselineDataset":
        base_dir = "." if isinstance(config, dict) else os.path.dirname(
            os.path.abspath(config))
        cfg = load_braid_config(config)
        batch = cfg["batch"]
        return cls(sources_from_config(cfg, base_dir), seq_len=int(batch["seq_len"]),
                   micro_batch_size=int(batch.get("micro_batch_size", 1)),
                   seed=int(cfg.get("seed", 0)), rank=rank, shuffle_buffer=shuffle_buffer)

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        rng = np.random.default_rng([self.seed, self.rank, worker])
        streams = [_SourceStream(s, np.random.default_rng([self.seed, self.rank, worker, i]),
                                 self.shuffle_buffer)
                   for i, s in enumerate(self.sources)]
        packer = _Packer(self.micro_batch_size, self.seq_len)
        draws = len(self.sources)
        while True:
            # Draw sources in blocks (one RNG call per 256 documents).
            for s in rng.choice(draws, size=256, p=self.probs):
                yield from packer.add(streams[s].next_document(), int(s))


def make_loader(config, rank: int = 0, world_size: int = 1, workers: int = 2,
                prefetch_factor: int = 2, shuffle_buffer: int = 64
                ) -> torch.utils.data.DataLoader:
    """The rank's DataLoader (fork workers). `world_size` only names the rank's share:
    every rank reads the whole mix with its own seed, as per-rank loaders do."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in [0, {world_size})")
    dataset = BaselineDataset.from_braid_config(config, rank=rank,
                                                shuffle_buffer=shuffle_buffer)
    extra = {}
    if workers > 0:
        extra = {"multiprocessing_context": "fork", "prefetch_factor": prefetch_factor}
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                       **extra)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", help="a Braid config (JSON or YAML) with tokens_column sources")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shuffle-buffer", type=int, default=64, help="documents per source")
    p.add_argument("--micro-batches", type=int, default=16)
    args = p.parse_args()
    loader = make_loader(args.config, args.rank, args.world_size, args.workers,
                         shuffle_buffer=args.shuffle_buffer)
    start = time.monotonic()
    tokens = 0
    for i, batch in enumerate(loader):
        if i == args.micro_batches:
            break
        tokens += batch["input_ids"].numel()
        cu = batch["cu_seqlens"]
        print(f"micro-batch {i}: {tuple(batch['input_ids'].shape)} pieces {len(cu) - 1} "
              f"sources {sorted(set(batch['source_ids'].flatten().tolist()))}", flush=True)
    elapsed = time.monotonic() - start
    print(f"{tokens:,} tokens in {elapsed:.2f} s ({tokens / elapsed:,.0f} tokens/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
