"""The Ray runtime on nodes as separate as hosts (tests/netns_cluster.py: each node its own
network and mount namespace, its own /tmp/ray, `ray start` in it), with trainer ranks
started inside their node as a launcher would: every rank receives the embedded runtime's
tensors (two and three nodes; a source tokenized in the loader, whose pieces the other
node fetches are answered from the planner's plans), TP peers on a node share one build,
a node killed mid-run
(every one of its processes) loses and repeats nothing on the nodes left, also when the
planner's node is lost four times in a row, a trainer whose Ray driver joins another
node's raylet is told so at once, and the bytes that cross a node's link per step stay
within 1.3x of its pieces. docs/distributed.md's quick start runs as written in
tests/test_quick_start_nodes.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

pytest.importorskip("ray")

import braid  # noqa: E402
from conftest import make_source, take_batches  # noqa: E402
from netns_cluster import NamespaceCluster  # noqa: E402

NAMESPACE = "braid-netns"
MARK = "BRAID-DIGEST "

TRAINER = textwrap.dedent("""
    import hashlib, json, sys, time
    import braid

    config, rank, world, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    step_s = float(sys.argv[5])  # the training step the loader overlaps
    loader = braid.Loader(json.load(open(config)), rank=rank, world_size=world)
    for i, batch in enumerate(loader):
        digest = hashlib.sha256()
        for name in sorted(batch):
            digest.update(name.encode() + batch[name].numpy().tobytes())
        print("BRAID-DIGEST " + json.dumps({"i": i, "t": time.monotonic(),
                                            "digest": digest.hexdigest()}), flush=True)
        if i + 1 == n:
            break
        time.sleep(step_s)
    loader.close()
