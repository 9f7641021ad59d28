"""The benchmark workloads (benchmarks/workloads.py) generate their data and configs, and
`braid run` runs each of them as a user would, on the embedded runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import braid_cli

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["longtail", "curriculum", "phases", "heavy_vlm"]


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("workloads")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "workloads.py"),
                           "--dir", str(out), "--tokens", "150000", "--dp", "2",
                           "--schedule-steps", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    paths = [l for l in done.stdout.splitlines() if l.endswith(".json")]
    return {Path(p).stem: Path(p) for p in paths}


@pytest.mark.parametrize("name", NAMES)
def test_each_workload_runs(configs, name):
    config = json.loads(configs[name].read_text())
    run = braid_cli("run", configs[name], "--steps", "4")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "imbalance" in run.stdout
    for source in config["sources"]:  # every source is in the summary's shares
        assert any(l.strip().startswith(source["name"] + " ") for l in run.stdout.splitlines()), \
            (source["name"], run.stdout[-2000:])
    plan = braid_cli("plan", configs[name], "--steps", "4")
    assert plan.returncode == 0, plan.stderr[-3000:]
    steps = [json.loads(l) for l in plan.stdout.splitlines() if l.startswith("{")]
    if name == "phases":  # the short phase (2 steps here), then the long context
        assert [s["seq_len"] for s in steps] == [2048, 2048, 8192, 8192]
    if name == "curriculum":  # the code share rises with the schedule
        share = [s["source_tokens"]["code"] / sum(s["source_tokens"].values())
                 for s in steps]
        assert share[0] < 0.2 and share[3] > 0.4, share
