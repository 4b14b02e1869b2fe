"""The PyTorch MLP trained by pslab in asp against PyTorch alone, side by side on this machine's
cores, at the same batch: samples per second of training.

    /usr/bin/python3 tests/bench/bench_torch_worker.py [--runs 3] [--workers 2,4] [--json FILE]

  alone   experiments/torch/mlp.py's MLP in one PyTorch process, no pslab: batches of 64 drawn
          from a shuffled Fashion-MNIST, forward, backward, torch.optim.SGD step; with 1 and with
          all of this machine's threads (torch.set_num_threads), the better one PyTorch's figure
          (its best, as a user who cares about speed runs it); 2000 steps after 200 of warm-up;
          and as many independent processes of 1 thread as there are cores, at once (the
          machine's cores used as pslab's workers use them): their samples/s summed
  pslab   experiments/configs/torch-mlp.toml in asp through the launcher, W workers and 2 servers
          on the same cores, one epoch, the evaluator only at the start and the end: the samples
          all workers trained between their first metrics line and their last (train.log_every =
          20 steps: the first 20, the warm-up, left out as PyTorch's are), over the span from the
          earliest first line to the latest last one
Rounds alternate (alone, then pslab for each W); figures are medians over rounds, and
asp_over_alone = pslab's / PyTorch's best. Needs PyTorch (python3-torch)."""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("PSLAB_BUILD") or REPO / "build").resolve()
os.environ.setdefault("PSLAB_CLIENT_LIB", str(BUILD / "worker" / "libpslab_client.so"))
sys.path.insert(0, str(REPO / "worker" / "python"))
sys.path.insert(0, str(REPO / "experiments" / "torch"))
import pslab  # noqa: E402
import pslab.torch as pt  # noqa: E402
import mlp  # noqa: E402

CONFIG = REPO / "experiments" / "configs" / "torch-mlp.toml"
BATCH = 64


def fashion_mnist():
    """The training set as pslab reads it (normalised), through a client of the data alone."""
    with pslab.Client(CONFIG, 0, None, overrides=['cluster.mode="asp"']) as c:
        x, y, _, _ = pt.data(c)
    return x, y


def alone(x, y, threads, steps=2000, warmup=200):
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = mlp.MLP(x.shape[1], 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    perm, at = torch.randperm(len(y)), 0
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        if at + BATCH > len(y):
            perm, at = torch.randperm(len(y)), 0
        idx = perm[at:at + BATCH]
        at += BATCH
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return steps * BATCH / (time.perf_counter() - t0)


def with_pslab(workers, runs_dir):
    r = subprocess.run(["/usr/bin/python3", str(REPO / "experiments" / "launch.py"), "run", str(CONFIG), "--runs-dir",
                        str(runs_dir), "--no-plots", "--set", 'cluster.mode="asp"', "--set", f"cluster.workers={workers}",
                        "--set", "train.epochs=1.0", "--set", "eval.every_epochs=0", "--set", "eval.interval_s=100000"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, PSLAB_BUILD=str(BUILD)))
    if r.returncode != 0:
        raise RuntimeError(f"launch.py exited {r.returncode}: {r.stderr[-2000:]}")
    run = sorted(runs_dir.glob("torch-mlp/*/run"))[-1]
    samples, began, ended = 0, float("inf"), 0.0  # (each worker's own span, summed, counted the time one ran alone)
    for m in (run / "metrics").glob("worker*.jsonl"):
        lines = [json.loads(line) for line in m.read_text().splitlines() if '"train"' in line]
        samples += (lines[-1]["step"] - lines[0]["step"]) * BATCH
        began, ended = min(began, lines[0]["t"]), max(ended, lines[-1]["t"])
    subprocess.run(["rm", "-rf", str(runs_dir / "torch-mlp")], check=False)
    return samples / (ended - began)


def alone_in_processes(n):
    """n independent PyTorch processes of 1 thread at once: their samples/s summed."""
    procs = [subprocess.Popen([sys.executable, __file__, "--alone-once"], stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    return sum(float(p.communicate(timeout=600)[0].split()[-1]) for p in procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--json")
    ap.add_argument("--alone-once", action="store_true", help=argparse.SUPPRESS)  # (one of alone_in_processes)
    a = ap.parse_args()
    x, y = fashion_mnist()
    if a.alone_once:
        return print(alone(x, y, 1))
    cores = os.cpu_count() or 1
    thread_counts = sorted({1, cores})
    rounds = {f"alone_{t}_threads": [] for t in thread_counts}
    if cores > 1:
        rounds[f"alone_{cores}_processes"] = []
    rounds.update({f"asp_{w}_workers": [] for w in map(int, a.workers.split(","))})
    with tempfile.TemporaryDirectory(prefix="pslab-bench-torch-") as tmp:
        for r in range(a.runs):
            for name in rounds:
                kind, n, _ = name.split("_")
                rounds[name].append(with_pslab(int(n), pathlib.Path(tmp)) if kind == "asp" else
                                    alone_in_processes(int(n)) if name.endswith("processes") else alone(x, y, int(n)))
                print(f"round {r + 1}/{a.runs}: {name} {rounds[name][-1]:,.0f} samples/s", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in rounds.items()}
    best_alone = max(v for k, v in med.items() if k.startswith("alone"))
    out = {"benchmark": "bench_torch_worker", "machine": platform.node(), "cpus": cores, "torch": torch.__version__,
           "batch": BATCH, "runs": a.runs, "samples_per_s": med, "rounds": rounds, "alone_best": best_alone,
           **{f"{k}_over_alone": v / best_alone for k, v in med.items() if k.startswith("asp")}}
    text = json.dumps(out, indent=2)
    if a.json:
        pathlib.Path(a.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
