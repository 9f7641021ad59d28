"""The per-rank baseline: what teams run today instead of Braid.

Every trainer rank builds its own PyTorch ``DataLoader`` over ``BaselineDataset``, an
``IterableDataset`` with worker processes (fork). Each worker opens every source's
Parquet files, draws sources by weight with its own seeded RNG (per rank and worker),
keeps a shuffle buffer per source and packs documents in the order drawn into
``seq_len`` sequences (a document that does not fit is split; the rest starts the next
sequence), ``micro_batch_size`` sequences per item, with the same tensors as
``braid.Loader``: ``input_ids``, ``labels`` (-100 where a document ends),
``loss_mask``, ``position_ids`` (restarting at every piece), ``cu_seqlens``,
``source_ids``, and for image documents ``pixel_values`` (one row per placeholder
token in the micro-batch).

It reads the sources a Braid config names, the way such a loader does:
- a `tokens_column` source: the token lists (only that column, a row group at a time;
  documents are NumPy views of the Arrow values buffer, no Python lists);
- a `text_column` source: the strings, tokenized a row group at a time with the
  `sentencepiece` package and the config's model (BOS/EOS as `tokenizer.bos/eos` say);
- an `image_column` + `text_column` source: each image decoded with Pillow, resized as
  Braid does (scaled down to `image.max_pixels`, sides rounded to `image.patch_size`,
  bilinear), normalized to [-1, 1] and cut into patches with NumPy; the document is
  `[BOS] placeholders caption [EOS]` with one placeholder per patch (`oversize: skip`
  drops documents longer than `seq_len`).

Weights may be constant, `{schedule: ...}` (piecewise linear) or `{steps: ...}`
(piecewise constant), and `phases` change `seq_len` and weights: the worker evaluates
them at the step its next micro-batch belongs to (the rank's micro-batches alternate
between the workers, so the worker knows which). A source is drawn with probability
proportional to its weight divided by its mean document length so far, so that the
token shares, not the document counts, follow the weights.

What it cannot do, and Braid does: exact per-step shares (sources are drawn per
document), one read of each source for the whole job (every worker of every rank reads
every source), cost-balanced ranks, a resumable state, streams of different ranks that
together cover each source once per epoch (ranks only differ by seed).

    from harness.baseline import make_loader
    loader = make_loader("job.json", rank=0, world_size=8, workers=2)
    for batch in loader: ...

    PYTHONPATH=benchmarks python -m harness.baseline job.json [--rank 0] \
        [--world-size 8] [--workers 2] [--micro-batches 16]

`metadata=True` (``BaselineDataset(..., metadata=True)``) reads and tokenizes the same
documents but decodes no image (its size comes from the header) and yields only
``cu_seqlens``, ``source_ids`` and ``image_tokens`` per piece: what
``benchmarks/bench.py`` uses to measure the baseline's imbalance at a large dp in one
process.
"""

from __future__ import annotations

import argparse
import bisect
import glob
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow.parquet as pq
import torch

IGNORE_LABEL = -100


# ----------------------------------------------------------------------------------------
# Config


def _weight_fn(value, where: str):
    """A Braid weight (a number, {schedule: [[step, w]...]} or {steps: [[step, w]...]})
    as a function of the step."""
    if isinstance(value, (int, float)):
        return lambda step, v=float(value): v
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("schedule",
                                                                              "steps"):
        kind, points = next(iter(value.items()))
        xs = [float(p[0]) for p in points]
        ys = [float(p[1]) for p in points]
        if kind == "schedule":
            return lambda step: float(np.interp(step, xs, ys))
        return lambda step: ys[max(0, bisect.bisect_right(xs, step) - 1)]
    raise ValueError(f"{where}: the baseline takes a number, schedule or steps")


@dataclass
class Source:
    name: str
    paths: Sequence[str]  # Parquet files
    column: str  # tokens_column (list of ids) or text_column (strings)
    weight: Any  # a number or a function of the step
    kind: str = "tokens"  # tokens | text | image
    image_column: str = ""
    patch_size: int = 14
    max_pixels: int = 262144
    image_token_id: int = 0
    skip_oversize: bool = False

    def weight_at(self, step: int) -> float:
        return self.weight(step) if callable(self.weight) else float(self.weight)


