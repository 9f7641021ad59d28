"""The declarative data plane (docs/dataplane.md): a few lines instead of YAML.

    plan = (braid.dataplane.sources("base.yaml")
            .mix({"web": 0.7, "code": {"schedule": [[0, 0.1], [1000, 0.3]]}})
            .distribute("dp").cost(attn=1.0, linear=4096).balance("karmarkar_karp")
            .broadcast_at("tp").plan())
    loader = braid.Loader(plan)

``plan()`` returns a ``braid._core.Config``, the same one the equivalent YAML produces,
usable by ``braid.Loader`` and ``braid._core.plan_job``. The builder is the C++
``braid::DataPlane`` (``braid._core.DataPlane``); this module only forwards arguments.
Bad arguments raise ``braid.ConfigError`` naming the primitive (``"mix.web: ..."``).
"""

from __future__ import annotations

from braid import _core
from braid.config import ConfigLike, load_config

DataPlane = _core.DataPlane

__all__ = ["DataPlane", "sources"]


def sources(config: ConfigLike) -> "_core.DataPlane":
    """A DataPlane over a base config (a path, a dict or a Config with seed, sources, batch).

    The base's weights, balance and topology are the starting point; the primitives then
    override them.
    """
    return _core.DataPlane(load_config(config))
