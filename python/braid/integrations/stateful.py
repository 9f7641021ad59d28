"""torchdata's ``StatefulDataLoader`` over a ``braid.Loader``.

A Loader is a ``torch.utils.data.IterableDataset`` with ``state_dict()`` /
``load_state_dict()``, so ``StatefulDataLoader`` (torchdata 0.11) saves and restores it
with its own state: ``dl.state_dict()`` holds the Loader's state under
``"dataset_state"``, and ``dl.load_state_dict()`` hands it back before the next
``iter(dl)``, so the resumed stream is exactly the uninterrupted one (no fast-forward).

Use ``num_workers=0``: Braid builds batches on its own threads, and a worker process
would hold a second engine (and fork a process that runs C++ threads). ``batch_size=None``
because each item already is a micro-batch. StatefulDataLoader does not coordinate ranks;
every rank saves and loads its own state (Braid's states of one step are identical on
every rank of a DP group).
"""

from __future__ import annotations

from typing import Any

from braid.loader import Loader


def stateful_dataloader(loader: Loader, **kwargs: Any):
    """``StatefulDataLoader(loader, batch_size=None, num_workers=0, **kwargs)``.

    Raises ``ImportError`` if torchdata is not installed and ``ValueError`` for
    ``num_workers > 0``.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    if kwargs.get("num_workers", 0) != 0:
        raise ValueError("use num_workers=0: Braid builds batches on its own threads")
    kwargs.setdefault("batch_size", None)
    kwargs["num_workers"] = 0
    return StatefulDataLoader(loader, **kwargs)
