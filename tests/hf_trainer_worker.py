"""One rank of a tiny Llama trained by BraidTrainer (run under torchrun by test_hf.py).

Records, per micro-batch that went through compute_loss, the hashes of the tensors the
model received, the loss the Trainer computed, the hand-computed cross-entropy sum over
Braid's (token, label) pairs on the same logits, and the Trainer's num_items_in_batch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback, TrainingArguments

import braid
from braid.integrations.hf import BraidTrainer


def tensor_hash(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def tiny_llama(vocab: int, seq_len: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=seq_len, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


class RecordingTrainer(BraidTrainer):
    records: list

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        logits = outputs.logits.detach().float()
        ce_sum = F.cross_entropy(logits.view(-1, logits.shape[-1]),
                                 inputs["shift_labels"].view(-1), ignore_index=-100,
                                 reduction="sum")
        self.records.append({
            "step": self.state.global_step,
            "input_ids": tensor_hash(inputs["input_ids"]),
            "shift_labels": tensor_hash(inputs["shift_labels"]),
            "position_ids": tensor_hash(inputs["position_ids"]),
            "loss": float(loss.detach()),
            "ce_sum": float(ce_sum),
            "num_items_in_batch": float(num_items_in_batch),
        })
        return (loss, outputs) if return_outputs else loss


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--max-steps", type=int, default=6)
    p.add_argument("--save-steps", type=int, default=3)
    p.add_argument("--stop-at", type=int, default=0)
    p.add_argument("--resume", default=None)
    p.add_argument("--vocab", type=int, default=128)
    opts = p.parse_args()
    torch.set_num_threads(1)

    loader = braid.Loader(opts.config)  # RANK / WORLD_SIZE from torchrun
    seq_len = braid.load_config(opts.config).seq_len
    args = TrainingArguments(
        output_dir=opts.output_dir, max_steps=opts.max_steps, per_device_train_batch_size=1,
        gradient_accumulation_steps=loader.micro_batches_per_step, learning_rate=1e-2,
        lr_scheduler_type="constant", save_strategy="steps", save_steps=opts.save_steps,
        logging_steps=1, report_to=[], use_cpu=True, ddp_backend="gloo", seed=0,
        disable_tqdm=True, dataloader_num_workers=0)
    trainer = RecordingTrainer(model=tiny_llama(opts.vocab, seq_len), args=args,
                               train_dataset=loader)
    trainer.records = []
    if opts.stop_at:
        trainer.add_callback(StopAt(opts.stop_at))
    trainer.train(resume_from_checkpoint=opts.resume)
    batches = trainer.train_dataset
    with open(f"{opts.record}.rank{loader.rank}.json", "w") as f:
        json.dump({"rank": loader.rank, "records": trainer.records,
                   "pending": len(batches._pending),
                   "callback_args": {"ignore_data_skip": args.ignore_data_skip}}, f)
    # Leave without tearing torch down. The Trainer's DDP model holds a Reducer whose
    # ProcessGroupGloo destructor joins gloo's worker thread while holding the GIL, and
    # that thread may still be retiring the last collective, whose tensors need the GIL to
    # be freed: seen deadlocked at the end of main() (py-spy: ~ProcessGroupGloo in
    # std::thread::join, the worker in gil_scoped_acquire), and, at interpreter exit, an
    # abort ("terminate called without an active exception"). The barrier makes sure the
    # other rank is past its last collective too; the records are written and flushed.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
