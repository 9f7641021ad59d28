"""The first node's host of a Ray job answering another node's piece fetches: from the
payloads of the plans its planner holds against reading and transforming the rows again.

On the Ray runtime's default placement the first node's host process plans from streams
that read the payloads (its own node's constructor builds from them) and serves by key
the pieces every other node's constructor fetches. This drives that process's two
services in one process, as its actor does: the planner service with payloads
(`_core.make_planner_service(read_payloads=True)`) and the source host
(`_core.make_source_host`), one with `serve_from_plans(planner)` and one without. Each
step it takes the plan and fetches the pieces of the buckets of the other node (the
second half of the buckets) from the source host, as their constructor does; then it
prints, per setting, the host's serving CPU per token sent, the rows it transformed and
those it took from the plans, and the fetches' wall time, alternating the settings.

The workload is benchmarks/workloads.py `hetero`'s books source alone (raw text
tokenized in the loader), made when missing.

    .venv/bin/python benchmarks/serve_other_nodes.py [--steps 24] [--seq-len 2048]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

from harness import books


def run(config: dict, steps: int, from_plans: bool) -> dict:
    from braid import _core

    cfg = _core.parse_config(json.dumps(config), os.getcwd())
    num_sources = len(config["sources"])
    planner = _core.make_planner_service(cfg, read_payloads=True)
    host = _core.make_source_host(cfg, list(range(num_sources)))
    if from_plans:
        host.serve_from_plans(planner)
    buckets = config["topology"]["dp"]
    others = range(buckets // 2, buckets)  # the other node's buckets
    fetch_s = 0.0
    digest = hashlib.sha1()  # of every reply: the two settings must send the same bytes
    try:
        for step in range(steps):
            plan = planner.plan(step, 120.0, None)["plan"]
            start = time.perf_counter()
            for b in others:
                asked = {s: r for s, r in
                         enumerate(_core.piece_requests(plan, b, num_sources)) if len(r)}
                if asked:
                    replies = host.fetch(asked)
                    books.digest_replies(replies, digest)
            fetch_s += time.perf_counter() - start
    finally:
        planner.stop()
    serving = host.status()["source_serving"]
    total = {k: sum(s[k] for s in serving.values())
             for k in ("cpu_s", "tokens_sent", "pieces", "rows_transformed",
                       "pieces_from_plans", "units_read")}
    total["fetch_s"] = fetch_s
    total["digest"] = digest.hexdigest()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join("out", "workloads"))
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    config = books.books_config(args.dir, args.seq_len)
    print(f"{'setting':<12} {'ns/token':>9} {'fetch s':>8} {'pieces':>7} "
          f"{'transformed':>11} {'from plans':>10} {'units read':>10}")
    rows = {"read again": [], "from plans": []}
    for _ in range(args.repeat):
        for setting, from_plans in (("read again", False), ("from plans", True)):
            t = run(config, args.steps, from_plans)
            rows[setting].append(t)
            print(f"{setting:<12} {1e9 * t['cpu_s'] / max(1, t['tokens_sent']):>9.0f} "
                  f"{t['fetch_s']:>8.3f} {t['pieces']:>7} {t['rows_transformed']:>11} "
                  f"{t['pieces_from_plans']:>10} {t['units_read']:>10}", flush=True)
    digests = {t["digest"] for v in rows.values() for t in v}
    if len(digests) != 1:
        raise AssertionError(f"the settings sent different replies: {digests}")
    best = {k: min(v, key=lambda t: t["cpu_s"]) for k, v in rows.items()}
    print(f"serving CPU, read again / from plans (best of {args.repeat} each): "
          f"{best['read again']['cpu_s'] / max(1e-9, best['from plans']['cpu_s']):.1f}x")


if __name__ == "__main__":
    main()
