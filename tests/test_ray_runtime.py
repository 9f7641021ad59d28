"""The Ray runtime on a real local Ray: every rank receives exactly the embedded runtime's
tensors, TP peers share one build, states resume exactly (also across runtimes), actors
killed mid-run lose and repeat nothing, and nothing is left after the job ends."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import subprocess
import sys
import textwrap
import time
from typing import Dict, List, Sequence

import pytest
import ray

import braid
from braid.ray_runtime import job as jobs
from conftest import assert_same_batches, encoded_image, take_batches

NAMESPACE = "braid-test"


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, object_store_memory=256 * 2**20,
             include_dashboard=False, log_to_driver=False,
             namespace=NAMESPACE, configure_logging=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def ray_config(config: dict, **runtime) -> dict:
    out = copy.deepcopy(config)
    out["runtime"] = {"kind": "ray", "namespace": NAMESPACE, "timeout_s": 60, **runtime}
    return out


def tp_config(small_dataset) -> dict:
    config = copy.deepcopy(small_dataset["config"])
    config["topology"] = {"dp": 2, "tp": 2, "pp": 1, "cp": 1}
    return config


def node_sockets(besides: Sequence[str] = ()) -> List[str]:
    """Braid's abstract Unix socket names open on this machine (node delivery), but those
    in `besides` (what other Braid jobs on the machine had open before a test)."""
    with open("/proc/net/unix") as f:
        return [name for name in (line.split()[-1] for line in f)
                if name.startswith("@braid-") and name not in besides]


@pytest.mark.parametrize("delivery", ["node", "object_store"])
def test_every_rank_gets_the_embedded_tensors_and_tp_peers_share_one_build(
        ray_cluster, small_dataset, delivery):
    config = tp_config(small_dataset)
    world = 4
    before = set(node_sockets())
    embedded = take_batches([braid.Loader(config, r, world) for r in range(world)], 12)
    loaders = [braid.Loader(ray_config(config, delivery=delivery), r, world)
               for r in range(world)]
    got = take_batches(loaders, 12)
    for r in range(world):
        assert_same_batches(got[r], embedded[r])
    # TP peers (ranks 0/1 and 2/3 share a DP rank) received one build: the constructor
    # built each (step, bucket) once, not once per rank, for every step up to the newest
    # one asked for and the steps_in_flight after it. (How far the trainers' receivers
    # asked ahead of the 12 micro-batches taken depends on timing: bound by the newest.
    # A rank that fell further behind than the kept window, as on a loaded machine, has
    # its (step, bucket) built again: counted apart, and far fewer than a build per rank.)
    job = loaders[0]._engine.job
    status = {a["role"]: a for a in jobs.status(job.name, job.namespace)}
    steps = 12 // loaders[0].micro_batches_per_step
    in_flight = 2
    newest = status["constructor"]["newest_step"]
    assert newest >= steps - 1
    built = status["constructor"]["built_buckets"]
    rebuilt = status["constructor"]["rebuilt_buckets"]
    assert built - rebuilt <= 2 * (newest + 1 + in_flight)
    assert rebuilt <= built // 4, (built, rebuilt)
    assert status["planner"]["clients"] == world
    delivered = status["constructor"]["delivered"]
    assert delivered >= 12 * world if delivery == "node" else delivered == 0
    for l in loaders:
        l.close()
    assert jobs.actor_names(job.name, job.namespace) == []
    deadline = time.monotonic() + 30  # the killed constructor's socket goes with it
    while node_sockets(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert node_sockets(before) == []


def test_pipeline_stages_and_context_ranks_map_the_embedded_tensors(ray_cluster,
                                                                   small_dataset):
    """pp 2 x cp 2 through node delivery: each stage's subset of a micro-batch's shared
    file and each context rank's split view (a file of its own) map to the embedded
    runtime's tensors."""
    config = copy.deepcopy(small_dataset["config"])
    config["topology"] = {"dp": 1, "tp": 1, "pp": 2, "cp": 2}
    world = 4
    embedded = take_batches([braid.Loader(config, r, world) for r in range(world)], 6)
    loaders = [braid.Loader(ray_config(config, job="stages"), r, world)
               for r in range(world)]
    got = take_batches(loaders, 6)
    for r in range(world):
        assert_same_batches(got[r], embedded[r])
    # The tensors a rank holds are the constructor's build files, mapped: not copies.
    held = next(iter(loaders[0]))
    with open("/proc/self/maps") as f:
        mapped = f.read()
    assert "memfd:braid-tensors" in mapped
    del held
    for l in loaders:
        l.close()


