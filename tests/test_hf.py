"""The Hugging Face Trainer over Braid, with real transformers and accelerate.

A tiny Llama (random init, vocabulary 128) on a seeded token dataset: the batch format
and its loss against a hand-computed cross-entropy, attention kept inside documents, the
state of the last trained micro-batch, and a 2-rank gloo run under torchrun (each rank's
stream, the loss of every micro-batch, resume bit for bit).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("accelerate") is None,
    reason="transformers and accelerate are not installed")

import braid  # noqa: E402

from conftest import write_docs  # noqa: E402

VOCAB = 128
SEQ_LEN = 32
GA = 2
WORKER = Path(__file__).resolve().parent / "hf_trainer_worker.py"


@pytest.fixture
def token_dataset(tmp_path: Path):
    """Two sources of documents with small token ids (1..VOCAB-1), seeded lengths."""
    rng = np.random.default_rng(23)
    sources = []
    for name, n, hi in (("web", 80, 70), ("code", 50, 40)):
        docs = [[int(t) for t in rng.integers(1, VOCAB, size=int(length))]
                for length in rng.integers(2, hi, size=n)]
        half = len(docs) // 2
        write_docs(tmp_path / name / "part-000.parquet", docs[:half])
        write_docs(tmp_path / name / "part-001.parquet", docs[half:])
        sources.append({"name": name, "path": str(tmp_path / name),
                        "tokens_column": "input_ids", "shuffle_window": 16})
    sources[0]["weight"], sources[1]["weight"] = 0.7, 0.3
    config = {
        "seed": 5,
        "topology": {"dp": 2, "tp": 1, "pp": 1, "cp": 1},
        "batch": {"global_tokens": 2 * GA * SEQ_LEN, "seq_len": SEQ_LEN,
                  "micro_batch_size": 1},
        "sources": sources,
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    return {"config": config, "path": path, "root": tmp_path}


def take(iterable, n):
    return list(itertools.islice(iter(iterable), n))


def tiny_llama():
    sys.path.insert(0, str(WORKER.parent))
    from hf_trainer_worker import tiny_llama as make

    return make(VOCAB, SEQ_LEN).eval()


# --- The batch and its loss ---

def test_loss_equals_hand_cross_entropy_and_labels_would_train_on_t_plus_2(token_dataset):
    from braid.integrations.hf import hf_batch

    model = tiny_llama()
    for raw in take(braid.Loader(token_dataset["config"], rank=1, world_size=2), 3):
        batch = hf_batch(raw)
        assert set(batch) == {"input_ids", "labels", "shift_labels", "position_ids",
                              "use_cache", "cu_seq_lens_q", "cu_seq_lens_k",
                              "max_length_q", "max_length_k"}
        assert batch["use_cache"] is False
        assert torch.equal(batch["shift_labels"], raw["labels"].to(torch.int64))
        # The core's max_seqlen: the longest piece, which position_ids show too (a piece
        # ends where the position does not go up by one).
        pos = raw["position_ids"].reshape(-1).tolist()
        longest = max(p for p in pos) + 1
        assert batch["max_length_q"] == batch["max_length_k"] == longest
        assert isinstance(batch["max_length_q"], int)
        with torch.no_grad():
            out = model(**batch)
            naive = model(input_ids=batch["input_ids"], labels=batch["labels"],
                          position_ids=batch["position_ids"], use_cache=False).loss
        logits = out.logits.float().view(-1, VOCAB)
        hand = F.cross_entropy(logits, raw["labels"].to(torch.int64).view(-1),
                               ignore_index=-100)
        assert abs(float(out.loss) - float(hand)) < 1e-6
        assert abs(float(naive) - float(hand)) > 1e-3  # labels= alone shifts again


@pytest.mark.parametrize("attention_mask", [False, True])
def test_packed_attention_stays_inside_each_document(token_dataset, attention_mask):
    """Logits of a packed row equal those of each of its pieces run alone."""
    from braid.integrations.hf import hf_batch

    model = tiny_llama()
    raws = take(braid.Loader(token_dataset["config"], rank=0, world_size=2), 4)
    cu = torch.cat([r["cu_seqlens"] for r in raws])
    assert any(len(r["cu_seqlens"]) > 2 for r in raws), "fixture packs several pieces"
    for raw in raws:
        batch = hf_batch(raw, varlen=False, attention_mask=attention_mask)
        if attention_mask:
            assert batch["attention_mask"].dtype == torch.bool
        with torch.no_grad():
            packed = model(**{k: v for k, v in batch.items() if "labels" not in k}).logits
        cu = raw["cu_seqlens"].tolist()
        for start, end in zip(cu[:-1], cu[1:]):
            with torch.no_grad():
                alone = model(input_ids=batch["input_ids"][:, start:end],
                              position_ids=batch["position_ids"][:, start:end],
                              use_cache=False).logits
            torch.testing.assert_close(packed[:, start:end], alone, rtol=0, atol=1e-5)
        if not attention_mask and len(cu) > 2:  # a cache turns per-document attention off
            with torch.no_grad():
                cached = model(**{**batch, "use_cache": True, "labels": None,
                                  "shift_labels": None}).logits
            assert (cached[:, cu[1]:] - packed[:, cu[1]:]).abs().max() > 1e-3


def test_attend_mask_is_true_where_attention_is_allowed():
    from braid.integrations.masks import attend_mask, masked_out_mask
    from braid.integrations.megatron import causal_block_mask

    cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    mask = attend_mask(cu, mbs=1, seq_len=8)
    doc = [0, 0, 0, 1, 2, 2, 2, 2]
    for i in range(8):
        for j in range(8):
            assert bool(mask[0, 0, i, j]) == (j <= i and doc[i] == doc[j])
    assert torch.equal(masked_out_mask(cu, 1, 8), ~mask)
    assert torch.equal(causal_block_mask(cu, 1, 8), ~mask)
    # PyTorch's convention: True = attend, so SDPA with this mask is causal per document.
    q = torch.randn(1, 1, 8, 4)
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    alone = F.scaled_dot_product_attention(q[:, :, :3], q[:, :, :3], q[:, :, :3],
                                           is_causal=True)
    torch.testing.assert_close(out[:, :, :3], alone)


# --- The state of the last trained micro-batch ---

def test_state_is_the_last_trained_micro_batch_under_read_ahead(token_dataset):
    from braid.integrations.hf import HFBatches

    config = token_dataset["config"]
    reference = take(HFBatches(braid.Loader(config, rank=1, world_size=2)), 8)
    batches = HFBatches(braid.Loader(config, rank=1, world_size=2))
    it = iter(batches)
    for _ in range(5):  # read 5, as a prefetching wrapper would
        next(it)
    for _ in range(3):
        batches.mark_trained()
    state = json.loads(json.dumps(batches.state_dict()))
    resumed = HFBatches(braid.Loader(config, rank=1, world_size=2))
    resumed.load_state_dict(state)
    for want, got in zip(reference[3:], take(resumed, 5)):
        assert torch.equal(want["input_ids"], got["input_ids"])
        assert torch.equal(want["shift_labels"], got["shift_labels"])
    # A new iterator of the same batches goes back to the last trained micro-batch too.
    again = next(iter(batches))
    assert torch.equal(again["input_ids"], reference[3]["input_ids"])


def test_state_is_exact_under_accelerates_prefetch(token_dataset):
    """accelerate's DataLoaderShard reads one micro-batch ahead of what it hands out."""
    from accelerate import Accelerator

    from braid.integrations.hf import HFBatches

    config = token_dataset["config"]
    reference = take(HFBatches(braid.Loader(config, rank=0, world_size=2)), 6)
    batches = HFBatches(braid.Loader(config, rank=0, world_size=2))
    dl = Accelerator(cpu=True).prepare(
        torch.utils.data.DataLoader(batches, batch_size=None, num_workers=0))
    it = iter(dl)
    for _ in range(3):
        next(it)
        batches.mark_trained()
    assert len(batches._pending) == 1  # read ahead, not trained
    resumed = HFBatches(braid.Loader(config, rank=0, world_size=2))
    resumed.load_state_dict(batches.state_dict())
    for want, got in zip(reference[3:], take(resumed, 3)):
        assert torch.equal(want["input_ids"], got["input_ids"])


