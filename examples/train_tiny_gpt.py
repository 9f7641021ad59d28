"""Train a tiny GPT on CPU with PyTorch DDP (gloo, 2 ranks) fed by ``braid.Loader``.

Packed sequences: every micro-batch row holds several documents, and attention is
restricted to each document through ``cu_seqlens`` (a block-diagonal causal mask), with
positions restarting at every document (``position_ids``). The loss is summed over the
tokens where ``loss_mask`` is 1 and divided by the step's token count over every rank.

A checkpoint holds the model, the optimizer and ``loader.state_dict()``; ``--resume``
continues from it. Training is seeded and runs one thread per rank, so a run stopped at
step K and resumed computes the same losses as the run that never stopped.

Commands (each launches 2 ranks itself, or runs under ``torchrun --nproc_per_node 2``):

    python examples/train_tiny_gpt.py                 # = compare: the whole demonstration
    python examples/train_tiny_gpt.py data DIR        # write the dataset and DIR/job.json
    python examples/train_tiny_gpt.py train --config DIR/job.json --run-dir RUN \
        --steps 300 [--stop-at 150] [--resume]
    torchrun --nproc_per_node 2 examples/train_tiny_gpt.py train --config ... \
        --run-dir ...
    python examples/train_tiny_gpt.py compare --out out/tiny_gpt --steps 300 --stop-at 150

``compare`` writes the dataset, trains without stopping, trains again stopping at
``--stop-at`` (a checkpoint, then the processes exit), resumes in fresh processes, and
writes ``losses.json`` (both curves, their largest difference) and ``losses.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import braid
from braid.integrations.masks import attend_mask

WORLD_SIZE = 2

# Token ids: 0 unused, 1 starts every document; "motifs" uses 2..127, "counting" 128..255.
VOCAB = 256
BOS = 1


# --- Data: two sources with structure a small model can learn ---

def write_dataset(root: Path, *, seed: int = 0, docs_per_source: int = 3000,
                  seq_len: int = 128, micro_batch_size: int = 8,
                  micro_batches: int = 1) -> Path:
    """Writes two Parquet token sources and a Braid config under ``root``.

    ``motifs``: a random motif of 2-8 tokens repeated to the document's length (the model
    learns to copy from earlier in the same document). ``counting``: ``start, start +
    stride, ...`` modulo 128 with a stride of 1-3 (learnable from the last two tokens).
    Returns the config path (``root/job.json``).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)

    def motifs(n: int) -> List[List[int]]:
        docs = []
        for _ in range(n):
            motif = rng.integers(2, 128, size=int(rng.integers(2, 9)))
            length = int(rng.integers(8, 2 * seq_len))
            docs.append([BOS] + np.resize(motif, length).tolist())
        return docs

    def counting(n: int) -> List[List[int]]:
        docs = []
        for _ in range(n):
            start, stride = int(rng.integers(0, 128)), int(rng.integers(1, 4))
            length = int(rng.integers(8, seq_len))
            body = 128 + (start + stride * np.arange(length)) % 128
            docs.append([BOS] + body.tolist())
        return docs

    sources = []
    for name, make, weight in (("motifs", motifs, 0.6), ("counting", counting, 0.4)):
        docs = make(docs_per_source)
        half = len(docs) // 2
        for part, chunk in enumerate((docs[:half], docs[half:])):
            path = root / name / f"part-{part:03d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            table = pa.table({"input_ids": pa.array(chunk, type=pa.list_(pa.int32()))})
            pq.write_table(table, path, row_group_size=256)
        sources.append({"name": name, "path": name, "tokens_column": "input_ids",
                        "weight": weight, "shuffle_window": 512})
    config = {
        "seed": seed,
        "topology": {"dp": WORLD_SIZE, "tp": 1, "pp": 1, "cp": 1},
        "batch": {"global_tokens":
                  WORLD_SIZE * micro_batches * micro_batch_size * seq_len,
                  "seq_len": seq_len, "micro_batch_size": micro_batch_size,
                  "packing": True},
        "balance": {"cost": {"attn": 1.0, "linear": float(seq_len)},
                    "algorithm": "karmarkar_karp"},
        "runtime": {"threads": 1},
        "sources": sources,
    }
    path = root / "job.json"
    path.write_text(json.dumps(config, indent=1))
    return path


