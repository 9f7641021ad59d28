"""Messages per step of the Ray runtime at 64 to 4,096 ranks: direct fetching against
forwarding through relay constructors. A counting simulation driven by real plans (the
planner service plans each step; no Ray, no data is moved); docs/distributed.md,
"Forwarding for thousands of ranks", reads the table.

Every exchange is a keyed call: a request and a reply, 2 messages, counted at both ends.
Per rank count (dp = ranks / tp, --ranks-per-node ranks per node, one constructor per
node serving the buckets of its ranks) and per scheme:

  direct/bucket  what the runtime does today: each node's constructor asks the planner
                 for the slice of the step plan holding its buckets, then per bucket
                 it builds calls each source actor that hosts a source with pieces in
                 that bucket
  direct/node    the same fetches batched per node and step: one call per (node, source
                 actor) with pieces in any of the node's buckets
  fwd/G          nodes in groups of G; the group's first node is its relay: it asks the
                 planner for the group's slice of the plan and each needed source actor
                 for the group's pieces (one call each per step); every other node of the
                 group asks its relay for its slice (plan slice, states, its pieces)

Columns (means per step over --steps steps; MB = 10^6 bytes of array payload, Ray's own
framing not counted; the trainers' requests to their node's constructor are the same in
every scheme and not counted):

  src max   messages at the busiest source actor (the fan-out the tree cuts)
  src all   messages at all source actors
  planner   messages at the planner
  node max  messages at the busiest constructor (a relay, when forwarding)
  total     messages in all
  peers     most callers of one source actor
  MB src    piece bytes out of the source actors (each piece leaves its actor once)
  MB plan   bytes out of the planner (plans and the states before and after the step)
  MB node   bytes in and out of the busiest constructor
  MB total  bytes moved in all

Data: --sources N:S pairs, N sources spread round-robin over S source actors (as
runtime.source_actors does), generated with benchmarks/many_sources.py's writer (lognormal
document lengths, a long tail past seq_len) under --dir and reused.

    .venv/bin/python benchmarks/fanout.py \
        [--ranks 64,1024,4096] [--sources 16:4,306:32] [--groups 8,32] [--steps 3] \
        [--seq-len 4096] [--ranks-per-node 8] [--tp 1] [--micro-batches 1] \
        [--tokens-per-file 1000000] [--distinct 16] [--dir out/fanout] [--json PATH] \
        [--verify]

`--verify` fetches every request for real (the sources' SourceService) and checks the counted reply
bytes against the replies (slow at many ranks: for small runs and the test).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys
import time
from typing import Dict, List

import numpy as np

from braid import _core

# This folder is on sys.path (the script's), as many_sources.py needs for the harness.
_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("many_sources",
                                               os.path.join(_HERE, "many_sources.py"))
many_sources = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(many_sources)

# Bytes of a request that names only a step (and a node or a timeout): two int64.
_SMALL_REQUEST = 16


class Tally:
    """Messages and bytes per endpoint ("planner", ("src", k), ("node", n)) for one
    scheme and one step."""

    def __init__(self) -> None:
        self.msgs: Dict = collections.Counter()
        self.bytes_out: Dict = collections.Counter()
        self.bytes_in: Dict = collections.Counter()
        self.callers: Dict = collections.defaultdict(set)
        self.total_msgs = 0
        self.total_bytes = 0
        self.piece_bytes = 0  # piece replies out of the source actors
        self.whole_plan_bytes = 0  # direct: the planner's bytes with whole plans

    def call(self, caller, callee, request_bytes: int, reply_bytes: int) -> None:
        self.msgs[caller] += 2
        self.msgs[callee] += 2
        self.callers[callee].add(caller)
        self.bytes_out[caller] += request_bytes
        self.bytes_in[callee] += request_bytes
        self.bytes_out[callee] += reply_bytes
        self.bytes_in[caller] += reply_bytes
        self.total_msgs += 2
        self.total_bytes += request_bytes + reply_bytes
        if isinstance(callee, tuple) and callee[0] == "src":
            self.piece_bytes += reply_bytes

    def summary(self, nodes: int, actors: int) -> Dict:
        src = [self.msgs[("src", k)] for k in range(actors)]
        node = [self.msgs[("node", n)] for n in range(nodes)]
        return {
            "src_max": max(src), "src_all": sum(src), "planner": self.msgs["planner"],
            "node_max": max(node), "total": self.total_msgs,
            "node_max_bytes": max(self.bytes_in[("node", n)] + self.bytes_out[("node", n)]
                                  for n in range(nodes)),
            "peers": max(len(self.callers[("src", k)]) for k in range(actors)),
            "src_bytes": self.piece_bytes,
            "plan_bytes": self.bytes_out["planner"], "total_bytes": self.total_bytes,
            "whole_plan_bytes": self.whole_plan_bytes,
            "per_node": node, "per_source_actor": src,
        }


class StepParts:
    """One step's plan cut the way the schemes need it: per bucket, per source actor, the
    pieces, request bytes and reply bytes; per bucket, its words in the plan message."""

    def __init__(self, step: Dict, num_sources: int, source_actor_of: List[int],
                 services=None) -> None:
        plan = step["plan"]
        self.plan = plan
        self.plan_words = len(plan)
        self.state_bytes = len(step["state_before"].encode()) + \
            len(step["state_after"].encode())
        buckets = int(plan[2])  # a whole plan: every bucket held, in order
        # by_bucket[b][actor] = [pieces, request bytes, reply bytes]
        self.by_bucket: List[Dict[int, List[int]]] = []
        self.verified = 0
        for b in range(buckets):
            per_actor: Dict[int, List[int]] = {}
            for source, req in enumerate(_core.piece_requests(plan, b, num_sources)):
                if not len(req):
                    continue
                q = req.reshape(-1, 5)  # file, row, start, len, doc_tokens
                start, length, doc = q[:, 2], q[:, 3], q[:, 4]
                tokens = int(np.sum(np.minimum(start + length + 1, doc) - start))
                # A reply: int32 tokens (each piece's, plus its label token when the
                # document goes on), int64 offsets; no loss mask for these sources.
                reply = 4 * tokens + 8 * (len(q) + 1)
                if services is not None:
                    got = services.fetch({source: req})[source]
                    real = got[0].nbytes + got[1].nbytes + \
                        (0 if got[2] is None else got[2].nbytes)
                    if real != reply:
                        raise AssertionError(f"bucket {b} source {source}: counted "
                                             f"{reply} reply bytes, fetched {real}")
                    self.verified += 1
                acc = per_actor.setdefault(source_actor_of[source], [0, 0, 0])
                acc[0] += len(q)
                acc[1] += req.nbytes
                acc[2] += reply
            self.by_bucket.append(per_actor)

    def slice_bytes(self, buckets: List[int]) -> int:
        """Bytes of the plan's slice holding `buckets` (what the planner sends a node's
        constructor: _core.slice_step_plan), plus the states."""
        return _core.slice_step_plan(self.plan, buckets).nbytes + self.state_bytes

    def full_plan_bytes(self) -> int:
        return 8 * self.plan_words + self.state_bytes


def merged(parts: StepParts, buckets: List[int]) -> Dict[int, List[int]]:
    """Per source actor, [pieces, request bytes, reply bytes] over `buckets`."""
    out: Dict[int, List[int]] = {}
    for b in buckets:
        for actor, (p, req, rep) in parts.by_bucket[b].items():
            acc = out.setdefault(actor, [0, 0, 0])
            acc[0] += p
            acc[1] += req
            acc[2] += rep
    return out


def count_direct(parts: StepParts, node_buckets: List[List[int]], per_bucket: bool
                 ) -> Tally:
    t = Tally()
    for n, buckets in enumerate(node_buckets):
        node = ("node", n)
        # The runtime sends each node the slice of its buckets (SliceStepPlan); the
        # whole plan to every node, as before slices, is counted aside.
        t.call(node, "planner", _SMALL_REQUEST, parts.slice_bytes(buckets))
        t.whole_plan_bytes += parts.full_plan_bytes()
        groups = [[b] for b in buckets] if per_bucket else [buckets]
        for group in groups:
            for actor, (_, req, rep) in sorted(merged(parts, group).items()):
                t.call(node, ("src", actor), req, rep)
    return t


def count_forward(parts: StepParts, node_buckets: List[List[int]], group: int) -> Tally:
    t = Tally()
    for first in range(0, len(node_buckets), group):
        members = list(range(first, min(first + group, len(node_buckets))))
        relay = ("node", first)
        group_buckets = [b for n in members for b in node_buckets[n]]
        t.call(relay, "planner", _SMALL_REQUEST, parts.slice_bytes(group_buckets))
        for actor, (_, req, rep) in sorted(merged(parts, group_buckets).items()):
            t.call(relay, ("src", actor), req, rep)
        for n in members[1:]:
            pieces = sum(rep for _, _, rep in merged(parts, node_buckets[n]).values())
            t.call(("node", n), relay, _SMALL_REQUEST,
                   parts.slice_bytes(node_buckets[n]) + pieces)
    return t


def write_config(path: str, base: str, sources: int, ranks: int, tp: int, seq_len: int,
                 micro_batches: int) -> None:
    dp = ranks // tp
    config = {
        "seed": 7,
        "topology": {"dp": dp, "tp": tp},
        "batch": {"global_tokens": dp * seq_len * micro_batches, "seq_len": seq_len},
        "sources": [{"name": f"s{s:04d}", "path": os.path.join(base, f"s{s:04d}"),
                     "tokens_column": "input_ids",
                     "weight": float(1 + (s % 7))} for s in range(sources)],
    }
    with open(path, "w") as f:
        json.dump(config, f, indent=1)


def simulate(config_path: str, ranks: int, ranks_per_node: int, actors: int,
             groups: List[int], steps: int, verify: bool) -> Dict:
    config = _core.load_config(config_path)
    num_sources = len(config.source_names)
    source_actor_of = [i % actors for i in range(num_sources)]
    nodes = (ranks + ranks_per_node - 1) // ranks_per_node
    node_buckets: List[List[int]] = []
    for n in range(nodes):
        ranks_here = range(n * ranks_per_node, min((n + 1) * ranks_per_node, ranks))
        node_buckets.append(sorted({_core.rank_bucket(config, r) for r in ranks_here}))
    services = (_core.make_source_host(config, list(range(num_sources)))
                if verify else None)
    schemes = ["direct/bucket", "direct/node"] + [f"fwd/{g}" for g in groups]
    per_step: Dict[str, List[Dict]] = {s: [] for s in schemes}
    planner = _core.make_planner_service(config, "")
    plan_s = count_s = 0.0
    verified = 0
    for s in range(steps):
        t0 = time.monotonic()
        step = planner.plan(s, 600.0)
        t1 = time.monotonic()
        parts = StepParts(step, num_sources, source_actor_of, services)
        verified += parts.verified
        per_step["direct/bucket"].append(
            count_direct(parts, node_buckets, True).summary(nodes, actors))
        per_step["direct/node"].append(
            count_direct(parts, node_buckets, False).summary(nodes, actors))
        for g in groups:
            per_step[f"fwd/{g}"].append(
                count_forward(parts, node_buckets, g).summary(nodes, actors))
        plan_s += t1 - t0
        count_s += time.monotonic() - t1
    return {"ranks": ranks, "nodes": nodes, "sources": num_sources,
            "source_actors": actors, "steps": steps, "config": config_path,
            "node_buckets": node_buckets, "verified_replies": verified,
            "plan_seconds": plan_s, "count_seconds": count_s, "per_step": per_step}


def mean(rows: List[Dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def print_table(result: Dict) -> None:
    print(f"\nranks={result['ranks']} nodes={result['nodes']} "
          f"sources={result['sources']} source_actors={result['source_actors']} "
          f"(means of {result['steps']} steps)")
    print(f"{'scheme':<14} {'src max':>8} {'src all':>8} {'planner':>8} {'node max':>8} "
          f"{'total':>8} {'peers':>6} {'MB src':>8} {'MB plan':>8} {'MB node':>8} "
          f"{'MB total':>9}")
    for scheme, rows in result["per_step"].items():
        print(f"{scheme:<14} {mean(rows, 'src_max'):>8.0f} {mean(rows, 'src_all'):>8.0f} "
              f"{mean(rows, 'planner'):>8.0f} {mean(rows, 'node_max'):>8.0f} "
              f"{mean(rows, 'total'):>8.0f} {mean(rows, 'peers'):>6.0f} "
              f"{mean(rows, 'src_bytes') / 1e6:>8.1f} "
              f"{mean(rows, 'plan_bytes') / 1e6:>8.1f} "
              f"{mean(rows, 'node_max_bytes') / 1e6:>8.1f} "
              f"{mean(rows, 'total_bytes') / 1e6:>9.1f}", flush=True)
    rows = result["per_step"]["direct/node"]
    print(f"  (direct with the whole plan to every node, as before plan slices: MB plan "
          f"{mean(rows, 'whole_plan_bytes') / 1e6:.1f})", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="64,1024,4096")
    p.add_argument("--sources", default="16:4,306:32",
                   help="N:S pairs: N sources over S source actors")
    p.add_argument("--groups", default="8,32", help="nodes per relay (fwd/G)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--micro-batches", type=int, default=1, help="per rank per step")
    p.add_argument("--tokens-per-file", type=int, default=1_000_000)
    p.add_argument("--distinct", type=int, default=16,
                   help="at most this many distinct files; more sources hard-link them")
    p.add_argument("--dir", default=os.path.join("out", "fanout"))
    p.add_argument("--json", help="write every step's counts (per node too) here")
    p.add_argument("--verify", action="store_true",
                   help="fetch every request and check the counted reply bytes")
    args = p.parse_args()
    groups = [int(g) for g in args.groups.split(",") if g]
    os.makedirs(args.dir, exist_ok=True)
    results = []
    for pair in args.sources.split(","):
        n, _, s = pair.partition(":")
        n, s = int(n), int(s or 1)
        base = many_sources.make_data(args.dir, n, 1, args.tokens_per_file, "large", 16,
                                      max(1, args.distinct))
        for ranks in [int(r) for r in args.ranks.split(",")]:
            if ranks % args.tp:
                p.error(f"--ranks {ranks} is not a multiple of --tp {args.tp}")
            config = os.path.join(args.dir, f"config-n{n}-r{ranks}.json")
            write_config(config, base, n, ranks, args.tp, args.seq_len,
                         args.micro_batches)
            result = simulate(config, ranks, args.ranks_per_node, min(s, n), groups,
                              args.steps, args.verify)
            results.append(result)
            print_table(result)
            print(f"  planned in {result['plan_seconds']:.1f} s, counted in "
                  f"{result['count_seconds']:.1f} s"
                  + (f", {result['verified_replies']} replies fetched and checked"
                     if args.verify else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
