"""Loader memory of R trainer processes: the per-rank baseline against Braid.

Generates N sources (one Parquet file each, --tokens-per-file tokens of long documents:
lognormal lengths with a tail past seq_len, one row group per file; the shape of
benchmarks/many_sources.py) and a Braid config over them (dp = R, one micro-batch per
rank per step), then, for each loader mode, starts R simulated trainer processes (fresh
interpreters, each importing torch and braid as a trainer does). When all have imported,
each starts its loader and pulls --micro-batches micro-batches at a steady rate (one per
--interval-ms; 0: as fast as it can).

Memory: every --sample-ms the harness sums the PSS (/proc/PID/smaps_rollup) of every
process the mode adds: the trainers, all their descendants (forked DataLoader workers)
and the mode's extra processes (daemons, actors); the figure is the peak of that sum
during the run, less the peak of the same R trainers in a `none` run that imports torch
and braid and loads nothing. PSS splits a shared page between the processes mapping it,
so shared libraries and copy-on-write pages after a fork count once.

Modes (MODES below): `baseline` (harness/baseline.py: a DataLoader with --workers
forked workers per rank), `braid` (braid.Loader(config, rank, R) in each trainer, the
embedded runtime), `braid-ray` (the same Loader with runtime.kind: ray against a Ray head
this script starts: Ray's daemons and the job's actors count as extra processes; the
trainers receive through node delivery), `braid-ray-store` (the same with
runtime.delivery: object_store: the trainers are Ray drivers), `litdata` and `energon`
(peers, harness/peers.py: LitData's pre-tokenized chunks, or Megatron-Energon's
WebDataset shards and blend metadataset, with --workers forked workers per rank; they
need benchmarks/requirements-peers.txt) and `mosaic` (MosaicML Streaming's MDS datasets
and StreamingDataset, --workers forked workers per rank; its trainers, and the `none`
run they are measured against, run under the python of its own environment, made by
benchmarks/setup-mosaic-env: --mosaic-python; without it the mode is skipped). A mode is
a `Mode` (harness/modes.py): what it changes in the config, how a trainer starts
its loader, which extra PIDs count, which interpreter runs the trainers.

    .venv/bin/python benchmarks/loader_memory.py \
        [--ranks 8] [--sources 4] [--tokens-per-file 4500000] \
        [--loaders baseline,braid,braid-ray] [--micro-batches 40] [--interval-ms 100] \
        [--seq-len 2048] [--micro-batch-size 4] [--workers 2] [--dir out/loader_memory] \
        [--json out.json] [--set KEY=VALUE ...] [--mosaic-python .venv-mosaic/bin/python] \
        [--idle-imports]

Prints a table, then the JSON (last line): per mode the peak PSS added (total, per
rank), tokens/s delivered, and the baseline/braid ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Tuple

# The harness package, from this script's folder (sys.path[0]).
from harness.modes import MODES, Mode, mosaic_unavailable
from harness.overrides import apply_overrides, parse_set
from harness.procs import children_map, descendants, sample, smaps_rollup, threads
from harness.run import run_processes

HERE = os.path.dirname(os.path.abspath(__file__))


def _sibling(name: str):
    """benchmarks/NAME.py as module NAME (once per process)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ----------------------------------------------------------------------------------------
# Trainer process


def _emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _self_figures() -> dict:
    """What a trainer can say about its own memory (the loader's parts, roughly)."""
    import pyarrow as pa

    roll = smaps_rollup(os.getpid()) or {}
    return {"pss": roll.get("Pss", 0), "pss_anon": roll.get("Pss_Anon", 0),
            "pss_file": roll.get("Pss_File", 0), "pss_shmem": roll.get("Pss_Shmem", 0),
            **_arrow_figures(pa), "threads": threads(os.getpid())}


