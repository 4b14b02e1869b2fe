#!/usr/bin/env python3
"""pslab's CPU benchmarks against another commit, side by side.

Builds BASE (a commit, tag or branch) in a git worktree of its own (runs/base-<commit>/, kept
for the next call), then runs each benchmark from BASE's build and from this checkout's build
in turn, round by round (BASE first in even rounds, this build first in odd ones), and reports
each figure's medians and its ratio per round, speed this build / BASE: on a machine whose
speed drifts (a VM's phases) the per-round ratio is the figure to read. Every invocation's
JSON and output go to the result file.

  tests/bench/bench_against.py f829795                       # train, cnn, ps-tcp, ps-shm, allreduce
  tests/bench/bench_against.py f829795 --only train --rounds 8
  tests/bench/bench_against.py HEAD~3 --base-build /elsewhere/build   # an existing build of it

Run on an otherwise idle machine; no test asserts a speed.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name -> (program, arguments, quick arguments)
BENCHMARKS = {
    "train": ("bench_train", ["--threads", "2", "--steps", "1000", "--runs", "3"],
              ["--threads", "2", "--steps", "20", "--warmup", "5", "--runs", "1"]),
    "cnn": ("bench_train", ["--model", "cnn", "--threads", "2", "--steps", "300", "--warmup", "50", "--runs", "3"],
            ["--model", "cnn", "--threads", "2", "--steps", "5", "--warmup", "2", "--runs", "1"]),
    "ps-tcp": ("bench_ps", ["--transport", "tcp", "--runs", "5"], ["--transport", "tcp", "--sizes-kib", "4", "--runs", "1"]),
    "ps-shm": ("bench_ps", ["--transport", "shm", "--runs", "5"], ["--transport", "shm", "--sizes-kib", "4", "--runs", "1"]),
    "allreduce": ("bench_allreduce", ["--ranks", "2", "--runs", "3", "--steps", "500"],
                  ["--ranks", "2", "--runs", "1", "--steps", "20"]),
}


class Refused(Exception):
    pass


def figures(program, result):
    """{figure name: (value, higher is better)} from one benchmark's JSON."""
    if program == "bench_train":
        return {"samples/s": (result["median_samples_per_s"], True)}
    if program == "bench_ps":
        return {f"push+pull {r['size_kib']} KiB, us": (r["pslab"]["push_pull_us"], False) for r in result["results"]}
    out = {"training samples/s": (result["train"]["samples_per_s"], True)}
    for n, v in result.get("allreduce_ms", {}).items():
        out[f"all-reduce of {n} floats, ms"] = (v["median"], False)
    return out


