"""examples/train_tiny_gpt.py as a user runs it: DDP on 2 ranks, stop, resume.

One command in a fresh process trains a tiny GPT without stopping, again stopping at step
``STOP`` (a checkpoint with the model, the optimizer and ``loader.state_dict()``), then
resumes in new processes. The resumed losses must equal the uninterrupted ones exactly:
every rank runs one thread, the seed fixes the model and the data, and a sum over 2 ranks
does not depend on the order it is taken in, so nothing may differ (tolerance 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import braid
from braid.integrations.megatron import causal_block_mask

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_tiny_gpt.py"
STEPS, STOP = 16, 7


def test_stopped_and_resumed_run_continues_the_uninterrupted_loss_curve(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(EXAMPLE), "compare", "--out", str(out),
           "--steps", str(STEPS), "--stop-at", str(STOP), "--docs", "200",
           "--seq-len", "64", "--micro-batch-size", "2", "--micro-batches", "2",
           "--width", "32", "--layers", "1", "--heads", "2", "--lr", "1e-2",
           "--warmup", "2", "--log-every", "5", "--timeout", "120"]
    # The example runs 3 trainings of 2 ranks; give up long before pytest would hang.
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    resumed_line = f"resumed from {out / 'interrupted' / 'checkpoint.pt'} at step {STOP}"
    assert resumed_line in done.stdout

    result = json.loads((out / "losses.json").read_text())
    full, interrupted = result["uninterrupted"], result["interrupted"]
    assert len(full) == len(interrupted) == STEPS
    # The loss falls: the mean of the last 4 steps is well under the first 4 (ln 256 =
    # 5.55 at the start; these sources are learnable from the first tokens of a document).
    first, last = sum(full[:4]) / 4, sum(full[-4:]) / 4
    assert last < first - 0.3, full
    # The first part is the same run; after the resume the curve continues exactly.
    assert interrupted[:STOP] == full[:STOP]
    diffs = [abs(a - b) for a, b in zip(full[STOP:], interrupted[STOP:])]
    assert max(diffs) == 0.0, diffs
    assert result["max_abs_diff_after_resume"] == 0.0
    assert result["bitwise_equal_after_resume"] is True
    assert (out / "losses.png").stat().st_size > 0

    # The last checkpoint: the resumed run's end, with each rank's Loader state.
    ckpt = torch.load(out / "interrupted" / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == STEPS and len(ckpt["loader"]) == 2
    assert all(state["step"] == STEPS for state in ckpt["loader"])
    assert set(ckpt["optimizer"]["state"]) and ckpt["losses"] == interrupted


def test_the_examples_mask_keeps_attention_inside_each_packed_document(tmp_path):
    # The batches the example trains on pack several documents per row; the mask that
    # its attention uses lets a token see exactly the earlier tokens of its document.
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_tiny_gpt as example
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    config = example.write_dataset(tmp_path, docs_per_source=100, seq_len=64,
                                   micro_batch_size=2)
    batch = next(iter(braid.Loader(str(config), rank=1, world_size=2)))
    assert len(batch["cu_seqlens"]) - 1 > batch["input_ids"].shape[0], "rows are packed"
    allowed = ~causal_block_mask(batch["cu_seqlens"], 2, 64)
    # Per token: itself and its earlier tokens of the same document (positions restart).
    assert torch.equal(allowed.sum(dim=-1).squeeze(1), batch["position_ids"] + 1)
    # The model's outputs for one document do not change when every other token of the
    # micro-batch does (a document after another one in its row: a causal mask alone
    # would let it see the earlier one).
    cu = batch["cu_seqlens"].tolist()
    begin, end = next((a, b) for a, b in zip(cu, cu[1:]) if a % 64 != 0)
    torch.manual_seed(0)
    model = example.TinyGPT(example.VOCAB, 64, width=16, layers=2, heads=2)
    other = batch["input_ids"].clone()
    noise = torch.randint(2, example.VOCAB, (2 * 64,))
    other.view(-1)[:begin] = noise[:begin]
    other.view(-1)[end:] = noise[end:]
    with torch.no_grad():
        a = model(batch["input_ids"], batch["position_ids"], batch["cu_seqlens"])
        b = model(other, batch["position_ids"], batch["cu_seqlens"])
    a, b = a.view(2 * 64, -1), b.view(2 * 64, -1)
    assert torch.allclose(a[begin:end], b[begin:end], atol=1e-6)
    assert not torch.allclose(a, b, atol=1e-3)
