#!/usr/bin/env python3
"""What replicated shards cost: the default comparison's asp run (experiments/configs/default.toml,
seed 1) with cluster.replicas = 1 and = 2, alternated round by round (the order swapped every
round), each a real run through the launcher. Writes runs/bench/replicas.json: per round the
samples/s of both and their ratio, and the medians.
  experiments/bench_replicas.py [--rounds 5] [--config CONFIG] [--set KEY=VALUE ...]"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def one_run(config, replicas, sets, runs):
    cmd = [sys.executable, str(ROOT / "experiments" / "launch.py"), "run", str(config), "--runs-dir", str(runs), "--no-plots",
           "--set", "cluster.mode=asp", "--set", "seed=1", "--set", f"cluster.replicas={replicas}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    summaries = {p.resolve() for p in pathlib.Path(runs).glob("*/*/run/summary.json")}  # (latest links to it)
    if p.returncode != 0 or len(summaries) != 1:
        sys.exit(f"bench_replicas: the run with cluster.replicas = {replicas} failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    s = json.loads(summaries.pop().read_text())
    return {"samples_per_s": s["samples_per_s"], "final_test_acc": s["final_test_acc"], "wall_s": s["wall_s"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--config", default=str(ROOT / "experiments" / "configs" / "default.toml"))
    ap.add_argument("--set", action="append", default=[], help="another KEY=VALUE for both runs")
    ap.add_argument("--json", default=str(ROOT / "runs" / "bench" / "replicas.json"))
    a = ap.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="pslab-bench-replicas-") as tmp:
        for r in range(a.rounds):
            got = {}
            for replicas in ((1, 2) if r % 2 == 0 else (2, 1)):
                got[replicas] = one_run(a.config, replicas, a.set, pathlib.Path(tmp) / f"r{r}-{replicas}")
            ratio = got[2]["samples_per_s"] / got[1]["samples_per_s"]
            rounds.append({"round": r + 1, "replicas_1": got[1], "replicas_2": got[2], "ratio": ratio})
            print(f"[bench_replicas] round {r + 1}: {got[1]['samples_per_s']:,.0f} vs {got[2]['samples_per_s']:,.0f} "
                  f"samples/s, ratio {ratio:.2f}", flush=True)
    out = {"config": a.config, "mode": "asp", "seed": 1, "sets": a.set, "rounds": rounds,
           "median_samples_per_s_1": statistics.median(x["replicas_1"]["samples_per_s"] for x in rounds),
           "median_samples_per_s_2": statistics.median(x["replicas_2"]["samples_per_s"] for x in rounds),
           "median_ratio": statistics.median(x["ratio"] for x in rounds)}
    pathlib.Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"[bench_replicas] median ratio {out['median_ratio']:.2f} over {a.rounds} rounds -> {a.json}")


if __name__ == "__main__":
    main()