def test_whole_micro_batches_with_padding_are_the_embedded_ones(ray_cluster, small_dataset):
    """Loader(stage_view=False) on Ray: every stage receives the whole micro-batch, the
    same tensors as embedded; batch.pad_to_multiple_of's padded pieces (fetched from the
    source actors a few tokens short of their planned length) arrive as embedded too."""
    config = copy.deepcopy(small_dataset["config"])
    config["topology"] = {"dp": 2, "tp": 1, "pp": 2, "cp": 1}
    config["batch"]["pad_to_multiple_of"] = 4
    world = 4
    embedded = take_batches([braid.Loader(config, r, world, stage_view=False)
                             for r in range(world)], 8)
    loaders = [braid.Loader(ray_config(config, job="whole"), r, world, stage_view=False)
               for r in range(world)]
    got = take_batches(loaders, 8)
    for r in range(world):
        assert_same_batches(got[r], embedded[r])
        for batch in got[r]:
            assert {"input_ids", "labels", "loss_mask", "cu_seqlens", "max_seqlen",
                    "cu_seqlens_unpadded"} <= set(batch)
            assert not (batch["cu_seqlens"] % 4).any()
    assert any((b["cu_seqlens"] != b["cu_seqlens_unpadded"]).any()
               for r in range(world) for b in got[r]), "some piece is padded"
    for l in loaders:
        l.close()
    assert jobs.actor_names("whole", NAMESPACE) == []


def test_the_planner_can_serve_the_payloads_itself(ray_cluster, small_dataset):
    """runtime.source_actors: 0: two actor processes (planner, constructor), same stream."""
    config = small_dataset["config"]
    embedded = take_batches([braid.Loader(config, r, 2) for r in range(2)], 8)
    loaders = [braid.Loader(ray_config(config, job="colocated", source_actors=0), r, 2)
               for r in range(2)]
    got = take_batches(loaders, 8)
    for r in range(2):
        assert_same_batches(got[r], embedded[r])
    status = {a["role"]: a for a in jobs.status("colocated", NAMESPACE)}
    assert sorted(status) == ["constructor", "planner"]
    assert status["planner"]["sources"] == [0, 1] and status["planner"]["requests"] > 0
    for l in loaders:
        l.close()
    assert jobs.actor_names("colocated", NAMESPACE) == []


def test_state_resumes_exactly_and_across_runtimes(ray_cluster, small_dataset):
    config = small_dataset["config"]
    ranks = [0, 1]
    full = take_batches([braid.Loader(config, r, 2) for r in ranks], 10)
    first = [braid.Loader(ray_config(config), r, 2) for r in ranks]
    head = take_batches(first, 3)  # mid-step: 2 micro-batches per rank per step
    states = [l.state_dict() for l in first]
    assert states[0] == states[1]
    for l in first:
        l.close()
    # Resume on Ray ...
    again = [braid.Loader(ray_config(config), r, 2) for r in ranks]
    for l, s in zip(again, states):
        l.load_state_dict(s)
    tail = take_batches(again, 7)
    for l in again:
        l.close()
    # ... and the same state on the embedded runtime.
    local = [braid.Loader(config, r, 2) for r in ranks]
    for l, s in zip(local, states):
        l.load_state_dict(s)
    local_tail = take_batches(local, 7)
    for r in range(2):
        assert_same_batches(head[r] + tail[r], full[r])
        assert_same_batches(local_tail[r], tail[r])


