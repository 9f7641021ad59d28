"""``braid run --runtime ray``: the whole job on Ray, every DP rank (bucket) simulated
in this process as a trainer rank would receive it, measured like the local run."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional

from braid import _core
from braid.ray_runtime import job as jobs
from braid.ray_runtime._ray import ray
from braid.ray_runtime.client import RayStream


def serving_over(actors: list) -> Dict[str, Dict[str, int]]:
    """Per source, what its piece fetches cost summed over every process that serves it
    (each process's `source_serving`, service/source_service.h ServeProfile)."""
    out: Dict[str, Dict[str, Any]] = {}
    for a in actors:
        for name, figures in (a.get("source_serving") or {}).items():
            total = out.setdefault(name, {})
            for key, value in figures.items():
                total[key] = total.get(key, 0) + value
    return out


def run_job(config: "_core.Config", steps: int,
            progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
    """Runs ``steps`` steps; returns ``_core.run_job``'s summary plus ``runtime`` and
    ``actors`` (each role's status at the end, with the actor that hosts it). Starts a local Ray instance when
    ``runtime.address`` has none."""
    if steps <= 0:
        raise _core.ConfigError("--steps: must be > 0")
    state = _core.initial_state_json(config)
    t0 = time.monotonic()
    streams = [RayStream(config, b, (0, 0, 0), True, state, start_local=True)
               for b in range(int(config.topology["buckets"]))]
    job = streams[0].job
    planner = ray.get_actor(f"{job.name}.planner", namespace=job.namespace)
    timeout_s = float(config.runtime["timeout_s"])
    try:
        recorder = _core.RunRecorder(config)
        last = t0
        for step in range(steps):
            tokens = micro_batches = 0
            for _ in range(config.micro_batches_per_rank_at(step)):
                for stream in streams:
                    tokens += stream.next()["input_ids"].size
                    micro_batches += 1
            now = time.monotonic()
            plan = ray.get(planner.plan.remote(step, timeout_s), timeout=timeout_s)
            recorder.add_step(plan["figures"], tokens, micro_batches, now - last, now - t0)
            last = now
            if progress is not None:
                progress(recorder.summary(0))
        actors = jobs.status(job.name, job.namespace)
        # One entry per role: a process hosting several counts once.
        rss = {a["name"]: a.get("rss_bytes", 0) for a in actors}
        summary = recorder.summary(sum(rss.values()))
        summary["runtime"] = "ray"
        summary["job"] = job.name
        summary["actors"] = actors
        # What reading each source cost the planner's streams (source/profile.h).
        for a in actors:
            if a.get("role") == "planner" and "source_profile" in a:
                summary["source_profile"] = a["source_profile"]
            if a.get("role") == "planner" and "source_allocation" in a:
                summary["source_allocation"] = a["source_allocation"]
            if a.get("role") == "planner" and "source_timeline" in a:
                summary["source_timeline"] = a["source_timeline"]
        summary["source_serving"] = serving_over(actors)
        return summary
    finally:
        for stream in streams:
            stream.close()
