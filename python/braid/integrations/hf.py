"""The Hugging Face ``Trainer`` (and TRL's trainers) over a ``braid.Loader``.

Handing a Loader to a stock ``Trainer`` as ``train_dataset`` goes wrong in four ways
(docs/integrations.md, "Hugging Face Trainer"): the default collator stacks
``per_device_train_batch_size`` micro-batches into one; causal-LM losses shift
``labels`` again (Braid's are already shifted, so the model would learn token t+2);
accelerate dispatches or shards the iterable, so ranks do not read their own streams;
and the Trainer resumes by reading and dropping every micro-batch already trained.
``BraidTrainer`` (or ``BraidTrainerMixin`` on any ``Trainer`` subclass, e.g. TRL's
``SFTTrainer``: ``braid_trainer_class(SFTTrainer)``) fixes each:

- ``get_train_dataloader`` returns ``DataLoader(batches, batch_size=None,
  num_workers=0)`` that accelerate never prepares: every rank reads its own Braid stream,
  all of it, one micro-batch per forward. ``remove_unused_columns`` has nothing to drop
  (the Trainer's collator is not used).
- Each micro-batch (``hf_batch``) holds ``input_ids``, ``shift_labels`` (Braid's labels,
  already next-token, ``-100`` where there is no target), ``labels`` (the same tensor:
  HF models compute a loss only when ``labels`` is given, and their loss takes
  ``shift_labels`` over it), ``position_ids`` (restarting at every document),
  ``use_cache=False`` and no ``attention_mask``: with sdpa or eager attention and no
  cache, HF keeps attention inside each document from ``position_ids``. With
  ``varlen=True`` (default) also ``cu_seq_lens_q/k`` and ``max_length_q/k`` for
  flash-attention's varlen kernels (other implementations ignore them). ``attention_mask=True`` adds a 4-D bool mask in
  PyTorch's convention (``True`` = attend, ``masks.attend_mask``), which HF uses as is.
- ``gradient_accumulation_steps`` must equal ``loader.micro_batches_per_step`` (one
  optimizer step is one Braid step); a phase that changes it stops training with an error.
  ``label_smoothing_factor`` is refused (HF's smoother shifts labels again).
- Resume: ``BraidStateCallback`` writes, on every checkpoint, the Loader state right after
  the last micro-batch that went through ``training_step`` (not the last one read: a
  prefetching wrapper may have read ahead) to ``braid_loader_rank{rank:05d}.json`` in the
  checkpoint folder, and loads it back at ``train(resume_from_checkpoint=...)``.
  ``ignore_data_skip`` is set, so the Trainer reads nothing to fast-forward.

The Loader's rank and world size must be the Trainer's (``RANK`` / ``WORLD_SIZE`` from
torchrun or ``accelerate launch`` give both).
"""

from __future__ import annotations

import json
import os
from collections import deque
from typing import Any, Deque, Dict, Iterator, Optional

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from braid.integrations.masks import attend_mask
from braid.loader import Loader

__all__ = ["BraidTrainer", "BraidTrainerMixin", "BraidStateCallback", "HFBatches",
           "braid_trainer_class", "hf_batch", "attend_mask", "state_file_name"]


def state_file_name(rank: int) -> str:
    """The file in a checkpoint folder that holds rank ``rank``'s Loader state."""
    return f"braid_loader_rank{rank:05d}.json"


def hf_batch(batch: Dict[str, torch.Tensor], *, varlen: bool = True,
             attention_mask: bool = False) -> Dict[str, Any]:
    """Braid's micro-batch -> the keyword arguments of an HF causal LM's ``forward``."""
    labels = batch["labels"].to(torch.int64)
    out: Dict[str, Any] = {
        "input_ids": batch["input_ids"].to(torch.int64),
        "labels": labels,
        "shift_labels": labels,
        "position_ids": batch["position_ids"].to(torch.int64),
        # A cache turns off HF's per-document attention from position_ids.
        "use_cache": False,
    }
    cu = batch["cu_seqlens"]
    if varlen:
        max_len = int(batch["max_seqlen"][0])  # the longest piece, from the core
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max_len,
                   max_length_k=max_len)
    if attention_mask:
        mbs, seq_len = out["input_ids"].shape
        out["attention_mask"] = attend_mask(cu, mbs, seq_len)
    return out