def _arrow_figures(pa) -> Dict[str, int]:
    """Bytes in Arrow's default pool and in its system pool (where Braid reads unless
    ARROW_DEFAULT_MEMORY_POOL is set), now and at their peaks."""
    default, system = pa.default_memory_pool(), pa.system_memory_pool()
    out = {"arrow_bytes": default.bytes_allocated(), "arrow_peak": default.max_memory()}
    if system.backend_name != default.backend_name:
        out.update(arrow_system_bytes=system.bytes_allocated(),
                   arrow_system_peak=system.max_memory())
    try:  # where Braid reads when Arrow has jemalloc (the wheels do)
        jemalloc = pa.jemalloc_memory_pool()
    except (NotImplementedError, AttributeError):
        jemalloc = None
    if jemalloc is not None and jemalloc.backend_name != default.backend_name:
        out.update(arrow_jemalloc_bytes=jemalloc.bytes_allocated(),
                   arrow_jemalloc_peak=jemalloc.max_memory())
    return out


def trainer_main(args) -> int:
    import torch  # noqa: F401  (a trainer has both imported)
    import braid  # noqa: F401

    for module in filter(None, args.imports.split(",")):  # --idle-imports
        importlib.import_module(module)
    mode = MODES[args.trainer]
    rank, world = args.rank, args.ranks
    _emit({"event": "ready", "pid": os.getpid()})
    if sys.stdin.readline().strip() != "go":
        return 1
    start = time.monotonic()
    it, close = mode.start(args.config, rank, world, args)
    interval = args.interval_ms / 1000.0
    waited = 0.0
    first = None
    shapes = []
    tokens = 0
    for i in range(args.micro_batches):
        due = start + i * interval
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        if it is None:
            continue
        t = time.monotonic()
        batch = next(it)
        waited += time.monotonic() - t
        if first is None:
            first = time.monotonic() - start
        ids = batch["input_ids"]
        cu = batch["cu_seqlens"]
        if int(cu[-1]) != ids.numel():
            raise AssertionError(f"cu_seqlens ends at {int(cu[-1])}, not {ids.numel()}")
        tokens += ids.numel()
        shapes.append(list(ids.shape))
        del batch, ids, cu
    elapsed = time.monotonic() - start
    figures = _self_figures()
    _emit({"event": "done", "rank": rank, "tokens": tokens, "elapsed_s": elapsed,
           "first_s": first, "wait_s": waited, "shapes": shapes[:4],
           "tokens_per_micro_batch": sorted({s[0] * s[1] for s in shapes}),
           "self": figures})
    sys.stdin.readline()  # "exit": the harness has its samples
    close()
    return 0


# ----------------------------------------------------------------------------------------
# Profile: where one trainer's memory goes, stage by stage