""")


@pytest.fixture(scope="module")
def nodes():
    why = NamespaceCluster.available()
    if why:
        pytest.skip(f"no namespace cluster here: {why}")
    # Nodes 1 and 2 offer the `loaders` resource that runtime.actor_resources can ask
    # for (the rolling node loss below); node 0 is the head, where trainers run.
    with NamespaceCluster(3, resources={1: {"loaders": 1}, 2: {"loaders": 1}}) as cluster:
        yield cluster


def digest(batch: Dict) -> str:
    d = hashlib.sha256()
    for name in sorted(batch):
        d.update(name.encode() + np.ascontiguousarray(batch[name]).tobytes())
    return d.hexdigest()


def tp_config(small_dataset) -> dict:
    config = copy.deepcopy(small_dataset["config"])
    config["topology"] = {"dp": 2, "tp": 2, "pp": 1, "cp": 1}
    return config


def ray_job(config: dict, job: str, **runtime) -> dict:
    out = copy.deepcopy(config)
    out["runtime"] = {"kind": "ray", "namespace": NAMESPACE, "job": job, "timeout_s": 60,
                      **runtime}
    return out


class Trainers:
    """Trainer ranks started inside their nodes; each prints a digest per micro-batch."""

    def __init__(self, nodes: NamespaceCluster, folder: Path, config: dict) -> None:
        self.nodes, self.folder = nodes, folder
        (folder / "job.json").write_text(json.dumps(config))
        (folder / "trainer.py").write_text(TRAINER)
        self.procs: Dict[int, object] = {}
        self.lines: Dict[int, List[dict]] = {}
        self.readers: List[threading.Thread] = []
        self.err: Dict[int, str] = {}

    def start(self, node: int, rank: int, world: int, n: int, step_s: float = 0) -> None:
        proc = self.nodes.popen(node, [sys.executable, str(self.folder / "trainer.py"),
                                       str(self.folder / "job.json"), str(rank), str(world),
                                       str(n), str(step_s)],
                                stdout=-1, stderr=-1, text=True)
        self.procs[rank], self.lines[rank] = proc, []

        def read() -> None:
            for line in proc.stdout:  # Ray may print to stdout too, even mid-line
                at = line.find(MARK)
                if at >= 0:
                    got, _ = json.JSONDecoder().raw_decode(line, at + len(MARK))
                    self.lines[rank].append(got)

        def read_err() -> None:
            self.err[rank] = proc.stderr.read()

        for target in (read, read_err):
            reader = threading.Thread(target=target, daemon=True)
            reader.start()
            self.readers.append(reader)

    def wait_for(self, rank: int, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(self.lines[rank]) < count:
            proc = self.procs[rank]
            if proc.poll() is not None and len(self.lines[rank]) < count:
                time.sleep(0.5)  # the reader may still be draining
                if len(self.lines[rank]) < count:
                    pytest.fail(f"rank {rank} exited {proc.returncode} after "
                                f"{len(self.lines[rank])} micro-batches: "
                                f"{self.stderr(rank)[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"rank {rank}: {len(self.lines[rank])} of {count} micro-batches "
                            f"in {timeout} s")
            time.sleep(0.05)

    def stderr(self, rank: int) -> str:
        for reader in self.readers:
            reader.join(5)
        return self.err.get(rank, "")

    def finish(self, ranks, timeout: float = 120) -> None:
        for rank in ranks:
            proc = self.procs[rank]
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert proc.returncode == 0, f"rank {rank}: {self.stderr(rank)[-3000:]}"
        for reader in self.readers:
            reader.join(5)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("groups", [2, 3])
def test_every_rank_on_separate_nodes_gets_the_embedded_tensors(nodes, small_dataset,
                                                                tmp_path, groups):
    """dp=GROUPS x tp=2 over GROUPS nodes: the TP peers of one DP group on each node."""
    config = tp_config(small_dataset)
    config["topology"]["dp"] = groups
    config["batch"]["global_tokens"] = groups * 2 * 32
    world, n = 2 * groups, 12
    want = take_batches([braid.Loader(config, r, world) for r in range(world)], n)
    trainers = Trainers(nodes, tmp_path, ray_job(config, f"netns-tp{groups}"))
    try:
        for rank in range(world):
            trainers.start(rank // 2, rank, world, n)
        trainers.finish(range(world))
    finally:
        trainers.stop_all()
    for rank in range(world):
        got = [line["digest"] for line in trainers.lines[rank]]
        assert got == [digest(b) for b in want[rank]], rank


def test_a_tokenized_source_on_two_nodes_is_served_from_the_planners_plans(nodes,
                                                                           tmp_path):
    """Raw text tokenized in the loader, dp=2 over nodes 0 and 1 (the planner's host on
    node 0): node 1's ranks get the embedded tensors, and the pieces node 1 fetched were
    answered from the payloads of the plans the first node's host holds, not tokenized
    again there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(31)
    words = "the loader reads every row once and plans the mix of sources".split()
    texts = [" ".join(rng.choice(words, size=int(rng.integers(5, 120))))
             for _ in range(300)]
    (tmp_path / "text").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "text" / "a.parquet",
                   row_group_size=32)
    model = braid._core.train_tiny_sentencepiece(texts[:200], str(tmp_path / "tok"), 40)
    config = {"seed": 4, "topology": {"dp": 2},
              "batch": {"global_tokens": 2 * 256, "seq_len": 256},
              "tokenizer": {"type": "sentencepiece", "model": model, "eos": True},
              "sources": [{"name": "text", "path": str(tmp_path / "text"),
                           "text_column": "text"}]}
    n = 16
    want = take_batches([braid.Loader(config, r, 2) for r in range(2)], n)
    job = "netns-text"
    trainers = Trainers(nodes, tmp_path, ray_job(config, job))
    try:
        # Rank 0 steps slowly, so that the job lasts until rank 1 (a new Ray driver on
        # node 1, seconds to start) has joined it.
        trainers.start(0, 0, 2, n, 1.0)
        trainers.wait_for(0, 1)
        assert planner_node(nodes, tmp_path, job) == 0
        trainers.start(1, 1, 2, n, 0.2)
        trainers.wait_for(1, n // 2)
        status = nodes.run(0, [sys.executable, "-m", "braid.cli", "status", "--json",
                               "--namespace", NAMESPACE, "--address",
                               f"{nodes.address(0)}:6390", job])
        trainers.finish(range(2))
    finally:
        trainers.stop_all()
    for rank in range(2):
        got = [line["digest"] for line in trainers.lines[rank]]
        assert got == [digest(b) for b in want[rank]], rank
    actors = json.loads(status.stdout.strip().splitlines()[-1])["actors"]
    planner = next(a for a in actors if a.get("role") == "planner")
    served = planner["source_serving"]["text"]
    # Node 1's first steps may have been planned before it joined, their plans already
    # lightened: those pieces are read and tokenized again; every later one came from the
    # plans, with no row tokenized for it.
    assert served["pieces_from_plans"] > 0, served
    assert served["rows_transformed"] <= served["pieces"] - served["pieces_from_plans"]


PLANNER_NODE = textwrap.dedent("""
    import sys, ray
    address, namespace, job = sys.argv[1:4]
    ray.init(address=address, namespace=namespace, log_to_driver=False)
    node = ray.get(ray.get_actor(job + ".planner").node.remote(), timeout=60)
    print("PLANNER-AT", next(n["NodeManagerAddress"] for n in ray.nodes()
                             if n["NodeID"] == node))
""")


def planner_node(nodes: NamespaceCluster, folder: Path, job: str) -> int:
    """The node that hosts job `job`'s planner (asked from node 0)."""
    (folder / "where.py").write_text(PLANNER_NODE)
    out = nodes.run(0, [sys.executable, str(folder / "where.py"),
                        f"{nodes.address(0)}:6390", NAMESPACE, job])
    return nodes.node_of(next(line.split()[1] for line in out.stdout.splitlines()
                              if line.startswith("PLANNER-AT ")))


def test_a_node_killed_mid_run_loses_and_repeats_nothing_on_the_others(nodes, small_dataset,
                                                                       tmp_path):
    """dp=4 over two nodes, two ranks each; node 1's ranks start first, so the job's
    planner and sources live on node 1. Node 1 is killed (every process in it: its
    raylet, the planner host, its trainers) once every rank has its third micro-batch;
    the planner comes back on node 0 and node 0's ranks finish with the embedded
    runtime's tensors. The longest wait is printed."""
    config = copy.deepcopy(small_dataset["config"])
    config["topology"] = {"dp": 4, "tp": 1, "pp": 1, "cp": 1}
    n = 300
    want = take_batches([braid.Loader(config, r, 4) for r in (0, 1)], n)
    trainers = Trainers(nodes, tmp_path, ray_job(config, "netns-loss"))
    try:
        for rank in (2, 3, 0, 1):
            trainers.start(rank // 2, rank, 4, n, step_s=0.02)
            if rank == 3:
                trainers.wait_for(2, 1)  # the job exists, placed from node 1
                where = planner_node(nodes, tmp_path, "netns-loss")
                assert where == 1, f"the planner runs on node {where}"
        for rank in range(4):
            trainers.wait_for(rank, 3)
        killed = nodes.kill_node(1)
        t_kill = time.monotonic()
        trainers.finish([0, 1], timeout=180)
    finally:
        trainers.stop_all()
        nodes.restart_node(1)
    assert killed >= 3
    for rank in (0, 1):
        got = [line["digest"] for line in trainers.lines[rank]]
        assert got == [digest(b) for b in want[rank]], rank
    assert any(line["t"] > t_kill for line in trainers.lines[0]), "finished before the kill"
    gaps = []  # between micro-batches of a surviving rank, from the kill on
    for rank in (0, 1):
        times = [t_kill] + [line["t"] for line in trainers.lines[rank] if line["t"] > t_kill]
        gaps += [b - a for a, b in zip(times, times[1:])]
    print(f"node loss: {killed} processes killed; the longest wait of a surviving rank "
          f"{max(gaps, default=0):.1f} s")
    assert max(gaps, default=0) < 120


def test_a_driver_on_another_nodes_raylet_is_one_line_at_once(nodes, small_dataset,
                                                              tmp_path):
    """The trap of nodes sharing /tmp/ray: a trainer in node 1's network namespace whose
    Ray driver joins node 0's raylet (it sees node 0's /tmp/ray) gets the constructor of
    node 0, whose socket it cannot reach; it is told so at once, not after timeout_s."""
    config = ray_job(small_dataset["config"], "netns-trap")
    (tmp_path / "job.json").write_text(json.dumps(config))
    (tmp_path / "trainer.py").write_text(TRAINER)
    enter = ["nsenter", f"--net=/proc/{nodes.anchors[1].pid}/ns/net",
             f"--mount=/proc/{nodes.anchors[0].pid}/ns/mnt"]
    t0 = time.monotonic()
    result = subprocess.run(enter + [sys.executable, str(tmp_path / "trainer.py"),
                                     str(tmp_path / "job.json"), "0", "2", "2", "0"],
                            capture_output=True, text=True, timeout=120, env=nodes.env)
    took = time.monotonic() - t0
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "another host or network namespace" in last and "/tmp/ray" in last, last
    assert took < 40, took  # not runtime.timeout_s (60 s) and more


def test_rolling_node_loss_of_the_planners_node_loses_and_repeats_nothing(
        nodes, small_dataset, tmp_path):
    """Two trainer ranks on node 0; the planner and the sources on the nodes that offer
    `loaders` (runtime.actor_resources), 1 and 2. Four times the node that hosts the
    planner is killed (every process in it) and started again: the planner comes back
    on a node that offers `loaders`, and the ranks finish with the embedded runtime's
    tensors. The longest wait of a rank after each kill is printed."""
    config = copy.deepcopy(small_dataset["config"])
    n = 600
    want = take_batches([braid.Loader(config, r, 2) for r in (0, 1)], n)
    job = ray_job(config, "netns-rolling", actor_resources={"loaders": 0.01})
    trainers = Trainers(nodes, tmp_path, job)
    kills: List[tuple] = []  # (node, processes, time of the kill)
    try:
        for rank in (0, 1):
            trainers.start(0, rank, 2, n, step_s=0.02)
        for _ in range(4):
            seen = min(len(trainers.lines[r]) for r in (0, 1))
            for rank in (0, 1):
                trainers.wait_for(rank, seen + 5)
            victim = planner_node(nodes, tmp_path, "netns-rolling")
            assert victim in (1, 2), f"the planner runs on node {victim}"
            kills.append((victim, nodes.kill_node(victim), time.monotonic()))
            nodes.restart_node(victim)
        trainers.finish([0, 1], timeout=240)
    finally:
        trainers.stop_all()
    for rank in (0, 1):
        got = [line["digest"] for line in trainers.lines[rank]]
        assert got == [digest(b) for b in want[rank]], rank
    waits = []  # per kill, the longest gap between micro-batches until the next kill
    ends = [k[2] for k in kills[1:]] + [float("inf")]
    for (_, _, t_kill), end in zip(kills, ends):
        for r in (0, 1):
            times = [t_kill] + [line["t"] for line in trainers.lines[r]
                                if t_kill < line["t"] < end]
            assert len(times) > 1, f"rank {r} had nothing between two kills"
            waits.append(max(b - a for a, b in zip(times, times[1:])))
    waits = [max(waits[i:i + 2]) for i in range(0, len(waits), 2)]
    print("rolling node loss: " + "; ".join(
        f"node {node} ({count} processes) killed, longest wait {wait:.1f} s"
        for (node, count, _), wait in zip(kills, waits)))
    assert max(waits) < 120


class LinkSampler:
    """Samples a node's link counters every `every` seconds in a thread."""

    def __init__(self, nodes: NamespaceCluster, node: int, every: float = 0.1) -> None:
        self.samples: List[tuple] = []  # (monotonic time, rx, tx)
        self.stop = threading.Event()
        self.error: List[BaseException] = []

        def run() -> None:
            try:
                while not self.stop.is_set():
                    got = nodes.link_bytes(node)
                    self.samples.append((time.monotonic(), got["rx"], got["tx"]))
                    self.stop.wait(every)
            except BaseException as e:  # raised again by close()
                self.error.append(e)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        if self.error:
            raise self.error[0]

    def at(self, t: float) -> np.ndarray:
        """(rx, tx) at time t, interpolated between samples."""
        assert self.samples[0][0] <= t <= self.samples[-1][0], "t outside the samples"
        times = [s[0] for s in self.samples]
        return np.array([np.interp(t, times, [s[k] for s in self.samples]) for k in (1, 2)])


def test_bytes_between_nodes_per_step_against_the_pieces(nodes, tmp_path):
    """dp=2 x tp=2 over nodes 0 and 1 at seq_len 2048, the planner and the sources on node
    0: what crosses node 1's link per step, in steady running, against the minimum (the
    tokens of its DP group's pieces, 4 bytes each plus the label token after each piece,
    once for the two TP peers) and against the link's idle rate (Ray's heartbeats)."""
    rng = np.random.default_rng(29)
    sources = []
    for index, (name, count) in enumerate((("web", 400), ("code", 200))):
        make_source(tmp_path, name, index, [int(x) for x in rng.integers(20, 999, size=count)],
                    row_group_size=64)
        sources.append({"name": name, "path": str(tmp_path / name),
                        "tokens_column": "input_ids", "weight": 0.6 if index == 0 else 0.4})
    seq = 2048
    config = {"seed": 3, "topology": {"dp": 2, "tp": 2, "pp": 1, "cp": 1},
              "batch": {"global_tokens": 2 * seq, "seq_len": seq, "micro_batch_size": 1},
              "sources": sources}
    n, first, step_s = 60, 10, 0.1
    want = take_batches([braid.Loader(config, r, 4) for r in (0, 2)], n)
    minimum = [4 * (int(b["cu_seqlens"][-1]) + len(b["cu_seqlens"]) - 1) for b in want[1]]
    trainers = Trainers(nodes, tmp_path, ray_job(config, "netns-bytes"))
    idle = LinkSampler(nodes, 1)
    time.sleep(3)
    idle.close()
    link = LinkSampler(nodes, 1)
    try:
        for rank in (0, 1):
            trainers.start(0, rank, 4, n, step_s)
        trainers.wait_for(0, 1)
        assert planner_node(nodes, tmp_path, "netns-bytes") == 0
        for rank in (2, 3):
            trainers.start(1, rank, 4, n, step_s)
        trainers.finish(range(4))
    finally:
        trainers.stop_all()
        link.close()
    for rank in (2, 3):
        got = [line["digest"] for line in trainers.lines[rank]]
        assert got == [digest(b) for b in want[1]], rank
    # Steady running: from node 1's micro-batch `first` to its last (one step each).
    t0, t1 = trainers.lines[2][first]["t"], trainers.lines[2][-1]["t"]
    steps = n - 1 - first
    rx, tx = (link.at(t1) - link.at(t0)) / steps
    idle_rate = (np.array(idle.samples[-1][1:]) - idle.samples[0][1:]) / (
        idle.samples[-1][0] - idle.samples[0][0])
    idle_step = idle_rate.sum() * (t1 - t0) / steps
    least = float(np.mean(minimum[first:]))
    print(f"bytes across node 1's link per step: {rx:,.0f} in, {tx:,.0f} out; the "
          f"minimum {least:,.0f} (pieces of its DP group); idle link {idle_step:,.0f} a "
          f"step ({idle_rate.sum():,.0f} B/s); in / minimum {rx / least:.2f}, "
          f"(in + out - idle) / minimum {(rx + tx - idle_step) / least:.2f}")
    assert rx >= least  # the counters see the pieces
    assert rx / least < 2  # the two TP peers' pieces cross once
    assert (rx + tx - idle_step) / least < 3