# --- Model ---

class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        # allowed: [b, 1, t, t], True where token i may attend to token j.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, width: int, layers: int,
                 heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                cu_seqlens: torch.Tensor) -> torch.Tensor:
        mbs, seq_len = input_ids.shape
        # Each token sees itself and the earlier tokens of its own document only.
        allowed = attend_mask(cu_seqlens, mbs, seq_len)
        x = self.tok(input_ids) + self.pos(position_ids)
        for block in self.blocks:
            x = block(x, allowed)
        return self.head(self.ln(x))


# --- Training (one rank) ---

def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def save_checkpoint(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # a crash mid-save never leaves a torn checkpoint


def train_rank(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    # One core per rank, which also fixes the order of every sum: with the seed, a rerun
    # and a resumed run compute the same bits (torch.use_deterministic_algorithms is not
    # needed for these CPU ops, and would import the compiler stack at start).
    torch.set_num_threads(1)
    run = Path(args.run_dir)
    ckpt_path = run / "checkpoint.pt"

    loader = braid.Loader(args.config, rank=rank, world_size=world)
    seq_len = json.loads(Path(args.config).read_text())["batch"]["seq_len"]
    torch.manual_seed(args.seed)
    model = TinyGPT(VOCAB, seq_len, args.width, args.layers, args.heads)
    ddp = nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                              betas=(0.9, 0.95))

    losses: List[float] = []
    start = 0
    if args.resume:
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"][rank])
        start, losses = ckpt["step"], ckpt["losses"]
        if rank == 0:
            print(f"resumed from {ckpt_path} at step {start}", flush=True)

    stop = args.stop_at if args.stop_at else args.steps
    batches = iter(loader)
    began = time.perf_counter()
    for step in range(start, stop):
        for group in optim.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        micro = [next(batches) for _ in range(loader.micro_batches_at(step))]
        # Every target token of the step, over all ranks, weighs the same.
        count = torch.stack([m["loss_mask"].sum() for m in micro]).sum().double()
        dist.all_reduce(count)
        count.clamp_(min=1)
        total = torch.zeros((), dtype=torch.float64)
        optim.zero_grad(set_to_none=True)
        for i, m in enumerate(micro):
            last = i == len(micro) - 1
            with ddp.no_sync() if not last else contextlib.nullcontext():
                logits = ddp(m["input_ids"], m["position_ids"], m["cu_seqlens"])
                per_token = F.cross_entropy(logits.flatten(0, 1), m["labels"].flatten(),
                                            ignore_index=-100, reduction="none")
                summed = (per_token * m["loss_mask"].flatten()).sum()
                # DDP averages gradients over ranks: scale by the world size.
                (summed * world / count.float()).backward()
            total += summed.detach().double()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        dist.all_reduce(total)
        losses.append(float(total / count))
        if rank == 0 and (step % args.log_every == 0 or step == stop - 1):
            rate = (step + 1 - start) / (time.perf_counter() - began)
            pieces = sum(len(m["cu_seqlens"]) - 1 for m in micro)
            rows = sum(m["input_ids"].shape[0] for m in micro)
            print(f"step {step:5d}  loss {losses[-1]:.4f}  {rate:.1f} steps/s  "
                  f"{pieces / rows:.1f} segments/row", flush=True)
        done = step + 1
        if done == stop or (args.save_every and done % args.save_every == 0):
            states = [None] * world
            dist.all_gather_object(states, loader.state_dict())
            if rank == 0:
                save_checkpoint(ckpt_path, {
                    "step": done, "model": model.state_dict(),
                    "optimizer": optim.state_dict(), "loader": states,
                    "losses": losses, "args": vars(args)})
            dist.barrier()
    loader.close()
    if rank == 0:
        (run / "losses.json").write_text(json.dumps(
            {"losses": losses, "seconds": time.perf_counter() - began}))


def _run_rank(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    try:
        train_rank(args)
    finally:
        dist.destroy_process_group()


def launch_ranks(train_argv: List[str], timeout: float) -> None:
    """Runs ``train_argv`` in WORLD_SIZE new processes of this script with the variables
    torchrun sets (what ``torchrun --standalone --nproc_per_node 2`` does), and waits."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "train", *train_argv],
        env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD_SIZE)})
        for rank in range(WORLD_SIZE)]
    deadline = time.monotonic() + timeout
    # A launcher stopped with SIGTERM stops its ranks too (the finally below).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                raise RuntimeError(f"a rank failed: exit codes {codes}")
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks still running after {timeout} s")
            time.sleep(0.1)
    finally:
        for p in procs:  # the others, after one failed: they would wait on it
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def train(args: argparse.Namespace, argv: List[str]) -> None:
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:  # one rank (torchrun's)
        _run_rank(args)
    else:
        launch_ranks(argv, args.timeout)


# --- The demonstration: uninterrupted against stopped + resumed ---

def compare(args: argparse.Namespace) -> Dict[str, object]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = write_dataset(out / "data", seed=args.seed, docs_per_source=args.docs,
                           seq_len=args.seq_len, micro_batch_size=args.micro_batch_size,
                           micro_batches=args.micro_batches)
    common = ["--config", str(config), "--steps", str(args.steps), "--seed",
              str(args.seed), "--width", str(args.width), "--layers", str(args.layers),
              "--heads", str(args.heads), "--lr", str(args.lr), "--warmup",
              str(args.warmup), "--log-every", str(args.log_every), "--timeout",
              str(args.timeout)]
    runs = {"uninterrupted": [], "stopped": ["--stop-at", str(args.stop_at)],
            "resumed": ["--resume"]}
    script = os.path.relpath(__file__)
    seconds = {}
    for name, extra in runs.items():
        run_dir = out / ("interrupted" if name != "uninterrupted" else name)
        train_argv = ["--run-dir", str(run_dir), *common, *extra]
        began = time.perf_counter()
        # Fresh processes for each run: the resumed one knows only the checkpoint.
        if args.launcher == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", str(WORLD_SIZE), script, "train", *train_argv]
            print(f"== {name}: torchrun {' '.join(cmd[3:])}", flush=True)
            subprocess.run(cmd, check=True, timeout=args.timeout)
        else:
            print(f"== {name}: python {script} train {' '.join(train_argv)}", flush=True)
            launch_ranks(train_argv, args.timeout)
        seconds[name] = round(time.perf_counter() - began, 2)
    full = json.loads((out / "uninterrupted" / "losses.json").read_text())["losses"]
    resumed = json.loads((out / "interrupted" / "losses.json").read_text())["losses"]
    k = args.stop_at
    diffs = [abs(a - b) for a, b in zip(full[k:], resumed[k:])]
    result = {
        "steps": args.steps, "stop_at": k,
        "uninterrupted": full, "interrupted": resumed,
        "max_abs_diff_after_resume": max(diffs) if diffs else 0.0,
        "bitwise_equal_after_resume": full[k:] == resumed[k:],
        "loss_first": full[0], "loss_last": full[-1],
        "loss_first10_mean": float(np.mean(full[:10])),
        "loss_last10_mean": float(np.mean(full[-10:])),
        "seconds": seconds,
        "model": {"width": args.width, "layers": args.layers, "heads": args.heads,
                  "seq_len": args.seq_len, "vocab": VOCAB},
    }
    (out / "losses.json").write_text(json.dumps(result, indent=1))
    plotted = plot(result, out / "losses.png")
    print(f"loss {full[0]:.4f} -> {full[-1]:.4f} over {args.steps} steps; resumed at "
          f"step {k}: largest difference {result['max_abs_diff_after_resume']:.3g} "
          f"(bitwise equal: {result['bitwise_equal_after_resume']}); "
          f"wrote {out / 'losses.json'}" + (f" and {plotted}" if plotted else ""))
    return result


def plot(result: Dict[str, object], path: Path) -> Optional[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    full, resumed, k = result["uninterrupted"], result["interrupted"], result["stop_at"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(range(1, len(full) + 1), full, color="tab:blue", lw=2.5, alpha=0.6,
            label="uninterrupted")
    ax.plot(range(1, k + 1), resumed[:k], color="tab:orange", lw=1,
            label=f"stopped at step {k}")
    ax.plot(range(k + 1, len(resumed) + 1), resumed[k:], color="tab:red", lw=1,
            ls="--", label="resumed from the checkpoint")
    ax.axvline(k, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean over target tokens, both ranks)")
    ax.set_title("Tiny GPT, DDP 2 ranks on braid.Loader "
                 "(packed, per-document attention)\n"
                 f"largest difference after resume: "
                 f"{result['max_abs_diff_after_resume']:.3g}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")

    def model_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--steps", type=int, default=300)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--width", type=int, default=64)
        p.add_argument("--layers", type=int, default=2)
        p.add_argument("--heads", type=int, default=4)
        p.add_argument("--lr", type=float, default=1e-2)
        p.add_argument("--warmup", type=int, default=10)
        p.add_argument("--log-every", type=int, default=25)
        p.add_argument("--timeout", type=int, default=600,
                       help="seconds before a hung rank or run is given up")

    p_data = sub.add_parser("data", help="write the dataset and its config")
    p_data.add_argument("dir")
    p_data.add_argument("--seed", type=int, default=0)

    p_train = sub.add_parser("train", help="train 2 ranks (or one rank under torchrun)")
    p_train.add_argument("--config", required=True)
    p_train.add_argument("--run-dir", required=True,
                         help="folder of checkpoint.pt and losses.json")
    p_train.add_argument("--stop-at", type=int, default=0,
                         help="save a checkpoint after this step and exit")
    p_train.add_argument("--save-every", type=int, default=0,
                         help="also save a checkpoint every this many steps")
    p_train.add_argument("--resume", action="store_true")
    model_flags(p_train)

    p_cmp = sub.add_parser("compare",
                           help="uninterrupted vs stopped + resumed, JSON + PNG")
    p_cmp.add_argument("--out", default="out/tiny_gpt")
    p_cmp.add_argument("--stop-at", type=int, default=None, help="default: --steps / 2")
    p_cmp.add_argument("--launcher", choices=("python", "torchrun"), default="python",
                       help="each run as `python THIS train` (which starts its 2 ranks) "
                            "or under torchrun")
    p_cmp.add_argument("--docs", type=int, default=3000, help="documents per source")
    p_cmp.add_argument("--seq-len", type=int, default=128)
    p_cmp.add_argument("--micro-batch-size", type=int, default=8)
    p_cmp.add_argument("--micro-batches", type=int, default=1,
                       help="micro-batches per rank per step (gradient accumulation)")
    model_flags(p_cmp)

    argv = argv if argv is not None else (sys.argv[1:] or ["compare"])
    args = parser.parse_args(argv)
    if args.command == "data":
        print(write_dataset(Path(args.dir), seed=args.seed))
    elif args.command == "train":
        train(args, argv[argv.index("train") + 1:])
    else:
        if args.stop_at is None:
            args.stop_at = args.steps // 2
        if not 0 < args.stop_at < args.steps:
            parser.error("--stop-at must be between 0 and --steps")
        compare(args)


if __name__ == "__main__":
    main()