@pytest.mark.parametrize("delivery", ["node", "object_store"])
def test_actors_killed_mid_run_lose_and_repeat_nothing(ray_cluster, small_dataset,
                                                       delivery):
    config = small_dataset["config"]
    embedded = take_batches([braid.Loader(config, r, 2) for r in range(2)], 24)
    loaders = [braid.Loader(ray_config(config, job="kills", delivery=delivery), r, 2)
               for r in range(2)]
    its = [iter(l) for l in loaders]
    rng = random.Random(3)
    got: List[List[Dict]] = [[], []]
    kills = []
    for i in range(24):
        if i in (3, 7, 11, 15, 19):
            names = jobs.actor_names("kills", NAMESPACE)
            victim = rng.choice(names)
            ray.kill(ray.get_actor(victim, namespace=NAMESPACE), no_restart=False)
            kills.append(victim)
        for k, it in enumerate(its):
            got[k].append({n: t.numpy().copy() for n, t in next(it).items()})
    for r in range(2):
        assert_same_batches(got[r], embedded[r])
    assert len(kills) == 5
    for l in loaders:
        l.close()
    assert jobs.actor_names("kills", NAMESPACE) == []


def test_each_role_killed_in_turn(ray_cluster, small_dataset):
    config = small_dataset["config"]
    config1 = copy.deepcopy(config)
    config1["topology"] = {"dp": 1, "tp": 1, "pp": 1, "cp": 1}
    embedded = take_batches([braid.Loader(config1, 0, 1)], 16)[0]
    # The sources in an actor of their own (runtime.source_actors: 1), killed apart.
    loader = braid.Loader(ray_config(config1, job="roles", source_actors=1), 0, 1)
    it = iter(loader)
    got = []
    for i in range(16):
        if i in (2, 6, 10):
            role = {2: "planner", 6: "sources.0", 10: "constructor"}[i]
            name = next(n for n in jobs.actor_names("roles", NAMESPACE)
                        if n.startswith(f"roles.{role}"))
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
        got.append({n: t.numpy().copy() for n, t in next(it).items()})
    assert_same_batches(got, embedded)
    # The restarted planner still knows the attached rank (Ray's key-value store), so a
    # rank detaching after a restart stops the job only when it is the last one.
    status = {a["role"]: a for a in jobs.status("roles", NAMESPACE)}
    assert status["planner"]["clients"] == 1
    loader.close()
    assert jobs.actor_names("roles", NAMESPACE) == []


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_restarted_planner_resumes_from_its_last_committed_state(ray_cluster,
                                                                    small_dataset):
    """Past a checkpoint (every 16th step), a killed planner restarts from the state
    it committed to Ray's key-value store, not from the job's start; same stream."""
    config = copy.deepcopy(small_dataset["config"])
    config["topology"] = {"dp": 1, "tp": 1, "pp": 1, "cp": 1}
    config["batch"]["global_tokens"] = 32  # one micro-batch per step
    embedded = take_batches([braid.Loader(config, 0, 1)], 44)[0]
    loader = braid.Loader(ray_config(config, job="committed"), 0, 1)

    def kill_planner_at(i: int) -> None:
        if i == 38:  # step 38: the planner committed step 32's state
            planner = ray.get_actor("committed.planner", namespace=NAMESPACE)
            pid = ray.get(planner.status.remote())["roles"][0]["pid"]
            ray.kill(planner, no_restart=False)
            # ray.kill returns before the process dies: the trainer goes on only once it
            # is gone, so the pipeline cannot run on past the next checkpoint meanwhile.
            deadline = time.monotonic() + 30
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)

    got = take_batches([loader], 44, on_micro_batch=kill_planner_at)[0]
    assert_same_batches(got, embedded)
    status = {a["role"]: a for a in jobs.status("committed", NAMESPACE)}
    assert status["planner"]["restored_from"] == 32
    loader.close()
    assert jobs.actor_names("committed", NAMESPACE) == []