@dataclass
class Plan:
    """What the config says about the shape of each step."""

    seq_len: int
    micro_batch_size: int = 1
    global_tokens: int = 0  # 0: one micro-batch per rank per step
    dp: int = 1
    phases: List[dict] = field(default_factory=list)  # until_step, seq_len, weights

    def phase(self, step: int) -> Optional[dict]:
        for p in self.phases:
            if step < p["until_step"]:
                return p
            continue
        return None

    def seq_len_at(self, step: int) -> int:
        p = self.phase(step)
        return int(p.get("seq_len", self.seq_len)) if p else self.seq_len

    def micro_batches_at(self, step: int) -> int:
        if not self.global_tokens:
            return 1
        return max(1, self.global_tokens // (self.dp * self.micro_batch_size *
                                             self.seq_len_at(step)))


def resolve_paths(path: str) -> List[str]:
    """A file, a folder (every *.parquet below it) or a glob, sorted, as Braid does."""
    if os.path.isdir(path):
        found = [os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                 if f.endswith(".parquet")]
    elif any(c in path for c in "*?["):
        found = glob.glob(path, recursive=True)
    else:
        found = [path] if os.path.isfile(path) else []
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


def _abs(path: str, base_dir: str) -> str:
    return path if "://" in path or os.path.isabs(path) else os.path.join(base_dir, path)


def sources_from_config(config: dict, base_dir: str = ".") -> List[Source]:
    out = []
    for i, s in enumerate(config["sources"]):
        where = f"sources[{i}]"
        common = dict(name=s["name"], paths=resolve_paths(_abs(s["path"], base_dir)),
                      weight=_weight_fn(s.get("weight", 1.0), where + ".weight"),
                      skip_oversize=s.get("oversize") == "skip")
        if "tokens_column" in s:
            out.append(Source(column=s["tokens_column"], **common))
        elif "image_column" in s and "text_column" in s:
            image = s.get("image", {})
            out.append(Source(column=s["text_column"], kind="image",
                              image_column=s["image_column"],
                              patch_size=int(image.get("patch_size", 14)),
                              max_pixels=int(image.get("max_pixels", 262144)),
                              image_token_id=int(image["image_token_id"]), **common))
        elif "text_column" in s:
            out.append(Source(column=s["text_column"], kind="text", **common))
        else:
            raise ValueError(f"{where}: the baseline reads tokens_column, text_column and "
                             "image_column + text_column sources")
    return out


def plan_from_config(config: dict) -> Plan:
    batch = config["batch"]
    phases = []
    for p in config.get("phases", []):
        phases.append({"until_step": int(p["until_step"]),
                       "seq_len": int(p.get("seq_len", batch["seq_len"])),
                       "weights": {k: _weight_fn(v, f"phases.weights.{k}")
                                   for k, v in p.get("weights", {}).items()}})
    return Plan(seq_len=int(batch["seq_len"]),
                micro_batch_size=int(batch.get("micro_batch_size", 1)),
                global_tokens=int(batch.get("global_tokens", 0)),
                dp=int(config.get("topology", {}).get("dp", 1)), phases=phases)


# ----------------------------------------------------------------------------------------
# Documents


@dataclass
class Document:
    ids: np.ndarray
    patches: Optional[np.ndarray] = None  # [placeholders, 3 * p * p] float32
    image_start: int = 0  # index of the first placeholder in ids
    image_tokens: int = 0  # placeholders (metadata mode: no patches)


def image_grid(height: int, width: int, patch: int, max_pixels: int) -> Tuple[int, int]:
    """Braid's resize rule (docs/sources.md): scale down keeping the aspect ratio to at
    most max_pixels, round each side to patches (at least one), and drop patches from the
    longer side while rounding up overshot."""
    scale = min(1.0, (max_pixels / float(height * width)) ** 0.5)
    gh = max(1, int(round(height * scale / patch)))
    gw = max(1, int(round(width * scale / patch)))
    while gh * gw * patch * patch > max_pixels and (gh > 1 or gw > 1):
        if gh >= gw:
            gh -= 1
        else:
            gw -= 1
    return gh, gw


def image_patches(data: bytes, patch: int, max_pixels: int) -> np.ndarray:
    """Decodes, resizes, normalizes and cuts one image: [gh * gw, 3 * patch * patch]."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        rgb = img.convert("RGB")
    gh, gw = image_grid(rgb.height, rgb.width, patch, max_pixels)
    rgb = rgb.resize((gw * patch, gh * patch), Image.BILINEAR)
    x = (np.asarray(rgb, dtype=np.float32) / 255.0 - 0.5) / 0.5  # [H, W, 3]
    x = x.reshape(gh, patch, gw, patch, 3).transpose(0, 2, 4, 1, 3)  # gh, gw, c, y, x
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * patch * patch))


def image_size(data: bytes) -> Tuple[int, int]:
    """(height, width) from the header alone."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.height, img.width


