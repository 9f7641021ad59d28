"""Faults on the Ray runtime, on a 3-node local cluster (ray.cluster_utils.Cluster): a
node that hosts the planner and the source actors is removed mid-run, actors of every
role are killed at random micro-batches, shadow source actors answer while a killed one
restarts, a trainer process is SIGKILLed between checkpoints and restarted from its last
one many times, and a whole job is restored from a saved state at another dp. Every
rank's stream stays the embedded runtime's, tensor for tensor."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from typing import Dict, List

import numpy as np

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


CRASHING_TRAINER = textwrap.dedent("""
    import hashlib, json, os, signal, sys
    import braid

    config, checkpoint, crash_at, save_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), 3
    loader = braid.Loader(json.load(open(config)), rank=1, world_size=2)
    taken = 0
    if os.path.exists(checkpoint):
        saved = json.load(open(checkpoint))
        loader.load_state_dict(saved["state"])
        taken = saved["taken"]
    print(json.dumps({"resumed_at": taken}), flush=True)
    for batch in loader:
        digest = hashlib.sha256()
        for name in sorted(batch):
            digest.update(name.encode() + batch[name].numpy().tobytes())
        print(json.dumps({"i": taken, "digest": digest.hexdigest()}), flush=True)
        taken += 1
        if taken % save_every == 0:  # a checkpoint, written as trainers do: atomically
            with open(checkpoint + ".tmp", "w") as f:
                json.dump({"state": loader.state_dict(), "taken": taken}, f)
            os.replace(checkpoint + ".tmp", checkpoint)
        if taken == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)  # between two checkpoints, unannounced
""")


def batch_digest(batch: Dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(batch):
        digest.update(name.encode() + np.ascontiguousarray(batch[name]).tobytes())
    return digest.hexdigest()


def test_a_trainer_killed_between_checkpoints_resumes_exactly(cluster, small_dataset,
                                                              tmp_path):
    """Rank 1 is a trainer process SIGKILLed at CRASH_POINTS seeded micro-batches, each
    time restarted from its last checkpoint (every 3rd micro-batch), as an elastic agent
    would, while the job's actors and rank 0 stay up: every micro-batch it takes after a
    restart is the uninterrupted stream's at that position."""
    c, _ = cluster
    config = small_dataset["config"]
    crash_points = int(os.environ.get("BRAID_CRASH_POINTS", "20"))
    rng = random.Random(25)
    crashes, at = [], 0
    for _ in range(crash_points):
        at += rng.randint(2, 7)  # at least one micro-batch past the last checkpoint
        crashes.append(at)
    total = crashes[-1] + 6
    want = take_batches([braid.Loader(config, r, 2) for r in range(2)], total)
    cfg = ray_config(config, job="crashing", address=c.address)
    (tmp_path / "job.json").write_text(json.dumps(cfg))
    (tmp_path / "trainer.py").write_text(CRASHING_TRAINER)
    rank0 = braid.Loader(cfg, 0, 2)
    got0: List[Dict] = []
    stop = threading.Event()

    def run_rank0() -> None:  # the other rank trains on meanwhile
        for batch in rank0:
            got0.append({k: t.numpy().copy() for k, t in batch.items()})
            if len(got0) == total or stop.is_set():
                return

    other = threading.Thread(target=run_rank0, daemon=True)
    other.start()
    seen: Dict[int, str] = {}
    resumes = []
    for crash in crashes + [total]:
        proc = subprocess.Popen([sys.executable, str(tmp_path / "trainer.py"),
                                 str(tmp_path / "job.json"), str(tmp_path / "ckpt.json"),
                                 str(crash)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            for line in proc.stdout:
                got = json.loads(line)
                if "resumed_at" in got:
                    resumes.append(got["resumed_at"])
                    continue
                seen.setdefault(got["i"], got["digest"])
                assert got["digest"] == batch_digest(want[1][got["i"]]), (crash, got["i"])
                if got["i"] + 1 == total:
                    break
        finally:
            proc.kill()
            err = proc.communicate(timeout=30)[1]
        if crash != total:
            assert proc.returncode == -signal.SIGKILL, err[-2000:]
    other.join(60)
    stop.set()
    rank0.close()
    assert sorted(seen) == list(range(total))
    # Each restart resumed at the checkpoint before its crash, not at the crash.
    assert resumes == [0] + [p - p % 3 for p in crashes]
    assert any(p % 3 for p in crashes)
    assert len(got0) == total
    assert_same_batches(got0, want[0])