# --- The Trainer's checks ---

def trainer_args(tmp_path, **kw):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1, use_cpu=True,
                             report_to=[], per_device_train_batch_size=1, **kw)


def test_trainer_refuses_what_would_train_wrong(token_dataset, tmp_path):
    from braid.integrations.hf import BraidTrainer

    config = dict(token_dataset["config"], topology={"dp": 1, "tp": 1, "pp": 1, "cp": 1})
    model = tiny_llama()
    with pytest.raises(ValueError, match="gradient_accumulation_steps to 4"):
        BraidTrainer(model=model, args=trainer_args(tmp_path, gradient_accumulation_steps=1),
                     train_dataset=braid.Loader(config, rank=0, world_size=1))
    with pytest.raises(ValueError, match="rank 1 of 2"):
        BraidTrainer(model=model, args=trainer_args(tmp_path, gradient_accumulation_steps=2),
                     train_dataset=braid.Loader(token_dataset["config"], rank=1,
                                                world_size=2))
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        BraidTrainer(model=model, args=trainer_args(tmp_path, gradient_accumulation_steps=4,
                                                    label_smoothing_factor=0.1),
                     train_dataset=braid.Loader(config, rank=0, world_size=1))
    args = trainer_args(tmp_path, gradient_accumulation_steps=4)
    trainer = BraidTrainer(model=model, args=args,
                           train_dataset=braid.Loader(config, rank=0, world_size=1))
    assert args.ignore_data_skip
    dl = trainer.get_train_dataloader()
    first = next(iter(dl))
    assert first["input_ids"].shape == (1, SEQ_LEN)  # one micro-batch, not stacked


