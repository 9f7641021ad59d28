"""docs/distributed.md's quick start, run line by line as written on two fresh nodes in
namespaces of their own (tests/netns_cluster.py, `bare`: nothing running in them).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest

pytest.importorskip("ray")

import braid  # noqa: E402
from conftest import take_batches  # noqa: E402
from netns_cluster import NamespaceCluster  # noqa: E402
from test_netns_cluster import digest, tp_config  # noqa: E402


QUICK_TRAIN = textwrap.dedent("""
    import hashlib, json, os, sys, time
    import braid

    n = int(sys.argv[1])
    loader = braid.Loader("job.yaml")  # RANK and WORLD_SIZE from torchrun
    out = open(f"digests-{os.environ['RANK']}.jsonl", "w")  # ranks share stdout
    for i, batch in enumerate(loader):
        digest = hashlib.sha256()
        for name in sorted(batch):
            digest.update(name.encode() + batch[name].numpy().tobytes())
        out.write(json.dumps({"i": i, "digest": digest.hexdigest()}) + "\\n")
        out.flush()
        if i + 1 == n:
            break
        time.sleep(0.05)
    while not os.path.exists("status-done"):  # the job stays up for `braid status`
        time.sleep(0.1)
    loader.close()
""")


def excerpt(lines: List[str]) -> str:
    """What a failed torchrun printed: from a little before the first line that reads as
    the cause (a native check or stack, a Python traceback) on, and the tail. A native
    stack alone, as the tail often is, does not say what failed."""
    text = "".join(lines)
    for markers in (("Check failed", "StackTrace", "*** SIG", "F0", "F1"),
                    ("Traceback", "Error")):
        found = [i for i in (text.find(m) for m in markers) if i >= 0]
        if found:
            start = max(0, min(found) - 1500)
            return f"{text[start:start + 5000]}\n...\n{text[-2000:]}"
    return text[-3000:]


def quick_start() -> List[tuple]:
    """docs/distributed.md's quick start: (command, where) per line of its bash block."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "distributed.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        command, _, where = line.partition("#")
        out.append((command.strip(), where.strip()))
    return out


def test_the_quick_start_runs_as_written_on_two_fresh_nodes(small_dataset, tmp_path):
    """docs/distributed.md's quick start, line by line, on two nodes in namespaces of their
    own with nothing running and a home each (no Ray token, as fresh hosts): `ray start`
    on each, torchrun on each with train.py and job.yaml as the docs say (2 ranks a node
    for 8), `braid status` while the job runs. Every rank receives the embedded
    runtime's tensors; the status names the job's planner and node 1's constructor."""
    why = NamespaceCluster.available()
    if why:
        pytest.skip(f"no namespace cluster here: {why}")
    config = tp_config(small_dataset)  # dp=2 x tp=2: a DP group's TP peers on a node
    n, world = 8, 4
    want = take_batches([braid.Loader(config, r, world) for r in range(world)], n)
    job = copy.deepcopy(config)
    job["runtime"] = {"kind": "ray"}
    (tmp_path / "job.yaml").write_text(json.dumps(job))  # JSON is YAML
    (tmp_path / "train.py").write_text(QUICK_TRAIN)
    lines = quick_start()
    assert [where.split(";")[0].split(":")[0] for _, where in lines] == [
        "on every node", "on the first node", "on every other node", "on every node",
        "on any node"], lines
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # `ray start` writes its address to /tmp/ray/ray_current_cluster, which a later
    # ray.init() on the machine would join: it must land in the node's own /tmp/ray.
    current = Path("/tmp/ray/ray_current_cluster")
    before = current.read_text() if current.exists() else None
    with NamespaceCluster(2, bare=True) as nodes:
        homes = [tmp_path / f"home{node}" for node in range(2)]
        for home in homes:
            home.mkdir()

        def shell(command: str) -> List[str]:
            command = command.replace("HEAD", nodes.address(0))
            command = command.replace("--nproc_per_node 8", "--nproc_per_node 2")
            command = command.replace("train.py", f"train.py {n}")
            return ["sh", "-c", f"cd {tmp_path} && {command}"]  # nsenter starts at /

        def run(node: int, command: str) -> str:
            out = subprocess.run(nodes.enter(node) + shell(command), capture_output=True,
                                 text=True, timeout=180, cwd=tmp_path,
                                 env={**env, "HOME": str(homes[node])})
            assert out.returncode == 0, (node, command, out.stdout[-2000:],
                                         out.stderr[-3000:])
            return out.stdout

        (pip, _), (head, _), (join, _), (train, _), (status, _) = lines
        assert pip.startswith("pip install")  # the package is this checkout's, installed
        run(0, head)
        run(1, join)
        procs = [subprocess.Popen(nodes.enter(node) + shell(train), cwd=tmp_path,
                                  env={**env, "HOME": str(homes[node])}, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for node in range(2)]
        errors: List[List[str]] = [[], []]
        readers = [threading.Thread(target=lambda f=f, o=o: o.extend(f), daemon=True)
                   for p, e in zip(procs, errors) for f, o in ((p.stdout, []), (p.stderr, e))]
        for reader in readers:
            reader.start()

        def digests() -> Dict[int, List[str]]:
            got = {}
            for rank in range(world):
                path = tmp_path / f"digests-{rank}.jsonl"
                rows = path.read_text().splitlines() if path.exists() else []
                got[rank] = [json.loads(row)["digest"] for row in rows
                             if row.endswith("}")]  # a row being written is not yet one
            return got

        try:
            deadline = time.monotonic() + 240
            while sum(len(d) for d in digests().values()) < world * n:
                for node, proc in enumerate(procs):
                    if proc.poll() is not None:
                        time.sleep(1)  # the readers drain
                        pytest.fail(f"torchrun on node {node} exited {proc.returncode}: "
                                    f"{excerpt(errors[node])}")
                assert time.monotonic() < deadline, (digests(), [
                    excerpt(e) for e in errors])
                time.sleep(0.2)
            shown = run(0, status)
            (tmp_path / "status-done").touch()
            for node, proc in enumerate(procs):
                proc.wait(timeout=120)
                time.sleep(0.5)
                assert proc.returncode == 0, excerpt(errors[node])
        except BaseException:  # pytest shows a failed test's stdout
            for node in range(2):
                print(nodes.ray_logs(node))
            raise
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for reader in readers:
            reader.join(5)
    got = digests()
    for rank in range(world):
        assert got.get(rank) == [digest(b) for b in want[rank]], rank
    assert ".planner" in shown and ".constructor." in shown, shown
    assert (current.read_text() if current.exists() else None) == before
