"""A PyTorch worker's push+pull against the C++ worker's, for the same bytes, side by side: one
pslab_server (asp, a shard of N floats) and one worker, the round trip a worker makes every step
(the gradient pushed, θ for the next step in the reply), timed per round trip.

    /usr/bin/python3 tests/bench/bench_client.py [--runs 5] [--sizes-kib 4,1024,16384]
                                                 [--transports shm,tcp] [--json FILE]

Per transport and size, `runs` rounds, each round a fresh server for each of, in turn:
  cpp      tests/bench_client (PsClient::push, as pslab_worker)
  python   pslab.Client.push from Python, θ and ∇θ the memory of CPU torch tensors (as
           pslab.torch.Worker holds them), through ctypes and libpslab_client.so
  step     pslab.Client.train_step: the same push by the run's rule (what pslab.torch.Worker.step
           calls after backward: the rule, straggler and metrics bookkeeping included)
Figures: the median round trip of each (µs, the median over rounds of each round's median) and
python_over_cpp, step_over_cpp (the target: <= 1.2). Needs PyTorch (python3-torch).
Placement: the server pinned to CPU 0, the worker to CPU 1 ("apart") or to CPU 0 too
("together"), the same for both clients: on this VM a wake-up across vCPUs costs ~60 µs, so
that unpinned figures of small tensors depend on where the scheduler happened to put them."""
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

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("PSLAB_BUILD") or REPO / "build").resolve()
os.environ.setdefault("PSLAB_CLIENT_LIB", str(BUILD / "worker" / "libpslab_client.so"))
sys.path.insert(0, str(REPO / "worker" / "python"))
sys.path.insert(0, str(REPO / "experiments"))
import pslab  # noqa: E402
from launcher.hosts import free_ports  # noqa: E402

CONFIG = """name = "bench-client"
seed = 1
[model]
kind = "external"
sizes = [{floats}]
[data]
kind = "external"
train_samples = 100000000
[optimizer]
kind = "sgd"
lr = 1e-6
[train]
batch = 32
steps = 10000000
[cluster]
mode = "asp"
workers = 1
servers = 1
transport = "{transport}"
auth = "none"
"""


def iterations_for(kib):
    """Round trips per round: about a second's worth here, at least 30."""
    return max(30, min(3000, int(200000 / max(kib, 64))))


class Server:
    """One pslab_server of the config, listening on a fresh address; stopped on exit."""

    def __init__(self, config, transport, tmp, cpu):
        if transport == "tcp":
            self.address = f"tcp://127.0.0.1:{free_ports('127.0.0.1', 1)[0]}"
        else:
            self.address = f"ipc://{tmp}/server0-{time.monotonic_ns()}"
        self.p = subprocess.Popen([str(BUILD / "server" / "pslab_server"), "-c", str(config), "--shard", "0", "--bind",
                                   self.address], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            _, err = self.p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            _, err = self.p.communicate()
        self.p.stderr.close()
        if self.p.returncode != 0 and exc[0] is None:
            raise RuntimeError(f"pslab_server exited {self.p.returncode}: {err.decode()[-1000:]}")


def cpp_round(config, server, iters, warmup, cpu):
    r = subprocess.run([str(BUILD / "tests" / "bench_client"), str(config), server.address, str(iters), str(warmup)],
                       capture_output=True, text=True, timeout=600, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    if r.returncode != 0:
        raise RuntimeError(f"bench_client: {r.stderr}")
    return statistics.median(json.loads(r.stdout)["round_trip_us"])


def python_round(config, server, iters, warmup, by_rule, cpu):
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})  # (this process and the client's threads, made from here on)
    try:
        return python_round_pinned(config, server, iters, warmup, by_rule)
    finally:
        os.sched_setaffinity(0, before)


def python_round_pinned(config, server, iters, warmup, by_rule):
    with pslab.Client(config, 0, server.address) as c:
        theta_t = torch.zeros(c.num_params)           # a CPU tensor's memory, as pslab.torch holds θ
        grad_t = torch.full((c.num_params,), 1e-7)
        theta, grad = theta_t.numpy(), grad_t.numpy()
        if by_rule:
            c.begin(theta)
        else:
            c.connect()
            c.pull(0, theta)
        times = []
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            if by_rule:
                c.train_step(i, 0.0, 32, 0.0, grad, theta)
            else:
                c.push(i, 32, grad, theta)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e6)
        if by_rule:
            c.end()
        else:
            c.bye(warmup + iters)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes-kib", default="4,1024,16384")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--placements", default="apart,together")
    ap.add_argument("--json")
    a = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="pslab-bench-client-") as tmp:
        tmp = pathlib.Path(tmp)
        points = [(t, k, pl) for t in a.transports.split(",") for k in map(int, a.sizes_kib.split(","))
                  for pl in a.placements.split(",")]
        for transport, kib, placement in points:
            cpu = 1 if placement == "apart" else 0  # (the worker's; the server's: 0)
            config = tmp / f"{transport}-{kib}.toml"
            config.write_text(CONFIG.format(floats=kib * 256, transport=transport))
            iters = iterations_for(kib)
            warmup = max(5, iters // 10)
            rounds = {"cpp": [], "python": [], "step": []}
            for _ in range(a.runs):  # alternating, a fresh server each
                for name in rounds:
                    with Server(config, transport, tmp, 0) as s:
                        rounds[name].append(cpp_round(config, s, iters, warmup, cpu) if name == "cpp" else
                                            python_round(config, s, iters, warmup, name == "step", cpu))
            med = {k: statistics.median(v) for k, v in rounds.items()}
            row = {"transport": transport, "kib": kib, "placement": placement, "iterations": iters, "runs": a.runs,
                   **{f"{k}_us": v for k, v in med.items()},
                   "python_over_cpp": med["python"] / med["cpp"], "step_over_cpp": med["step"] / med["cpp"],
                   "rounds_us": rounds}
            results.append(row)
            print(f"{transport:4} {kib:6} KiB {placement:8}  cpp {med['cpp']:9.1f} us  python {med['python']:9.1f} us "
                  f"({row['python_over_cpp']:.3f}x)  step {med['step']:9.1f} us ({row['step_over_cpp']:.3f}x)",
                  file=sys.stderr, flush=True)
    out = {"benchmark": "bench_client", "machine": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
           "python": platform.python_version(), "results": results}
    text = json.dumps(out, indent=2)
    if a.json:
        pathlib.Path(a.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
