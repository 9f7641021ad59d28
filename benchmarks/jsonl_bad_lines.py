"""A JSON Lines file with lines that do not parse, read under on_error: skip, against the
same file without them: what the bad lines cost Braid's reader.

One plain `.jsonl` file of `--records` token-list records (formats_jsonl.py's: 60,000
are 180 MB), and a copy with every `--every`-th record replaced by a line that does not
parse; each read whole by a source loader (one worker, `runtime.length_cache` holding
the counts) in a new process, alternately `--repeat` times. Prints the best of each, the
ratio, and checks that the copy yields every other record.

    .venv/bin/python benchmarks/jsonl_bad_lines.py [--records 60000] [--every 1000]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from formats_jsonl import write_files
from harness.format_reads import read_in_fresh_process


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="braid-jsonl-bad-") as top:
        clean, bad = os.path.join(top, "clean"), os.path.join(top, "bad")
        os.makedirs(clean)
        os.makedirs(bad)
        write_files(clean, "", args.records, 1, seed=4)
        name = os.listdir(clean)[0]
        with open(os.path.join(clean, name)) as f:
            lines = f.read().splitlines()
        broken = set(range(args.every // 2, len(lines), args.every))
        with open(os.path.join(bad, name), "w") as f:
            f.write("".join(('{"input_ids": [1,, 2]}' if i in broken else line) + "\n"
                            for i, line in enumerate(lines)))

        def config(folder):
            return {"seed": 1, "batch": {"global_tokens": 4096, "seq_len": 4096},
                    "runtime": {"length_cache": os.path.join(top, "counts")},
                    "sources": [{"name": "s", "path": folder,
                                 "tokens_column": "input_ids", "workers": 1,
                                 "on_error": "skip"}]}

        for folder in (clean, bad):  # counted once, kept
            read_in_fresh_process(config(folder), len(lines))
        lost = sum(len(json.loads(lines[i])["input_ids"]) for i in broken)
        runs = {"clean": [], "bad": []}
        tokens = {}
        for _ in range(args.repeat):
            for key, folder in (("clean", clean), ("bad", bad)):
                r = read_in_fresh_process(config(folder), len(lines))
                tokens[key] = r["payload_tokens"]
                runs[key].append(r["seconds"])
        # Every record but the bad ones (each skipped in its place) arrived.
        assert tokens["bad"] == tokens["clean"] - lost, (tokens, lost)
        mb = os.path.getsize(os.path.join(clean, name)) / 1e6
        best = {k: min(v) for k, v in runs.items()}
        print(f"one .jsonl file of {len(lines):,} records ({mb:.0f} MB), "
              f"{len(broken)} of them (every {args.every:,}th) not JSON in the copy; "
              f"on_error: skip, one worker, best of {args.repeat}")
        print(f"    clean file                    {best['clean']:7.2f} s")
        print(f"    with the bad lines            {best['bad']:7.2f} s   ratio "
              f"{best['bad'] / best['clean']:5.2f}")


if __name__ == "__main__":
    main()