def test_stop_removes_a_crashed_jobs_actors(ray_cluster, small_dataset, tmp_path):
    """A trainer killed with SIGKILL never detaches: its job's actors stay until
    `braid stop JOB` removes them."""
    from conftest import braid_cli

    cfg = json.dumps(ray_config(small_dataset["config"], address=ray_cluster,
                                job="crashed", source_actors=1))
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, cfg, "1000000"],
                            env={**os.environ, "RANK": "0", "WORLD_SIZE": "2"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120

        def receiving() -> bool:  # attached, and its first batches built
            roles = {a.get("role"): a for a in jobs.status("crashed", NAMESPACE)}
            return (roles.get("planner", {}).get("clients") == 1
                    and roles.get("constructor", {}).get("built_buckets", 0) > 0)

        while not receiving():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.3)
    finally:
        proc.kill()
        proc.wait()
    assert "crashed" in jobs.jobs(NAMESPACE)
    status = braid_cli("status", "crashed", "--namespace", NAMESPACE,
                       "--address", ray_cluster)
    assert status.returncode == 0, status.stderr[-2000:]
    assert "crashed.planner" in status.stdout and "clients=1" in status.stdout, status.stdout
    stop = braid_cli("stop", "crashed", "--namespace", NAMESPACE, "--address", ray_cluster)
    assert stop.returncode == 0 and "stopped 3 actors" in stop.stdout, stop.stderr[-2000:]
    assert jobs.actor_names("crashed", NAMESPACE) == []


TRAINER = textwrap.dedent("""
    import hashlib, json, os, sys
    import braid
    config = json.loads(sys.argv[1])
    loader = braid.Loader(config)  # RANK and WORLD_SIZE from the environment
    digests = []
    for i, batch in zip(range(int(sys.argv[2])), loader):
        h = hashlib.sha256()
        for name in sorted(batch):
            h.update(name.encode()); h.update(batch[name].numpy().tobytes())
        digests.append(h.hexdigest())
    loader.close()
    print("DIGESTS " + json.dumps(digests))
    print("IMPORTED-RAY " + json.dumps("ray" in sys.modules))
""")


def digests(batches: List[Dict]) -> List[str]:
    out = []
    for b in batches:
        h = hashlib.sha256()
        for name in sorted(b):
            h.update(name.encode())
            h.update(b[name].tobytes())
        out.append(h.hexdigest())
    return out


SEQUENTIAL = textwrap.dedent("""
    import hashlib, json, sys
    import braid
    config = json.loads(sys.argv[1])
    digests = []
    for rank in [0, 1, 0, 1, 0, 1]:  # each close ends the job; the next starts it again
        loader = braid.Loader(config, rank, 2)
        for i, batch in zip(range(4), loader):
            h = hashlib.sha256()
            for name in sorted(batch):
                h.update(name.encode()); h.update(batch[name].numpy().tobytes())
            digests.append(h.hexdigest())
        loader.close()
    print("DIGESTS " + json.dumps(digests))
""")


def test_a_job_ended_by_its_last_rank_starts_again_for_the_next(ray_cluster,
                                                                small_dataset, tmp_path):
    """In a fresh process, loaders opened one after the other: each close detaches the
    job's last rank (the job ends) and the next loader attaches while it may still be
    ending; it starts the job again and gets the embedded runtime's batches."""
    config = small_dataset["config"]
    embedded = [digests(take_batches([braid.Loader(config, r, 2)], 4)[0]) for r in (0, 1)]
    cfg = json.dumps(ray_config(config, address=ray_cluster, job="again"))
    run = subprocess.run([sys.executable, "-c", SEQUENTIAL, cfg], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.split("DIGESTS ", 1)[1])
    assert got == (embedded[0] + embedded[1]) * 3
    assert jobs.actor_names("again", NAMESPACE) == []


def test_a_rank_arriving_as_the_job_ends_waits_for_it_to_go_and_starts_anew(
        ray_cluster, small_dataset):
    """The race of a late rank: the job's last rank detached (the job ended) and its
    actors are not killed yet. The ended planner refuses the late rank's attach (it would
    be attached to actors about to go); the rank tries again until the job's actors are
    gone, then starts the job anew, with itself its only rank."""
    import threading

    from braid import _core

    config = braid.load_config(ray_config(small_dataset["config"], job="late"))
    state = _core.initial_state_json(config)
    first = jobs.attach(config, state, "rank-a")
    assert ray.get(first.planner.detach.remote("rank-a")) == 0  # ended, not stopped yet
    with pytest.raises(ConnectionError, match="job ended"):
        ray.get(first.planner.attach.remote("rank-b"))
    stopper = threading.Timer(1.5, jobs.stop, args=("late", NAMESPACE))
    t0 = time.monotonic()
    stopper.start()
    try:
        second = jobs.attach(config, state, "rank-b")
    finally:
        stopper.join()
    assert time.monotonic() - t0 >= 1.5  # refused until the old actors were gone
    roles = ray.get(second.planner.status.remote())["roles"]
    assert next(r for r in roles if r["role"] == "planner")["clients"] == 1
    assert ray.get(second.planner.detach.remote("rank-b")) == 0
    jobs.stop("late", NAMESPACE)


