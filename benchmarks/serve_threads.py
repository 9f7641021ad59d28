"""A source host answering piece fetches (the Ray runtime's `source_actors` layout, and
any fetch of a row no held plan has) with one thread against the pool's threads: the
rows of a fetch that need their transform (raw text tokenized in the loader) are
transformed side by side on the host's pool.

Plans come first, from a planner service over the token counts; then each setting's
source host (`_core.make_source_host` over a config whose `runtime.threads` is 1 or
`--threads`) is asked for every bucket's pieces of every step, as the constructors ask,
in a fresh host per run. It prints per setting the fetches' wall time, the host's
serving CPU and the rows it transformed, alternating the settings, and checks that both
sent the same bytes.

The workload is benchmarks/workloads.py `hetero`'s books source alone, made when missing.

    .venv/bin/python benchmarks/serve_threads.py [--steps 12] [--threads 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

from harness import books


def plans(config: dict, steps: int) -> list:
    """Per step, per bucket, the piece requests of each source (piece_requests)."""
    from braid import _core

    cfg = _core.parse_config(json.dumps(config), os.getcwd())
    planner = _core.make_planner_service(cfg, read_payloads=False)
    n = len(config["sources"])
    out = []
    try:
        for step in range(steps):
            plan = planner.plan(step, 300.0, None)["plan"]
            out.append([{s: r for s, r in enumerate(_core.piece_requests(plan, b, n))
                         if len(r)} for b in range(config["topology"]["dp"])])
    finally:
        planner.stop()
    return out


def serve(config: dict, asked_by_step: list) -> dict:
    from braid import _core

    cfg = _core.parse_config(json.dumps(config), os.getcwd())
    host = _core.make_source_host(cfg, list(range(len(config["sources"]))))
    digest = hashlib.sha1()
    start = time.perf_counter()
    for buckets in asked_by_step:
        for asked in buckets:
            if asked:
                replies = host.fetch(asked)
                books.digest_replies(replies, digest)
    wall = time.perf_counter() - start
    serving = host.status()["source_serving"]
    total = {k: sum(s[k] for s in serving.values())
             for k in ("cpu_s", "tokens_sent", "rows_transformed", "units_read")}
    total.update(wall_s=wall, digest=digest.hexdigest())
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join("out", "workloads"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    config = books.books_config(args.dir, args.seq_len)
    asked = plans(config, args.steps)
    settings = (("1 thread", 1), (f"{args.threads} threads", args.threads))
    print(f"{'setting':<12} {'fetch s':>8} {'CPU s':>7} {'tokens':>9} "
          f"{'transformed':>11} {'units read':>10}")
    rows = {name: [] for name, _ in settings}
    for _ in range(args.repeat):
        for name, threads in settings:
            t = serve(dict(config, runtime={"threads": threads}), asked)
            rows[name].append(t)
            print(f"{name:<12} {t['wall_s']:>8.3f} {t['cpu_s']:>7.3f} "
                  f"{t['tokens_sent']:>9} {t['rows_transformed']:>11} "
                  f"{t['units_read']:>10}", flush=True)
    digests = {t["digest"] for v in rows.values() for t in v}
    if len(digests) != 1:
        raise AssertionError(f"the settings sent different replies: {digests}")
    best = {k: min(v, key=lambda t: t["wall_s"]) for k, v in rows.items()}
    one, many = (best[name] for name, _ in settings)
    print(f"fetch wall, 1 thread / {args.threads} threads (best of {args.repeat} each): "
          f"{one['wall_s'] / max(1e-9, many['wall_s']):.2f}x")


if __name__ == "__main__":
    main()
