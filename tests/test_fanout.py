"""benchmarks/fanout.py at a tiny size: its message counts add up, agree with a recount
from `braid plan`'s own output, and forwarding cuts the source actors' fan-out."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import braid_cli

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "fanout.py"
RANKS, PER_NODE, SOURCES, ACTORS, GROUPS, STEPS = 32, 4, 6, 3, (2, 3), 2


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    out = tmp_path_factory.mktemp("fanout")
    result = subprocess.run(
        [sys.executable, str(BENCHMARK), "--ranks", str(RANKS),
         "--ranks-per-node", str(PER_NODE), "--sources", f"{SOURCES}:{ACTORS}",
         "--groups", ",".join(map(str, GROUPS)), "--steps", str(STEPS),
         "--seq-len", "1024", "--micro-batches", "2", "--tokens-per-file", "100000",
         "--dir", str(out), "--json", str(out / "counts.json"), "--verify"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stderr
    (run,) = json.loads((out / "counts.json").read_text())["results"]
    return run, result.stdout


def test_counts_add_up(counted):
    run, stdout = counted
    nodes = RANKS // PER_NODE
    assert run["nodes"] == nodes and run["source_actors"] == ACTORS
    assert "direct/bucket" in stdout and f"fwd/{GROUPS[-1]}" in stdout
    # Every reply's counted size was checked against a real fetch.
    assert run["verified_replies"] > 0
    for scheme, steps in run["per_step"].items():
        assert len(steps) == STEPS
        relays = nodes if scheme.startswith("direct") else \
            math.ceil(nodes / int(scheme.split("/")[1]))
        for s in steps:
            assert s["planner"] == 2 * relays, scheme
            assert s["src_all"] == sum(s["per_source_actor"])
            assert s["src_max"] == max(s["per_source_actor"])
            assert s["node_max"] == max(s["per_node"])
            # A call has a node at one end (a planner or source actor at the other) or,
            # relay <-> member, at both ends.
            between_nodes = s["total"] - s["planner"] - s["src_all"]
            assert sum(s["per_node"]) == s["planner"] + s["src_all"] + 2 * between_nodes
            if scheme.startswith("direct"):
                assert between_nodes == 0 and s["total"] == sum(s["per_node"])
            else:  # one call per member that is not its group's relay
                assert between_nodes == 2 * (nodes - relays)
    # Each piece leaves its source actor once, whatever the scheme.
    piece_bytes = {tuple(s["src_bytes"] for s in steps)
                   for steps in run["per_step"].values()}
    assert len(piece_bytes) == 1 and min(next(iter(piece_bytes))) > 0


def test_forwarding_cuts_the_source_actors_fan_out(counted):
    run, _ = counted
    steps = run["per_step"]

    def total(scheme, key):
        return sum(s[key] for s in steps[scheme])

    assert total("direct/node", "src_all") < total("direct/bucket", "src_all")
    for g in GROUPS:
        fwd = f"fwd/{g}"
        assert total(fwd, "src_all") < total("direct/node", "src_all")
        assert total(fwd, "src_max") < total("direct/bucket", "src_max")
        assert total(fwd, "planner") < total("direct/node", "planner")
        assert max(s["peers"] for s in steps[fwd]) <= math.ceil(run["nodes"] / g)


def test_direct_counts_match_a_recount_from_the_cli_plan(counted):
    # `braid plan` prints the same steps as JSON; which source actors each bucket and
    # each node needs follows from the sources of its pieces.
    run, _ = counted
    result = braid_cli("plan", run["config"], "--steps", STEPS)
    assert result.returncode == 0, result.stderr
    plans = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(plans) == STEPS
    for step, plan in enumerate(plans):
        needs = {}  # bucket -> source actors with pieces in it
        for rank in plan["ranks"]:
            needs[rank["dp"]] = {int(d["src"][1:]) % ACTORS
                                 for mb in rank["micro_batches"] for d in mb["docs"]}
        assert sorted(needs) == list(range(RANKS))
        per_bucket = sum(len(a) for a in needs.values())
        assert run["per_step"]["direct/bucket"][step]["src_all"] == 2 * per_bucket
        node_sets = [set().union(*(needs[b] for b in buckets))
                     for buckets in run["node_buckets"]]
        assert run["per_step"]["direct/node"][step]["src_all"] == \
            2 * sum(len(a) for a in node_sets)
        for g in GROUPS:
            groups = [set().union(*node_sets[i:i + g])
                      for i in range(0, len(node_sets), g)]
            assert run["per_step"][f"fwd/{g}"][step]["src_all"] == \
                2 * sum(len(a) for a in groups)
