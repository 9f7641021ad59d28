"""Delivery on the Ray runtime against the embedded runtime: how long a trainer waits.

R trainer processes (spawned, each importing torch and braid as a trainer does) pull
micro-batches from `braid.Loader` and "train" on each for --step-ms / micro-batches per
step (a sleep). Per runtime it prints the fraction of wall time the trainers spent
waiting in next() after the first step (start-up excluded), and the mean and p90
latency of next(). The ratios ray / embedded of the mean latency are printed last (`ray`:
node delivery, the default; `ray-store`: runtime.delivery object_store); all run in this
one invocation on the same data (braid's demo dataset).

    .venv/bin/python benchmarks/ray_delivery.py \
        [--ranks 2] [--steps 20] [--step-ms 200] [--seq-len 2048] [--micro-batches 4] \
        [--steps-in-flight 2] [--dir out/ray_delivery]

The Ray runtime joins a local Ray instance this script starts (no dashboard).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time


def trainer(config: dict, rank: int, world: int, steps: int, step_s: float, out) -> None:
    import sys; sys.setswitchinterval(float(os.environ.get("SWITCH", "0.005")))
    import braid  # noqa: F401 - a trainer imports braid (and torch) first

    loader = braid.Loader(config, rank, world)
    per_step = loader.micro_batches_per_step
    sleep = step_s / per_step
    waits, start = [], time.perf_counter()
    it = iter(loader)
    first_step_end = None
    for i in range(steps * per_step):
        t0 = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t0)
        if i + 1 == per_step:
            first_step_end = time.perf_counter()
        time.sleep(sleep)
    end = time.perf_counter()
    loader.close()
    steady = waits[per_step:]
    out.put({"rank": rank, "waits": steady, "wall": end - first_step_end,
             "total": end - start})


def run(config: dict, args) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=trainer, args=(config, r, args.ranks, args.steps,
                                               args.step_ms / 1000, q))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    results = [q.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    waits = sorted(w for r in results for w in r["waits"])
    wall = sum(r["wall"] for r in results)
    return {"wait_fraction": sum(waits) / wall,
            "mean_ms": 1000 * statistics.fmean(waits),
            "p90_ms": 1000 * waits[int(0.9 * (len(waits) - 1))],
            "micro_batches": len(waits)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-ms", type=float, default=200)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps-in-flight", type=int, default=2)
    ap.add_argument("--dir", default=os.path.join("out", "ray_delivery"))
    args = ap.parse_args()

    import ray
    import yaml

    from braid import _core

    demo = _core.make_demo_dataset(os.path.abspath(args.dir), seed=1, seq_len=args.seq_len,
                                   dp=args.ranks, micro_batches=args.micro_batches,
                                   scale=1.0)
    with open(demo["config_path"]) as f:
        config = yaml.safe_load(f)
    base = os.path.dirname(demo["config_path"])
    for s in config["sources"]:
        s["path"] = os.path.join(base, s["path"]) if not os.path.isabs(s["path"]) else s["path"]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    address = ray.get_runtime_context().gcs_address
    results = {"embedded": run(config, args)}
    ray_config = dict(config, runtime={"kind": "ray", "address": address,
                                       "steps_in_flight": args.steps_in_flight})
    results["ray"] = run(ray_config, args)  # runtime.delivery: node, the default
    store_config = dict(config, runtime={**ray_config["runtime"],
                                         "delivery": "object_store"})
    results["ray-store"] = run(store_config, args)
    ray.shutdown()
    print(f"{args.ranks} trainer ranks, {args.steps} steps of {args.step_ms:.0f} ms, "
          f"{args.micro_batches} micro-batches of {args.seq_len} tokens per rank per step")
    print(f"{'runtime':<10} {'wait %':>8} {'mean ms':>9} {'p90 ms':>8}")
    for name, r in results.items():
        print(f"{name:<10} {100 * r['wait_fraction']:>7.2f}% {r['mean_ms']:>9.2f} "
              f"{r['p90_ms']:>8.2f}")
    ratios = {name: results[name]["mean_ms"] / max(results["embedded"]["mean_ms"], 1e-9)
              for name in ("ray", "ray-store")}
    for name, ratio in ratios.items():
        print(f"ratio {name} / embedded (mean next() latency): {ratio:.2f}")
    print(json.dumps({**results, "latency_ratio": ratios["ray"],
                      "latency_ratio_store": ratios["ray-store"]}))


if __name__ == "__main__":
    main()
