"""What a run is: the binaries, a config's sweep expanded and validated by pslab_worker, what
the launcher needs from each resolved config, and the names of run directories."""
import datetime
import math
import os
import pathlib
import re
import subprocess
import tomllib
from dataclasses import dataclass

from .common import REPO, UsageError
from .processes import check_signal

FASHION_TRAIN = 60000
SYNTHETIC_TRAIN = 8192


@dataclass
class Binaries:
    build: pathlib.Path
    worker: pathlib.Path
    server: pathlib.Path


def find_binaries(build_dir):
    build = pathlib.Path(build_dir or os.environ.get("PSLAB_BUILD") or REPO / "build").resolve()
    b = Binaries(build, build / "worker" / "pslab_worker", build / "server" / "pslab_server")
    for path in (b.worker, b.server):
        if not os.access(path, os.X_OK):
            raise UsageError(f"{path} not found; build it with experiments/setup.sh, or point "
                             f"--build-dir / PSLAB_BUILD at a build directory")
    return b


def binary_config(bins, args):
    """Runs `pslab_worker config ARGS`; returns stdout or raises UsageError with the binary's error."""
    p = subprocess.run([str(bins.worker), "config", *args], capture_output=True, text=True)
    check_signal()  # a Ctrl-C reaches the binary too
    if p.returncode != 0:
        raise UsageError((p.stderr or p.stdout).strip() or f"pslab_worker config exited {p.returncode}")
    return p.stdout


def expand_sweep(bins, config, sets, tmp):
    """Returns [(resolved config text, label or None)] for every sweep point, each validated.
    The binary applies --set before expanding: a swept key overridden with one value is no
    longer swept."""
    args = ["-c", str(config)]
    for s in sets:
        args += ["--set", s]
    out = binary_config(bins, args + ["--expand", str(tmp / "points")])
    points = []
    for line in out.splitlines():
        if not line.strip():
            continue
        path, _, label = line.partition("\t")
        points.append((pathlib.Path(path), None if label in ("", "-") else label))
    if not points:
        raise UsageError(f"{config}: the sweep has no points")
    # Validate each point once more through the binary and keep its fully resolved form.
    resolved = []
    for i, (path, label) in enumerate(points):
        out_path = tmp / f"resolved{i:03d}.toml"
        binary_config(bins, ["-c", str(path), "--write", str(out_path)])
        resolved.append((out_path.read_text(), label))
    return resolved


@dataclass
class RunInfo:
    """What the launcher needs from a resolved config (read with tomllib; never validated here)."""
    name: str
    mode: str
    workers: int
    servers: int  # 0 for allreduce
    launcher: str
    hosts: list
    bind: str
    seed: int
    device: str
    target_acc: float
    epochs: float
    total_steps: int
    raw: dict


def read_run_info(source):
    """From a resolved config: a path, or its text."""
    if isinstance(source, str):
        c = tomllib.loads(source)
    else:
        with open(source, "rb") as f:
            c = tomllib.load(f)
    cl, tr, data = c["cluster"], c["train"], c["data"]
    mode = cl["mode"]
    W = int(cl["workers"])
    S = 0 if mode == "allreduce" else int(cl["servers"])
    # Steps per worker, the same formula as the workers' (sampler.cpp, setup.cpp).
    if data["kind"] == "fashion-mnist":
        N = min(data["train_samples"], FASHION_TRAIN) if data["train_samples"] > 0 else FASHION_TRAIN
    else:
        N = data["train_samples"] if data["train_samples"] > 0 else SYNTHETIC_TRAIN
    steps_per_epoch = math.ceil(math.ceil(N / W) / tr["batch"])
    total = tr["steps"] if tr["steps"] > 0 else max(1, math.ceil(tr["epochs"] * steps_per_epoch - 1e-9))
    return RunInfo(name=c["name"], mode=mode, workers=W, servers=S, launcher=cl["launcher"],
                   hosts=list(cl.get("hosts", [])), bind=cl["bind"], seed=c["seed"], device=tr["device"],
                   target_acc=c["eval"]["target_acc"], epochs=tr["epochs"], total_steps=total, raw=c)


def safe_dir_name(label):
    if not label:
        return "run"
    name = re.sub(r"[^A-Za-z0-9._,=+-]", "_", label).strip("._") or "run"
    return name[:120]


def new_invocation_dir(runs_dir, name):
    base = pathlib.Path(runs_dir).resolve() / name
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        d = base / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            continue
    raise UsageError(f"cannot create a run directory under {base}")
