"""The peer of bench_train in PyTorch: the same models, data, batch and plain SGD, on a GPU.

    python3 tests/bench/torch_train.py --model mlp|cnn|resnet20 --batch 64[,256,...] [--steps 2000 | --seconds S]
                                       [--runs 3] [--warmup 200] [--feeds resident,staged,graph]
                                       [--device cuda] [--data DIR] [--tf32] [--json FILE]

Models (as pslab builds them, src/core/model.cpp): mlp = 784-256-128-10 with ReLU; cnn = conv
5x5/s2/p2 1->16, ReLU, conv 5x5/s2/p2 16->32, ReLU, linear 1568->10; resnetD (D = 6n + 2: 8,
20, 56) = experiments/torch/resnet.py, the network model.kind = "resnet" builds, with batch norm
in training mode. Softmax cross-entropy (mean over the batch), SGD lr 0.01, no momentum. Each step: a batch of sample indices from a
shuffled epoch, gather, forward, backward, step; nothing is read back to the host.

Three ways to run it, all measured, the best reported as PyTorch's figure (its best, as a user
who cares about speed runs it):
  resident  eager; the data set uploaded once; each batch gathered on the GPU by index
  staged    eager; the data set in pinned host memory; each batch gathered on the host and
            copied asynchronously (non_blocking)
  graph     the whole step captured once in a CUDA graph (torch.cuda.graph: gather by index,
            forward, backward, SGD) and replayed, the batch's indices copied into its static
            input; a feed that fails (e.g. a capture error) is reported with its error
  graph_channels_last   (resnet) the same with the network in channels_last (NHWC)
cuDNN picks convolution algorithms by timing them (cudnn.benchmark; pslab takes cuDNN's heuristic
choice, the same in every run, unless PSLAB_CUDNN=timed: on an H200 a 0.96-1.01x difference). Float32 by default: TF32 off for matmuls and cuDNN convolutions (PyTorch allows TF32 in cuDNN
by default); --tf32 allows it in both, to compare with bench_train --tf32.
Metric: samples / wall time of `steps` steps after `warmup` steps (torch.cuda.synchronize
around each run), median over `runs`; with --seconds S each run is as many steps as take about S
seconds (counted from a timed probe after the warm-up), so that a GPU check's time is known in
advance. Several batches (--batch 64,256) share one start of Python and CUDA; --json FILE then
needs "{batch}" in its name (one file per batch). Data: Fashion-MNIST from --data when there,
else random inputs of the same shape."""
import argparse
import gzip
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def load(data_dir):
    d = pathlib.Path(data_dir) if data_dir else None
    img, lab = (d / "train-images-idx3-ubyte.gz", d / "train-labels-idx1-ubyte.gz") if d else (None, None)
    if d and img.exists() and lab.exists():
        x = np.frombuffer(gzip.open(img).read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255.0
        x = (x - x.mean()) / x.std()
        y = np.frombuffer(gzip.open(lab).read(), np.uint8, offset=8).astype(np.int64)
        return torch.from_numpy(x.copy()), torch.from_numpy(y.copy()), "fashion-mnist"
    g = torch.Generator().manual_seed(1)
    return torch.randn(60000, 784, generator=g), torch.randint(0, 10, (60000,), generator=g), "random"


def model_of(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    if kind == "cnn":
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 16, 5, 2, 2), nn.ReLU(),
                             nn.Conv2d(16, 32, 5, 2, 2), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 7 * 7, 10))
    if kind.startswith("resnet") and kind[6:].isdigit() and (int(kind[6:]) - 2) % 6 == 0:
        repo = pathlib.Path(__file__).resolve().parents[2]
        sys.path[:0] = [str(repo / "experiments" / "torch"), str(repo / "worker" / "python")]
        import resnet  # experiments/torch/resnet.py
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), resnet.ResNet(1, 10, blocks=(int(kind[6:]) - 2) // 6))
    raise SystemExit(f"torch_train.py: unknown --model {kind!r} (mlp, cnn or resnetD, D = 6n + 2)")


def steps_for(a, run):
    """Steps per timed run: a.steps, or with a.seconds as many as take about that long (probed
    with 5, 10, 20, ... steps until a probe lasts 0.05 s)."""
    if not a.seconds:
        return a.steps
    n = 5
    while True:
        t0 = time.perf_counter()
        run(n)
        took = time.perf_counter() - t0
        if took >= 0.05 or n >= 100000:
            return max(5, round(a.seconds * n / took))
        n *= 2


def timed(a, run):
    """Samples/s of run(steps) in each of a.runs runs, after run(a.warmup); and the steps."""
    run(a.warmup)
    steps = steps_for(a, run)
    rates = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        run(steps)
        rates.append(steps * a.batch / (time.perf_counter() - t0))
    return rates, steps


def measure(a, x, y, feed):
    dev = torch.device(a.device)
    torch.manual_seed(1)
    model = model_of(a.model).to(dev)
    if feed.endswith("_channels_last"):
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = x.shape[0]
    if feed != "staged":
        xs, ys = x.to(dev), y.to(dev)
    else:
        xs, ys = x.pin_memory(), y.pin_memory()
    per_epoch = n // a.batch
    state = {"step": 0, "perm": None}

    def batch():
        k = state["step"] % per_epoch
        if k == 0:
            state["perm"] = torch.randperm(n, device=dev if feed == "resident" else "cpu")
        idx = state["perm"][k * a.batch:(k + 1) * a.batch]
        state["step"] += 1
        if feed == "resident":
            return xs[idx], ys[idx]
        return (xs[idx].pin_memory().to(dev, non_blocking=True), ys[idx].pin_memory().to(dev, non_blocking=True))

    if feed.startswith("graph"):
        return graphed(a, model, opt, xs, ys, n, per_epoch, dev)

    def run(steps):
        for _ in range(steps):
            xb, yb = batch()
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize() if dev.type == "cuda" else None

    return timed(a, run)


def graphed(a, model, opt, xs, ys, n, per_epoch, dev):
    """The step captured in a CUDA graph (PyTorch's whole-network capture recipe): warm-up on a
    side stream, capture with the gradients unset, then per step copy the batch's indices into
    the graph's static input and replay."""
    static_idx = torch.randperm(n, device=dev)[:a.batch].clone()

    def step():
        loss = F.cross_entropy(model(xs[static_idx]), ys[static_idx])
        loss.backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    state = {"step": 0, "perm": None}

    def run(steps):
        for _ in range(steps):
            k = state["step"] % per_epoch
            if k == 0:
                state["perm"] = torch.randperm(n, device=dev)
            static_idx.copy_(state["perm"][k * a.batch:(k + 1) * a.batch])
            state["step"] += 1
            graph.replay()
        torch.cuda.synchronize()

    return timed(a, run)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch", default="64", help="a batch size, or several: 64,256,1024")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=0.0, help="each timed run about this long instead of --steps")
    ap.add_argument("--feeds", help="these feeds alone (comma-separated; default: every one this device has)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 in matmuls and cuDNN convolutions (default: float32)")
    ap.add_argument("--threads", help="CPU: thread counts to measure, the best one PyTorch's figure (default: 1 and "
                                      "every core: one thread is PyTorch's fastest at small sizes)")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.backends.cudnn.benchmark = True  # convolutions: cuDNN's measured fastest algorithm (its best)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_train.py: PyTorch sees no CUDA GPU")
    try:
        batches = [int(b) for b in a.batch.split(",")]
    except ValueError:
        sys.exit(f"torch_train.py: --batch {a.batch!r}: batch sizes, comma-separated")
    if a.json and len(batches) > 1 and "{batch}" not in a.json:
        sys.exit("torch_train.py: several batches write one file each: --json needs {batch} in its name")
    threads = a.threads.split(",") if a.threads else [str(t) for t in sorted({1, os.cpu_count() or 1})]
    feeds = ("resident", "staged", "graph") if a.device == "cuda" else tuple(f"resident@{t}" for t in threads)
    # (staged, graph: GPU only; on the CPU, resident@T: on T threads)
    if a.device == "cuda" and a.model.startswith("resnet"):
        feeds += ("graph_channels_last",)
    if a.feeds:
        wanted = set(a.feeds.split(","))
        unknown = wanted - set(feeds) - {f.partition("@")[0] for f in feeds}
        if unknown:
            sys.exit(f"torch_train.py: --feeds {a.feeds}: {', '.join(sorted(unknown))} not among {', '.join(feeds)} here")
        feeds = tuple(f for f in feeds if f in wanted or f.partition("@")[0] in wanted)
    x, y, data = load(a.data)
    for batch in batches:
        a.batch = batch
        text = json.dumps(measure_batch(a, x, y, data, feeds), indent=2)
        print(text)
        if a.json:
            pathlib.Path(a.json.replace("{batch}", str(batch))).write_text(text + "\n")


def measure_batch(a, x, y, data, feeds):
    out = {"benchmark": "torch_train_throughput", "model": a.model, "batch": a.batch, "data": data,
           "torch": torch.__version__, "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
           "steps_per_run": None if a.seconds else a.steps, "seconds_per_run": a.seconds or None, "warmup_steps": a.warmup, "runs": a.runs, "tf32": a.tf32}
    for feed in feeds:
        base, _, threads = feed.partition("@")
        if threads:
            torch.set_num_threads(int(threads))
        try:
            rates, steps = measure(a, x, y, base)
        except Exception as e:  # a feed that cannot run here is reported, the others still measured
            print(f"torch_train.py: feed {feed} failed: {type(e).__name__}: {e}", file=sys.stderr)
            out[feed] = {"error": f"{type(e).__name__}: {e}"}
            continue
        out[feed] = {"samples_per_s": rates, "median_samples_per_s": statistics.median(rates), "steps_per_run": steps}
    ran = [f for f in feeds if "median_samples_per_s" in out[f]]
    if not ran:
        sys.exit("torch_train.py: no feed ran: " + "; ".join(out[f]["error"] for f in feeds))
    out["best_feed"] = max(ran, key=lambda f: out[f]["median_samples_per_s"])
    out["median_samples_per_s"] = out[out["best_feed"]]["median_samples_per_s"]
    return out


if __name__ == "__main__":
    main()