def test_trainer_processes_started_as_a_user_would(ray_cluster, small_dataset, tmp_path):
    """Two fresh processes that import only braid, RANK/WORLD_SIZE from the environment,
    join the running cluster by address and get the embedded runtime's batches."""
    config = small_dataset["config"]
    embedded = take_batches([braid.Loader(config, r, 2) for r in range(2)], 6)
    cfg = json.dumps(ray_config(config, address=ray_cluster, job="procs"))
    procs = [subprocess.Popen([sys.executable, "-c", TRAINER, cfg, "6"],
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path)
             for r in range(2)]
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        line = next(l for l in out.splitlines() if l.startswith("DIGESTS "))
        assert json.loads(line[len("DIGESTS "):]) == digests(embedded[r])
        # Node delivery (the default): the trainer never ran a Ray driver.
        assert "IMPORTED-RAY false" in out.splitlines()
    assert jobs.actor_names("procs", NAMESPACE) == []


def test_autoscale_changes_no_tensor_on_either_runtime(ray_cluster, small_dataset, tmp_path):
    """runtime.autoscale re-shares threads and read-ahead before every step (a source of
    weight 0 until step 8 idle until step 2): every rank's tensors on Ray with it equal
    the embedded runtime's without it, and `braid run` reports the shares it chose."""
    from conftest import braid_cli, write_config

    config = copy.deepcopy(small_dataset["config"])
    config["sources"][1]["weight"] = {"steps": [[0, 0.0], [8, 0.3]]}
    world = 2
    fixed = copy.deepcopy(config)
    fixed["runtime"] = {"autoscale": False}
    embedded = take_batches([braid.Loader(fixed, r, world) for r in range(world)], 24)
    loaders = [braid.Loader(ray_config(config, job="autoscale"), r, world)
               for r in range(world)]
    got = take_batches(loaders, 24)
    for r in range(world):
        assert_same_batches(got[r], embedded[r])
    for l in loaders:
        l.close()
    run = braid_cli("run", write_config(tmp_path / "job.json", config), "--steps", "12",
                    "--report", tmp_path / "report")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "source threads" in run.stdout
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    changes = report["source_allocation"]
    assert changes[0]["step"] == 0 and not changes[0]["sources"]["code"]["active"]
    # The run's timeline: the source of weight 0 until step 8 read nothing while the
    # first step was planned.
    timeline = report["source_timeline"]
    assert timeline[0]["steps"][0] == 0 and timeline[-1]["steps"][1] >= 10
    assert timeline[0]["sources"]["code"]["samples"] == 0, timeline[0]
    first_active = next(c["step"] for c in changes if c["sources"]["code"]["active"])
    assert first_active == 8 - (2 + 2 + 2)  # the lookahead: prefetch + in flight + 2
    off = braid_cli("run", write_config(tmp_path / "fixed.json", fixed), "--steps", "12")
    assert off.returncode == 0 and "source threads" not in off.stdout


