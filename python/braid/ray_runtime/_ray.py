"""Imports Ray, or fails with a config error that says how to install it."""

from braid._core import ConfigError

try:
    import ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a venv without ray
    raise ConfigError(
        "runtime.kind: ray needs the ray package: pip install 'braid[ray]' "
        f"(import failed: {exc})") from exc

__all__ = ["ray"]