class _Tokenizer:
    """The config's SentencePiece model through the `sentencepiece` package."""

    def __init__(self, config: dict, base_dir: str):
        spec = config.get("tokenizer", {})
        if spec.get("type", "sentencepiece") != "sentencepiece":
            raise ValueError("tokenizer.type: the baseline tokenizes with sentencepiece only")
        try:
            import sentencepiece
        except ImportError:
            raise ImportError("the baseline tokenizes text with the sentencepiece "
                              "package: pip install 'braid[bench]'") from None

        self.sp = sentencepiece.SentencePieceProcessor(
            model_file=_abs(spec["model"], base_dir))
        self.bos = [self.sp.bos_id()] if spec.get("bos", False) else []
        self.eos = [self.sp.eos_id()] if spec.get("eos", True) else []

    def encode(self, texts: List[str]) -> List[List[int]]:
        return [self.bos + ids + self.eos for ids in self.sp.encode(texts)]


class _SourceStream:
    """One source as seen by one worker: endless epochs of documents.

    Each epoch permutes the (file, row group) pairs; a row group is read whole (the
    columns the source needs) and its rows pass through a shuffle buffer of
    `buffer_size` documents. A token document is a view of its row group's values
    buffer, so a row group stays alive while the buffer holds one of its documents.
    """

    def __init__(self, source: Source, rng: np.random.Generator, buffer_size: int,
                 tokenizer: Optional[_Tokenizer], seq_len: int, metadata: bool):
        self.source = source
        self.rng = rng
        self.buffer_size = max(1, buffer_size)
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.metadata = metadata
        self.files = [pq.ParquetFile(p) for p in source.paths]  # footers, kept open
        self.row_groups = [(f, g) for f, pf in enumerate(self.files)
                           for g in range(pf.metadata.num_row_groups)]
        self.order: List[int] = []
        self.buffer: List[Document] = []
        self.incoming: Iterator[Document] = iter(())
        self.documents = 0
        self.tokens = 0

    def mean_length(self) -> float:
        return self.tokens / self.documents if self.documents else 1.0

    def _read_next_row_group(self) -> Iterator[Document]:
        if not self.order:
            self.order = list(self.rng.permutation(len(self.row_groups)))
        f, g = self.row_groups[self.order.pop()]
        kind = self.source.kind
        columns = [self.source.column] + ([self.source.image_column]
                                          if kind == "image" else [])
        table = self.files[f].read_row_group(g, columns=columns)
        if kind == "tokens":
            for chunk in table.column(0).chunks:
                if chunk.null_count:
                    raise ValueError(f"{self.source.paths[f]}: null rows in row group {g}")
                offsets = np.asarray(chunk.offsets)  # honours the chunk's own offset
                values = chunk.values.to_numpy(zero_copy_only=True)
                for i in range(len(chunk)):
                    if offsets[i + 1] > offsets[i]:
                        yield Document(values[offsets[i]:offsets[i + 1]])
            return
        ids = self.tokenizer.encode(table.column(self.source.column).to_pylist())
        if kind == "text":
            for row in ids:
                if row:
                    yield Document(np.asarray(row, np.int64))
            return
        images = table.column(self.source.image_column).to_pylist()
        s = self.source
        for row, imgs in zip(ids, images):
            imgs = imgs if isinstance(imgs, list) else [imgs]
            lead = 1 if self.tokenizer.bos else 0
            if self.metadata:
                count = sum(int(np.prod(image_grid(*image_size(b), s.patch_size,
                                                   s.max_pixels))) for b in imgs)
                patches = None
            else:
                patches = np.concatenate([image_patches(b, s.patch_size, s.max_pixels)
                                          for b in imgs])
                count = len(patches)
            doc = np.concatenate([np.asarray(row[:lead], np.int64),
                                  np.full(count, s.image_token_id, np.int64),
                                  np.asarray(row[lead:], np.int64)])
            if s.skip_oversize and len(doc) > self.seq_len:
                continue
            yield Document(doc, patches, lead, count)

    def _pull(self) -> Optional[Document]:
        for _ in range(2):  # an empty row group, then a fresh one
            doc = next(self.incoming, None)
            if doc is not None:
                self.documents += 1
                self.tokens += len(doc.ids)
                return doc
            self.incoming = self._read_next_row_group()
        return None

    def fill(self) -> None:
        while len(self.buffer) < self.buffer_size:
            doc = self._pull()
            if doc is None:
                break
            self.buffer.append(doc)

    def next_document(self) -> Document:
        self.fill()
        if not self.buffer:
            raise ValueError(f"source {self.source.name}: no documents")
        k = int(self.rng.integers(len(self.buffer)))
        self.buffer[k], self.buffer[-1] = self.buffer[-1], self.buffer[k]
        return self.buffer.pop()


