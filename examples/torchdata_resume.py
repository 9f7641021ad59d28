"""Checkpoint and resume a Braid stream through torchdata's StatefulDataLoader.

``StatefulDataLoader.state_dict()`` includes the Braid Loader's own state (step, source
cursors; a few KB of JSON-able values), and ``load_state_dict()`` restores it, so the
resumed run sees exactly the micro-batches the uninterrupted run would have seen.

Run this file: it writes a small demo dataset to a temporary folder, takes 10 micro-batches
in one go, then 4 + (checkpoint, new process state) + 6, and checks they are equal.
Needs torchdata: ``pip install 'braid[torchdata]'`` (torchdata 0.11.0); without it the
example says so and exits with status 1.
"""

from __future__ import annotations

import itertools
import json
import tempfile

import torch

import braid
from braid import _core
from braid.integrations.stateful import stateful_dataloader


def main() -> None:
    try:
        import torchdata  # noqa: F401
    except ImportError:
        raise SystemExit("this example needs torchdata: pip install 'braid[torchdata]'")
    with tempfile.TemporaryDirectory() as tmp:
        config = _core.make_demo_dataset(tmp, seed=1, seq_len=256, dp=2, micro_batches=2,
                                         scale=0.02)["config_path"]
        reference = list(itertools.islice(
            stateful_dataloader(braid.Loader(config, rank=0, world_size=2)), 10))

        dl = stateful_dataloader(braid.Loader(config, rank=0, world_size=2))
        it = iter(dl)
        first = [next(it) for _ in range(4)]
        checkpoint = json.dumps(dl.state_dict())  # save it with the model
        print(f"checkpoint after 4 micro-batches: {len(checkpoint)} bytes")

        resumed = stateful_dataloader(braid.Loader(config, rank=0, world_size=2))
        resumed.load_state_dict(json.loads(checkpoint))
        rest = list(itertools.islice(resumed, 6))
        same = all(torch.equal(a[k], b[k])
                   for a, b in zip(reference, first + rest) for k in a)
        print("resumed stream equals the uninterrupted one:", same)
        assert same


if __name__ == "__main__":
    main()
