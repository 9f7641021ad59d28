"""The job of the serving benchmarks (serve_other_nodes.py, serve_threads.py): the
hetero workload's books source alone (raw text tokenized in the loader), at dp=8 and
64 sequences a step, its files made by benchmarks/workloads.py when missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def books_config(workloads_dir: str, seq_len: int) -> dict:
    """The config: `workloads_dir`/hetero's seed, tokenizer and books source (weight 1),
    dp=8, global_tokens 64 * seq_len."""
    subprocess.run([sys.executable, os.path.join(BENCHMARKS, "workloads.py"), "hetero",
                    "--dir", workloads_dir], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    with open(os.path.join(workloads_dir, "hetero", "hetero.json")) as f:
        hetero = json.load(f)
    books = next(s for s in hetero["sources"] if s["name"] == "books")
    return {"seed": hetero["seed"], "tokenizer": hetero["tokenizer"],
            "topology": {"dp": 8},
            "batch": {"global_tokens": 64 * seq_len, "seq_len": seq_len},
            "sources": [dict(books, weight=1.0)]}


def digest_replies(replies: dict, digest) -> None:
    """Adds a host.fetch() reply's tokens and offsets, source by source, to `digest`."""
    for source in sorted(replies):
        for array in replies[source][:2]:  # tokens, offsets
            digest.update(array.tobytes())
