"""`benchmarks/bench.py CONFIG --ranks R`: Braid against the per-rank baseline and peers,
on the same mix, in one run.

For each loader (Braid on the chosen runtime, then each of `--against`), R simulated
trainer processes (harness/trainer.py) run `--steps` synchronous data-parallel steps
whose time per rank is the cost model of what the rank received. Reported per loader:

- memory: the peak of the summed PSS of every process the loader adds (trainers, their
  forked workers, daemons and actors), less the peak of R trainers that load nothing
  (the `none` run: the same imports and process group);
- tokens/s delivered, the trainers' wait for data (share of their run time);
- DP imbalance per step: max / mean over ranks of the cost each received;
- end-to-end steps/s after `--warmup` steps (a step ends when the slowest rank ends),
  and the steps/s the costs alone allow (no waiting for data);
- at `--imbalance-dp` ranks (default 64) and `--imbalance-micro-batches` micro-batches
  per rank, the imbalance per step without running trainers: Braid's planner and the
  baseline's streams (read and tokenized, images sized from their headers, one process).

The time unit: `--step-ms` is the simulated compute of a rank's step at the mean cost
Braid's planner assigns (the same seconds per cost unit for every loader).

Writes DIR/bench.json and DIR/{imbalance,memory,throughput}.png; prints a table and a
progress bar (stderr).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from harness.cost import batch_cost, cost_model
from harness.modes import MODES, mosaic_unavailable
from harness.overrides import apply_overrides, parse_set
from harness.procs import free_port, python_env, sample

PEERS = ("baseline", "litdata", "energon", "mosaic")


class BenchError(RuntimeError):
    """A loader under test failed in its trainers (their own error is on stderr above)."""


# ----------------------------------------------------------------------------------------
# Configs


def _rebase(config: dict, base_dir: str) -> dict:
    """The config with every relative path made absolute (it is rewritten elsewhere)."""
    out = copy.deepcopy(config)

    def fix(d: dict, key: str) -> None:
        value = d.get(key)
        if isinstance(value, str) and "://" not in value and not os.path.isabs(value):
            d[key] = os.path.normpath(os.path.join(base_dir, value))

    for holder in [out] + out.get("sources", []):
        fix(holder, "path")
        if isinstance(holder.get("tokenizer"), dict):
            fix(holder["tokenizer"], "model")
            fix(holder["tokenizer"], "file")
    return out


def with_ranks(config: dict, ranks: int, micro_batches: Optional[int] = None,
               tp: int = 1, pp: int = 1) -> dict:
    """The config at `ranks` trainer ranks in groups of `tp` x `pp` (dp = ranks / (tp *
    pp)), on the embedded runtime. The global batch is the one of `ranks` DP ranks each
    receiving the config's micro-batches per step (or `micro_batches` at batch.seq_len),
    whatever the layout: the same job on the same ranks, so each DP group of a tp x pp
    layout receives tp * pp times a DP rank's micro-batches."""
    if tp < 1 or pp < 1 or ranks % (tp * pp):
        raise ValueError(f"--ranks {ranks} is not a multiple of --tp {tp} x --pp {pp}")
    out = copy.deepcopy(config)
    batch = out["batch"]
    dp = int(out.get("topology", {}).get("dp", 1))
    mbs = int(batch.get("micro_batch_size", 1))
    seq_len = int(batch["seq_len"])
    per_rank = int(batch.get("global_tokens", dp * mbs * seq_len)) // dp
    if micro_batches:
        per_rank = micro_batches * mbs * seq_len
    topology = out.setdefault("topology", {})
    topology.update(dp=ranks // (tp * pp), tp=tp, pp=pp)
    batch["global_tokens"] = per_rank * ranks
    # The config's runtime settings stay (threads, memory budget...); which runtime runs
    # is the bench's choice (--runtime), not the config's.
    runtime = {k: v for k, v in out.get("runtime", {}).items() if k != "kind"}
    out.pop("runtime", None)
    if runtime:
        out["runtime"] = runtime
    return out


def cannot_express(name: str, config: dict) -> Optional[str]:
    """Why loader `name` cannot run this mix (None: it can).

    litdata, energon and mosaic read the token lists their converters wrote
    (harness/peers.py: pre-tokenized sources only), with one constant weight per
    source (LitData's `CombinedStreamingDataset` weights, Energon's metadataset `blend`
    weights, Streaming's `Stream` proportions: floats fixed for the run) and one seq_len
    for the whole run (no phases). The baseline reads token, text and image-caption
    sources with a SentencePiece tokenizer (harness/baseline.py)."""
    if name == "baseline":
        from harness import baseline

        try:
            baseline.sources_from_config(config)
            baseline.plan_from_config(config)
            tokenizer = config.get("tokenizer", {}).get("type", "sentencepiece")
            if tokenizer != "sentencepiece" and any("tokens_column" not in s
                                                    for s in config["sources"]):
                return "tokenizer.type: the baseline tokenizes with sentencepiece only"
        except (ValueError, FileNotFoundError) as e:
            return str(e)
        except KeyError as e:
            return f"the baseline needs the key {e}"
        return None
    if name not in ("litdata", "energon", "mosaic"):
        return None
    topology = config.get("topology", {})
    if int(topology.get("tp", 1)) * int(topology.get("pp", 1)) > 1:
        return f"--tp/--pp: {name} runs data-parallel ranks only here"
    for i, s in enumerate(config["sources"]):
        if "tokens_column" not in s:
            return f"sources[{i}]: {name} reads pre-tokenized token lists only"
        if not isinstance(s.get("weight", 1.0), (int, float)):
            return f"sources[{i}].weight: {name} takes constant weights only"
    if config.get("phases"):
        return f"phases: {name} has one sequence length and one mix"
    return None


def _write(path: str, config: dict) -> str:
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    return path


# ----------------------------------------------------------------------------------------
# Planner figures (no trainers)


def braid_plan(config: dict, steps: int) -> List[List[float]]:
    """Per step, the cost of each rank as Braid's planner assigns it."""
    from braid import _core

    out: List[List[float]] = []
    parsed = _core.parse_config(json.dumps(config), os.getcwd())
    _core.plan_job(parsed, steps, "",
                   lambda line: out.append([r["cost"] for r in json.loads(line)["ranks"]]))
    return out


def baseline_costs(config: dict, ranks: int, steps: int, workers: int,
                   shuffle_buffer: int, progress=None) -> List[List[float]]:
    """Per step, the cost each of `ranks` baseline ranks receives (their DataLoaders'
    streams replayed in this process from metadata: the same documents, no image
    decoded)."""
    from harness.baseline import BaselineDataset

    model = cost_model(config)
    costs = [[0.0] * ranks for _ in range(steps)]
    for rank in range(ranks):
        data = BaselineDataset.from_braid_config(config, rank=rank, world_size=ranks,
                                                 shuffle_buffer=shuffle_buffer,
                                                 metadata=True)
        streams = [data.worker_stream(w, workers) for w in range(workers)]
        item = 0
        for step in range(steps):
            for _ in range(data.plan.micro_batches_at(step)):
                batch = next(streams[item % workers])  # DataLoader's round robin
                item += 1
                costs[step][rank] += batch_cost(batch, **model)
        del streams
        if progress is not None:
            progress.update(1)
    return costs


def imbalance(costs: List[List[float]]) -> List[float]:
    return [max(c) / statistics.fmean(c) if statistics.fmean(c) > 0 else 1.0
            for c in costs]


# ----------------------------------------------------------------------------------------
# Trainer runs


def run_processes(label: str, cmds: List[List[str]], extra_pids, timeout: float,
                  sample_ms: float, progress=None, before_go=None,
                  env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Runs one trainer process per command through the harness protocol (each prints
    {"event": "ready"}, waits for "go" on stdin, may print {"event": "step"}, prints
    {"event": "done", ...} and exits after "exit"), sampling the memory of the trainers,
    their descendants and `extra_pids()` every `sample_ms` from "go" until every trainer
    is done. `before_go(pids)` runs once all are ready; `env` adds to their environment
    (python_env: they find the harness).
    Returns the samples ("peak": the largest), the done events in rank order and the wall
    time from "go". A trainer that exits early or a run past `timeout` seconds raises
    BenchError naming `label`."""
    env = python_env(dict(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                          PYTHONUNBUFFERED="1", **(env or {})))
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env) for cmd in cmds]
    deadline = time.monotonic() + timeout
    events: "queue.Queue[tuple]" = queue.Queue()

    def read(i: int, p: subprocess.Popen) -> None:
        # Blocking reads in a thread of its own (select on a buffered pipe misses lines
        # already in the buffer); EOF is an event too.
        for line in p.stdout:
            if line.startswith("{"):
                events.put((i, json.loads(line)))
        events.put((i, None))

    def next_event(wait: Optional[float] = None) -> tuple:
        """The next event within `wait` seconds (queue.Empty) and the deadline."""
        left = deadline - time.monotonic()
        late = BenchError(f"{label}: the trainers did not finish in {timeout:g} s "
                          "(--timeout)")
        if left <= 0:
            raise late
        try:
            i, event = events.get(timeout=left if wait is None else min(wait, left))
        except queue.Empty:
            if wait is None or wait >= left:
                raise late from None
            raise
        if event is None:
            raise BenchError(f"{label}: the trainer of rank {i} exited with "
                             f"{procs[i].wait()} (its error is above)")
        return i, event

    def send(word: str) -> None:
        for p in procs:
            p.stdin.write(word + "\n")
            p.stdin.flush()

    try:
        for i, p in enumerate(procs):
            threading.Thread(target=read, args=(i, p), daemon=True).start()
        for _ in procs:
            i, event = next_event()
            if event["event"] != "ready":
                raise BenchError(f"{label}: rank {i} did not start: {event}")
        pids = [p.pid for p in procs]
        if before_go is not None:
            before_go(pids)
        sample_s = sample_ms / 1000.0
        send("go")
        start = time.monotonic()
        samples = [sample(pids, extra_pids())]
        reports: List[Optional[dict]] = [None] * len(procs)
        last = time.monotonic()
        while any(r is None for r in reports):
            if time.monotonic() - last >= sample_s:
                samples.append(sample(pids, extra_pids()))
                last = time.monotonic()
            try:
                i, event = next_event(max(0.0, sample_s - (time.monotonic() - last)))
            except queue.Empty:
                continue
            if event["event"] == "step":
                if progress is not None:
                    progress.update(1)
            elif event["event"] == "done":
                reports[i] = event
        for _ in range(2):  # every loader still alive after its last micro-batch
            samples.append(sample(pids, extra_pids()))
            time.sleep(sample_s)
        wall = time.monotonic() - start
        send("exit")
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                raise BenchError(f"{label}: trainer {p.pid} exited with {p.returncode} "
                                 "(its error is above)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"peak": max(samples, key=lambda s: s["total"]), "samples": len(samples),
            "reports": reports, "wall_s": wall}


def run_trainers(mode_name: str, config_path: str, args, spec: dict,
                 progress=None, python: Optional[str] = None) -> Dict[str, Any]:
    """R simulated trainers (harness/trainer.py) in one mode, under the mode's
    interpreter (or `python`: the `none` run of another mode's)."""
    mode = MODES[mode_name]
    port = free_port()
    python = python or mode.python(args)
    cmds = [[python, "-m", "harness.trainer",
             json.dumps(dict(spec, mode=mode_name, config=config_path, rank=r, port=port))]
            for r in range(args.ranks)]
    label = mode_name if mode_name != "none" else "none (the trainers that load nothing)"
    if python != sys.executable:
        label += f" under {python}"
    # The rendezvous as torchrun hands it to every rank (a loader may key what the ranks
    # of one node share by it: docs/parallelism.md, "Peers on a node").
    env = dict(mode.env(mode.state) or {}, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return run_processes(label, cmds, lambda: mode.extra_pids(mode.state), args.timeout,
                         args.sample_ms, progress, env=env)


def summarize(run: dict, none_peak: float, warmup: int, scale: float,
              group: int = 1) -> Dict[str, Any]:
    """One loader's figures from its run (`scale`: seconds per cost unit; `group`: tp *
    pp, the ranks that share a DP group's compute, trainer.py)."""
    reports = run["reports"]
    steps = len(reports[0]["steps"])
    per_step_costs = [[r["steps"][k]["cost"] for r in reports] for k in range(steps)]
    ends = reports[0]["steps"]
    span = ends[-1]["end_s"] - ends[warmup - 1]["end_s"] if warmup else ends[-1]["end_s"]
    # Each rank computes 1/group of its DP group's cost (with pp > 1 the vision term is
    # the first stage's alone, trainer.py: there this bound is approximate).
    compute_s = scale * sum(max(c) for c in per_step_costs[warmup:]) / group
    tokens = sum(r["tokens"] for r in reports)
    elapsed = max(r["elapsed_s"] for r in reports)
    return {
        "added_pss_bytes": run["peak"]["total"] - none_peak,
        "peak_processes": run["peak"]["processes"],
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "wait_fraction": (sum(s["wait_s"] for r in reports for s in r["steps"]) /
                          sum(r["elapsed_s"] for r in reports)),
        # The same over the timed steps (after --warmup), each rank's share of its span.
        "wait_fraction_timed": (
            sum(s["wait_s"] for r in reports for s in r["steps"][warmup:]) /
            (len(reports) * span) if span > 0 else 0.0),
        "imbalance_per_step": imbalance(per_step_costs),
        "mean_rank_cost": statistics.fmean(x for c in per_step_costs for x in c),
        "steps_per_s": (steps - warmup) / span if span > 0 else 0.0,
        # What the costs alone allow: each step as long as its slowest rank's compute.
        "ideal_steps_per_s": (steps - warmup) / compute_s if compute_s > 0 else 0.0,
    }


# ----------------------------------------------------------------------------------------
# Output


def plots(out_dir: str, result: dict) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    loaders = result["loaders"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in loaders.items():
        axes[0].plot(r["imbalance_per_step"], label=name)
    axes[0].set(title=f"imbalance per step, {result['ranks']} ranks (trainers)",
                xlabel="step", ylabel="max / mean rank cost")
    for name, values in result["imbalance_dp"]["per_step"].items():
        axes[1].plot(values, label=name)
    axes[1].set(title=f"imbalance per step, dp={result['imbalance_dp']['dp']} (planned)",
                xlabel="step")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    written.append(os.path.join(out_dir, "imbalance.png"))
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in loaders:
        points = sorted((int(r), m[name]) for r, m in result["memory_by_ranks"].items()
                        if name in m)
        ax.plot([p[0] for p in points], [p[1] / 1e9 for p in points], "o-", label=name)
    ax.set(title="loader memory (added PSS)", xlabel="trainer ranks", ylabel="GB")
    ax.legend()
    fig.tight_layout()
    written.append(os.path.join(out_dir, "memory.png"))
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(loaders)
    axes[0].bar(names, [loaders[n]["tokens_per_s"] / 1e6 for n in names])
    axes[0].set(title="tokens/s delivered", ylabel="M tokens/s")
    axes[1].bar(names, [loaders[n]["steps_per_s"] for n in names], label="measured")
    axes[1].plot(names, [loaders[n]["ideal_steps_per_s"] for n in names], "k_",
                 markersize=30, label="costs alone")
    axes[1].set(title="end-to-end steps/s (simulated trainer)")
    axes[1].legend()
    fig.tight_layout()
    written.append(os.path.join(out_dir, "throughput.png"))
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)
    return written


def table(result: dict) -> str:
    lines = [f"{'loader':<12} {'memory GB':>10} {'tokens/s':>11} {'wait':>6} "
             f"{'cost':>6} {'imbalance':>10} {'steps/s':>8} {'vs base':>8} "
             f"{'dp=' + str(result['imbalance_dp']['dp']):>8}"]
    base = result["loaders"].get("baseline")
    dp_mean = result["imbalance_dp"]["mean"]
    unit = next(iter(result["loaders"].values()))["mean_rank_cost"] or 1.0
    for name, r in result["loaders"].items():
        vs = (f"{r['steps_per_s'] / base['steps_per_s']:>7.2f}x"
              if base and base["steps_per_s"] > 0 else f"{'-':>8}")
        dp = f"{dp_mean[name]:.4f}" if name in dp_mean else "-"
        lines.append(f"{name:<12} {r['added_pss_bytes'] / 1e9:>10.2f} "
                     f"{r['tokens_per_s']:>11,.0f} {r['wait_fraction']:>6.3f} "
                     f"{r['mean_rank_cost'] / unit:>6.3f} "
                     f"{statistics.fmean(r['imbalance_per_step']):>10.4f} "
                     f"{r['steps_per_s']:>8.3f} {vs} {dp:>8}")
    for name, why in result["skipped"].items():
        lines.append(f"{name:<12} skipped: {why}")
    lines.append("cost: the mean cost a rank received per step, against Braid's; "
                 "imbalance: mean over steps of max / mean rank cost")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/bench.py",
                                description=__doc__.split("\n")[0])
    p.add_argument("config", help="a Braid config (JSON or YAML)")
    p.add_argument("--ranks", default="8",
                   help="trainer processes; a comma list (4,8) runs each, for memory "
                   "against ranks (the other figures: the largest)")
    p.add_argument("--runtime", choices=["embedded", "ray"], default="embedded",
                   help="Braid's runtime (ray: a Ray head of its own, node delivery)")
    p.add_argument("--against", default="baseline",
                   help=f"comma list of {', '.join(PEERS)} (none: '')")
    p.add_argument("--tp", type=int, default=1,
                   help="trainer ranks in tensor-parallel groups of this size: TP peers "
                   "receive the same data (dp = ranks / (tp * pp); the global batch "
                   "stays that of dp = ranks)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages, likewise")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=4, help="steps not timed")
    p.add_argument("--step-ms", type=float, default=200.0,
                   help="simulated compute of a rank's step at Braid's mean rank cost")
    p.add_argument("--imbalance-dp", type=int, default=64)
    p.add_argument("--imbalance-micro-batches", type=int, default=8,
                   help="micro-batches per rank at --imbalance-dp (0: the config's)")
    p.add_argument("--imbalance-steps", type=int, default=12)
    p.add_argument("--workers", type=int, default=2,
                   help="DataLoader workers per rank of the baseline and peers")
    p.add_argument("--shuffle-buffer", type=int, default=64,
                   help="baseline: documents per source")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config override for every loader (JSON value; a dotted key, or "
                   "sources.KEY on every source), e.g. balance.split=even")
    p.add_argument("--out", help="output folder (default: out/bench/CONFIG_NAME)")
    p.add_argument("--sample-ms", type=float, default=200.0)
    p.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    p.add_argument("--ray-defaults", action="store_true",
                   help="start the Ray head with Ray's defaults (prestarted workers, a log "
                   "monitor) rather than docs/distributed.md's settings for Braid's nodes")
    p.add_argument("--ray-object-store-mb", type=int, default=256, help=argparse.SUPPRESS)
    p.add_argument("--mosaic-python", metavar="PATH",
                   help="mosaic: the python of MosaicML Streaming's environment (default: "
                   "$BRAID_MOSAIC_PYTHON, else .venv-mosaic beside this venv, made by "
                   "benchmarks/setup-mosaic-env)")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401  (the plots, at the end)
        from tqdm import tqdm
    except ImportError as e:
        raise ValueError(f"benchmarks/bench.py needs {e.name}: "
                         "pip install 'braid[bench]'")
    from harness.baseline import load_braid_config

    ranks_list = sorted({int(r) for r in str(args.ranks).split(",") if r})
    if not ranks_list or min(ranks_list) < 1:
        raise ValueError("--ranks: positive integers")
    against = [a for a in args.against.split(",") if a]
    for a in against:
        if a not in PEERS:
            raise ValueError(f"--against: unknown loader {a!r} (of {', '.join(PEERS)})")
    if args.tp < 1 or args.pp < 1:
        raise ValueError("--tp and --pp must be positive")
    for r in ranks_list:
        if r % (args.tp * args.pp):
            raise ValueError(f"--ranks {r} is not a multiple of --tp {args.tp} x "
                             f"--pp {args.pp}")
    if not 0 <= args.warmup < args.steps:
        raise ValueError("--warmup must be below --steps")
    config = _rebase(load_braid_config(args.config),
                     os.path.dirname(os.path.abspath(args.config)))
    overrides = parse_set(args.set)
    apply_overrides(config, overrides)
    name = os.path.splitext(os.path.basename(args.config))[0]
    out_dir = os.path.abspath(args.out or os.path.join("out", "bench", name))
    os.makedirs(out_dir, exist_ok=True)
    args.dir = out_dir  # where modes put converted data
    braid_mode = "braid" if args.runtime == "embedded" else "braid-ray"
    layout = with_ranks(config, max(ranks_list), tp=args.tp, pp=args.pp)
    skipped = {a: why for a in against if (why := cannot_express(a, layout))}
    if "mosaic" in against and "mosaic" not in skipped:
        why = mosaic_unavailable(args)
        if why:
            skipped["mosaic"] = why
    loaders = [braid_mode] + [a for a in against if a not in skipped]
    model = cost_model(config)
    # One `none` run per interpreter: a loader's memory is its trainers' less idle
    # trainers under the same Python, torch and braid.
    pythons = list(dict.fromkeys(MODES[m].python(args) for m in loaders))

    total = (len(ranks_list) * (len(loaders) + len(pythons)) * args.steps +
             args.imbalance_dp * ("baseline" in loaders) + 1)
    progress = tqdm(total=total, desc=name, unit="step", disable=args.no_progress,
                    file=sys.stderr, mininterval=0.5)
    # The time unit: Braid's mean rank cost at the largest R is --step-ms.
    top = max(ranks_list)
    planned = braid_plan(with_ranks(config, top), args.steps)
    scale = args.step_ms / 1000.0 / statistics.fmean(x for c in planned for x in c)

    memory_by_ranks: Dict[int, Dict[str, float]] = {}
    figures: Dict[str, dict] = {}
    for ranks in ranks_list:
        args.ranks = ranks
        base = with_ranks(config, ranks, tp=args.tp, pp=args.pp)
        dp = base["topology"]["dp"]
        spec = {"ranks": ranks, "steps": args.steps, "scale": scale, **model,
                "dp": dp, "tp": args.tp, "pp": args.pp,
                "tokens_per_rank_step": base["batch"]["global_tokens"] // dp,
                "workers": args.workers, "shuffle_buffer": args.shuffle_buffer}
        runs, none_peaks = {}, {}
        for python in pythons:
            progress.set_description(f"{name}: none x {ranks}")
            path = _write(os.path.join(out_dir, f"config-none-{ranks}.json"), base)
            none_peaks[python] = run_trainers("none", path, args, spec, progress,
                                              python=python)["peak"]["total"]
        for mode_name in loaders:
            progress.set_description(f"{name}: {mode_name} x {ranks}")
            mode = MODES[mode_name]
            try:
                prepared = mode.prepare(dict(base), args, mode.state)
                path = _write(os.path.join(out_dir, f"config-{mode_name}-{ranks}.json"),
                              prepared)
                runs[mode_name] = run_trainers(mode_name, path, args, spec, progress)
            finally:
                mode.cleanup(mode.state)
        memory_by_ranks[ranks] = {}
        for mode_name in loaders:
            none_peak = none_peaks[MODES[mode_name].python(args)]
            s = summarize(runs[mode_name], none_peak, args.warmup, scale,
                          group=args.tp * args.pp)
            s["python"] = MODES[mode_name].python(args)
            memory_by_ranks[ranks][mode_name] = s["added_pss_bytes"]
            if ranks == top:
                figures[mode_name] = s

    # Imbalance at a large dp, from the planner and the baseline's replayed streams.
    progress.set_description(f"{name}: imbalance at dp={args.imbalance_dp}")
    big = with_ranks(config, args.imbalance_dp, args.imbalance_micro_batches or None)
    per_step = {braid_mode: imbalance(braid_plan(big, args.imbalance_steps))}
    if "baseline" in loaders:
        per_step["baseline"] = imbalance(baseline_costs(
            big, args.imbalance_dp, args.imbalance_steps, args.workers,
            args.shuffle_buffer, progress))
    progress.update(1)
    progress.close()

    result = {
        "config": os.path.abspath(args.config), "ranks": top, "runtime": args.runtime,
        "layout": {"dp": top // (args.tp * args.pp), "tp": args.tp, "pp": args.pp},
        "steps": args.steps, "warmup": args.warmup, "step_ms": args.step_ms,
        "scale_s": scale, "cost": model, "workers": args.workers, "overrides": overrides,
        "loaders": figures, "skipped": skipped,
        "memory_by_ranks": {str(r): m for r, m in memory_by_ranks.items()},
        "imbalance_dp": {"dp": args.imbalance_dp,
                         "micro_batches": args.imbalance_micro_batches or "config",
                         "steps": args.imbalance_steps, "per_step": per_step,
                         "mean": {k: statistics.fmean(v) for k, v in per_step.items()}},
    }
    if "baseline" in figures:
        b = figures["baseline"]
        result["speedup_over_baseline"] = {
            n: figures[n]["steps_per_s"] / b["steps_per_s"] for n in figures
            if n != "baseline" and b["steps_per_s"] > 0}
        result["speedup_costs_alone_over_baseline"] = {
            n: figures[n]["ideal_steps_per_s"] / b["ideal_steps_per_s"] for n in figures
            if n != "baseline" and b["ideal_steps_per_s"] > 0}
        # The same at equal mean cost: what balance alone gives (the loaders' mixes and
        # cuts differ: Braid cuts a long document at a source's step quota).
        result["speedup_balance_only_over_baseline"] = {
            n: v * figures[n]["mean_rank_cost"] / b["mean_rank_cost"]
            for n, v in result["speedup_costs_alone_over_baseline"].items()}
        result["memory_ratio_baseline_over"] = {
            n: b["added_pss_bytes"] / figures[n]["added_pss_bytes"] for n in figures
            if n != "baseline" and figures[n]["added_pss_bytes"] > 0}
    result["plots"] = plots(out_dir, result)
    path = os.path.join(out_dir, "bench.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{name}: {top} ranks (dp={top // (args.tp * args.pp)} x tp={args.tp} x "
          f"pp={args.pp}), {args.steps} steps ({args.warmup} warm-up) of "
          f"{args.step_ms:g} ms at Braid's mean rank cost; dp={args.imbalance_dp} "
          f"imbalance over {args.imbalance_steps} planned steps")
    print(table(result))
    for n, v in result.get("speedup_over_baseline", {}).items():
        print(f"{n} / baseline: end-to-end {v:.2f}x, costs alone "
              f"{result['speedup_costs_alone_over_baseline'][n]:.2f}x, balance alone "
              f"{result['speedup_balance_only_over_baseline'][n]:.2f}x; memory baseline / "
              f"{n}: {result['memory_ratio_baseline_over'].get(n, float('nan')):.2f}x")
    print(f"wrote {path} and {len(result['plots'])} plots")
    return 0
