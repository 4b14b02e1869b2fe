#!/usr/bin/python3
"""Convergence plots of pslab runs: test accuracy and training loss against wall-clock time
and epochs. Reads <run>/metrics/*.jsonl; writes <run>/plots/*.png (or --out for overlays).

    plot.py RUN_DIR [RUN_DIR ...] [--out DIR]
"""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"plot.py: {path}:{n}: not a JSON line: {e}")
    return rows


def load_run(run):
    run = pathlib.Path(run)
    files = sorted((run / "metrics").glob("*.jsonl"))
    if not files:
        sys.exit(f"plot.py: {run}/metrics has no *.jsonl files")
    rows = [r for f in files for r in read_jsonl(f)]
    return run.name, rows


def plot(runs, out):
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for label, rows in runs:
        ev = [r for r in rows if r.get("kind") == "eval" and "test_acc" in r]
        tr = [r for r in rows if r.get("kind") == "train"]
        axes[0][0].plot([r["t"] for r in ev], [100 * r["test_acc"] for r in ev], marker="o", label=label)
        axes[0][1].plot([r["epoch"] for r in ev], [100 * r["test_acc"] for r in ev], marker="o", label=label)
        axes[1][0].plot([r["t"] for r in tr], [r["loss"] for r in tr], label=label, lw=0.8)
        axes[1][1].plot([r["epoch"] for r in tr], [r["loss"] for r in tr], label=label, lw=0.8)
    for ax, (x, y) in zip(axes.flat, [("wall-clock time (s)", "test accuracy (%)"), ("epoch", "test accuracy (%)"),
                                      ("wall-clock time (s)", "training loss"), ("epoch", "training loss")]):
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("convergence")
    fig.tight_layout()
    path = out / "convergence.png"
    fig.savefig(path, dpi=110)
    print(f"plot.py: wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories")
    ap.add_argument("--out", help="where to write the PNGs (default: <run>/plots for one run)")
    a = ap.parse_args()
    runs = [load_run(r) for r in a.runs]
    out = pathlib.Path(a.out) if a.out else pathlib.Path(a.runs[0]) / "plots"
    plot(runs, out)


if __name__ == "__main__":
    main()
