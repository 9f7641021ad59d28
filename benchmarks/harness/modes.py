"""The loaders `benchmarks/bench.py` and `benchmarks/loader_memory.py` compare, each a
`Mode`: how a trainer process starts it, what the harness prepares first (a converted
dataset, a Ray head) and which processes outside the trainers' trees it adds.

`args` is the harness's namespace: `workers` and `shuffle_buffer` (the baseline's and
the peers' DataLoader workers), `dir` (where converted data goes),
`ray_object_store_mb` (the Ray head the Ray modes start) and `mosaic_python` (the
interpreter of MosaicML Streaming's environment; None: `mosaic_python()` finds it). Not
thread-safe: a mode's `state` belongs to the harness thread.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from harness.procs import children_map, descendants, free_port, python_env


@dataclass
class Mode:
    """One way of feeding R trainers.

    prepare(config, args) -> config     in the harness: the config this mode runs (may
                                        start daemons and remember them in `state`)
    start(config_path, rank, R, args)   in a trainer after the imports: returns
        -> (iterator, close)            (iterator of micro-batch dicts, a close function)
    extra_pids(state) -> [pid]          in the harness, at every sample: processes outside
                                        the trainers' trees that the mode adds (daemons,
                                        actors); their PSS counts
    cleanup(state)                      in the harness after the run
    python(args) -> path                the interpreter the trainers (and the `none` run
                                        they are measured against) run under
    env(state) -> {name: value}         variables added to the trainers' environment
    imports                             the modules start() imports (a peer's library):
                                        loader_memory.py --idle-imports has the trainers
                                        and the `none` run import them before the start
    """

    name: str
    start: Callable[..., Tuple[Optional[Iterable], Callable[[], None]]]
    prepare: Callable[[dict, argparse.Namespace, dict], dict] = (
        lambda config, args, state: config)
    extra_pids: Callable[[dict], List[int]] = lambda state: []
    cleanup: Callable[[dict], None] = lambda state: None
    python: Callable[[argparse.Namespace], str] = lambda args: sys.executable
    env: Callable[[dict], Dict[str, str]] = lambda state: {}
    imports: Tuple[str, ...] = ()
    state: Dict[str, Any] = field(default_factory=dict)


def _start_none(config_path, rank, world_size, args):
    return None, lambda: None


def _start_baseline(config_path, rank, world_size, args):
    from harness.baseline import make_loader

    # One loader per rank; in tp x pp groups (Megatron's order: tp fastest, then dp,
    # then pp) the ranks of a DP group load the same data, as torchtitan- and FSDP-style
    # trainers do: the loader of DP rank `dp` of `world / (tp * pp)`.
    tp, pp = getattr(args, "tp", 1), getattr(args, "pp", 1)
    dp_size = world_size // (tp * pp)
    loader = make_loader(config_path, rank=(rank // tp) % dp_size, world_size=dp_size,
                         workers=args.workers, shuffle_buffer=args.shuffle_buffer)
    it = iter(loader)

    def close():
        # Stops and joins the workers.
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    return it, close


def _start_braid(config_path, rank, world_size, args):
    import braid

    loader = braid.Loader(config_path, rank, world_size)
    return iter(loader), loader.close


def _convert(config: dict, args, peer: str) -> List[str]:
    """Runs peers.py's converter for `peer` (once: its folders under --dir/PEER are
    reused) in a process of its own (LitData's optimize starts workers of its own),
    under the peer's interpreter; returns the folders."""
    path = os.path.abspath(os.path.join(args.dir, f"config-{peer}-convert.json"))
    with open(path, "w") as f:
        json.dump(config, f)
    flag = [f"--{peer}"] if peer in ("energon", "mosaic") else []
    done = subprocess.run([MODES[peer].python(args), "-m", "harness.peers", *flag, path,
                           os.path.abspath(os.path.join(args.dir, peer))],
                          capture_output=True, text=True, env=python_env())
    if done.returncode != 0:
        raise RuntimeError(f"{peer}: converting the sources failed:\n"
                           f"{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _prepare_litdata(config: dict, args, state: dict) -> dict:
    """Converts the sources to LitData's pre-tokenized chunks and records their folders in
    the config for the trainers."""
    return dict(config, litdata_folders=_convert(config, args, "litdata"))


def _prepare_energon(config: dict, args, state: dict) -> dict:
    """Converts the sources to Energon datasets (WebDataset shards, `energon prepare`)
    with a metadataset blending them by the config's weights, and records its folder in
    the config for the trainers."""
    _convert(config, args, "energon")
    return dict(config, energon_root=os.path.abspath(os.path.join(args.dir, "energon")))


def _start_litdata(config_path, rank, world_size, args):
    with open(config_path) as f:
        config = json.load(f)
    from harness.peers import litdata_loader

    return litdata_loader(config, config["litdata_folders"], rank, world_size,
                          args.workers)


def _start_energon(config_path, rank, world_size, args):
    with open(config_path) as f:
        config = json.load(f)
    from harness.peers import energon_loader

    return energon_loader(config, config["energon_root"], rank, world_size, args.workers,
                          shuffle_buffer=args.shuffle_buffer)


# ----------------------------------------------------------------------------------------
# MosaicML Streaming: an environment of its own

MOSAIC_SETUP = "benchmarks/setup-mosaic-env"
MOSAIC_PYTHON_ENV = "BRAID_MOSAIC_PYTHON"
# Streaming's shared memory: /dev/shm/NNNNNN_NAME (streaming/base/constant.py SHM_TO_CLEAN).
_MOSAIC_SHM = re.compile(r"^\d{6}_(locals|barrier|next_epoch|cache_usage|shard_states|"
                         r"shard_access_times|resume|epoch_shape|epoch_data)$")


def mosaic_python(args=None) -> str:
    """The interpreter of MosaicML Streaming's environment: `args.mosaic_python`, else
    $BRAID_MOSAIC_PYTHON, else the `.venv-mosaic` that benchmarks/setup-mosaic-env makes
    beside this interpreter's venv (the checkout's .venv) or in the current folder. The
    path may not exist (mosaic_unavailable says so)."""
    explicit = getattr(args, "mosaic_python", None) or os.environ.get(MOSAIC_PYTHON_ENV)
    if explicit:
        return explicit
    candidates = [os.path.join(os.path.dirname(os.path.abspath(sys.prefix)),
                               ".venv-mosaic", "bin", "python"),
                  os.path.join(os.getcwd(), ".venv-mosaic", "bin", "python")]
    return next((c for c in candidates if os.path.exists(c)), candidates[0])


def mosaic_unavailable(args=None) -> Optional[str]:
    """Why the `mosaic` mode cannot run here (None: it can): its interpreter is missing,
    or lacks mosaicml-streaming or braid. Its trainers run this harness (python_env)."""
    python = mosaic_python(args)
    fix = (f"create it with {MOSAIC_SETUP} (or name its python with --mosaic-python or "
           f"${MOSAIC_PYTHON_ENV})")
    if not os.access(python, os.X_OK):
        return f"no MosaicML Streaming environment at {python}: {fix}"
    probe = ("import importlib.util as u, json; print(json.dumps("
             "[u.find_spec(m) is not None for m in ('streaming', 'braid')]))")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"{python} does not run ({done.stderr.strip()[-200:]}): {fix}"
    has_streaming, has_braid = json.loads(done.stdout.strip().splitlines()[-1])
    if not has_streaming or not has_braid:
        missing = "mosaicml-streaming" if not has_streaming else "braid"
        return f"{python} has no {missing}: {fix}"
    return None


def _mosaic_shm() -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if _MOSAIC_SHM.match(n)}
    except OSError:
        return set()


def _prepare_mosaic(config: dict, args, state: dict) -> dict:
    """Converts the sources to MDS datasets (under the Mosaic interpreter), gives the run a
    temp folder of its own (Streaming leaves its file locks there, and would skip their
    prefixes in later runs) and a port for the process group Streaming starts where the
    trainers have none; records what is in /dev/shm before the run."""
    import tempfile

    folders = _convert(config, args, "mosaic")
    state["tmp"] = tempfile.mkdtemp(prefix="braid-mosaic-bench-")
    state["shm_before"] = _mosaic_shm()
    return dict(config, mosaic_folders=folders, mosaic_master_port=free_port())


def _cleanup_mosaic(state: dict) -> None:
    """Removes the run's temp folder and any shared memory of Streaming's that the
    trainers' own cleanup (clean_stale_shared_memory on close) left behind."""
    import shutil

    for name in _mosaic_shm() - state.pop("shm_before", set()):
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass
    if state.get("tmp"):
        shutil.rmtree(state.pop("tmp"), ignore_errors=True)


def _mosaic_env(state: dict) -> Dict[str, str]:
    """The run's temp folder; and quiet resource trackers: Python before 3.13 registers a
    shared memory segment that a process only attaches to (as every rank but the node's
    first does Streaming's), so at exit each tracker warns that it cannot unlink segments
    that rank 0's clean_stale_shared_memory already removed."""
    if not state.get("tmp"):
        return {}
    return {"TMPDIR": state["tmp"],
            "PYTHONWARNINGS": "ignore::UserWarning:multiprocessing.resource_tracker"}


def _start_mosaic(config_path, rank, world_size, args):
    with open(config_path) as f:
        config = json.load(f)
    from harness.peers import mosaic_loader

    return mosaic_loader(config, config["mosaic_folders"], rank, world_size, args.workers,
                         master_port=config["mosaic_master_port"])


def _prepare_ray(config: dict, args, state: dict, delivery: str = "node") -> dict:
    """Starts a Ray head of its own (`ray start --head`, its own temp dir, no dashboard,
    a small object store, token authentication off on loopback; unless `--ray-defaults`,
    no prestarted workers, no log monitor and no autoscaler monitor) and points the
    config at it. With `delivery` node the trainers attach through a short-lived helper process
    (counted while it lives: it is a trainer's child) and receive through the node's
    constructor; with object_store each trainer is a Ray driver."""
    import tempfile

    temp = tempfile.mkdtemp(prefix="braid-ray-bench-")
    port = 20000 + os.getpid() % 20000
    os.environ["RAY_AUTH_MODE"] = "disabled"  # the trainers inherit it
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    lean, env = [], dict(os.environ)
    if not getattr(args, "ray_defaults", False):
        # What docs/distributed.md suggests for nodes that run only Braid's actors: no
        # prestarted task workers (Braid runs no Ray tasks), no log monitor (the
        # trainers are no Ray drivers, nobody reads streamed worker logs), no autoscaler
        # monitor (a fixed cluster).
        lean = ["--include-log-monitor=false", "--no-monitor"]
        env["RAY_prestart_worker_first_driver"] = "0"
    subprocess.run([ray_bin, "start", "--head", f"--port={port}", f"--temp-dir={temp}",
                    "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
                    f"--object-store-memory={args.ray_object_store_mb << 20}", *lean],
                   check=True, capture_output=True, text=True, env=env)
    state["temp"] = temp
    runtime = {"kind": "ray", "address": f"127.0.0.1:{port}",
               "namespace": f"bench{os.getpid()}", "delivery": delivery}
    return dict(config, runtime={**config.get("runtime", {}), **runtime})


def _ray_pids(state: dict) -> List[int]:
    """The daemons of this run's Ray head (their command line names its temp dir) and
    every process they started (the job's actors, idle workers)."""
    temp = state.get("temp")
    if not temp:
        return []
    roots = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if temp.encode() in f.read():
                    roots.append(int(name))
        except OSError:
            continue
    return sorted(set(roots) | set(descendants(roots, children_map())))


def _cleanup_ray(state: dict) -> None:
    import signal

    pids = _ray_pids(state)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        time.sleep(1.0)
    state.pop("temp", None)


MODES: Dict[str, Mode] = {
    "none": Mode("none", _start_none),
    "baseline": Mode("baseline", _start_baseline),
    "braid": Mode("braid", _start_braid),
    # The Ray runtime: the trainers (Ray drivers) plus Ray's daemons and the job's
    # actors (planner, source actors, the node's constructor), all counted.
    "braid-ray": Mode("braid-ray", _start_braid, prepare=_prepare_ray,
                      extra_pids=_ray_pids, cleanup=_cleanup_ray),
    # A peer (harness/peers.py): LitData's pre-tokenized chunks, forked workers.
    "litdata": Mode("litdata", _start_litdata, prepare=_prepare_litdata,
                    imports=("litdata",)),
    # A peer: Megatron-Energon's WebDataset shards and a blend metadataset, packing with
    # document boundaries, forked workers.
    "energon": Mode("energon", _start_energon, prepare=_prepare_energon,
                    imports=("megatron.energon",)),
    # A peer: MosaicML Streaming's MDS datasets, a StreamingDataset of one Stream per
    # source, forked workers packing documents; trainers under its own interpreter.
    "mosaic": Mode("mosaic", _start_mosaic, prepare=_prepare_mosaic,
                   cleanup=_cleanup_mosaic, python=mosaic_python,
                   env=_mosaic_env, imports=("streaming",)),
    # The same with runtime.delivery: object_store (every trainer a Ray driver).
    "braid-ray-store": Mode(
        "braid-ray-store", _start_braid,
        prepare=lambda c, a, s: _prepare_ray(c, a, s, delivery="object_store"),
        extra_pids=_ray_pids, cleanup=_cleanup_ray),
}

