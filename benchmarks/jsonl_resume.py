"""Resuming inside a large compressed JSON Lines file: the first batch of a `braid.Loader`
resumed from a state saved deep in the file, against the first batch of a fresh one, each
in a new process.

One `.jsonl.zst` file of `--records` token-list records (formats_jsonl.py's: 60,000 are
71 MB, 180 MB of JSON), read in 4 MiB blocks of records (shuffle_window_bytes); a
loader saves its state after `--at` of an epoch's micro-batches; then, alternately
`--repeat` times, a fresh process resumes from it and one starts from the beginning, and
each times its first batch (load_state_dict included, the process's one-time costs paid
first on a small source; the counts are in runtime.length_cache, so neither counts the
file). The resumed loader reopens the file
and passes the records before its block: its extra time over the fresh start is that
pass. Prints both and their ratio, and checks the resumed batches equal the batches a
loader that ran on reaches.

    .venv/bin/python benchmarks/jsonl_resume.py [--records 60000] [--at 0.85]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile

from formats_jsonl import write_files
from harness.format_reads import loader_in_fresh_process


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--at", type=float, default=0.85,
                    help="share of the epoch to resume at")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="braid-jsonl-resume-") as top:
        root = os.path.join(top, "data")
        os.makedirs(root)
        tokens = write_files(root, ".zst", args.records, 1, seed=4)
        seq = 4096

        def config(folder):
            return {"seed": 1, "batch": {"global_tokens": 16 * seq, "seq_len": seq},
                    "runtime": {"length_cache": os.path.join(top, "counts")},
                    "sources": [{"name": "s", "path": folder,
                                 "tokens_column": "input_ids"}]}

        # A small source each process reads first: its one-time costs are not timed.
        warm = os.path.join(top, "warm")
        os.makedirs(warm)
        write_files(warm, "", 400, 1, seed=5)
        job = dict(config=config(root), warm=config(warm))
        state = os.path.join(top, "state.pkl")
        skip = int(args.at * tokens / seq)  # micro-batches: about that share of the file
        # The state there, and the batches after it of a loader that runs on.
        ran_on = loader_in_fresh_process(**job, skip=skip, save=state, batches=3)
        runs = {"resume": [], "fresh": []}
        for _ in range(args.repeat):
            resumed = loader_in_fresh_process(**job, state=state, batches=3)
            assert resumed["batches"] == ran_on["batches"], "a resumed batch differs"
            runs["resume"].append(resumed["seconds"])
            runs["fresh"].append(loader_in_fresh_process(**job)["seconds"])
        mb = os.path.getsize(os.path.join(root, os.listdir(root)[0])) / 1e6
        resume, fresh = min(runs["resume"]), min(runs["fresh"])
        print(f"one .jsonl.zst file of {args.records:,} records ({mb:.0f} MB, "
              f"{tokens / 1e6:.1f}M tokens), resumed {skip:,} micro-batches of {seq} "
              f"tokens in (about {args.at:.0%} of it); best of {args.repeat}")
        print(f"    first batch, fresh start      {fresh:7.3f} s")
        print(f"    first batch, resumed          {resume:7.3f} s   "
              f"ratio {resume / fresh:6.2f}")


if __name__ == "__main__":
    main()