def test_cli_run_and_status_on_ray(ray_cluster, small_dataset, tmp_path):
    from conftest import braid_cli, write_config

    path = write_config(tmp_path / "job.json",
                        ray_config(small_dataset["config"], address=ray_cluster,
                                   source_actors=1))
    run = braid_cli("run", path, "--steps", "4", "--report", tmp_path / "report")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "RSS of the job's 3 actors" in run.stdout
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["steps"] == 4
    # The planner's timeline, from its host: contiguous spans from step 0, both sources.
    timeline = report["source_timeline"]
    assert timeline[0]["steps"][0] == 0 and timeline[-1]["steps"][1] >= 3
    assert all(a["steps"][1] == b["steps"][0] for a, b in zip(timeline, timeline[1:]))
    assert set(timeline[0]["sources"]) == {"web", "code"}
    assert sum(span["sources"]["web"]["samples"] for span in timeline) > 0
    # What the source actor's fetches cost: a row transformed for its first piece only
    # (documents are cut into pieces here), at least the delivered tokens sent (steps
    # are built ahead), the bytes of their arrays.
    serving = report["source_serving"]
    assert set(serving) == {"web", "code"}, serving
    for name, s in serving.items():
        assert 0 < s["rows_transformed"] <= s["pieces"], (name, s)
        assert s["bytes_sent"] >= 4 * s["tokens_sent"] > 0, (name, s)
        assert s["units_read"] > 0 and s["peak_cached_bytes"] >= s["cached_bytes"] > 0
    sent = sum(s["tokens_sent"] for s in serving.values())
    assert sent >= report["tokens"] - report["padding_tokens"], (sent, report["tokens"])
    assert "source serving" in run.stdout
    # The planner's streams held samples ahead of it, within the job's budget.
    assert all(p["peak_held_bytes"] > 0 for p in report["source_profile"].values())
    local = braid_cli("run", path, "--steps", "4", "--runtime", "local")
    assert local.returncode == 0, local.stderr[-3000:]

    def line(out: str, key: str) -> str:
        return next(l for l in out.splitlines() if l.strip().startswith(key))

    # The same stream: the same tokens, padding, balance and shares.
    for key in ("tokens ", "padding", "imbalance", "web", "code"):
        assert line(run.stdout, key) == line(local.stdout, key), key
    status = braid_cli("status", "--namespace", NAMESPACE, "--address", ray_cluster)
    assert status.returncode == 0, status.stderr
    stop = braid_cli("stop", "nothing-here", "--namespace", NAMESPACE,
                     "--address", ray_cluster)
    assert stop.returncode == 0 and "stopped 0 actors" in stop.stdout


@pytest.fixture(scope="module")
def caption_config(tmp_path_factory) -> dict:
    """An image-caption source (PNG images of a few sizes, some rows with two) mixed with
    text, one micro-batch of 2,048 tokens per rank and step, dp 2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from braid import _core

    root = tmp_path_factory.mktemp("ray_captions")
    rng = random.Random(5)
    words = "a chart of loaders and planners with arrows boxes and colours".split()
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 30))) + "."
            for _ in range(200)]
    model = _core.train_tiny_sentencepiece(text, str(root / "tok"), 60)

    images = [[encoded_image(rng, rng.randint(20, 90), rng.randint(20, 90))
               for _ in range(2 if rng.random() < 0.2 else 1)] for _ in range(60)]
    pq.write_table(pa.table({"image": pa.array(images, pa.list_(pa.binary())),
                             "caption": [rng.choice(text) for _ in images]}),
                   root / "captions.parquet", row_group_size=20)
    pq.write_table(pa.table({"text": [" ".join(rng.choice(text) for _ in range(8))
                                      for _ in range(80)]}),
                   root / "text.parquet", row_group_size=20)
    return {
        "seed": 3,
        "topology": {"dp": 2, "tp": 1, "pp": 1, "cp": 1},
        "batch": {"global_tokens": 4096, "seq_len": 2048, "micro_batch_size": 1},
        "balance": {"cost": {"attn": 1.0, "linear": 2048, "vision": 8}},
        "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
        "sources": [
            {"name": "captions", "path": str(root / "captions.parquet"), "weight": 0.6,
             "image_column": "image", "text_column": "caption", "oversize": "skip",
             "image": {"patch_size": 14, "image_token_id": 1000}},
            {"name": "text", "path": str(root / "text.parquet"), "weight": 0.4,
             "text_column": "text"}],
    }


def test_an_image_that_does_not_decode_is_blanked_on_ray_as_embedded(
        ray_cluster, caption_config, tmp_path):
    """Under on_error: skip, a row whose image body does not decode (its header does) is
    found by the constructor, which decodes the images the source actor sends encoded:
    the ranks get the embedded runtime's tensors (the row blank, its loss mask 0) and the
    constructor counts the blanked pieces."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    config = copy.deepcopy(caption_config)
    table = pq.read_table(config["sources"][0]["path"])
    images = table.column("image").to_pylist()
    for row in range(0, len(images), 3):  # a header that reads, a body cut short
        images[row][0] = images[row][0][:64]
    path = tmp_path / "captions.parquet"
    pq.write_table(table.set_column(0, "image", pa.array(images, pa.list_(pa.binary()))),
                   path, row_group_size=20)
    config["sources"][0].update(path=str(path), on_error="skip")
    embedded = take_batches([braid.Loader(config, r, 2) for r in range(2)], 10)
    loaders = [braid.Loader(ray_config(config, job="blanks"), r, 2) for r in range(2)]
    got = take_batches(loaders, 10)
    for r in range(2):
        assert_same_batches(got[r], embedded[r])
    job = loaders[0]._engine.job
    status = {a["role"]: a for a in jobs.status(job.name, job.namespace)}
    assert status["constructor"]["blanked_pieces"].get(0, 0) >= 1
    for l in loaders:
        l.close()


