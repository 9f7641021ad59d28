"""`--set KEY=VALUE` config overrides for the benchmarks (`benchmarks/bench.py`,
`benchmarks/loader_memory.py`...). Stateless."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, Optional


def parse_set(items: Optional[Iterable[str]]) -> Dict[str, Any]:
    """KEY=VALUE strings as {KEY: VALUE}, VALUE parsed as JSON where it is JSON."""
    out = {}
    for item in items or []:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def apply_overrides(config: dict, extra: Dict[str, Any]) -> None:
    """Sets each `--set KEY=VALUE` in `config`: a dotted key path, or `sources.KEY` on
    every source."""
    for key, value in extra.items():
        if key.startswith("sources."):  # every source
            for source in config["sources"]:
                source[key[len("sources."):]] = value
            continue
        node = config
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
