"""pslab's CPU backend against PyTorch on the same CPU, the same ResNet (experiments/torch/resnet.py
is the network model.kind = "resnet" builds), side by side.

    /usr/bin/python3 tests/bench/bench_resnet.py speed [--depths 8,20] [--rounds 3] [--json FILE]
                                                       (experiments/bench.sh resnet; $PSLAB_BUILD: the build)
    /usr/bin/python3 tests/bench/bench_resnet.py train [--epochs 8] [--json FILE]

speed   training samples/s at batch 128 on Fashion-MNIST's 28 x 28 images, both with this
        machine's threads (OpenBLAS's and torch.set_num_threads): pslab's bench_train --model
        resnet against a PyTorch step of the same work (a batch gathered from resident images,
        forward, cross-entropy, backward, plain SGD, as bench_train's optimizer), in
        PyTorch's default memory format and in channels_last, the better one PyTorch's figure (its
        best); rounds alternate pslab and PyTorch; medians over rounds; ratio = pslab / PyTorch.
train   PyTorch alone with the recipe of experiments/configs/resnet-single.toml (ResNet-8, batch
        128, momentum 0.9, lr 0.05 with a 0.5-epoch linear warmup and a cosine decay, weight decay
        5e-4, standardised pixels; --augment: crops of 2-pixel padding and flips): test accuracy after each
        epoch in eval mode (running statistics), wall time. pslab's side: launch.py run
        experiments/configs/resnet-single.toml.
Needs PyTorch (python3-torch) and Fashion-MNIST (dataset-fashion-mnist)."""
import argparse
import gzip
import json
import math
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments" / "torch"))
sys.path.insert(0, str(REPO / "worker" / "python"))
import resnet  # noqa: E402  (experiments/torch/resnet.py)

DATA = pathlib.Path("/usr/share/datasets/fashion-mnist")


def idx(path):
    raw = gzip.open(path).read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion():
    """Standardised images (n, 1, 28, 28) and labels, as pslab's data.normalize does."""
    x, y = idx(DATA / "train-images-idx3-ubyte.gz"), idx(DATA / "train-labels-idx1-ubyte.gz")
    xt, yt = idx(DATA / "t10k-images-idx3-ubyte.gz"), idx(DATA / "t10k-labels-idx1-ubyte.gz")
    x = torch.tensor(x, dtype=torch.float32).div_(255).unsqueeze(1)
    xt = torch.tensor(xt, dtype=torch.float32).div_(255).unsqueeze(1)
    mean, std = x.mean(), x.std()
    return (x - mean) / std, torch.tensor(y, dtype=torch.long), (xt - mean) / std, torch.tensor(yt, dtype=torch.long)


def torch_speed(depth, batch, steps, channels_last):
    """The same work as bench_train's step: a batch gathered from a resident set of images, forward,
    backward, plain SGD (bench_train's optimizer)."""
    model = resnet.ResNet(1, 10, blocks=(depth - 2) // 6)
    images, labels = torch.randn(8192, 1, 28, 28), torch.randint(10, (8192,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    order = torch.randperm(len(labels))

    def step(i=[0]):
        at = i[0] % (len(labels) // batch) * batch
        i[0] += 1
        idx = order[at:at + batch]
        x, y = images[idx], labels[idx]
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - t)


def pslab_speed(depth, batch, steps, threads):
    build = pathlib.Path(os.environ.get("PSLAB_BUILD", REPO / "build"))
    out = subprocess.run([str(build / "tests" / "bench_train"), "--model", "resnet", "--depth", str(depth),
                          "--batch", str(batch), "--steps", str(steps), "--runs", "1", "--warmup", "3",
                          "--threads", str(threads)], capture_output=True, text=True, check=True)
    out = out.stdout + out.stderr
    return float(re.search(r"run 0: ([0-9.]+) samples/s", out).group(1)), re.search(r'"backend": "([^"]*)"', out).group(1)


def speed(a):
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    result = {"benchmark": "resnet_cpu_speed", "batch": a.batch, "threads": threads, "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "depths": {}}
    for depth in a.depths:
        rows = {"pslab": [], "torch": [], "torch_channels_last": []}
        steps = max(5, 2000 // (depth * 8))
        for r in range(a.rounds):
            sps, backend = pslab_speed(depth, a.batch, steps, threads)
            rows["pslab"].append(sps)
            rows["torch"].append(torch_speed(depth, a.batch, steps, False))
            rows["torch_channels_last"].append(torch_speed(depth, a.batch, steps, True))
            print(f"resnet-{depth} round {r}: pslab {rows['pslab'][-1]:.0f}, torch {rows['torch'][-1]:.0f}, "
                  f"torch channels_last {rows['torch_channels_last'][-1]:.0f} samples/s", flush=True)
        med = {k: statistics.median(v) for k, v in rows.items()}
        best = max(med["torch"], med["torch_channels_last"])
        result["depths"][str(depth)] = {"runs": rows, "median": med, "pslab_backend": backend,
                                        "pslab_over_torch_best": med["pslab"] / best}
        print(f"resnet-{depth}: pslab {med['pslab']:.0f} / PyTorch's best {best:.0f} = {med['pslab'] / best:.2f}x")
    return result


def train(a):
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(1)
    x, y, xt, yt = fashion()
    model = resnet.ResNet(1, 10, blocks=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    per_epoch = len(x) // 128
    total, warmup = a.epochs * per_epoch, per_epoch // 2

    def lr_at(k):  # linear warmup, then cosine to 0
        return 0.05 * (k + 1) / warmup if k < warmup else 0.025 * (1 + math.cos(math.pi * (k - warmup) / (total - warmup)))

    def augment(b):  # pad 2, random 28 x 28 crop, flip half the time
        p = F.pad(b, (2, 2, 2, 2))
        i, j = np.random.randint(0, 5, 2)
        b = p[:, :, i:i + 28, j:j + 28]
        return torch.where(torch.rand(len(b), 1, 1, 1) < 0.5, b.flip(3), b)

    log, start, k, trained = [], time.perf_counter(), 0, 0.0
    for epoch in range(a.epochs):
        model.train()
        t = time.perf_counter()
        order = torch.randperm(len(x))
        for s in range(per_epoch):
            for g in opt.param_groups:
                g["lr"] = lr_at(k)
            sel = order[s * 128:(s + 1) * 128]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(augment(x[sel]) if a.augment else x[sel]), y[sel]).backward()
            opt.step()
            k += 1
        trained += time.perf_counter() - t
        model.eval()
        with torch.no_grad():
            correct = sum((model(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item() for i in range(0, len(xt), 1000))
        log.append({"epoch": epoch + 1, "test_acc": correct / len(xt), "wall_s": time.perf_counter() - start,
                    "train_samples_per_s": (epoch + 1) * per_epoch * 128 / trained})
        print(f"epoch {epoch + 1}: test acc {100 * correct / len(xt):.2f}%  {log[-1]['train_samples_per_s']:.0f} samples/s  "
              f"{log[-1]['wall_s']:.0f} s", flush=True)
    return {"benchmark": "resnet_torch_train", "recipe": "experiments/configs/resnet-single.toml", "torch": torch.__version__,
            "threads": os.cpu_count(), "epochs": log}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["speed", "train"])
    ap.add_argument("--depths", default="8,20", type=lambda s: [int(d) for d in s.split(",")])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--augment", action="store_true", help="train: crops and flips")
    ap.add_argument("--json")
    a = ap.parse_args()
    result = speed(a) if a.what == "speed" else train(a)
    if a.json:
        pathlib.Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