def test_image_caption_sources_arrive_whole_on_ray(ray_cluster, caption_config):
    """Images travel encoded from the source actor to the constructor with their pieces
    (grid and bytes) and are decoded there: every rank gets the embedded runtime's
    tensors, pixel_values included."""
    embedded = take_batches([braid.Loader(caption_config, r, 2) for r in range(2)], 10)
    assert any("pixel_values" in b for rank in embedded for b in rank)
    loaders = [braid.Loader(ray_config(caption_config, job="captions"), r, 2)
               for r in range(2)]
    got = take_batches(loaders, 10)
    for r in range(2):
        assert_same_batches(got[r], embedded[r])
    for l in loaders:
        l.close()


def test_an_attach_helper_that_dies_with_no_answer_shows_rays_message(monkeypatch):
    """A helper that dies joining Ray (a driver's fatal error: its message, then a native
    stack longer than the error's excerpt) fails the attach with the fatal message, not
    only the stack's tail."""
    import subprocess as sp

    from braid.ray_runtime import client

    fatal = ("[2026 C 1] core_worker.cc:9: Failed to register worker to Raylet\n"
             "*** StackTrace Information ***\n"
             + "".join(f"/lib/libpython.so(f+{i}) [0x{i}] f\n" for i in range(40)))
    monkeypatch.setattr(client.subprocess, "run", lambda *args, **kwargs:
                        sp.CompletedProcess(args, 1, stdout=b"", stderr=fatal.encode()))
    with pytest.raises(RuntimeError, match="status 1 and no answer") as error:
        client.attach_in_helper({}, "{}", "c", 5.0)
    assert "Failed to register worker" in str(error.value)


def test_a_late_rank_waits_out_the_ended_jobs_actors_but_not_a_failed_creation(
        monkeypatch):
    """A rank that attaches while the job it finds is being stopped (its actors killed one
    by one, their names released slowly on a loaded cluster) tries again until
    runtime.timeout_s, however many killed actors it meets; an actor whose creation failed
    is raised at once."""
    class Config:
        runtime = {"timeout_s": 30}

    tries = []

    def killed_five_times(config, state_json, client):
        tries.append(client)
        if len(tries) <= 5:
            raise ray.exceptions.ActorDiedError()  # killed as the job ended
        return "job"

    monkeypatch.setattr(jobs.time, "sleep", lambda s: None)
    monkeypatch.setattr(jobs, "_attach_once", killed_five_times)
    assert jobs.attach(Config(), "{}", "late") == "job"
    assert len(tries) == 6
    tries.clear()

    def creation_failed(config, state_json, client):
        tries.append(client)
        raise ray.exceptions.RayActorError(actor_init_failed=True)

    monkeypatch.setattr(jobs, "_attach_once", creation_failed)
    with pytest.raises(ray.exceptions.RayActorError):
        jobs.attach(Config(), "{}", "late")
    assert len(tries) == 1
