"""Faults on the Ray runtime, on a 3-node local cluster (ray.cluster_utils.Cluster): a
node that hosts the planner and the source actors is removed mid-run, actors of every
role are killed at random micro-batches, shadow source actors answer while a killed one
restarts, and a whole job is restored from a saved state at another dp. Every rank's stream stays the embedded runtime's, tensor for tensor."""

from __future__ import annotations

import copy
import random
from typing import List

import pytest
import ray
from ray.cluster_utils import Cluster

import braid
from braid.ray_runtime import job as jobs
from conftest import assert_same_batches, take_batches

NAMESPACE = "braid-faults"


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "object_store_memory": 128 * 2**20, "include_dashboard": False})
    # Two nodes for the job's shared actors (runtime.actor_resources: loaders).
    workers = [c.add_node(num_cpus=1, resources={"loaders": 1},
                          object_store_memory=96 * 2**20) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, namespace=NAMESPACE, log_to_driver=False,
             configure_logging=False)
    yield c, workers
    ray.shutdown()
    c.shutdown()


def ray_config(config: dict, **runtime) -> dict:
    out = copy.deepcopy(config)
    out["runtime"] = {"kind": "ray", "namespace": NAMESPACE, "timeout_s": 60, **runtime}
    return out


def test_removing_the_node_of_the_planner_and_sources_loses_nothing(cluster,
                                                                    small_dataset):
    """The shared actors run on the two worker nodes (runtime.actor_resources); the one
    that hosts the planner is removed mid-run, the actors come back on the other."""
    c, workers = cluster
    config = small_dataset["config"]
    embedded = take_batches([braid.Loader(config, r, 2) for r in range(2)], 16)
    cfg = ray_config(config, job="node-loss", actor_resources={"loaders": 0.01})
    loaders = [braid.Loader(cfg, r, 2) for r in range(2)]
    removed = []

    def remove_at(i: int) -> None:
        if i == 5:
            where = {a["name"]: a.get("node") for a in jobs.status("node-loss", NAMESPACE)}
            victim = next(w for w in workers if w.node_id == where["node-loss.planner"])
            c.remove_node(victim)
            removed.append(victim.node_id)

    got = take_batches(loaders, 16, remove_at)
    for r in range(2):
        assert_same_batches(got[r], embedded[r])
    moved = {a["name"]: a.get("node") for a in jobs.status("node-loss", NAMESPACE)}
    assert moved["node-loss.planner"] not in (removed[0], None)
    for l in loaders:
        l.close()
    assert jobs.actor_names("node-loss", NAMESPACE) == []


KILLS = 42


def test_many_random_kills_of_every_role_lose_and_repeat_nothing(cluster, small_dataset):
    config = copy.deepcopy(small_dataset["config"])
    n = 3 * KILLS
    embedded = take_batches([braid.Loader(config, r, 2) for r in range(2)], n)
    cfg = ray_config(config, job="random-kills", source_actors=2)
    loaders = [braid.Loader(cfg, r, 2) for r in range(2)]
    rng = random.Random(20261201)
    kill_at = set(rng.sample(range(1, n), KILLS))
    killed: List[str] = []

    def kill(i: int) -> None:
        if i in kill_at:
            victim = rng.choice(jobs.actor_names("random-kills", NAMESPACE))
            ray.kill(ray.get_actor(victim, namespace=NAMESPACE), no_restart=False)
            killed.append(victim.split(".")[1])

    got = take_batches(loaders, n, kill)
    for r in range(2):
        assert_same_batches(got[r], embedded[r])
    assert len(killed) == KILLS
    assert {"planner", "sources", "constructor"} <= set(killed)
    for l in loaders:
        l.close()
    assert jobs.actor_names("random-kills", NAMESPACE) == []


def test_shadow_source_actors_answer_while_a_killed_one_restarts(cluster, small_dataset):
    config = small_dataset["config"]
    n = 24
    embedded = take_batches([braid.Loader(config, r, 2) for r in range(2)], n)
    cfg = ray_config(config, job="shadowed", shadow=True, source_actors=1)
    loaders = [braid.Loader(cfg, r, 2) for r in range(2)]

    def kill_primary(i: int) -> None:
        if i in (3, 8, 13, 18):
            ray.kill(ray.get_actor("shadowed.sources.0", namespace=NAMESPACE),
                     no_restart=False)

    got = take_batches(loaders, n, kill_primary)
    for r in range(2):
        assert_same_batches(got[r], embedded[r])
    status = {a["name"]: a for a in jobs.status("shadowed", NAMESPACE)}
    assert "shadowed.sources.0.shadow" in status
    constructor = next(a for name, a in status.items() if ".constructor." in name)
    assert constructor["shadow_failovers"] >= 1
    assert status["shadowed.sources.0.shadow"]["requests"] >= 1
    for l in loaders:
        l.close()
    assert jobs.actor_names("shadowed", NAMESPACE) == []


def test_a_whole_job_restored_at_another_dp_continues_the_stream(cluster, small_dataset):
    config = small_dataset["config"]
    first = [braid.Loader(ray_config(config), r, 2) for r in range(2)]
    per_step = first[0].micro_batches_per_step
    take_batches(first, 3 * per_step)  # three whole steps: a step boundary
    state = first[0].state_dict()
    assert state == first[1].state_dict()
    for l in first:
        l.close()
    assert not [j for j in jobs.jobs(NAMESPACE) if j.startswith("braid-")]
    # Every actor gone; the job comes back at dp=4 from the saved state.
    wide = copy.deepcopy(config)
    wide["topology"]["dp"] = 4
    wide["batch"]["global_tokens"] = config["batch"]["global_tokens"]
    local = [braid.Loader(wide, r, 4) for r in range(4)]
    for l in local:
        l.load_state_dict(state)
    want = take_batches(local, 4)
    again = [braid.Loader(ray_config(wide), r, 4) for r in range(4)]
    for l in again:
        l.load_state_dict(state)
    got = take_batches(again, 4)
    for r in range(4):
        assert_same_batches(got[r], want[r])
    for l in again:
        l.close()