def _malloc_figures() -> Dict[str, int]:
    """glibc's heap: bytes in use and held by its arenas (mallinfo2), or {}."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):
        return {}
    m = libc.mallinfo2()
    return {"malloc_in_use": m.uordblks + m.hblkhd, "malloc_held": m.arena + m.hblkhd}


def profile_main(args, config_path: str) -> int:
    """One trainer (rank 0 of --ranks) in this process: PSS and its parts after each
    stage (imports, loader start, first and last micro-batch, close)."""
    rows = []

    def snap(stage: str) -> None:
        roll = smaps_rollup(os.getpid()) or {}
        kids = descendants([os.getpid()], children_map())
        kid_pss = sum((smaps_rollup(k) or {}).get("Pss", 0) for k in kids)
        row = {"stage": stage, "pss": roll.get("Pss", 0) + kid_pss,
               "pss_anon": roll.get("Pss_Anon", 0), "children_pss": kid_pss,
               "rss": roll.get("Rss", 0)}
        if "pyarrow" in sys.modules:
            row.update(_arrow_figures(sys.modules["pyarrow"]))
        row.update(_malloc_figures())
        row["threads"] = threads(os.getpid())
        rows.append(row)

    snap("python")
    import torch  # noqa: F401

    snap("import torch")
    import braid  # noqa: F401
    import pyarrow  # noqa: F401  (already loaded by braid's core: the same pool)

    snap("import braid")
    mode = MODES[args.profile]
    it, close = mode.start(config_path, 0, args.ranks, args)
    snap("loader made")
    batch = next(it)
    del batch
    snap("first micro-batch")
    for _ in range(args.micro_batches - 1):
        batch = next(it)
        del batch
    snap(f"micro-batch {args.micro_batches}")
    time.sleep(1.0)
    snap("+1 s idle")
    close()
    del it
    import gc

    gc.collect()
    time.sleep(0.5)
    snap("closed")
    mib = 2**20
    keys = ["pss", "pss_anon", "children_pss", "arrow_bytes", "arrow_peak",
            "arrow_system_bytes", "arrow_system_peak", "arrow_jemalloc_bytes",
            "arrow_jemalloc_peak", "malloc_in_use", "malloc_held",
            "threads"]
    print("MiB; sys, jemalloc: Arrow's system pool and its jemalloc pool (where Braid reads)")
    print(f"{'stage':<18}" + "".join(f"{k.replace('arrow_system', 'sys').replace('arrow_jemalloc', 'jem'):>14}"
                                     for k in keys))
    for row in rows:
        cells = []
        for k in keys:
            v = row.get(k)
            cells.append("-" if v is None else (str(v) if k == "threads"
                                                  else f"{v / mib:.1f}"))
        print(f"{row['stage']:<18}" + "".join(f"{c:>14}" for c in cells))
    print(json.dumps({"profile": args.profile, "stages": rows}), flush=True)
    return 0


# ----------------------------------------------------------------------------------------
# Harness



def run_mode(mode: Mode, config_path: str, args, python: str = "",
             imports: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """Starts R trainers in `mode` under its interpreter (or `python`: the `none` run of
    another mode's), importing `imports` before they report ready; returns the samples
    and their reports."""
    cmd = [python or mode.python(args), os.path.abspath(__file__), "--trainer", mode.name,
           "--imports", ",".join(imports),
           "--config", config_path, "--ranks", str(args.ranks),
           "--micro-batches", str(args.micro_batches), "--interval-ms",
           str(args.interval_ms), "--workers", str(args.workers),
           "--shuffle-buffer", str(args.shuffle_buffer)]
    idle = []

    def idle_samples(pids: List[int]) -> None:  # the trainers, ready, before their loaders
        for _ in range(3):
            idle.append(sample(pids, mode.extra_pids(mode.state))["total"])
            time.sleep(args.sample_ms / 1000.0)

    label = mode.name + (f" under {cmd[0]}" if cmd[0] != sys.executable else "")
    run = run_processes(label, [cmd + ["--rank", str(r)] for r in range(args.ranks)],
                        lambda: mode.extra_pids(mode.state), args.timeout, args.sample_ms,
                        before_go=idle_samples, env=mode.env(mode.state))
    return dict(run, idle_before=statistics.median(idle))


def write_config(path: str, base: str, args, extra: dict) -> dict:
    config = {
        "seed": 7,
        "topology": {"dp": args.ranks},
        "batch": {"global_tokens": args.ranks * args.micro_batch_size * args.seq_len,
                  "seq_len": args.seq_len, "micro_batch_size": args.micro_batch_size},
        "sources": [{"name": f"s{s:04d}", "path": os.path.join(base, f"s{s:04d}"),
                     "tokens_column": "input_ids", "weight": float(1 + s % 4)}
                    for s in range(args.sources)],
    }
    apply_overrides(config, extra)
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    return config


def summarize(name: str, run: dict, none_peak: float, ranks: int) -> dict:
    reports = run["reports"]
    tokens = sum(r["tokens"] for r in reports)
    elapsed = max(r["elapsed_s"] for r in reports)
    added = run["peak"]["total"] - none_peak
    firsts = [r["first_s"] for r in reports if r["first_s"] is not None]
    return {
        "added_pss_bytes": added,
        "added_pss_per_rank_bytes": added / ranks,
        "added_vs_own_idle_bytes": run["peak"]["total"] - run["idle_before"],
        "peak_pss_bytes": run["peak"]["total"],
        "peak_trainers_bytes": run["peak"]["trainers"],
        "peak_workers_bytes": run["peak"]["workers"],
        "peak_extra_bytes": run["peak"]["extra"],
        # The extra processes at the peak by name (daemons, actors): MB each.
        "peak_extra_parts": {k: v for k, v in sorted(
            run["peak"].get("extra_parts", {}).items(), key=lambda kv: -kv[1])},
        "peak_processes": run["peak"]["processes"],
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "tokens_per_micro_batch": sorted({t for r in reports
                                          for t in r["tokens_per_micro_batch"]}),
        "first_micro_batch_s": max(firsts) if firsts else None,
        "wait_fraction": (sum(r["wait_s"] for r in reports) /
                          sum(r["elapsed_s"] for r in reports)),
        "samples": run["samples"],
        "trainer_self": [r["self"] for r in reports],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=8, help="trainer processes (dp)")
    p.add_argument("--sources", type=int, default=4)
    p.add_argument("--tokens-per-file", type=int, default=4_500_000)
    p.add_argument("--loaders", default="baseline,braid",
                   help=f"modes, comma-separated, of {sorted(set(MODES) - {'none'})}")
    p.add_argument("--micro-batches", type=int, default=40, help="per rank")
    p.add_argument("--interval-ms", type=float, default=100.0,
                   help="one micro-batch per interval per rank; 0: as fast as possible")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="baseline workers per rank")
    p.add_argument("--ray-defaults", action="store_true",
                   help="start the Ray head with Ray's defaults (prestarted workers, a log "
                   "monitor) rather than docs/distributed.md's settings for Braid's nodes")
    p.add_argument("--ray-object-store-mb", type=int, default=256,
                   help="braid-ray: the Ray head's object store")
    p.add_argument("--shuffle-buffer", type=int, default=64,
                   help="baseline shuffle buffer, documents per source")
    p.add_argument("--dir", default=os.path.join("out", "loader_memory"))
    p.add_argument("--set", action="append", help="config override KEY=VALUE (JSON)")
    p.add_argument("--sample-ms", type=float, default=200.0)
    p.add_argument("--timeout", type=float, default=600.0, help="per mode, seconds")
    p.add_argument("--json", help="also write the JSON here")
    p.add_argument("--idle-imports", action="store_true",
                   help="the peers' trainers import their library (litdata, "
                   "megatron.energon, streaming) before they start, and so do the idle "
                   "trainers under the same python: the memory added without the imports")
    p.add_argument("--mosaic-python", metavar="PATH",
                   help="mosaic: the python of MosaicML Streaming's environment (default: "
                   "$BRAID_MOSAIC_PYTHON, else .venv-mosaic beside this venv, made by "
                   "benchmarks/setup-mosaic-env)")
    p.add_argument("--profile", choices=sorted(set(MODES) - {"none", "mosaic"}),
                   help="instead: one trainer (rank 0) in this process, its memory "
                   "stage by stage (MiB)")
    # A trainer process (started by the harness).
    p.add_argument("--trainer", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--imports", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.trainer:
        return trainer_main(args)

    make_data = _sibling("many_sources").make_data
    if args.profile:
        base = make_data(args.dir, args.sources, 1, args.tokens_per_file, "large", 16,
                         args.sources)
        path = os.path.join(args.dir, f"config-profile-{args.profile}.json")
        extra = parse_set(args.set)
        config = MODES[args.profile].prepare(write_config(path, base, args, extra), args,
                                             MODES[args.profile].state)
        with open(path, "w") as f:
            json.dump(config, f, indent=1)
        try:
            return profile_main(args, path)
        finally:
            MODES[args.profile].cleanup(MODES[args.profile].state)

    loaders = [m for m in args.loaders.split(",") if m]
    for m in loaders:
        if m not in MODES or m == "none":
            p.error(f"--loaders: unknown mode {m!r}")
    skipped = {}
    if "mosaic" in loaders and (why := mosaic_unavailable(args)):
        skipped["mosaic"] = why
        loaders.remove("mosaic")
    base = make_data(args.dir, args.sources, 1, args.tokens_per_file, "large", 16,
                     args.sources)
    extra = parse_set(args.set)
    print(f"ranks={args.ranks} sources={args.sources} tokens/file={args.tokens_per_file:,} "
          f"seq_len={args.seq_len} micro_batch_size={args.micro_batch_size} "
          f"micro-batches/rank={args.micro_batches} interval={args.interval_ms:g} ms "
          f"baseline workers={args.workers} overrides={extra or '-'}"
          f"{' (peers imported before the start)' if args.idle_imports else ''}", flush=True)
    results: Dict[str, dict] = {}
    runs = {}
    # One `none` run per interpreter: a mode's memory is its trainers' less idle trainers
    # under the same Python, torch and braid. The first is this one's (`none`).
    pythons = list(dict.fromkeys([sys.executable] + [MODES[m].python(args)
                                                      for m in loaders]))
    none_of = {py: "none" if i == 0 else f"none@{py}" for i, py in enumerate(pythons)}
    # --idle-imports: each mode's trainers import its library first, and the idle
    # trainers under its python import those of every mode that runs there.
    imports_of = {py: tuple(dict.fromkeys(m for name in loaders
                                          if MODES[name].python(args) == py
                                          for m in MODES[name].imports))
                  for py in pythons} if args.idle_imports else {}
    for name in list(none_of.values()) + loaders:
        mode = MODES[name.split("@")[0]]
        python = name.split("@", 1)[1] if "@" in name else ""
        imports = (imports_of.get(python or sys.executable, ()) if mode.name == "none"
                   else mode.imports if args.idle_imports else ())
        config = write_config(os.path.join(args.dir, f"config-{mode.name}.json"), base,
                              args, extra)
        try:
            config = mode.prepare(config, args, mode.state)
            path = os.path.join(args.dir, f"config-{mode.name}.json")
            with open(path, "w") as f:
                json.dump(config, f, indent=1)
            runs[name] = run_mode(mode, path, args, python, imports)
        finally:
            mode.cleanup(mode.state)
        print(f"  {name}: peak {runs[name]['peak']['total'] / 1e9:.2f} GB over "
              f"{runs[name]['peak']['processes']} processes, {runs[name]['samples']} "
              f"samples, {runs[name]['wall_s']:.1f} s", flush=True)
    none_peak = runs["none"]["peak"]["total"]
    for name in loaders:
        own_none = none_of[MODES[name].python(args)]
        results[name] = summarize(name, runs[name], runs[own_none]["peak"]["total"],
                                  args.ranks)
        results[name]["python"] = MODES[name].python(args)
        results[name]["none_peak_pss_bytes"] = runs[own_none]["peak"]["total"]
    out = {
        "ranks": args.ranks, "sources": args.sources,
        "tokens_per_file": args.tokens_per_file, "seq_len": args.seq_len,
        "micro_batch_size": args.micro_batch_size, "micro_batches": args.micro_batches,
        "interval_ms": args.interval_ms, "workers": args.workers,
        "shuffle_buffer": args.shuffle_buffer, "overrides": extra,
        "idle_imports": args.idle_imports,
        "none_peak_pss_bytes": none_peak, "modes": results, "skipped": skipped,
    }
    if "baseline" in results:
        for name, r in results.items():
            if name != "baseline" and r["added_pss_bytes"] > 0:
                out[f"ratio_baseline_over_{name}"] = (
                    results["baseline"]["added_pss_bytes"] / r["added_pss_bytes"])
    # Decimal units (GB = 1e9 bytes), as the issues quote them; the JSON has bytes.
    print(f"{'mode':<10} {'added GB':>9} {'per rank MB':>12} {'trainers GB':>12} "
          f"{'workers GB':>11} {'extra GB':>9} {'tokens/s':>10} {'first s':>8} "
          f"{'wait':>5}")
    for name, r in results.items():
        print(f"{name:<10} {r['added_pss_bytes'] / 1e9:>9.2f} "
              f"{r['added_pss_per_rank_bytes'] / 1e6:>12.0f} "
              f"{r['peak_trainers_bytes'] / 1e9:>12.2f} "
              f"{r['peak_workers_bytes'] / 1e9:>11.2f} "
              f"{r['peak_extra_bytes'] / 1e9:>9.2f} {r['tokens_per_s']:>10,.0f} "
              f"{r['first_micro_batch_s'] or 0:>8.2f} {r['wait_fraction']:>5.2f}")
    for name, r in results.items():
        if r["peak_extra_parts"]:
            print(f"{name} extra at the peak, MB: " + ", ".join(
                f"{k} {v / 1e6:.0f}" for k, v in r["peak_extra_parts"].items()))
    for name, why in skipped.items():
        print(f"{name:<10} skipped: {why}")
    for key, value in out.items():
        if key.startswith("ratio_"):
            print(f"{key}: {value:.2f}")
    text = json.dumps(out)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