class HFBatches(torch.utils.data.IterableDataset):
    """HF micro-batches (``hf_batch``) over a Loader, with the state of the last trained one.

    ``mark_trained()`` says the oldest micro-batch handed out and not yet marked went
    through a training step; ``state_dict()`` is the Loader's state right after the last
    marked one (before any is marked: where iteration started). A new ``iter()`` goes
    back to that state, so micro-batches read ahead and never trained come again.
    """

    def __init__(self, loader: Loader, *, varlen: bool = True,
                 attention_mask: bool = False) -> None:
        self.loader = loader
        self.varlen = varlen
        self.attention_mask = attention_mask
        self._pending: Deque[Dict[str, Any]] = deque()  # states after handed-out batches
        self._trained_state: Optional[Dict[str, Any]] = None

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if self._pending and self._trained_state is not None:
            self.loader.load_state_dict(self._trained_state)
        self._pending.clear()
        self._trained_state = self.loader.state_dict()
        return self._batches()

    def _batches(self) -> Iterator[Dict[str, Any]]:
        for batch in self.loader:
            out = hf_batch(batch, varlen=self.varlen, attention_mask=self.attention_mask)
            self._pending.append(self.loader.state_dict())
            yield out

    def mark_trained(self) -> None:
        if not self._pending:
            raise RuntimeError("mark_trained() without a micro-batch handed out")
        self._trained_state = self._pending.popleft()

    def state_dict(self) -> Dict[str, Any]:
        if self._trained_state is not None:
            return self._trained_state
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
        self._pending.clear()
        self._trained_state = None


class BraidStateCallback(TrainerCallback):
    """Saves and restores the Loader state of the last trained micro-batch with each
    checkpoint, and stops training when a phase changes the micro-batches per step."""

    def __init__(self, batches: HFBatches) -> None:
        self.batches = batches
        self.resume_from: Optional[str] = None  # set by BraidTrainerMixin.train

    def on_train_begin(self, args, state, control, **kwargs):
        if self.resume_from is None:
            return
        rank = self.batches.loader.rank
        path = os.path.join(self.resume_from, state_file_name(rank))
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path}: no Braid loader state for rank {rank} in the checkpoint (saved "
                "by BraidStateCallback); resuming without it would not continue the stream")
        with open(path) as f:
            saved = json.load(f)
        if saved["global_step"] != state.global_step:
            raise ValueError(f"{path} was saved at step {saved['global_step']}, but the "
                             f"checkpoint resumes at step {state.global_step}")
        self.batches.load_state_dict(saved["loader"])
        self.resume_from = None

    def on_step_begin(self, args, state, control, **kwargs):
        want = self.batches.loader.micro_batches_at(state.global_step)
        if want != args.gradient_accumulation_steps:
            raise ValueError(
                f"at step {state.global_step} the Braid config gives "
                f"{want} micro-batches per rank (a phase's seq_len), but "
                f"gradient_accumulation_steps is {args.gradient_accumulation_steps}: "
                "train each phase with its own gradient_accumulation_steps")

    def on_save(self, args, state, control, **kwargs):
        loader = self.batches.loader
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, state_file_name(loader.rank))
        record = {"global_step": state.global_step, "rank": loader.rank,
                  "world_size": loader.world_size, "loader": self.batches.state_dict()}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)


