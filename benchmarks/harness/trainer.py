"""A simulated synchronous data-parallel trainer rank, as the harness (run.py) starts it.

One process per rank (a fresh interpreter that imports torch and braid, as a trainer
does), joined to the others by a gloo process group. Per step it pulls micro-batches from
its loader until it holds the rank's share of the step's tokens; after each one it
"computes" for the cost model's time of what it received (it sleeps, so the loaders keep
the CPUs), then waits at a barrier for the slowest rank: a step ends when the slowest
rank ends, as with an all-reduce of gradients.

A micro-batch's time is its cost (cost.py: the planner's cost model) times `scale`
seconds. In a layout of tp x pp groups (spec `tp`, `pp`; ranks in Megatron's order, tp
fastest, then dp, then pp) every rank of a DP group receives that group's micro-batches
and computes its share of them: the language part of the cost divided by tp * pp (each
rank holds 1/tp of a stage, each stage 1/pp of the layers), the vision part divided by
tp on the first stage only (the vision encoder runs there), so a step at a DP group's
cost takes each rank as long as a DP rank's step at dp = ranks.

Protocol with the harness (stdout JSON lines, stdin words): prints {"event": "ready"},
waits for "go", prints {"event": "step", ...} after each step on rank 0, then
{"event": "done", ...} with per-step figures, and exits after "exit".

    python -m harness.trainer '{"mode": "braid", "config": ..., "rank": 0, ...}'
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import List


def _emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main(spec: dict) -> int:
    import torch
    import torch.distributed as dist

    import braid  # noqa: F401  (a trainer imports it; the `none` mode loads nothing)
    from harness.cost import batch_cost, batch_tokens
    from harness.modes import MODES

    rank, world = spec["rank"], spec["ranks"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}",
                            rank=rank, world_size=world)
    mode = MODES[spec["mode"]]
    _emit({"event": "ready", "pid": os.getpid()})
    if sys.stdin.readline().strip() != "go":
        return 1
    attn, linear, vision = spec["attn"], spec["linear"], spec["vision"]
    scale = spec["scale"]
    tp, pp = int(spec.get("tp", 1)), int(spec.get("pp", 1))
    first_stage = rank // (world // pp) == 0
    per_step = spec["tokens_per_rank_step"]
    dist.barrier()
    start = time.monotonic()
    it, close = mode.start(spec["config"], rank, world, _Args(spec))
    steps: List[dict] = []
    tokens = 0
    for step in range(spec["steps"]):
        if it is None:
            dist.barrier()
            steps.append({"cost": 0.0, "wait_s": 0.0, "end_s": time.monotonic() - start})
            if rank == 0:
                _emit({"event": "step", "step": step})
            continue
        cost = wait = 0.0
        got = 0
        while got < per_step:
            t = time.monotonic()
            batch = next(it)
            wait += time.monotonic() - t
            c = batch_cost(batch, attn, linear, vision)
            c_vision = batch_cost(batch, 0.0, 0.0, vision) if vision else 0.0
            n = batch_tokens(batch)
            got += n
            cost += c
            del batch
            compute = (c - c_vision) / (tp * pp) + (c_vision / tp if first_stage else 0.0)
            time.sleep(compute * scale)  # the simulated forward and backward
        tokens += got
        t = time.monotonic()
        dist.barrier()  # the gradients' all-reduce: the slowest rank ends the step
        steps.append({"cost": cost, "wait_s": wait, "barrier_s": time.monotonic() - t,
                      "tokens": got, "end_s": time.monotonic() - start})
        if rank == 0:
            _emit({"event": "step", "step": step})
    elapsed = time.monotonic() - start
    _emit({"event": "done", "rank": rank, "tokens": tokens, "elapsed_s": elapsed,
           "steps": steps})
    sys.stdin.readline()  # "exit": the harness has its samples
    close()
    dist.destroy_process_group()
    return 0


class _Args:
    """The harness options a mode's start() reads."""

    def __init__(self, spec: dict):
        self.workers = spec["workers"]
        self.shuffle_buffer = spec["shuffle_buffer"]
        self.tp = int(spec.get("tp", 1))
        self.pp = int(spec.get("pp", 1))


if __name__ == "__main__":
    torch_threads = os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(json.loads(sys.argv[1])))
