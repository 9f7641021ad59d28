"""`braid bench`: Braid against what teams run today, on the same mix, in one run.

- `baseline`: the per-rank PyTorch DataLoader baseline (every rank reads every source);
- `peers`: other loaders (LitData), converted with their own writers;
- `modes`: how a trainer process starts each loader, and what the harness prepares;
- `trainer`: a simulated synchronous data-parallel trainer rank (cost-model step times);
- `cost`: the cost model of a micro-batch (what the trainers pay, and the harness replays);
- `procs`: memory of process trees (PSS) from /proc, a free port;
- `run`: the harness behind `braid bench` (docs/benchmarks.md).

Nothing here is imported by `import braid` or `braid.Loader`.
"""