# --- Two gloo ranks under torchrun ---

def torchrun(token_dataset, out: Path, record: Path, *extra: str) -> None:
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(braid.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", str(WORKER), "--config", str(token_dataset["path"]), "--output-dir", str(out),
         "--record", str(record), *extra],
        capture_output=True, text=True, timeout=300, env=env, cwd=token_dataset["root"])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]


def read_records(record: Path, rank: int):
    with open(f"{record}.rank{rank}.json") as f:
        return json.load(f)


def stream_hashes(config, rank, n):
    out = []
    for raw in take(braid.Loader(config, rank=rank, world_size=2), n):
        out.append({k: hashlib.sha256(raw[src].to(torch.int64).contiguous().numpy()
                                      .tobytes()).hexdigest()
                    for k, src in (("input_ids", "input_ids"), ("shift_labels", "labels"),
                                   ("position_ids", "position_ids"))} | {
            "targets": int((raw["labels"] >= 0).sum())})
    return out


def test_two_ranks_train_their_own_streams_and_resume_bit_for_bit(token_dataset, tmp_path):
    steps, stop = 6, 3
    full, part = tmp_path / "full", tmp_path / "part"
    torchrun(token_dataset, full, tmp_path / "full_rec", "--max-steps", str(steps))
    torchrun(token_dataset, part, tmp_path / "stop_rec", "--max-steps", str(steps),
             "--stop-at", str(stop))
    checkpoint = part / f"checkpoint-{stop}"
    assert sorted(p.name for p in checkpoint.glob("braid_loader_rank*.json")) == [
        "braid_loader_rank00000.json", "braid_loader_rank00001.json"]
    torchrun(token_dataset, part, tmp_path / "resume_rec", "--max-steps", str(steps),
             "--resume", str(checkpoint))

    config = token_dataset["config"]
    streams = [stream_hashes(config, rank, steps * GA) for rank in range(2)]
    worst, resumed_equal = 0.0, 0
    for rank in range(2):
        full_rec = read_records(tmp_path / "full_rec", rank)["records"]
        # Every rank trained on its own stream, all of it, in order.
        assert len(full_rec) == steps * GA
        for got, want in zip(full_rec, streams[rank]):
            for key in ("input_ids", "shift_labels", "position_ids"):
                assert got[key] == want[key], (rank, key)
        # The loss of every micro-batch is the hand-computed cross-entropy over Braid's
        # pairs, normalized by the step's targets on both ranks (HF's num_items_in_batch)
        # times the world size (DDP averages the gradients).
        for i, got in enumerate(full_rec):
            step = i // GA
            n = sum(s["targets"] for r in range(2) for s in streams[r][step * GA:(step + 1) * GA])
            assert got["num_items_in_batch"] == n
            assert abs(got["loss"] - got["ce_sum"] / n * 2) < 1e-6
            worst = max(worst, abs(got["loss"] - got["ce_sum"] / n * 2))
        # Resumed after step 3: the same micro-batches and the same losses, bit for bit.
        resumed = read_records(tmp_path / "resume_rec", rank)
        assert resumed["pending"] == 0  # nothing read that was not trained
        assert len(resumed["records"]) == (steps - stop) * GA
        for want, got in zip(full_rec[stop * GA:], resumed["records"]):
            assert got["input_ids"] == want["input_ids"]
            assert got["loss"] == want["loss"]
            resumed_equal += 1
    losses = [r["loss"] for r in read_records(tmp_path / "full_rec", 0)["records"]]
    assert len(set(losses)) > 1
    print(f"\nhashes equal: {2 * steps * GA} micro-batches on 2 ranks; largest |loss - "
          f"hand| {worst:.3g}; resumed losses equal bit for bit: {resumed_equal}")