def git(*args):
    p = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise Refused(f"git {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout.strip()


def build_base(base, programs):
    """BASE built in runs/base-<commit>/build (a worktree kept for the next call); its tests/ dir."""
    try:
        commit = git("rev-parse", "--verify", "--quiet", base + "^{commit}")
    except Refused:
        raise Refused(f"'{base}' is not a commit of {ROOT}")
    tree = ROOT / "runs" / f"base-{commit[:12]}"
    if not (tree / ".git").exists():
        git("worktree", "prune")
        print(f"[against] a worktree of {commit[:12]} in {tree}", flush=True)
        git("worktree", "add", "--detach", str(tree), commit)
    build = tree / "build"
    if not (build / "build.ninja").exists():
        p = subprocess.run(["cmake", "-S", str(tree), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise Refused(f"cmake could not configure {commit[:12]} in {build}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    print(f"[against] building {', '.join(programs)} of {commit[:12]}", flush=True)
    p = subprocess.run(["cmake", "--build", str(build), "--target", *[f"tests/{x}" for x in programs]],
                       capture_output=True, text=True)
    if p.returncode != 0:  # (older trees name the targets without their folder)
        p = subprocess.run(["cmake", "--build", str(build), "--target", *programs], capture_output=True, text=True)
    if p.returncode != 0:
        raise Refused(f"{commit[:12]} does not build {', '.join(programs)} in {build}:\n{p.stdout[-3000:]}")
    return build / "tests"


def run_one(binary, args, scratch):
    js = Path(scratch) / "out.json"
    js.unlink(missing_ok=True)
    t0 = time.time()
    p = subprocess.run([str(binary), *args, "--json", str(js)], capture_output=True, text=True)
    if p.returncode != 0 or not js.exists():
        raise Refused(f"{binary} {' '.join(args)} failed (exit {p.returncode}):\n{p.stdout[-1500:]}{p.stderr[-1500:]}")
    return {"json": json.loads(js.read_text()), "output": p.stdout, "wall_s": round(time.time() - t0, 2)}


def summary(program, rounds):
    """Per figure: medians of both builds and the per-round speed ratio this / base."""
    out = {}
    names = figures(program, rounds[0]["new"]["json"])
    for name, (_, higher) in names.items():
        pairs = []
        for r in rounds:
            b, n = figures(program, r["base"]["json"]).get(name), figures(program, r["new"]["json"]).get(name)
            if b and n and b[0] > 0 and n[0] > 0:
                pairs.append((b[0], n[0]))
        if not pairs:
            continue
        ratios = [(n / b) if higher else (b / n) for b, n in pairs]
        out[name] = {"base": statistics.median(b for b, _ in pairs), "this": statistics.median(n for _, n in pairs),
                     "speed_per_round": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                     "rounds": len(ratios)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="benchmarks: " + ", ".join(BENCHMARKS))
    ap.add_argument("base", help="the commit to compare with (anything git rev-parse takes)")
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds per benchmark (default 5)")
    ap.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated benchmarks (default: all)")
    ap.add_argument("--base-build", help="an existing build of BASE (its tests/ holds the benchmarks): no worktree, no build")
    ap.add_argument("--quick", action="store_true", help="tiny runs, to check that everything starts")
    ap.add_argument("--json", help="write every result here (default runs/bench/against-BASE.json)")
    a = ap.parse_args()
    try:
        only = [x for x in a.only.split(",") if x]
        unknown = [x for x in only if x not in BENCHMARKS]
        if unknown:
            raise Refused(f"unknown benchmark {', '.join(unknown)} (--only takes {', '.join(BENCHMARKS)})")
        if a.rounds < 1:
            raise Refused(f"--rounds must be at least 1, not {a.rounds}")
        programs = sorted({BENCHMARKS[x][0] for x in only})
        this = Path(os.environ.get("PSLAB_BUILD", ROOT / "build")) / "tests"
        missing = [p for p in programs if not (this / p).exists()]
        if missing:
            raise Refused(f"this checkout's build has no {', '.join(missing)} in {this} (run experiments/setup.sh)")
        base = Path(a.base_build) / "tests" if a.base_build else build_base(a.base, programs)
        missing = [p for p in programs if not (base / p).exists()]
        if missing:
            raise Refused(f"the build of {a.base} has no {', '.join(missing)} in {base}")
    except Refused as e:
        print(f"bench_against: {e}", file=sys.stderr)
        return 2
    try:
        this_commit = git("rev-parse", "--short", "HEAD")
    except Refused:
        this_commit = "unknown (not a git checkout)"
    result = {"base": a.base, "base_build": str(base.parent), "this_build": str(this.parent),
              "this_commit": this_commit, "rounds": a.rounds, "benchmarks": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for name in only:
            program, args, quick = BENCHMARKS[name]
            args = quick if a.quick else args
            rounds = []
            for r in range(a.rounds):
                row = {}
                for side in (["base", "new"] if r % 2 == 0 else ["new", "base"]):
                    try:
                        row[side] = run_one((base if side == "base" else this) / program, args, scratch)
                    except Refused as e:
                        print(f"bench_against: {e}", file=sys.stderr)
                        return 1
                rounds.append(row)
                print(f"[against] {name}: round {r + 1}/{a.rounds}", flush=True)
            s = summary(program, rounds)
            result["benchmarks"][name] = {"command": [program, *args], "summary": s, "rounds": rounds}
            for fig, v in s.items():
                print(f"{name:10s} {fig:34s} {a.base}: {v['base']:10.4g}  this: {v['this']:10.4g}  "
                      f"speed this/base per round {v['speed_per_round']:.2f} [{v['min']:.2f}-{v['max']:.2f}], {v['rounds']} rounds",
                      flush=True)
    out = Path(a.json) if a.json else ROOT / "runs" / "bench" / f"against-{a.base.replace('/', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"[against] -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