# ----------------------------------------------------------------------------------------
# Packing


class _Packer:
    """Packs documents in order into micro-batches of `rows` x `seq_len` tokens."""

    def __init__(self, rows: int, seq_len, metadata: bool = False):
        """`seq_len`: an int, or a function of the number of micro-batches emitted so far
        (phases change the sequence length of later micro-batches)."""
        self.rows, self.metadata = rows, metadata
        self.seq_len_of = seq_len if callable(seq_len) else (lambda emitted: seq_len)
        self.emitted = 0
        self._new()

    def _new(self) -> None:
        self.seq_len = self.seq_len_of(self.emitted)
        self.cu = [0]
        self.src_runs: List[int] = []
        self.image_tokens: List[int] = []
        self.patches: List[np.ndarray] = []
        self.t = 0  # tokens placed in this micro-batch
        if self.metadata:
            return
        shape = (self.rows, self.seq_len)
        self.ids = np.zeros(shape, np.int64)
        self.labels = np.full(shape, IGNORE_LABEL, np.int64)
        self.mask = np.zeros(shape, np.float32)
        self.pos = np.zeros(shape, np.int64)
        self.src = np.zeros(shape, np.int32)

    def add(self, doc: Document, source: int) -> List[Dict[str, torch.Tensor]]:
        """Places `doc` (split across sequences as needed); returns full micro-batches."""
        out = []
        n = len(doc.ids)
        start = 0
        while start < n:
            room = self.seq_len - self.t % self.seq_len
            take = min(room, n - start)
            a, b = self.t, self.t + take
            # Placeholders of this piece: [lo, hi) of the document's image run.
            lo = max(start, doc.image_start) - doc.image_start
            hi = min(start + take, doc.image_start + doc.image_tokens) - doc.image_start
            images = max(0, hi - lo)
            if not self.metadata:
                ids, labels = self.ids.reshape(-1), self.labels.reshape(-1)
                mask, pos = self.mask.reshape(-1), self.pos.reshape(-1)
                ids[a:b] = doc.ids[start:start + take]
                # A token's target is the next token of its document, across pieces.
                has_next = min(take, n - start - 1)
                labels[a:a + has_next] = doc.ids[start + 1:start + 1 + has_next]
                mask[a:a + has_next] = 1.0
                if doc.image_tokens:  # no loss on predicting a placeholder
                    first = doc.image_start - 1 - start
                    last = doc.image_start + doc.image_tokens - 1 - start
                    if last > 0 and first < take:
                        labels[a + max(0, first):a + min(take, last)] = IGNORE_LABEL
                        mask[a + max(0, first):a + min(take, last)] = 0.0
                pos[a:b] = np.arange(take)
                self.src.reshape(-1)[a:b] = source
                if images and doc.patches is not None:
                    self.patches.append(doc.patches[lo:hi])
            self.src_runs.append(source)
            self.image_tokens.append(images)
            self.t = b
            self.cu.append(b)
            start += take
            if self.t == self.rows * self.seq_len:
                out.append(self._emit())
        return out

    def _emit(self) -> Dict[str, torch.Tensor]:
        cu = torch.from_numpy(np.asarray(self.cu, np.int32))
        if self.metadata:
            batch = {"cu_seqlens": cu,
                     "source_ids": torch.tensor(self.src_runs, dtype=torch.int32),
                     "image_tokens": torch.tensor(self.image_tokens, dtype=torch.int64)}
        else:
            batch = {"input_ids": torch.from_numpy(self.ids),
                     "labels": torch.from_numpy(self.labels),
                     "loss_mask": torch.from_numpy(self.mask),
                     "position_ids": torch.from_numpy(self.pos),
                     "cu_seqlens": cu,
                     "source_ids": torch.from_numpy(self.src)}
            if self.patches:
                batch["pixel_values"] = torch.from_numpy(np.concatenate(self.patches))
        self.emitted += 1
        self._new()
        return batch


# ----------------------------------------------------------------------------------------
# Dataset and loader


