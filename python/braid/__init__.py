"""Braid: a multi-source data loader for training large foundation models.

The C++ core (``braid._core``) does the work: source loaders, the planner, constructors
and the embedded runtime. This package is the thin layer users touch: ``braid.Loader``
(PyTorch), the ``braid`` command line, and the error types.
"""

from braid._core import ConfigError, DataError, StorageError
from braid.transforms import register_transform, unregister_transform

__all__ = ["ConfigError", "DataError", "StorageError", "Loader", "load_config",
           "register_transform", "unregister_transform"]
__version__ = "0.1.0"


def __getattr__(name):
    # Loader imports torch; keep `import braid` light for the CLI and for users without it.
    if name == "Loader":
        from braid.loader import Loader

        return Loader
    if name == "load_config":
        from braid.config import load_config

        return load_config
    raise AttributeError(f"module 'braid' has no attribute {name!r}")
