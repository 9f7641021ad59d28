"""The ``braid`` command line: plan, run, demo, inspect, status, stop, calibrate.

Exit codes: 0 success; 2 bad usage or config (stderr names the key path); 3 bad data or
storage (stderr names the file); 130 interrupted (SIGINT, Ctrl-C); 141 the reader of stdout went away
(``braid plan ... | head``); 143 terminated (SIGTERM, as launchers send). Each prints
at most one line on stderr and no traceback; 1 is an internal error (a bug in braid), the
only case that prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback
from typing import Callable, Dict, List, Optional, Type

from braid import _core
from braid.config import load_config

EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_DATA = 3
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141, as a tool killed by SIGPIPE
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143


class _Terminated(BaseException):
    """SIGTERM arrived; raised at the next Python line (a step's progress, a plan line).

    Unwinding it stops the C++ engine: its destructor joins every thread.
    """


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _cmd_plan(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.dp is not None:
        config = config.with_dp(args.dp)
    state_in = ""
    if args.state_in:
        try:
            with open(args.state_in, encoding="utf-8") as f:
                state_in = f.read()
        except OSError as e:
            raise _core.ConfigError(f"--state-in: cannot read {args.state_in}: {e.strerror}")
    out = sys.stdout

    def emit(line: str) -> None:
        out.write(line)
        out.write("\n")

    state = _core.plan_job(config, args.steps, state_in, emit)
    out.flush()
    if args.state_out:
        with open(args.state_out, "w", encoding="utf-8") as f:
            f.write(state)
            f.write("\n")
    return 0


def _print_summary(summary: dict, out=sys.stdout) -> None:
    print("summary:", file=out)
    print(f"  steps            {summary['steps']}", file=out)
    print(f"  tokens           {summary['tokens']:,}", file=out)
    padding = summary["padding_tokens"]
    print(f"  padding          {padding:,} tokens "
          f"({padding / max(summary['tokens'], 1):.2%} of slots)"
          + (f", {summary['multimodal_cut']} multimodal documents cut for lack of room"
             if summary["multimodal_cut"] else "")
          + (f", {summary['multimodal_deferred']} deferred to a later step"
             if summary["multimodal_deferred"] else ""), file=out)
    print(f"  tokens/s         {summary['tokens_per_s']:,.0f} (whole run), "
          f"{summary['steady_tokens_per_s']:,.0f} after the first step", file=out)
    print(f"  imbalance        mean {summary['imbalance_mean']:.4f}  "
          f"max {summary['imbalance_max']:.4f}  (max rank cost / mean rank cost)", file=out)
    print(f"                   mean {summary['sequential_imbalance_mean']:.4f} for the same "
          f"sequences assigned in order, as per-rank loaders do", file=out)
    if summary.get("runtime") == "ray":
        print(f"  memory           {_fmt_bytes(summary['loader_peak_rss_bytes'])} (RSS of "
              f"the job's {len({a['name'] for a in summary['actors']})} actors at the end; "
              f"job {summary['job']})",
              file=out)
    else:
        print(f"  peak memory      {_fmt_bytes(summary['loader_peak_rss_bytes'])} "
              "(process RSS)", file=out)
    print("  source share     achieved / target", file=out)
    for name, share in summary["source_share"].items():
        print(f"    {name:<14} {share:.4f} / {summary['target_share'][name]:.4f}"
              f"   skipped {summary['skipped'][name]}"
              + (f", blanked {summary['blanked'][name]}" if summary["blanked"][name] else "")
              + _skipped_files(summary, name), file=out)
    _print_context(summary, out)
    _print_profile(summary.get("source_profile"), out)
    _print_serving(summary.get("source_serving"), out)
    _print_allocation(summary.get("source_allocation"), out)
    _print_timeline(summary.get("source_timeline"), out)


def _print_timeline(timeline: Optional[list], out, indent: str = "  ") -> None:
    """Per source: CPU and the planner's wait per step over the last quarter of the
    steps, how busy its threads were then, and the span in which planning waited on it
    the most (report.json has every span)."""
    if not timeline:
        return
    first, end = timeline[0]["steps"][0], timeline[-1]["steps"][1]
    since = end - max(1, (end - first) // 4)
    recent = [span for span in timeline if span["steps"][1] > since] or timeline[-1:]
    a = recent[0]["steps"][0]
    print(f"{indent}source time      ms per step of CPU and of the planner's wait on it, "
          f"busy (read CPU / its threads' time), steps {a}-{end - 1}; the most wait in a "
          f"span of {len(timeline)}", file=out)

    def per_step(spans: list, name: str, key: str) -> float:
        steps = sum(max(1, s["steps"][1] - s["steps"][0]) for s in spans)
        return 1000 * sum(s["sources"][name][key] for s in spans) / steps

    def busy(spans: list, name: str) -> str:
        given = [s["sources"][name] for s in spans
                 if s["sources"][name].get("busy") is not None]
        thread_s = sum(d["thread_s"] for d in given)
        if thread_s <= 0:
            return "idle"
        return f"{100 * sum(d['busy'] * d['thread_s'] for d in given) / thread_s:.0f} %"

    for name in timeline[-1]["sources"]:
        worst = max(timeline, key=lambda span: per_step([span], name, "wait_s"))
        print(f"{indent}  {name:<14} {per_step(recent, name, 'cpu_s'):>9,.2f} "
              f"{per_step(recent, name, 'wait_s'):>9,.2f} {busy(recent, name):>6}   "
              f"{per_step([worst], name, 'wait_s'):,.2f} at steps {worst['steps'][0]}-"
              f"{worst['steps'][1] - 1}", file=out)


def _print_allocation(changes: Optional[list], out, indent: str = "  ") -> None:
    """Per source: the threads and read-ahead runtime.autoscale gave it, first and last,
    and how many times they changed (report.json has every change)."""
    if not changes:
        return
    print(f"{indent}source threads   workers and read-ahead (runtime.autoscale), at step "
          f"{changes[0]['step']} -> step {changes[-1]['step']}; {len(changes) - 1} changes",
          file=out)

    def share(s: dict) -> str:
        if not s["active"]:
            return "idle"
        return f"{s['workers']} x {_fmt_bytes(s['read_ahead_bytes'])}"

    for name, first in changes[0]["sources"].items():
        last = changes[-1]["sources"][name]
        print(f"{indent}  {name:<14} {share(first):>14} -> {share(last)}", file=out)


def _print_profile(profile: Optional[dict], out, indent: str = "  ") -> None:
    """Per source: what loading it cost (CPU per sample and per token of read, decode and
    transform; bytes read per sample; samples produced; how long the planner waited for
    it)."""
    if not profile:
        return
    print(f"{indent}source cost      CPU per sample, per token; bytes read per sample; "
          "samples; planner's wait on it; held ahead at most (this process's loaders)",
          file=out)
    for name, p in profile.items():
        print(f"{indent}  {name:<14} {p['cpu_s_per_sample'] * 1e6:>10,.1f} us  "
              f"{p['cpu_s_per_token'] * 1e9:>9,.1f} ns  "
              f"{_fmt_bytes(p['bytes_per_sample']):>9}  {p['samples']:,}  "
              f"{p.get('consumer_wait_s', 0.0):.3f} s  "
              f"{_fmt_bytes(p.get('peak_held_bytes', 0))}", file=out)


def _print_serving(serving: Optional[dict], out, indent: str = "  ") -> None:
    """Per source: what answering the constructors' piece requests cost (Ray): CPU and
    bytes sent per token sent, rows transformed per piece, pieces answered from the
    planner's plans, units read, the cache."""
    serving = {n: s for n, s in (serving or {}).items() if s.get("pieces")}
    if not serving:
        return
    print(f"{indent}source serving   CPU and bytes sent per token sent; pieces; rows "
          "transformed per piece; pieces from plans; units read; cache now / at most",
          file=out)
    for name, s in serving.items():
        tokens = max(s["tokens_sent"], 1)
        print(f"{indent}  {name:<14} {s['cpu_s'] / tokens * 1e9:>9,.1f} ns  "
              f"{s['bytes_sent'] / tokens:>6.2f} B  {s['pieces']:,}  "
              f"{s['rows_transformed'] / s['pieces']:.2f}  "
              f"{s.get('pieces_from_plans', 0):,}  {s['units_read']:,}  "
              f"{_fmt_bytes(s['cached_bytes'])} / {_fmt_bytes(s['peak_cached_bytes'])}",
              file=out)


def _print_context(summary: dict, out) -> None:
    """Per source: mean context / bound and the share drift (docs/plan-format.md)."""
    if "source_context" not in summary:
        return
    seq_len = max(summary.get("max_seq_len", 0), 1)
    print("  context          mean context / bound, share drift (tokens received less "
          "the share; largest |drift| in seq_lens)", file=out)
    for name, ratio in summary["source_context"].items():
        drift = summary["source_drift"][name]
        worst = summary["source_drift_max"][name]
        print(f"    {name:<14} {ratio:.4f}   drift {drift:+,.0f} tokens, largest "
              f"{worst:,.0f} ({worst / seq_len:.2f} x {seq_len})", file=out)


def _skipped_files(summary: dict, name: str) -> str:
    files = summary.get("skipped_files", {}).get(name, 0)
    if not files:
        return ""
    unknown = summary.get("skipped_files_rows_unknown", {}).get(name, 0)
    return (f", files skipped {files}"
            + (f" ({unknown} that did not open: rows unknown)" if unknown else ""))


def _run(config, steps: int, report: Optional[str]) -> dict:
    every = max(1, steps // 10)

    def progress(s: dict) -> None:
        if s["steps"] == 1 or s["steps"] % every == 0 or s["steps"] == steps:
            print(f"step {s['steps']:>6}/{steps}  {s['tokens_per_s']:>12,.0f} tok/s  "
                  f"imbalance {s['step_imbalance'][-1]:.4f}", flush=True)

    if config.runtime["kind"] == "ray":
        from braid.ray_runtime.run import run_job

        summary = run_job(config, steps, progress)
    else:
        summary = _core.run_job(config, steps, progress)
    _print_summary(summary)
    if report:
        from braid.report import write_report

        paths = write_report(summary, report)
        print(f"report: {', '.join(paths)}")
    return summary


def _with_runtime(config, runtime: Optional[str]):
    return config if runtime is None else config.with_runtime_kind(runtime)


def _cmd_run(args: argparse.Namespace) -> int:
    config = _with_runtime(load_config(args.config), args.runtime)
    if args.dp is not None:
        config = config.with_dp(args.dp)
    _run(config, args.steps, args.report)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    data_dir = os.path.abspath(args.dir)
    demo = _core.make_demo_dataset(data_dir, seed=args.seed, seq_len=args.seq_len,
                                   dp=args.dp, micro_batches=args.micro_batches)
    print(f"demo data: {demo['docs']:,} documents, {demo['tokens']:,} tokens in "
          f"{len(demo['source_names'])} sources ({', '.join(demo['source_names'])}) "
          f"under {data_dir}")
    print(f"config: {demo['config_path']}  ({args.dp} simulated DP ranks, "
          f"{args.micro_batches} micro-batches of {args.seq_len} tokens per rank per step)")
    config = _with_runtime(load_config(demo["config_path"]), args.runtime)
    report = args.report or os.path.join(data_dir, "report")
    _run(config, args.steps, report)
    return 0


def _ray_connect(args: argparse.Namespace):
    from braid.ray_runtime import job as jobs
    from braid.ray_runtime._ray import ray

    if not ray.is_initialized():
        try:
            ray.init(address=args.address, log_to_driver=False, configure_logging=False)
        except ConnectionError as e:
            raise _core.ConfigError(f"--address: no Ray cluster at {args.address!r} ({e})")
    return jobs


def _cmd_status(args: argparse.Namespace) -> int:
    jobs = _ray_connect(args)
    names = [args.job] if args.job else jobs.jobs(args.namespace)
    if not names:
        print(f"no braid jobs in namespace {args.namespace!r}")
    for name in names:
        actors = jobs.status(name, args.namespace)
        if args.json:
            print(json.dumps({"job": name, "actors": actors}))
            continue
        print(f"job {name}: {len(actors)} actors")
        for a in actors:
            if "error" in a:
                print(f"  {a['name']:<48} not answering: {a['error']}")
                continue
            # A serving process's calls and cache are in its `source serving` lines.
            serving = ("requests", "cached_bytes") if a.get("source_serving") else ()
            extra = {k: v for k, v in a.items()
                     if k not in ("name", "role", "pid", "rss_bytes", "node",
                                  "source_profile", "source_allocation",
                                  "source_timeline", "source_serving", *serving)}
            print(f"  {a['name']:<48} node {a['node'][:12]} pid {a['pid']:<7} "
                  f"rss {_fmt_bytes(a['rss_bytes']):>9}  "
                  + " ".join(f"{k}={v}" for k, v in extra.items()))
            _print_profile(a.get("source_profile"), sys.stdout, indent="    ")
            _print_serving(a.get("source_serving"), sys.stdout, indent="    ")
            _print_allocation(a.get("source_allocation"), sys.stdout, indent="    ")
            _print_timeline(a.get("source_timeline"), sys.stdout, indent="    ")
    if args.job and not jobs.actor_names(args.job, args.namespace):
        print(f"braid: error: no actors of job {args.job!r} in namespace "
              f"{args.namespace!r}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    jobs = _ray_connect(args)
    names = jobs.stop(args.job, args.namespace)
    print(f"job {args.job}: stopped {len(names)} actors"
          + (": " + ", ".join(names) if names else ""))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    # A local path is made absolute here: Arrow reads a relative one as a URI without a
    # scheme and refuses it.
    path = args.path if "://" in args.path else os.path.abspath(args.path)
    info = _core.inspect(path, args.column or "")
    if args.json:
        print(json.dumps(info, sort_keys=True))
        return 0
    print(f"files: {len(info['files'])}   rows: {info['rows']:,}")
    for f in info["files"]:
        print(f"  {f['path']}  rows {f['rows']:,}  row groups {f['row_groups']}  "
              f"{_fmt_bytes(f['bytes'])}")
    print("schema:")
    for line in info["schema"].splitlines():
        print(f"  {line}")
    if not info["column"]:
        print("no list<int> token column; give --column for one")
        return 0
    docs = sum(info["buckets"]) + info["empty"]
    print(f"column '{info['column']}': {info['tokens']:,} tokens in {docs:,} documents"
          f" ({info['empty']} empty, {info['nulls']} null)")
    print(f"  tokens per document: min {info['min_tokens']}  median {info['p50_tokens']}"
          f"  p99 {info['p99_tokens']}  max {info['max_tokens']}")
    peak = max(info["buckets"], default=0)
    first = next((k for k, c in enumerate(info["buckets"]) if c), 0)
    for k, count in enumerate(info["buckets"]):
        if k < first:
            continue
        bar = "#" * (0 if peak == 0 else max(1 if count else 0, round(40 * count / peak)))
        print(f"  [{2 ** k:>7}, {2 ** (k + 1):>7})  {count:>9,}  {bar}")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:  # --- planner: calibrate ---
    from braid import calibrate

    try:
        fit = calibrate.calibrate(args.timings, args.config, args.out,
                                  intercept=not args.no_intercept)
    except calibrate.CalibrateError as e:
        print(f"braid: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(calibrate.format_fit(fit, intercept=not args.no_intercept))
    print(f"wrote {args.out} (balance.cost.attn, balance.cost.linear)")
    if (os.path.dirname(os.path.abspath(args.out))
            != os.path.dirname(os.path.abspath(args.config))):
        print("note: relative paths in the config now resolve from the new file's folder",
              file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="braid", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="planner only: one JSON line per step on stdout")
    plan.add_argument("config")
    plan.add_argument("--steps", type=int, required=True)
    plan.add_argument("--dp", type=int, help="override topology.dp")
    plan.add_argument("--state-in", help="resume from a state written by --state-out")
    plan.add_argument("--state-out", help="write the state after the last step")
    plan.set_defaults(func=_cmd_plan)

    run = sub.add_parser("run", help="the whole pipeline with simulated trainer ranks")
    run.add_argument("config")
    run.add_argument("--steps", type=int, default=100)
    run.add_argument("--dp", type=int, help="override topology.dp")
    run.add_argument("--report", help="write report.json and plots to this folder")
    run.add_argument("--runtime", choices=["local", "ray"],
                     help="override runtime.kind (ray: starts a local Ray if none runs)")
    run.set_defaults(func=_cmd_run)

    demo = sub.add_parser("demo", help="make a small multi-source dataset and run it")
    demo.add_argument("--dir", default=os.path.join("out", "demo"))
    demo.add_argument("--steps", type=int, default=60)
    demo.add_argument("--seed", type=int, default=1234)
    demo.add_argument("--seq-len", type=int, default=4096)
    demo.add_argument("--dp", type=int, default=8)
    demo.add_argument("--micro-batches", type=int, default=4)
    demo.add_argument("--report", help="report folder (default: DIR/report)")
    demo.add_argument("--runtime", choices=["local", "ray"],
                      help="override runtime.kind (ray: starts a local Ray if none runs)")
    demo.set_defaults(func=_cmd_demo)

    inspect = sub.add_parser("inspect", help="schema, files, rows, token-length histogram")
    inspect.add_argument("path", help="a source's files: a Parquet, JSON Lines or Arrow "
                         "(save_to_disk) file, a WebDataset .tar shard, a Megatron "
                         "dataset's prefix or .idx, a directory, glob or URI")
    inspect.add_argument("--column", help="token column (default: the first list<int>; "
                         "a WebDataset shard's: a JSON member or field, json:FIELD)")
    inspect.add_argument("--json", action="store_true", help="one JSON object instead")
    inspect.set_defaults(func=_cmd_inspect)

    # --- the Ray runtime's jobs (docs/distributed.md) ---
    status = sub.add_parser("status", help="a Ray job's actors: node, memory, progress")
    status.add_argument("job", nargs="?", help="the job's name (default: every job)")
    stop = sub.add_parser("stop", help="remove a Ray job's actors (e.g. a crashed job's)")
    stop.add_argument("job")
    for cmd in (status, stop):
        cmd.add_argument("--namespace", default="braid", help="runtime.namespace")
        cmd.add_argument("--address", default="auto", help="the Ray cluster (runtime.address)")
    status.add_argument("--json", action="store_true", help="one JSON object per job")
    status.set_defaults(func=_cmd_status)
    stop.set_defaults(func=_cmd_stop)

    # --- planner: calibrate (docs/planner.md) ---
    cal = sub.add_parser("calibrate", help="fit balance.cost.attn/linear from step timings")
    cal.add_argument("timings", help="CSV: step_time_s and seq_lens (or sum_l2, sum_l)")
    cal.add_argument("config")
    cal.add_argument("--out", required=True, help="the new config (YAML; .json: JSON)")
    cal.add_argument("--no-intercept", action="store_true",
                     help="fit without a fixed per-step term")
    cal.set_defaults(func=_cmd_calibrate)
    # --- end planner: calibrate ---
    return p


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split("\n")) or type(e).__name__


def _error(e: BaseException, code: int) -> int:
    print(f"braid: error: {_one_line(e)}", file=sys.stderr)
    return code


def _on_sigterm(signum, frame) -> None:
    raise _Terminated()


def _silence_stdout() -> None:
    # The reader is gone: send what is still buffered to /dev/null, so that the flush at
    # exit neither fails nor prints "Exception ignored".
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        print("braid: error: there is no 'braid bench': the benchmark harness lives in the "
              "repository's benchmarks/bench.py (a checkout, not the wheel), with the same "
              "options", file=sys.stderr)
        return EXIT_USAGE
    args = _parser().parse_args(argv)  # bad usage: argparse prints one line, exits 2
    return run_with_exit_codes(lambda: args.func(args))


def run_with_exit_codes(command: Callable[[], int],
                        errors: Optional[Dict[Type[BaseException], int]] = None) -> int:
    """Runs `command()` and returns its exit code, or the code of what it raised (the
    module's docstring), printing at most one line on stderr; SIGTERM raises at the next
    Python line while it runs in the main thread. `errors` maps more exception types to
    codes, checked first (benchmarks/bench.py: a loader that failed in its trainers)."""
    errors = errors or {}
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return command()
    except tuple(errors) as e:
        return _error(e, next(code for kind, code in errors.items() if isinstance(e, kind)))
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("braid: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _Terminated:
        print("braid: terminated (SIGTERM)", file=sys.stderr)
        return EXIT_TERMINATED
    except _core.ConfigError as e:
        return _error(e, EXIT_USAGE)
    except (_core.DataError, _core.StorageError) as e:
        return _error(e, EXIT_DATA)
    except MemoryError:
        print("braid: error: out of memory", file=sys.stderr)
        return EXIT_DATA
    except OSError as e:  # a file the command writes or reads itself (--state-out, ...)
        return _error(e, EXIT_DATA)
    except ValueError as e:  # a value the Python layer rejected
        return _error(e, EXIT_USAGE)
    except Exception as e:  # noqa: BLE001 - anything else is a bug, not bad input
        traceback.print_exc()
        print(f"braid: internal error (a bug in braid; please report it with the "
              f"traceback above): {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else
                          signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
