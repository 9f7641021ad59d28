"""The benchmark harness behind `benchmarks/bench.py`: Braid against what teams run today,
on the same mix, in one run.

- `baseline`: the per-rank PyTorch DataLoader baseline (every rank reads every source);
- `peers`: other loaders (LitData), converted with their own writers;
- `modes`: how a trainer process starts each loader, and what the harness prepares;
- `trainer`: a simulated synchronous data-parallel trainer rank (cost-model step times);
- `cost`: the cost model of a micro-batch (what the trainers pay, the harness replays);
- `procs`: the harness's processes: their memory (PSS) from /proc, their environment,
  a free port;
- `run`: the harness behind `benchmarks/bench.py` (docs/benchmarks.md).

It lives in the repository, not in the `braid` wheel: `braid` never imports it. Scripts
find it with `benchmarks/` on their path (the folder of `benchmarks/*.py`); the Python
processes it starts get that folder first on PYTHONPATH (`procs.python_env`) and run
`python -m harness.NAME`, from any working directory and under any interpreter.
"""
