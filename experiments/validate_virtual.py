#!/usr/bin/python3
"""The virtual cluster against real runs of one config, measured alternately on this machine.

  experiments/validate_virtual.py [CONFIG] [--rounds N] [--out FILE]

Each round: `launch.py calibrate CONFIG` (two short real runs: the cost model as the machine is
now), the config in the virtual cluster with that calibration, then the config for real. Per mode
it reports the medians over the rounds of samples/s, asp's (and ssp's) mean staleness and the
final test accuracy, virtual beside real, with the ratios; writes them as JSON (default
runs/bench/virtual.json). The acceptance of the virtual cluster: samples/s within 20%, asp's mean
staleness within 25%, final accuracy within 1 point."""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
LAUNCH = REPO / "experiments" / "launch.py"


def launch(*args):
    r = subprocess.run([sys.executable, str(LAUNCH), *map(str, args)], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"validate_virtual: launch.py {' '.join(map(str, args))} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def summaries(runs):
    inv = next(d for d in sorted(pathlib.Path(runs).glob("*/*")) if d.is_dir() and not d.is_symlink())
    return {json.loads((d / "summary.json").read_text())["mode"]: json.loads((d / "summary.json").read_text())
            for d in inv.iterdir() if (d / "summary.json").exists()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default=str(REPO / "experiments" / "configs" / "default.toml"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "runs" / "bench" / "virtual.json"))
    a = ap.parse_args()
    rows = {"virtual": [], "real": []}
    # One run per mode (seed 1), evaluated once a second: a time-based evaluation costs the
    # virtual and the real run alike, so their samples/s compare.
    same = ["--set", "seed=1", "--set", "eval.every_epochs=0", "--set", "eval.interval_s=1"]
    with tempfile.TemporaryDirectory(prefix="pslab-validate-") as tmp:
        tmp = pathlib.Path(tmp)
        for i in range(a.rounds):
            cal = tmp / f"cal{i}.json"
            launch("calibrate", a.config, *same, "--runs-dir", tmp / f"calruns{i}", "--out", cal)
            launch("run", a.config, *same, "--set", 'cluster.launcher="virtual"', "--calibration", cal,
                   "--runs-dir", tmp / f"virtual{i}", "--no-plots")
            launch("run", a.config, *same, "--runs-dir", tmp / f"real{i}", "--no-plots")
            rows["virtual"].append(summaries(tmp / f"virtual{i}"))
            rows["real"].append(summaries(tmp / f"real{i}"))
            print(f"round {i + 1}/{a.rounds} done", flush=True)
    modes = sorted({m for kind in rows for r in rows[kind] for m in r})
    result = {"config": a.config, "rounds": a.rounds, "modes": {}}
    print(f"{'mode':<10} {'samples/s virtual':>18} {'real':>10} {'ratio':>6}   {'staleness v':>11} {'real':>6}   "
          f"{'acc v':>7} {'real':>7}")
    for m in modes:
        def med(kind, f):
            vals = [f(r[m]) for r in rows[kind] if m in r and f(r[m]) is not None]
            return statistics.median(vals) if vals else None
        sps = {k: med(k, lambda s: s["samples_per_s"]) for k in rows}
        stale = {k: med(k, lambda s: (s.get("staleness") or {}).get("mean")) for k in rows}
        acc = {k: med(k, lambda s: s["final_test_acc"]) for k in rows}
        # (a run that failed, or a mode missing from a round, has no figure: None, and no ratio)
        entry = {"samples_per_s": sps, "samples_per_s_ratio": ratio(sps["virtual"], sps["real"]),
                 "staleness_mean": stale, "final_test_acc": acc,
                 "accuracy_points": 100 * (acc["virtual"] - acc["real"]) if None not in acc.values() else None,
                 "each_round": {k: [r.get(m, {}).get("samples_per_s") for r in rows[k]] for k in rows}}
        if stale["real"]:  # (0 under bsp: no ratio)
            entry["staleness_ratio"] = ratio(stale["virtual"], stale["real"])
        result["modes"][m] = entry
        print(f"{m:<10} {fmt(sps['virtual'], 18, ',.0f')} {fmt(sps['real'], 10, ',.0f')} "
              f"{fmt(entry['samples_per_s_ratio'], 6, '.2f')}   {fmt(stale['virtual'], 11, '.2f')} {fmt(stale['real'], 6, '.2f')}   "
              f"{fmt(acc['virtual'] and 100 * acc['virtual'], 6, '.2f')}% {fmt(acc['real'] and 100 * acc['real'], 6, '.2f')}%")
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {out}")


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(x, width, spec):
    return f"{x:>{width}{spec}}" if x is not None else f"{'-':>{width}}"


if __name__ == "__main__":
    main()