class BaselineDataset(torch.utils.data.IterableDataset):
    """Micro-batches for one rank; each DataLoader worker makes its own stream.

    Nothing is opened before ``__iter__`` (which runs in the worker after the fork).
    The stream of worker `w` of rank `r` is a pure function of (seed, r, w); a
    DataLoader alternates between its workers.
    """

    def __init__(self, sources: Sequence[Source], plan: Plan, seed: int = 0, rank: int = 0,
                 shuffle_buffer: int = 64, tokenizer_spec: Tuple[dict, str] = ({}, "."),
                 metadata: bool = False):
        if not sources:
            raise ValueError("no sources")
        self.sources = list(sources)
        self.plan = plan
        self.seed = seed
        self.rank = rank
        self.shuffle_buffer = shuffle_buffer
        self.tokenizer_spec = tokenizer_spec
        self.metadata = metadata

    @classmethod
    def from_braid_config(cls, config, rank: int = 0, world_size: int = 0,
                          shuffle_buffer: int = 64, metadata: bool = False
                          ) -> "BaselineDataset":
        base_dir = "." if isinstance(config, dict) else os.path.dirname(
            os.path.abspath(config))
        cfg = load_braid_config(config)
        plan = plan_from_config(cfg)
        if world_size:
            plan.dp = world_size
        return cls(sources_from_config(cfg, base_dir), plan, seed=int(cfg.get("seed", 0)),
                   rank=rank, shuffle_buffer=shuffle_buffer,
                   tokenizer_spec=(cfg, base_dir), metadata=metadata)

    def worker_stream(self, worker: int, workers: int) -> Iterator[Dict[str, torch.Tensor]]:
        """Worker `worker`'s micro-batches: the rank's items worker, worker + workers, ..."""
        rng = np.random.default_rng([self.seed, self.rank, worker])
        tokenizer = None
        if any(s.kind != "tokens" for s in self.sources):
            tokenizer = _Tokenizer(*self.tokenizer_spec)
        longest = max([self.plan.seq_len] + [p["seq_len"] for p in self.plan.phases])
        streams = [_SourceStream(s, np.random.default_rng([self.seed, self.rank, worker, i]),
                                 self.shuffle_buffer, tokenizer, longest, self.metadata)
                   for i, s in enumerate(self.sources)]
        for stream in streams:  # the first row group: a first mean document length
            stream.fill()
        step_of = _StepCounter(self.plan)
        # The rank's k-th micro-batch from this worker is its item worker + k * workers.
        packer = _Packer(self.plan.micro_batch_size,
                         lambda k: self.plan.seq_len_at(step_of(worker + k * workers)),
                         self.metadata)
        while True:
            step = step_of(worker + packer.emitted * workers)
            phase = self.plan.phase(step)
            weights = np.array([
                (phase["weights"][s.name](step) if phase and s.name in phase["weights"]
                 else s.weight_at(step)) / max(1.0, st.mean_length())
                for s, st in zip(self.sources, streams)], np.float64)
            if (weights < 0).any() or weights.sum() <= 0:
                raise ValueError(f"step {step}: weights must be >= 0 and not all 0")
            s = int(rng.choice(len(weights), p=weights / weights.sum()))
            yield from packer.add(streams[s].next_document(), s)

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.worker_stream(worker, workers)


class _StepCounter:
    """The step of the rank's `item`-th micro-batch (micro-batches per rank per step
    change with the phases' seq_len)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.starts = [0]  # starts[k]: the rank's first item of step k

    def __call__(self, item: int) -> int:
        while self.starts[-1] <= item:
            step = len(self.starts) - 1
            self.starts.append(self.starts[-1] + self.plan.micro_batches_at(step))
        return bisect.bisect_right(self.starts, item) - 1


def make_loader(config, rank: int = 0, world_size: int = 1, workers: int = 2,
                prefetch_factor: int = 2, shuffle_buffer: int = 64
                ) -> torch.utils.data.DataLoader:
    """The rank's DataLoader (fork workers). `world_size` is the dp of the steps (their
    micro-batches per rank); every rank reads the whole mix with its own seed, as
    per-rank loaders do."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in [0, {world_size})")
    dataset = BaselineDataset.from_braid_config(config, rank=rank, world_size=world_size,
                                                shuffle_buffer=shuffle_buffer)
    extra = {}
    if workers > 0:
        extra = {"multiprocessing_context": "fork", "prefetch_factor": prefetch_factor}
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                       **extra)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", help="a Braid config (JSON or YAML)")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shuffle-buffer", type=int, default=64, help="documents per source")
    p.add_argument("--micro-batches", type=int, default=16)
    args = p.parse_args(argv)
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
