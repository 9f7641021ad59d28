"""Braid as Megatron-LM's external data iterator.

In a Megatron training script (``--dataloader-type external``), return Braid's iterator
from the datasets provider; ``get_batch`` then reads Megatron's usual keys from it:

    from braid.integrations import megatron as braid_megatron

    def train_valid_test_datasets_provider(train_val_test_num_samples):
        train = braid_megatron.data_iterator(
            "job.yaml", rank=torch.distributed.get_rank(),
            world_size=torch.distributed.get_world_size())
        return train, None, None   # None on ranks that read no data

``job.yaml``'s topology must match Megatron's (tp, pp, cp, dp; Megatron's rank order).
Megatron splits sequences for context parallelism itself, so ``data_iterator`` hands
whole sequences to every CP rank. Megatron's ``get_batch`` reads ``cu_seqlens``,
``cu_seqlens_padded`` and ``max_seqlen`` for its packed (THD) path, as these batches hold
them; or pass ``attention_mask="causal"`` (and ``packed=False``) for a block-diagonal
causal mask instead. ``--dataloader-save DIR`` works: the iterator has ``save_state()``,
and ``data_iterator(..., dataloader_save=args.dataloader_save, iteration=args.iteration)``
restores it (docs/integrations.md).

Run this file to see, without Megatron, what every rank of a small tp=2 x pp=2 x dp=2 job
receives (it writes a small demo dataset to a temporary folder).
"""

from __future__ import annotations

import os
import tempfile

from braid import _core
from braid.integrations import megatron


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        demo = _core.make_demo_dataset(tmp, seed=1, seq_len=256, dp=2, micro_batches=2,
                                       scale=0.02)
        text = open(demo["config_path"]).read().replace(
            "topology: {dp: 2, tp: 1, pp: 1, cp: 1}", "topology: {dp: 2, tp: 2, pp: 2, cp: 1}")
        config = os.path.join(tmp, "megatron.yaml")
        with open(config, "w") as f:
            f.write(text)
        world = 8
        for rank in range(world):
            it = megatron.data_iterator(config, rank=rank, world_size=world,
                                        attention_mask="causal")
            if it is None:
                print(f"rank {rank}: no data (Megatron broadcasts from TP rank 0)")
                continue
            batch = next(it)
            shapes = {k: (tuple(v.shape) if v is not None else None)
                      for k, v in batch.items()}
            print(f"rank {rank} (dp {it.loader.dp_rank}, pp {it.loader.pp_rank}): {shapes}")


if __name__ == "__main__":
    main()