class BraidTrainerMixin:
    """Put before a ``transformers.Trainer`` subclass; ``train_dataset`` is a
    ``braid.Loader`` (or an ``HFBatches`` for non-default batch options).

    Raises ``ValueError`` at construction when the Loader's rank or world size is not the
    Trainer's, ``gradient_accumulation_steps`` is not ``micro_batches_per_step``, or
    ``label_smoothing_factor`` is set (HF's smoother shifts labels again).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        batches = kwargs.get("train_dataset")
        if isinstance(batches, Loader):
            batches = HFBatches(batches)
        if isinstance(batches, HFBatches) and _is_trl(type(self)):
            # TRL's trainers accept only a `datasets` dataset and would tokenize it: give
            # them a stand-in and no preparation; training reads `batches`.
            kwargs["train_dataset"] = _stand_in_dataset()
            targs = kwargs.get("args")
            if targs is not None and hasattr(targs, "dataset_kwargs"):
                targs.dataset_kwargs = {**(targs.dataset_kwargs or {}),
                                        "skip_prepare_dataset": True}
        super().__init__(*args, **kwargs)
        if batches is None:
            batches = self.train_dataset
            if isinstance(batches, Loader):
                batches = HFBatches(batches)
        self.train_dataset = batches
        if not isinstance(batches, HFBatches):
            raise TypeError("train_dataset must be a braid.Loader or "
                            f"braid.integrations.hf.HFBatches, not {type(batches).__name__}")
        loader = batches.loader
        args = self.args
        if (loader.rank, loader.world_size) != (args.process_index, args.world_size):
            raise ValueError(
                f"the Loader is rank {loader.rank} of {loader.world_size}, the Trainer "
                f"process {args.process_index} of {args.world_size}: make the Loader with "
                "the Trainer's rank and world size (RANK / WORLD_SIZE)")
        if args.gradient_accumulation_steps != loader.micro_batches_per_step:
            raise ValueError(
                f"gradient_accumulation_steps is {args.gradient_accumulation_steps}, but "
                f"the Braid config gives {loader.micro_batches_per_step} micro-batches per "
                "rank per step: set gradient_accumulation_steps to "
                f"{loader.micro_batches_per_step}")
        if args.label_smoothing_factor:
            raise ValueError("label_smoothing_factor shifts Braid's pre-shifted labels "
                             "again; smooth in the model's loss instead")
        args.ignore_data_skip = True  # the Loader resumes from its state, reads nothing
        self._braid_callback = BraidStateCallback(batches)
        self.add_callback(self._braid_callback)

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        # Not through accelerator.prepare: no dispatch, no sharding, no stacking.
        return torch.utils.data.DataLoader(self.train_dataset, batch_size=None,
                                           num_workers=0)

    def training_step(self, *args: Any, **kwargs: Any):
        loss = super().training_step(*args, **kwargs)
        self.train_dataset.mark_trained()
        return loss

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any):
        path = resume_from_checkpoint
        if isinstance(path, bool):
            path = get_last_checkpoint(self.args.output_dir) if path else None
            if resume_from_checkpoint and path is None:
                raise ValueError(
                    f"No valid checkpoint found in output directory ({self.args.output_dir})")
        self._braid_callback.resume_from = path
        return super().train(path, *args, **kwargs)


def _is_trl(cls: type) -> bool:
    return any(c.__module__.split(".")[0] == "trl" for c in cls.__mro__)


def _stand_in_dataset():
    import datasets

    def one_row():  # TRL's constructor looks at one row (for image keys)
        yield {"input_ids": [0]}

    return datasets.IterableDataset.from_generator(one_row)


def braid_trainer_class(base: type) -> type:
    """``BraidTrainerMixin`` over ``base`` (a ``Trainer`` subclass, e.g. TRL's
    ``SFTTrainer``)."""
    return type(f"Braid{base.__name__}", (BraidTrainerMixin, base), {})


class BraidTrainer(BraidTrainerMixin, Trainer):
    """``transformers.Trainer`` fed by a ``braid.Loader`` (see the module docs)."""
