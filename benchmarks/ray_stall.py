"""How long a trainer waits when an actor of its Ray job dies.

One trainer (dp=1) pulls micro-batches from `braid.Loader` with `runtime.kind: ray`,
"training" --step-ms per step; at fixed micro-batches the job's actors are killed in turn
(`ray.kill(..., no_restart=False)`: Ray restarts them): with the default placement its
one host process (`JOB.planner`: planner, sources and constructor), with
`--source-actors 1` the planner, the source actor and the constructor apart. Prints, per role, the longest `next()` in the --window micro-batches after the
kill, and the median `next()` without kills, from one run. The stream itself is checked
against the embedded runtime by the tests (tests/test_ray_faults.py).

    .venv/bin/python benchmarks/ray_stall.py \
        [--kills 3] [--step-ms 200] [--window 16] [--dir out/ray_stall] [--shadow] \
        [--source-actors 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=3, help="kills per role")
    ap.add_argument("--source-actors", type=int, default=None,
                    help="runtime.source_actors (default: unset, one host process)")
    ap.add_argument("--step-ms", type=float, default=200)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--dir", default=os.path.join("out", "ray_stall"))
    ap.add_argument("--shadow", action="store_true",
                    help="runtime.shadow: hot-standby source actors")
    args = ap.parse_args()

    import ray
    import yaml

    import braid
    from braid import _core
    from braid.ray_runtime import job as jobs

    demo = _core.make_demo_dataset(os.path.abspath(args.dir), seed=1, seq_len=2048, dp=1,
                                   micro_batches=4, scale=1.0)
    with open(demo["config_path"]) as f:
        config = yaml.safe_load(f)
    base = os.path.dirname(demo["config_path"])
    for s in config["sources"]:
        s["path"] = os.path.join(base, s["path"])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, namespace="stall")
    config["runtime"] = {"kind": "ray", "namespace": "stall", "job": "stall",
                         "shadow": args.shadow}
    if args.source_actors is not None:
        config["runtime"]["source_actors"] = args.source_actors
    loader = braid.Loader(config, 0, 1)
    sleep = args.step_ms / 1000 / loader.micro_batches_per_step
    roles = (["planner"] if args.source_actors is None
             else ["planner", "sources.0", "constructor"])
    plan = {}
    at = 2 * args.window
    for k in range(args.kills):
        for role in roles:
            plan[at] = role
            at += args.window
    total = at + args.window
    waits, stalls = [], {r: [] for r in roles}
    it = iter(loader)
    last_kill = None
    for i in range(total):
        if i in plan:
            name = next(n for n in jobs.actor_names("stall", "stall")
                        if n.startswith(f"stall.{plan[i]}") and not n.endswith(".shadow"))
            ray.kill(ray.get_actor(name, namespace="stall"), no_restart=False)
            last_kill = (plan[i], i, [])
        t0 = time.perf_counter()
        next(it)
        dt = time.perf_counter() - t0
        if last_kill is not None and i < last_kill[1] + args.window:
            last_kill[2].append(dt)
            if i == last_kill[1] + args.window - 1:
                stalls[last_kill[0]].append(max(last_kill[2]))
                last_kill = None
        elif i >= args.window:
            waits.append(dt)
        time.sleep(sleep)
    failovers = sum(a.get("shadow_failovers", 0) for a in jobs.status("stall", "stall"))
    loader.close()
    ray.shutdown()
    out = {"median_next_s": statistics.median(waits),
           "max_next_after_kill_s": {r: max(v) for r, v in stalls.items()},
           "each_kill_s": stalls, "shadow_failovers": failovers}
    print(f"median next() without kills: {1000 * out['median_next_s']:.2f} ms")
    for r, v in stalls.items():
        print(f"{r:<12} longest next() after a kill: " +
              ", ".join(f"{x:.2f} s" for x in v))
    print(f"requests also sent to a shadow: {failovers}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
