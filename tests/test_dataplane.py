"""braid.dataplane: the declarative primitives compile to the Config the YAML gives."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

import braid
import braid.dataplane
from braid import _core
from braid.config import load_config


def plan_lines(config, steps):
    lines = []
    state = _core.plan_job(load_config(config), steps, "", lines.append)
    return lines + [state]


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


@pytest.fixture
def base(small_dataset):
    """small_dataset's config with default weights and balance: what the plane overrides."""
    config = copy.deepcopy(small_dataset["config"])
    del config["balance"]
    for s in config["sources"]:
        del s["weight"]
    return config


@pytest.fixture
def yaml_equivalent(small_dataset):
    config = copy.deepcopy(small_dataset["config"])
    config["sources"][0]["weight"] = 0.7
    config["sources"][1]["weight"] = {"schedule": [[0, 0.1], [6, 0.3]]}
    config["balance"] = {"cost": {"attn": 1.0, "linear": 4096}, "algorithm": "greedy"}
    return config


def build(base):
    return (braid.dataplane.sources(base)
            .mix({"web": 0.7, "code": {"schedule": [[0, 0.1], [6, 0.3]]}})
            .distribute("dp").cost(attn=1.0, linear=4096).balance("greedy")
            .broadcast_at("tp").plan())


def test_python_plan_equals_yaml_line_for_line(base, yaml_equivalent):
    plan = build(base)
    assert isinstance(plan, _core.Config)
    assert plan.fingerprint() == load_config(yaml_equivalent).fingerprint()
    a = plan_lines(plan, 10)
    assert a == plan_lines(yaml_equivalent, 10)
    assert a != plan_lines(base, 10)  # the primitives took effect


def test_stepwise_weights_and_a_config_base(base, small_dataset):
    yaml = copy.deepcopy(base)
    yaml["sources"][0]["weight"] = {"steps": [[0, 1], [3, 0]]}
    yaml["sources"][1]["weight"] = 0.5
    plan = (braid.dataplane.sources(load_config(base))
            .mix({"web": {"steps": [(0, 1), (3, 0.0)]}, "code": 0.5}).plan())
    assert plan_lines(plan, 6) == plan_lines(yaml, 6)


def test_loader_over_the_plan_yields_the_same_first_batches(base, yaml_equivalent):
    plan = build(base)
    for rank in range(2):
        a = take(braid.Loader(plan, rank=rank, world_size=2), 4)
        b = take(braid.Loader(yaml_equivalent, rank=rank, world_size=2), 4)
        assert len(a) == len(b) == 4
        for x, y in zip(a, b):
            assert x.keys() == y.keys()
            for key in x:
                assert torch.equal(x[key], y[key]), key


def test_builder_is_one_cpp_object(base):
    plane = braid.dataplane.sources(base)
    assert isinstance(plane, braid.dataplane.DataPlane)
    assert plane.mix({"web": 1}) is plane
    assert plane.distribute_axis == "dp"
    assert plane.broadcast_dims == ["tp", "pp"]
    plane.broadcast_at("pp")  # with distribute dp, TP and PP are broadcast anyway
    assert plane.broadcast_dims == ["tp", "pp"]
    plane.distribute("world")
    assert plane.broadcast_dims == ["pp"]
    config = plane.plan()
    assert config.topology["distribute"] == "world"
    assert config.topology["broadcast_at"] == ["pp"]


def test_phase_and_vision_cost_match_yaml(base):
    plane = (braid.dataplane.sources(base)
             .phase(2, seq_len=16, weights={"web": 0})
             .cost(attn=1.0, linear=8, vision=4, mode="backbone"))
    config = plane.plan()
    as_yaml = dict(base, phases=[{"until_step": 2, "seq_len": 16, "weights": {"web": 0}}],
                   balance={"cost": {"attn": 1.0, "linear": 8, "vision": 4,
                                     "mode": "backbone"}})
    assert config.fingerprint() == load_config(as_yaml).fingerprint()
    assert plan_lines(config, 4) == plan_lines(as_yaml, 4)
    with pytest.raises(braid.ConfigError, match=r"phase\[0\].weights.nope"):
        braid.dataplane.sources(base).phase(2, weights={"nope": 1})


@pytest.mark.parametrize("call, message", [
    (lambda p: p.mix({"web": -1}), "mix.web: must be a finite number >= 0"),
    (lambda p: p.mix({"nope": 1}), "mix.nope: unknown source"),
    (lambda p: p.mix({"web": "a lot"}), "mix.web: must be a number"),
    (lambda p: p.mix({"code": {"schedule": [[0, 0.1], [0, 0.2]]}}),
     "mix.code.schedule[1][0]: steps must be >= 0 and strictly increasing"),
    (lambda p: p.mix({"code": {"schedule": [[0, 0.1], [5]]}}),
     "mix.code.schedule[1]: must be a [step, weight] pair"),
    (lambda p: p.mix({"code": {"linear": [[0, 1]]}}), "mix.code.linear: unknown key"),
    (lambda p: p.mix({"web": 0, "code": 0}).plan(), "mix: all weights are 0 at step 0"),
    (lambda p: p.balance("x"), "balance: unknown method 'x'"),
    (lambda p: p.cost(attn=-1.0), "cost.attn: must be"),
    (lambda p: p.cost(linear=float("nan")), "cost.linear: must be"),
    (lambda p: p.distribute("rows"), "distribute: unknown axis 'rows'"),
    (lambda p: p.broadcast_at("dp"), "broadcast_at: 'dp'"),
    (lambda p: p.broadcast_at("ep"), "broadcast_at: unknown dimension 'ep'"),
])
def test_bad_arguments_raise_config_error_naming_the_primitive(base, call, message):
    with pytest.raises(braid.ConfigError) as info:
        call(braid.dataplane.sources(base))
    assert message in str(info.value)


def test_world_axis_gives_every_rank_a_bucket_unless_broadcast(base):
    assert braid.dataplane.sources(base).distribute("world").plan().topology["buckets"] == 2
    wide = copy.deepcopy(base)
    wide["topology"]["tp"] = 2
    world = braid.dataplane.sources(wide).distribute("world").plan()
    assert world.topology["buckets"] == 4
    assert world.micro_batches_per_rank == 1
    shared = braid.dataplane.sources(wide).distribute("world").broadcast_at("tp").plan()
    assert shared.topology["buckets"] == 2
    assert plan_lines(shared, 3) == plan_lines(wide, 3)
    with pytest.raises(braid.ConfigError, match="distribute.group: must divide"):
        braid.dataplane.sources(wide).distribute("world", group=3).plan()