# --- TRL ---

@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed")
def test_trl_sft_trainer_trains_on_braids_stream_with_its_loss(token_dataset, tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    from braid.integrations.hf import braid_trainer_class

    class Recording(braid_trainer_class(SFTTrainer)):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
            with torch.no_grad():
                logits = model(input_ids=inputs["input_ids"], use_cache=False,
                               position_ids=inputs["position_ids"]).logits.float()
            hand = F.cross_entropy(logits.view(-1, VOCAB), inputs["shift_labels"].view(-1),
                                   ignore_index=-100, reduction="sum") / num_items_in_batch
            self.records.append((inputs["input_ids"].clone(), float(loss.detach()), float(hand)))
            return loss

    config = dict(token_dataset["config"], topology={"dp": 1, "tp": 1, "pp": 1, "cp": 1})
    loader = braid.Loader(config, rank=0, world_size=1)
    # Braid tokenizes; TRL only wants a tokenizer object (pad / eos ids).
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({f"t{i}": i for i in range(VOCAB)},
                                             unk_token="t3")),
        pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3")
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=2, use_cpu=True,
                     per_device_train_batch_size=1, report_to=[], save_strategy="no",
                     gradient_accumulation_steps=loader.micro_batches_per_step,
                     learning_rate=1e-2, disable_tqdm=True)
    trainer = Recording(model=tiny_llama().train(), args=args, train_dataset=loader,
                        processing_class=tok)
    trainer.records = []
    trainer.train()
    want = take(braid.Loader(config, rank=0, world_size=1), 2 * loader.micro_batches_per_step)
    assert len(trainer.records) == len(want)
    for (ids, loss, hand), raw in zip(trainer.records, want):
        assert torch.equal(ids, raw["input_ids"].to(torch.int64))
        assert abs(loss - hand) < 1e-6
