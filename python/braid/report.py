"""``braid run --report DIR``: report.json and PNG plots from a run summary. The plots
need matplotlib (``pip install 'braid[plots]'``); without it the report is report.json
alone."""

from __future__ import annotations

import json
import os
import sys
from typing import List


def write_report(summary: dict, directory: str) -> List[str]:
    """Writes DIR/report.json and, when matplotlib imports, the plots (else one line on
    stderr says how to get them); returns the paths written."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    report_path = os.path.join(directory, "report.json")
    with open(report_path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
        f.write("\n")
    paths.append(report_path)
    try:
        import matplotlib
    except ImportError:
        print("braid: no plots in the report: they need matplotlib "
              "(pip install 'braid[plots]')", file=sys.stderr)
        return paths
    matplotlib.use("Agg")
    paths.extend(_plots(summary, directory))
    return paths


def _plots(summary: dict, directory: str) -> List[str]:
    import matplotlib.pyplot as plt

    paths = []
    steps = list(range(len(summary["step_imbalance"])))

    def save(fig, name: str) -> None:
        fig.tight_layout()
        path = os.path.join(directory, name)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, summary["step_imbalance"], lw=1)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("max / mean rank cost")
    ax.set_title("Imbalance across DP ranks per step")
    save(fig, "imbalance.png")

    names = list(summary["source_share"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [summary["target_share"][n] for n in names], 0.4,
           label="target")
    ax.bar([x + 0.2 for x in xs], [summary["source_share"][n] for n in names], 0.4,
           label="achieved")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("share of tokens")
    ax.set_title("Mix: target vs achieved token share")
    ax.legend()
    save(fig, "source_share.png")

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, [s * 1000 for s in summary["step_seconds"]], lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("ms to deliver the step")
    ax.set_title("Loader time per step (all simulated ranks)")
    save(fig, "step_time.png")

    changes = summary.get("source_allocation")
    if changes:  # runtime.autoscale: each source's workers from each change to the next
        fig, ax = plt.subplots(figsize=(7, 3.5))
        last = max(len(steps) - 1, changes[-1]["step"])
        for name in changes[0]["sources"]:
            xs = [c["step"] for c in changes] + [last]
            ys = [c["sources"][name]["workers"] for c in changes]
            ax.step(xs, ys + ys[-1:], where="post", lw=1, label=name)
        ax.set_xlabel("step")
        ax.set_ylabel("pool threads (workers)")
        ax.set_title("Threads per source (runtime.autoscale; 0: idle)")
        ax.legend(fontsize="small")
        save(fig, "source_threads.png")

    timeline = summary.get("source_timeline")
    if timeline:  # per span of steps: each source's CPU and the planner's wait on it
        names = list(timeline[0]["sources"])
        starts = [span["steps"][0] for span in timeline]
        widths = [max(1, span["steps"][1] - span["steps"][0]) for span in timeline]
        for key, label, file in (
                ("cpu_s", "CPU ms per step (read, decode, transform)", "source_cpu.png"),
                ("wait_s", "planner's wait ms per step", "source_wait.png")):
            fig, ax = plt.subplots(figsize=(7, 3.5))
            for name in names:
                ys = [1000 * span["sources"][name][key] / w
                      for span, w in zip(timeline, widths)]
                ax.step(starts + [starts[-1] + widths[-1]], ys + ys[-1:], where="post",
                        lw=1, label=name)
            ax.set_xlabel("step")
            ax.set_ylabel(label.split(" (")[0])
            ax.set_title(f"Per source: {label}")
            ax.legend(fontsize="small")
            save(fig, file)
        # How busy each source's threads were (read CPU over its threads' time; a gap
        # where it had none): 1 means its threads were the limit. A read step's CPU
        # counts in the span it ends in, so each point is taken over the last 4 spans.
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for name in names:
            used = [(span["sources"][name].get("busy") or 0.0) *
                    span["sources"][name].get("thread_s", 0.0) for span in timeline]
            given = [span["sources"][name].get("thread_s", 0.0) for span in timeline]
            ys = []
            for i in range(len(timeline)):
                g = sum(given[max(0, i - 3):i + 1])
                ys.append(sum(used[max(0, i - 3):i + 1]) / g if g > 0 else float("nan"))
            ax.step(starts + [starts[-1] + widths[-1]], ys + ys[-1:], where="post", lw=1,
                    label=name)
        ax.set_xlabel("step")
        ax.set_ylabel("busy")
        ax.set_title("Per source: read CPU / its threads' time (over 4 spans)")
        ax.legend(fontsize="small")
        save(fig, "source_busy.png")
    return paths
