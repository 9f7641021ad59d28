"""Steady running for a long time: memory, threads and open files of every process.

Trainer ranks (--ranks, each its own process, as torchrun starts them) pull micro-batches
from `braid.Loader` and "train" --step-ms per micro-batch, for --minutes, on the longtail
workload's 16 sources (benchmarks/workloads.py) written small (--tokens per source), so
every source wraps its epoch many times; the first source's weight changes at
--schedule-steps (a schedule change). With --runtime ray the job runs on a local Ray
instance and one of its actors is killed every --kill-every-s seconds (Ray restarts it).

Every --sample-s seconds each process of the job is sampled from /proc: the trainers and,
on Ray, every actor process of the job (`braid status`'s pids): RSS, threads, open
descriptors. Printed at the end, per process: the RSS slope over the last half of the
run (least squares, MB per 10 minutes), and threads and descriptors at the middle and the
end. The samples go to --out (JSON).

    .venv/bin/python benchmarks/soak.py [--runtime local|ray] [--minutes 60] [--ranks 2]
        [--step-ms 20] [--tokens 200000] [--schedule-steps 400] [--kill-every-s 120]
        [--sample-s 10] [--dir out/soak] [--out out/soak/soak-RUNTIME.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import textwrap
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]

TRAINER = textwrap.dedent("""
    import json, sys, time
    import braid

    config, rank, world, step_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    loader = braid.Loader(json.load(open(config)), rank=rank, world_size=world)
    taken, last = 0, time.monotonic()
    for batch in loader:
        taken += 1
        time.sleep(step_s)
        if time.monotonic() - last > 5:
            print(json.dumps({"rank": rank, "taken": taken,
                              "step": loader.state_dict()["step"]}), flush=True)
            last = time.monotonic()
""")


def proc_sample(pid: int) -> Dict[str, float]:
    """RSS (bytes), threads and open descriptors of `pid`, or {} once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {}
    if "VmRSS" not in fields:  # a zombie: killed, not reaped yet
        return {}
    return {"rss": int(fields["VmRSS"].split()[0]) * 1024,
            "threads": int(fields["Threads"]), "fds": fds}


def slope_mb_per_10min(points: List[tuple]) -> float:
    """Least-squares slope of (seconds, bytes) points, in MB per 10 minutes."""
    n = len(points)
    if n < 2:
        return float("nan")
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return float("nan")
    cov = sum((t - mt) * (v - mv) for t, v in points)
    return cov / var * 600 / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=["local", "ray"], default="local")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=20)
    ap.add_argument("--tokens", type=int, default=200_000, help="per source")
    ap.add_argument("--schedule-steps", type=int, default=400)
    ap.add_argument("--kill-every-s", type=float, default=120, help="(ray)")
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--dir", default=os.path.join("out", "soak"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out_path = args.out or os.path.join(args.dir, f"soak-{args.runtime}.json")
    os.makedirs(args.dir, exist_ok=True)

    sys.path.insert(0, HERE)  # workloads.py and what it loads beside it
    import workloads
    made = workloads.make("longtail", argparse.Namespace(
        dir=args.dir, tokens=args.tokens, dp=args.ranks, schedule_steps=args.schedule_steps))
    with open(made) as f:
        config = json.load(f)
    first = config["sources"][0]
    first["weight"] = {"schedule": [[0, first["weight"]],
                                    [args.schedule_steps, first["weight"] / 4]]}
    ray = None
    if args.runtime == "ray":
        import ray
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 namespace="braid-soak", configure_logging=False)
        config["runtime"] = {"kind": "ray", "namespace": "braid-soak", "job": "soak",
                             "address": ray.get_runtime_context().gcs_address,
                             "timeout_s": 300}
    job_path = os.path.join(args.dir, f"soak-{args.runtime}.job.json")
    with open(job_path, "w") as f:
        json.dump(config, f)
    trainer_path = os.path.join(args.dir, "soak_trainer.py")
    with open(trainer_path, "w") as f:
        f.write(TRAINER)
    logs = [open(os.path.join(args.dir, f"trainer-{r}.log"), "w") for r in range(args.ranks)]
    trainers = [subprocess.Popen([sys.executable, trainer_path, job_path, str(r),
                                  str(args.ranks), str(args.step_ms / 1000)],
                                 stdout=logs[r], stderr=subprocess.STDOUT)
                for r in range(args.ranks)]
    samples: Dict[str, List[dict]] = {}
    kills: List[dict] = []
    rng = random.Random(7)
    t0 = time.monotonic()
    next_kill = t0 + args.kill_every_s
    end = t0 + args.minutes * 60
    try:
        while time.monotonic() < end:
            now = time.monotonic() - t0
            pids = {f"trainer-{r}": p.pid for r, p in enumerate(trainers)}
            if ray is not None:
                from braid.ray_runtime import registry
                for role in registry.status("soak", "braid-soak"):
                    if "pid" in role:
                        pids[f"{role['name']}"] = role["pid"]
                if time.monotonic() >= next_kill:
                    names = registry.actor_names("soak", "braid-soak")
                    if names:
                        victim = rng.choice(names)
                        ray.kill(ray.get_actor(victim, namespace="braid-soak"),
                                 no_restart=False)
                        kills.append({"t": now, "actor": victim})
                    next_kill += args.kill_every_s
            for name, pid in pids.items():
                got = proc_sample(pid)
                if got:
                    samples.setdefault(name, []).append({"t": now, "pid": pid, **got})
            for r, p in enumerate(trainers):
                if p.poll() is not None:
                    raise SystemExit(f"trainer {r} exited with {p.returncode}: see "
                                     f"{logs[r].name}")
            time.sleep(args.sample_s)
    finally:
        for p in trainers:
            p.terminate()
        for p in trainers:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        if ray is not None:
            from braid.ray_runtime import registry
            registry.stop("soak", "braid-soak")
            ray.shutdown()
    half = args.minutes * 60 / 2
    report = {"runtime": args.runtime, "minutes": args.minutes, "ranks": args.ranks,
              "kills": kills, "processes": {}}
    print(f"soak: {args.runtime}, {args.minutes:g} min, {args.ranks} ranks, "
          f"{len(kills)} actor kills")
    print(f"{'process':<28} {'RSS end MB':>10} {'slope MB/10min':>15} {'threads':>9} "
          f"{'fds':>9}")
    for name, rows in sorted(samples.items()):
        # One process: an actor restarted by a kill is a new pid; its own samples count.
        pid = rows[-1]["pid"]
        own = [r for r in rows if r["pid"] == pid]
        late = [r for r in own if r["t"] >= half]
        mid = late[0] if late else own[0]
        slope = slope_mb_per_10min([(r["t"], r["rss"]) for r in late])
        report["processes"][name] = {
            "rss_end": own[-1]["rss"], "slope_mb_per_10min": slope,
            "threads": [mid["threads"], own[-1]["threads"]],
            "fds": [mid["fds"], own[-1]["fds"]], "since_s": own[0]["t"], "samples": rows}
        print(f"{name:<28} {own[-1]['rss'] / 1e6:>10.0f} {slope:>15.2f} "
              f"{mid['threads']:>4}->{own[-1]['threads']:<4} {mid['fds']:>4}->{own[-1]['fds']:<4}")
    with open(out_path, "w") as f:
        json.dump(report, f)
    print(f"samples: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
