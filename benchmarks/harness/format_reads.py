"""One file format read through Braid's source loader against the format's own reader,
on the same files, one thread each (benchmarks/formats_*.py).

Braid reads twice per round: counting the rows when the source opens, and with
runtime.length_cache holding the counts of an earlier open. The readers take turns, so a
change in the machine's load falls on all of them; each keeps its best run, and each
round's own ratio is given too (their median). A Braid
process keeps the counts it took of each unchanged file, so each counting round reads
the files under new names (hard links in a folder of its own), which it has not counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable, Dict, List, Tuple

from braid import _core

_READ = """
import json, sys
from braid import _core
job = json.load(sys.stdin)
cfg = _core.parse_config(json.dumps(job["config"]), "/")
r = _core.read_source(cfg, 0, job["rows"], job["payloads"])
json.dump({k: r[k] for k in ("samples", "payload_tokens", "seconds")}, sys.stdout)
"""


def read_in_fresh_process(config: Dict[str, Any], rows: int, payloads: bool = True,
                          env: Dict[str, str] | None = None) -> Dict[str, Any]:
    """`_core.read_source(config, 0, rows, payloads)` in a new Python process (nothing
    that this one opened or counted is known there), with `env` added to this process's
    environment: its samples, payload_tokens and seconds (the read's own timing, opening
    the source included, the process's start not)."""
    out = subprocess.run([sys.executable, "-c", _READ], check=True, capture_output=True,
                         text=True, env={**os.environ, **(env or {})},
                         input=json.dumps({"config": config, "rows": rows,
                                           "payloads": payloads}))
    return json.loads(out.stdout)


_LOADER = """
import hashlib, json, pickle, sys, time
import braid
job = json.load(sys.stdin)
if job["warm"] is not None:  # the process's one-time costs, paid on a small source
    next(iter(braid.Loader(job["warm"], rank=0, world_size=1)))
start = time.perf_counter()
loader = braid.Loader(job["config"], rank=0, world_size=1)
if job["state"] is not None:
    with open(job["state"], "rb") as f:
        loader.load_state_dict(pickle.load(f))
it = iter(loader)
for _ in range(job["skip"]):
    next(it)
if job["save"] is not None:
    with open(job["save"], "wb") as f:
        pickle.dump(loader.state_dict(), f)
seconds, digests = None, []
for k in range(job["batches"]):
    batch = next(it)
    if seconds is None:
        seconds = time.perf_counter() - start
    h = hashlib.sha256()
    for name in sorted(batch):
        h.update(name.encode() + batch[name].numpy().tobytes())
    digests.append(h.hexdigest())
json.dump({"seconds": seconds, "batches": digests}, sys.stdout)
"""


def loader_in_fresh_process(config: Dict[str, Any], state: str | None = None,
                            batches: int = 1, skip: int = 0, save: str | None = None,
                            warm: Dict[str, Any] | None = None) -> Dict[str, Any]:
    """A `braid.Loader(config)` (rank 0 of 1) in a new Python process, restored from the
    pickled state at `state` when given: `skip` batches taken, its state then pickled to
    `save` when given, then `batches` more. Returns `seconds` (from the Loader's making
    to the first of those, load_state_dict included; after `warm`'s first batch in the
    same process when given, so the process's one-time costs are not in it) and
    `batches`, each one's digest."""
    out = subprocess.run([sys.executable, "-c", _LOADER], check=True, capture_output=True,
                         text=True,
                         input=json.dumps({"config": config, "state": state, "skip": skip,
                                           "save": save, "batches": batches,
                                           "warm": warm}))
    return json.loads(out.stdout)


def compare(top: str, root: str, tokens_column: str, rows: int, tokens: int,
            reference: Callable[[List[str]], Tuple[int, float]], repeat: int,
            title: str, ref_name: str, unit: str) -> None:
    """Reads the source at `root` (its files hold `rows` rows of `tokens` token ids in
    `tokens_column`) and `reference(paths)` (-> tokens, seconds) `repeat` times in turn and
    prints each rate and Braid's ratio to the reference. `top` holds the length cache."""
    paths = sorted(os.path.join(root, p) for p in os.listdir(root))

    def config(folder, **runtime):
        return _core.parse_config(json.dumps({
            "seed": 1, "batch": {"global_tokens": 4096, "seq_len": 4096},
            "runtime": runtime,
            "sources": [{"name": "s", "path": folder, "tokens_column": tokens_column,
                         "workers": 1}]}), "/")

    def braid_read(cfg):
        r = _core.read_source(cfg, 0, rows)
        assert r["samples"] == rows and r["payload_tokens"] == tokens
        return r["payload_tokens"], r["seconds"]

    def new_names(round_):  # the same files, not yet counted by this process
        folder = os.path.join(top, f"round-{round_}")
        os.makedirs(folder)
        for p in paths:
            os.link(p, os.path.join(folder, os.path.basename(p)))
        return folder

    kept = config(root, length_cache=os.path.join(top, "counts"))
    braid_read(kept)  # keeps the counts
    runs = {"ref": [], "counted": [], "kept": []}
    for round_ in range(repeat):
        runs["ref"].append(reference(paths))
        runs["counted"].append(braid_read(config(new_names(round_))))
        runs["kept"].append(braid_read(kept))
    ref_tok, ref_s = min(runs["ref"], key=lambda r: r[1])
    mb = sum(os.path.getsize(p) for p in paths) / 1e6
    print(f"{title}: {rows:,} {unit} in {len(paths)} files, {tokens / 1e6:.1f}M tokens, "
          f"{mb:.0f} MB on disk, one thread")
    print(f"    {ref_name:<36}{ref_tok / ref_s / 1e6:8.2f} M tokens/s")
    for name, key in ((f"Braid, counting the {unit}", "counted"),
                      ("Braid, counts in runtime.length_cache", "kept")):
        br_tok, br_s = min(runs[key], key=lambda r: r[1])
        assert ref_tok == br_tok == tokens
        # Each round's own ratio (the readers ran back to back): less swayed by a change
        # in the machine's load between rounds than the best runs are.
        rounds = sorted(r[1] / b[1] for r, b in zip(runs["ref"], runs[key]))
        print(f"    {name:<36}{br_tok / br_s / 1e6:8.2f} M tokens/s   ratio "
              f"{(br_tok / br_s) / (ref_tok / ref_s):6.3f}   (target >= 1.0; median of "
              f"rounds {rounds[len(rounds) // 2]:.3f})")
