"""Config loading: a path or a dict, handed to the C++ parser (which validates)."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Union

from braid import _core

ConfigLike = Union[str, os.PathLike, Mapping[str, Any], "_core.Config"]


def load_config(config: ConfigLike) -> "_core.Config":
    """Returns a validated config from a YAML/JSON file path, a dict, or a Config.

    Relative source paths in a dict resolve against the current directory. Raises
    ``braid.ConfigError`` naming the key path of the first problem.
    """
    if isinstance(config, _core.Config):
        return config
    if isinstance(config, Mapping):
        return _core.parse_config(json.dumps(config), os.getcwd())
    if isinstance(config, (str, os.PathLike)):
        return _core.load_config(os.fspath(config))
    raise TypeError(f"config must be a path, a dict or a braid Config, not {type(config)}")
