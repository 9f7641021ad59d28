"""User transforms: Python functions that turn a source's rows into token ids.

A source with ``transform: {python: SPEC, columns: [a, b]}`` calls a function once per
row with the values of those columns (``str``, ``bytes``, ``int``, ``float``, ``bool``,
``list``, ``dict`` for structs, ``None`` for nulls), in the loader's worker threads
holding the GIL only around the call. ``SPEC`` is ``"package.module:function"`` (imported
when the loader is made) or the name of a function registered here. The function returns
a list or array of token ids, a dict ``{"tokens": ..., "loss_mask": ...}``, or ``None`` to
drop the row. With ``batched: true`` it is called once per chunk of rows with one list per
column (``fn(texts)`` rather than ``fn(text)``) and returns a list of one such result per
row (see docs/sources.md, "User transforms").
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional

_lock = threading.Lock()
_registry: Dict[str, Callable[..., Any]] = {}


def register_transform(name: str, fn: Callable[..., Any]) -> None:
    """Registers ``fn`` under ``name`` for ``transform: {python: name}`` in this process.

    Replaces a function registered under the same name. ``name`` must not contain ``:``
    (that form imports a module). A loader looks the name up when it is made.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(
            f"transform name must be a non-empty string without ':', not {name!r}")
    if not callable(fn):
        raise TypeError(f"transform {name!r} must be callable, not {type(fn).__name__}")
    with _lock:
        _registry[name] = fn


def unregister_transform(name: str) -> None:
    """Removes a registered transform (no error if there is none)."""
    with _lock:
        _registry.pop(name, None)


def registered_transform(name: str) -> Optional[Callable[..., Any]]:
    """The function registered under ``name``, or ``None``."""
    with _lock:
        return _registry.get(name)
