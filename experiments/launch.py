#!/usr/bin/python3
"""pslab experiment launcher: one config (or a sweep of configs) -> processes -> run directories.

  launch.py run CONFIG [--set key=value ...] [--runs-dir DIR] [--build-dir DIR]
                       [--dry-run] [--no-plots] [--keep-going] [--max-minutes M] [--base-port P]
  launch.py task RUN_DIR [--print] [--hosts H1,H2,...]      (one Slurm task; srun runs it)

`run` expands the sweep in CONFIG (a list where one value is expected is swept; the cross
product of all such lists is run, one run after the other), validates every point with the
pslab_worker binary before anything starts, and then for each point starts the servers, the
workers and the evaluator, prints a progress line about once a second, and writes

  runs/<name>/<YYYYmmdd-HHMMSS>/            one invocation
    comparison.md, comparison.csv          one row per run
    plots/*.png                            the runs overlaid
    <label>/                               one run (label from the sweep, e.g. mode=ssp_2; "run" without a sweep)
      config.toml manifest.json summary.json metrics/*.jsonl logs/*.log plots/*.png

Placement (cluster.launcher in the config):
  local  every process on this machine, on cluster.bind, on free ports (bind to port 0).
  ssh    processes round-robin over cluster.hosts (servers first, then workers, then the
         evaluator), each started as
           ssh -o BatchMode=yes -o ConnectTimeout=10 HOST 'cd REPO && exec CMD'
         REPO is this checkout's absolute path, which must be the same on every host, on a
         shared file system (the run directory and the binaries are read and written there).
         Listening ports are fixed: base port (29500, --base-port) + process index, the index
         counting servers 0..S-1, then workers, then the evaluator. Servers bind tcp://*:PORT
         unless cluster.bind is set to something other than a loopback address.
         Stopping a run stops the local ssh clients; a remote process whose peers vanish fails
         on its own after cluster.timeout_s.
  slurm  the launcher runs ONE
           srun --ntasks=N --kill-on-bad-exit=1 --distribution=cyclic /usr/bin/python3 experiments/launch.py task RUN_DIR
         (N = S + W + 1; allreduce: W + 1). Each task reads SLURM_PROCID, SLURM_NTASKS and the
         step's node list (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, expanded with
         `scontrol show hostnames`), takes its role (tasks 0..S-1 servers, then workers, the
         last one the evaluator; allreduce: workers, then the evaluator), derives every endpoint
         from the node list (task i runs on node i mod nodes: cyclic distribution) and the
         fixed ports above, and execs its binary with its output in RUN_DIR/logs/. Run it
         inside an allocation (salloc / sbatch) so that srun starts at once: metric times count
         from the launcher's start. Shared file system assumed, as for ssh.

Binaries: <repo>/build/{worker/pslab_worker,server/pslab_server} (experiments/setup.sh builds
them there); --build-dir or the environment variable PSLAB_BUILD point elsewhere.

A run whose training loss stops being finite ends with status "diverged" (its workers say at
which step); that is the experiment's outcome, not a failure.

Exit status: 0 all runs succeeded; 1 a run failed (a process exited non-zero, or the run ran
past --max-minutes); 2 bad config or usage (nothing was started); 130 / 143 stopped by SIGINT
(Ctrl-C) / SIGTERM. In every case no process of the run is left behind.
"""
import argparse
import csv
import ctypes
import datetime
import json
import math
import os
import pathlib
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass

REPO = pathlib.Path(__file__).resolve().parent.parent
PLOT_PY = REPO / "experiments" / "plot.py"
DEFAULT_BASE_PORT = 29500
KILL_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long
FASHION_TRAIN = 60000
SYNTHETIC_TRAIN = 8192
LIBRARY_PACKAGES = ["libzmq5", "libopenblas0", "libopenblas0-pthread", "libgloo0", "libflatbuffers2",
                    "libtomlplusplus3", "python3-matplotlib", "python3-numpy"]


def say(*parts):
    print(*parts, flush=True)


def warn(msg):
    print(f"launch.py: {msg}", file=sys.stderr, flush=True)


class UsageError(Exception):
    """Bad config, options or missing binaries: exit 2, nothing started."""


class RunFailed(Exception):
    """A run failed; the message says which process and why."""


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# ---- signals: a flag, checked wherever the launcher waits ----------------------------------
_signal_received = None


def _on_signal(signum, _frame):
    global _signal_received
    if _signal_received is None:
        _signal_received = signum


def check_signal():
    if _signal_received is not None:
        raise Interrupted(_signal_received)


def sleep_checked(seconds):
    end = time.monotonic() + seconds
    while True:
        check_signal()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.1))


# ---- binaries and config (all parsing and validation is the binary's) ----------------------
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


# ---- the processes of a run ----------------------------------------------------------------
@dataclass
class Proc:
    name: str           # server0, worker1, evaluator
    role: str           # server, worker, evaluator
    rank: int           # shard or worker rank; -1 for the evaluator
    index: int          # position in start order (servers, workers, evaluator)
    host: str           # where it runs ("local" for the local launcher)
    argv: list          # the pslab binary's command line
    command: list = None  # what the launcher runs (argv, or ssh ... argv)
    popen: object = None
    returncode: int = None
    log: pathlib.Path = None

    def describe(self):
        return f"{self.name}" + (f" (rank {self.rank})" if self.role == "worker" else
                                 f" (shard {self.rank})" if self.role == "server" else "")


def is_loopback(addr):
    return addr in ("localhost", "::1") or addr.startswith("127.")


def free_port(addr):
    host = "0.0.0.0" if addr in ("*", "0.0.0.0") else addr
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tcp(host, port):
    return f"tcp://[{host}]:{port}" if ":" in host and host != "*" else f"tcp://{host}:{port}"


def process_layout(info):
    """[(role, rank)] in start order: servers, workers, the evaluator."""
    layout = [("server", k) for k in range(info.servers)]
    layout += [("worker", r) for r in range(info.workers)]
    layout.append(("evaluator", -1))
    return layout


def plan(info, run_dir, run_start, bins, hosts_of, port_of, bind_addr, connect_addr, gloo_host=None):
    """The command line of every process of a run.

    hosts_of(i): host of process i; port_of(i): its listening port (servers, allreduce rank 0,
    allreduce evaluator); bind_addr(host) / connect_addr(host): the address a listener on
    `host` binds to / peers connect to.
    """
    layout = process_layout(info)
    hosts = [hosts_of(i) for i in range(len(layout))]
    per_host = {h: hosts.count(h) for h in hosts}
    cfg = str(run_dir / "config.toml")
    common = ["-o", str(run_dir), "--run-start", f"{run_start:.6f}"]
    S, W = info.servers, info.workers
    server_eps = ",".join(tcp(connect_addr(hosts[k]), port_of(k)) for k in range(S))
    coordinator = tcp(connect_addr(hosts[S]), port_of(S))          # allreduce: rank 0 binds it
    snapshots = tcp(connect_addr(hosts[S + W]), port_of(S + W))    # allreduce: the evaluator binds it
    procs = []
    gpu_slots = {}  # host -> GPU slots handed out there (workers and the evaluator; servers use no GPU)
    for i, (role, rank) in enumerate(layout):
        host = hosts[i]
        poh = ["--procs-on-host", str(per_host[host]), "-q"]
        if role != "server":
            poh += ["--gpu-slot", str(gpu_slots.get(host, 0))]
            gpu_slots[host] = gpu_slots.get(host, 0) + 1
        if role == "server":
            name = f"server{rank}"
            argv = [str(bins.server), "-c", cfg, "--shard", str(rank), "--bind", tcp(bind_addr(host), port_of(i)),
                    "--metrics", str(run_dir / "metrics" / f"{name}.jsonl"), "--run-start", f"{run_start:.6f}",
                    "--wait-for-shutdown"]
        elif role == "worker":
            name = f"worker{rank}"
            if info.mode == "allreduce":
                argv = [str(bins.worker), "allreduce", "-c", cfg, "--rank", str(rank), "--coordinator", coordinator,
                        "--snapshots", snapshots, *common, *poh]
                if gloo_host:  # multi-host: Gloo listens on this rank's own address, not cluster.bind
                    argv += ["--host", gloo_host(host)]
            else:
                argv = [str(bins.worker), "ps", "-c", cfg, "--rank", str(rank), "--servers", server_eps, *common, *poh]
        else:
            name = "evaluator"
            where = ["--snapshots", snapshots] if info.mode == "allreduce" else ["--servers", server_eps]
            argv = [str(bins.worker), "eval", "-c", cfg, *where, *common, *poh]
        procs.append(Proc(name=name, role=role, rank=rank, index=i, host=host, argv=argv,
                          log=run_dir / "logs" / f"{name}.log"))
    return procs


def plan_local(info, run_dir, run_start, bins):
    bind = info.bind
    connect = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind, bind)
    ports = {}

    def port_of(i):
        if i not in ports:
            ports[i] = free_port(bind)
        return ports[i]

    procs = plan(info, run_dir, run_start, bins, lambda i: "local", port_of, lambda h: bind, lambda h: connect)
    for p in procs:
        p.command = p.argv
    return procs


def remote_bind(info):
    return "*" if is_loopback(info.bind) else info.bind


def plan_cluster(info, run_dir, run_start, bins, hosts, base_port):
    """ssh and Slurm: process i on hosts[i % len(hosts)], listening on base_port + i."""
    return plan(info, run_dir, run_start, bins, lambda i: hosts[i % len(hosts)], lambda i: base_port + i,
                lambda h: remote_bind(info), lambda h: h, gloo_host=lambda h: h)


def ssh_command(host, argv):
    remote = f"cd {shlex.quote(str(REPO))} && exec {shlex.join(argv)}"
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, remote]


def plan_ssh(info, run_dir, run_start, bins, base_port):
    procs = plan_cluster(info, run_dir, run_start, bins, info.hosts, base_port)
    for p in procs:
        p.command = ssh_command(p.host, p.argv)
    return procs


def srun_command(info, run_dir):
    n = len(process_layout(info))
    return ["srun", f"--ntasks={n}", "--kill-on-bad-exit=1", "--distribution=cyclic",
            "/usr/bin/python3", "experiments/launch.py", "task", str(run_dir)]


# ---- starting and stopping -----------------------------------------------------------------
def _die_with_parent():
    """Child side, before exec: SIGKILL this process if the launcher dies (even by SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def start(proc, cwd):
    proc.log.parent.mkdir(parents=True, exist_ok=True)
    with open(proc.log, "wb") as log:
        proc.popen = subprocess.Popen(proc.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent)


def stop_all(procs):
    """SIGTERM to every live process group, SIGKILL after KILL_GRACE_S; reaps them all."""
    live = [p for p in procs if p.popen is not None and p.popen.poll() is None]
    for p in live:
        try:
            os.killpg(p.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and any(p.popen.poll() is None for p in live):
        time.sleep(0.05)
    for p in live:
        if p.popen.poll() is None:
            try:
                os.killpg(p.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in live:
        p.popen.wait()
        # Anything else left in its group (none expected: the binaries do not fork).
        try:
            os.killpg(p.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return live


def describe_exit(rc):
    if rc is not None and rc < 0:
        try:
            return f"was killed by signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def log_tail(path, n=20):
    try:
        lines = pathlib.Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"    (no log: {e})"
    if not lines:
        return "    (the log is empty)"
    return "\n".join("    " + line for line in lines[-n:])


# ---- metrics: incremental reading for the progress line; whole files for the summary -------
class Tail:
    """New complete JSON lines of a file that another process is appending to."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
        return rows


def fmt_duration(s):
    if s is None or s != s or s == math.inf:
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """One line about the state of a run, from the newest metrics lines."""

    def __init__(self, info, run_dir, prefix):
        self.info, self.prefix = info, prefix
        self.tails = {r: Tail(run_dir / "metrics" / f"worker{r}.jsonl") for r in range(info.workers)}
        self.eval_tail = Tail(run_dir / "metrics" / "evaluator.jsonl")
        self.first = {}   # rank -> first train line
        self.latest = {}  # rank -> newest train line
        self.last_eval = None

    def poll(self):
        for r, tail in self.tails.items():
            for row in tail.read():
                if row.get("kind") == "train":
                    self.first.setdefault(r, row)
                    self.latest[r] = row
        for row in self.eval_tail.read():
            if row.get("kind") == "eval":
                self.last_eval = row

    def line(self, elapsed):
        info = self.info
        parts = [f"[{self.prefix}]"]
        acc = self.last_eval.get("test_acc") if self.last_eval else None
        if not self.latest:
            parts.append("starting: waiting for the first training metrics")
        else:
            total = info.total_steps
            epochs = [self.latest[r]["epoch"] for r in self.latest]
            mean_epoch = sum(epochs) / info.workers
            steps = [self.latest.get(r, {}).get("step", 0) for r in range(info.workers)]
            slow = min(range(info.workers), key=lambda r: steps[r])
            now_t = elapsed
            rate = sum(row.get("samples_per_s", 0.0) for r, row in self.latest.items()
                       if row["step"] < total and now_t - row["t"] < 5.0)
            parts.append(f"epoch {mean_epoch:.2f}/{info.epochs:g}" if info.raw["train"]["steps"] <= 0
                         else f"epoch {mean_epoch:.2f}")
            parts.append(f"step {min(steps)}/{total}" if min(steps) == max(steps)
                         else f"step {min(steps)}-{max(steps)}/{total}")
            losses = [row.get("loss") for row in self.latest.values()]
            losses = [x if isinstance(x, (int, float)) else math.nan for x in losses]  # NaN is written as null
            parts.append(f"loss {sum(losses) / len(losses):.4f}")
            parts.append(f"test acc {100 * acc:.2f}%" if acc is not None else "test acc -")
            parts.append(f"{rate:,.0f} samples/s")
            parts.append(f"elapsed {fmt_duration(elapsed)}")
            # ETA from the slowest worker's own pace between its first and newest lines.
            eta = None
            s_last = steps[slow]
            if s_last >= total:
                eta = 0.0
            elif slow in self.first and self.latest[slow]["t"] > self.first[slow]["t"]:
                f, l = self.first[slow], self.latest[slow]
                pace = (l["step"] - f["step"]) / (l["t"] - f["t"])
                if pace > 0:
                    eta = max(0.0, (total - s_last) / pace - (now_t - l["t"]))
            elif s_last > 0:
                eta = elapsed * (total - s_last) / s_last
            parts.append(f"ETA {fmt_duration(eta)}")
            return "  ".join(parts)
        if acc is not None:
            parts.append(f"test acc {100 * acc:.2f}%")
        parts.append(f"elapsed {fmt_duration(elapsed)}")
        return "  ".join(parts)


def read_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut short by a killed process
    except FileNotFoundError:
        pass
    return rows


def merged_staleness(finals):
    """{mean, p99, max, count} over the staleness histograms of every server and worker."""
    counts = []
    for fin in finals:
        for hist in (fin.get("staleness_hist") or {}).values():
            for s, c in enumerate(hist):
                if s >= len(counts):
                    counts.extend([0] * (s + 1 - len(counts)))
                counts[s] += c
    total = sum(counts)
    if total == 0:
        return None
    mean = sum(s * c for s, c in enumerate(counts)) / total
    cum, p99 = 0, 0
    for s, c in enumerate(counts):
        cum += c
        if cum >= 0.99 * total:
            p99 = s
            break
    mx = max(s for s, c in enumerate(counts) if c > 0)
    return {"mean": mean, "p99": p99, "max": mx, "count": total}


# Statuses of runs whose processes all finished (plotted and compared); "diverged": the
# training loss stopped being finite, which is the experiment's outcome, not a failure.
COMPLETED = ("ok", "diverged")


def summarize(info, run_dir, wall_s, status="ok", failure=None):
    """summary.json: the keys of design.md, plus step-time means and a few extras.

    samples_per_s (all workers together) = total samples / training span, where a worker's
    samples in a metrics window = samples_per_s * window length (t minus its previous line's
    t; for its first line the window's samples are step * batch), and the span runs from the
    earliest window start (first line's t minus its window's length) to the last train line.
    """
    metrics = run_dir / "metrics"
    batch = info.raw["train"]["batch"]
    worker_rows = {r: read_jsonl(metrics / f"worker{r}.jsonl") for r in range(info.workers)}
    train = {r: [x for x in rows if x.get("kind") == "train"] for r, rows in worker_rows.items()}
    # A worker whose loss stopped being finite wrote one "diverged" line; the earliest counts.
    diverged = min((x for rows in worker_rows.values() for x in rows if x.get("kind") == "diverged"),
                   key=lambda x: x.get("epoch", 0.0), default=None)
    if diverged and status == "ok":
        status = "diverged"
    evals = [x for x in read_jsonl(metrics / "evaluator.jsonl") if x.get("kind") == "eval"]
    finals = [x for k in range(info.servers) for x in read_jsonl(metrics / f"server{k}.jsonl")
              if x.get("kind") == "server_final"]

    total_samples, starts, ends = 0.0, [], []
    step_ms = {"compute": 0.0, "comm": 0.0, "wait": 0.0, "delay": 0.0}
    n_steps = 0
    per_worker = {}
    for r, rows in train.items():
        prev_t, prev_step = None, 0
        w_steps, w_ms = 0, {k: 0.0 for k in step_ms}
        for x in rows:
            steps = x["step"] - prev_step
            if prev_t is None:
                samples = steps * batch
                window = samples / x["samples_per_s"] if x["samples_per_s"] > 0 else 0.0
                starts.append(x["t"] - window)
            else:
                samples = x["samples_per_s"] * (x["t"] - prev_t)
            total_samples += samples
            for k in step_ms:
                w_ms[k] += x.get(f"{k}_ms", 0.0) * steps
            w_steps += steps
            prev_t, prev_step = x["t"], x["step"]
        if rows:
            ends.append(rows[-1]["t"])
            per_worker[str(r)] = {k: v / w_steps for k, v in w_ms.items()} if w_steps else None
            for k in step_ms:
                step_ms[k] += w_ms[k]
            n_steps += w_steps
    span = (max(ends) - min(starts)) if starts and ends else 0.0

    acc = [x for x in evals if "test_acc" in x]
    final = evals[-1] if evals else None
    hit = next((x for x in acc if x["test_acc"] >= info.target_acc), None)
    classification = info.raw["data"]["kind"] != "least-squares"
    s = {
        "mode": info.mode,
        "workers": info.workers,
        "servers": info.servers,
        "device": info.device,
        "seed": info.seed,
        "final_test_acc": final.get("test_acc") if final and classification else None,
        "best_test_acc": max(x["test_acc"] for x in acc) if acc else None,
        "target_acc": info.target_acc,
        "time_to_target_s": hit["t"] if hit else None,
        "epochs_to_target": hit["epoch"] if hit else None,
        "epochs": final["epoch"] if final else None,
        "samples_per_s": total_samples / span if span > 0 else None,
        "bytes_pushed": sum(f.get("bytes_in", 0) for f in finals) if finals else None,
        "bytes_pulled": sum(f.get("bytes_out", 0) for f in finals) if finals else None,
        "staleness": merged_staleness(finals) if info.mode != "allreduce" else None,
        "wall_s": wall_s,
        # extras
        "status": status,
        "final_test_loss": final.get("test_loss") if final else None,
        "final_is_last_eval": bool(final and final.get("final")),
        "evaluations": len(evals),
        "steps_per_worker": info.total_steps,
        "step_time_ms": {k: v / n_steps for k, v in step_ms.items()} if n_steps else None,
        "step_time_ms_per_worker": per_worker or None,
        "train_samples": total_samples,
    }
    if info.mode == "allreduce":
        ar = [x.get("allreduce_bytes") for rows in train.values() for x in rows[-1:]]
        if ar and all(v is not None for v in ar):
            s["bytes_pushed"] = s["bytes_pulled"] = sum(ar)
    if diverged:
        s["diverged"] = {k: diverged.get(k) for k in ("worker", "step", "epoch")}
    if failure:
        s["failure"] = failure
    return s


def result_line(label, s):
    def pct(v):
        return f"{100 * v:.2f}%" if v is not None else "-"
    parts = [f"[{label}] {s['status']}: final test acc {pct(s['final_test_acc'])} (best {pct(s['best_test_acc'])})"]
    if s["time_to_target_s"] is not None:
        parts.append(f"{pct(s['target_acc'])} reached at {s['time_to_target_s']:.1f} s, epoch {s['epochs_to_target']:.2f}")
    else:
        parts.append(f"{pct(s['target_acc'])} not reached")
    if s.get("diverged"):
        parts.append(f"training diverged at epoch {s['diverged']['epoch']:.2f} (loss not finite: lower "
                     "optimizer.lr or lengthen schedule.warmup_epochs)")
    if s["samples_per_s"]:
        parts.append(f"{s['samples_per_s']:,.0f} samples/s")
    parts.append(f"wall {s['wall_s']:.1f} s")
    return ", ".join(parts)


# ---- manifest ------------------------------------------------------------------------------
def _cmd_out(argv, cwd=None):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=cwd)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


_host_facts = None


def host_facts():
    """Facts that are the same for every run of an invocation (computed once)."""
    global _host_facts
    if _host_facts is None:
        cpu = None
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        gpu = None
        if shutil.which("nvidia-smi"):
            gpu = _cmd_out(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
        libs = {}
        out = _cmd_out(["dpkg-query", "-W", "-f=${Package} ${Version}\\n", *LIBRARY_PACKAGES])
        for line in (out or "").splitlines():
            pkg, _, ver = line.partition(" ")
            if ver:
                libs[pkg] = ver
        libs["python"] = platform.python_version()
        rev = _cmd_out(["git", "rev-parse", "HEAD"], cwd=REPO)
        status = _cmd_out(["git", "--no-optional-locks", "status", "--porcelain"], cwd=REPO)
        _host_facts = {
            "git": {"revision": rev, "dirty": bool(status) if status is not None else None},
            "host": socket.gethostname(),
            "cpu": {"model": cpu, "cores": os.cpu_count()},
            "gpu": gpu or None,
            "libraries": libs,
        }
    return _host_facts


def write_manifest(run_dir, info, label, procs, run_start, bins, extra=None):
    m = dict(host_facts())
    m.update({
        "name": info.name,
        "label": label,
        "mode": info.mode,
        "seed": info.seed,
        "launcher": info.launcher,
        "start_time": datetime.datetime.fromtimestamp(run_start).astimezone().isoformat(timespec="seconds"),
        "run_start_unix_s": run_start,
        "build_dir": str(bins.build),
        "launcher_command": shlex.join([sys.executable, *sys.argv]),
        "processes": [{"name": p.name, "role": p.role, "rank": p.rank, "host": p.host,
                       "pid": p.popen.pid if p.popen else None,
                       "command": shlex.join(p.command or p.argv)} for p in procs],
    })
    if extra:
        m.update(extra)
    (run_dir / "manifest.json").write_text(json.dumps(m, indent=2) + "\n")


# ---- one run -------------------------------------------------------------------------------
def run_plot(args_list, quiet=False):
    """Runs plot.py (Debian's python, which has matplotlib); a failure is a warning."""
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    p = subprocess.Popen([py, str(PLOT_PY), *args_list], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while p.poll() is None:
            sleep_checked(0.05)
    except Interrupted:
        p.kill()
        p.wait()
        raise
    out = p.stdout.read()
    p.stdout.close()
    if p.returncode != 0:
        warn(f"plot.py failed (exit {p.returncode}); the run's data is complete:\n{out.strip()}")
    elif not quiet:
        sys.stdout.write(out)


def monitor(procs, progress, run_start, deadline_s, failure_of):
    """Waits for every process; returns when all exited 0, raises RunFailed otherwise."""
    last_line = 0.0
    while True:
        check_signal()
        for p in procs:
            if p.returncode is None:
                rc = p.popen.poll()
                if rc is not None:
                    p.returncode = rc
                    if rc != 0:
                        raise failure_of(p)
        if all(p.returncode is not None for p in procs):
            return
        now = time.time()
        if now - run_start > deadline_s:
            running = ", ".join(p.name for p in procs if p.returncode is None)
            raise RunFailed(f"the run exceeded --max-minutes {deadline_s / 60:g} (wall-clock guard); "
                            f"still running: {running}")
        if now - last_line >= 1.0:
            progress.poll()
            say(progress.line(now - run_start))
            last_line = now
        time.sleep(0.1)


def process_failure(p):
    return RunFailed(f"{p.describe()} on {p.host} {describe_exit(p.returncode)}; the last lines of {p.log}:\n"
                     f"{log_tail(p.log)}")


def srun_failure(procs, srun_proc, run_dir):
    """Which task failed, from srun's own log ("srun: error: NODE: task 3: Exited with exit code 1")."""
    def make(p):
        text = p.log.read_text(errors="replace") if p.log.exists() else ""
        m = re.search(r"error:.*?tasks? (\d+)", text)
        msg = f"srun {describe_exit(p.returncode)}"
        if m and int(m.group(1)) < len(procs):
            t = procs[int(m.group(1))]
            tlog = run_dir / "logs" / f"{t.name}.log"
            msg += f"; task {t.index} = {t.describe()} failed; the last lines of {tlog}:\n{log_tail(tlog)}"
        return RunFailed(msg + f"\nthe last lines of {p.log}:\n{log_tail(p.log)}")
    return make


def execute_run(point, label, run_dir, bins, opts, prefix):
    """Starts one run, waits for it and writes its files; returns its summary (raises RunFailed)."""
    info = read_run_info(point)
    run_dir.mkdir(parents=True)
    (run_dir / "metrics").mkdir()
    (run_dir / "logs").mkdir()
    (run_dir / "config.toml").write_text(point)
    run_start = time.time()
    extra = {}
    if info.launcher == "local":
        procs = plan_local(info, run_dir, run_start, bins)
        started = procs
    elif info.launcher == "ssh":
        procs = plan_ssh(info, run_dir, run_start, bins, opts.base_port)
        started = procs
    else:  # slurm: one srun; each task finds its role (launch.py task)
        procs = plan_cluster(info, run_dir, run_start, bins, [f"<node of task {i}>" for i in range(len(process_layout(info)))],
                             opts.base_port)
        (run_dir / "launch.json").write_text(json.dumps({
            "run_start": run_start, "build_dir": str(bins.build), "base_port": opts.base_port}, indent=2) + "\n")
        srun = Proc(name="srun", role="srun", rank=-1, index=-1, host="local", argv=srun_command(info, run_dir),
                    log=run_dir / "logs" / "srun.log")
        srun.command = srun.argv
        started = [srun]
        extra["srun_command"] = shlex.join(srun.argv)
    write_manifest(run_dir, info, label, procs, run_start, bins, extra)
    progress = Progress(info, run_dir, prefix)
    failure_of = srun_failure(procs, started[0], run_dir) if info.launcher == "slurm" else process_failure
    try:
        for p in started:
            check_signal()
            start(p, REPO)
        if info.launcher != "slurm":
            write_manifest(run_dir, info, label, procs, run_start, bins, extra)  # now with pids
        monitor(started, progress, run_start, opts.max_minutes * 60, failure_of)
    except BaseException as e:
        stopped = stop_all(started)
        if not isinstance(e, (RunFailed, Interrupted)):
            raise  # a launcher bug: its processes are stopped all the same
        wall = time.time() - run_start
        failure = str(e) if isinstance(e, RunFailed) else f"stopped by {e}"
        s = summarize(info, run_dir, wall, status="failed" if isinstance(e, RunFailed) else "interrupted",
                      failure=failure.splitlines()[0])
        (run_dir / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
        if stopped:
            warn(f"stopped {len(stopped)} other process(es): {', '.join(p.name for p in stopped)}")
        raise
    wall = time.time() - run_start
    s = summarize(info, run_dir, wall)
    (run_dir / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    say(result_line(prefix, s))
    if not opts.no_plots:
        run_plot([str(run_dir), "--out", str(run_dir / "plots")], quiet=True)
    return s


# ---- comparison of the runs of an invocation -----------------------------------------------
COLUMNS = [("run", "run"), ("mode", "mode"), ("workers", "W"), ("servers", "S"), ("status", "status"),
           ("final_test_acc", "final acc"), ("best_test_acc", "best acc"), ("time_to_target_s", "time to target (s)"),
           ("epochs_to_target", "epochs to target"), ("epochs", "epochs"), ("samples_per_s", "samples/s"),
           ("staleness_mean", "staleness mean"), ("staleness_p99", "p99"), ("staleness_max", "max"),
           ("bytes_pushed", "bytes pushed"), ("bytes_pulled", "bytes pulled"), ("wall_s", "wall (s)")]


def comparison_rows(results):
    rows = []
    for label, s in results:
        st = s.get("staleness") or {}
        row = dict(s)
        row.update({"run": label, "staleness_mean": st.get("mean"), "staleness_p99": st.get("p99"),
                    "staleness_max": st.get("max")})
        rows.append(row)
    return rows


def fmt_cell(key, v):
    if v is None:
        return "-"
    if key in ("final_test_acc", "best_test_acc"):
        return f"{100 * v:.2f}%"
    if key in ("bytes_pushed", "bytes_pulled"):
        return f"{v / 1e6:.1f} MB"
    if key in ("samples_per_s",):
        return f"{v:,.0f}"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def write_comparison(inv_dir, results, target):
    rows = comparison_rows(results)
    with open(inv_dir / "comparison.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([k for k, _ in COLUMNS])
        for r in rows:
            w.writerow(["" if r.get(k) is None else r.get(k) for k, _ in COLUMNS])
    head = "| " + " | ".join(h for _, h in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [head, sep] + ["| " + " | ".join(fmt_cell(k, r.get(k)) for k, _ in COLUMNS) + " |" for r in rows]
    table = "\n".join(lines)
    ok = [r for r in rows if r.get("time_to_target_s") is not None]
    notes = []
    if ok:
        t = min(ok, key=lambda r: r["time_to_target_s"])
        e = min(ok, key=lambda r: r["epochs_to_target"])
        notes.append(f"First to {100 * target:.0f}% test accuracy in wall-clock time: **{t['run']}** "
                     f"({t['time_to_target_s']:.1f} s); in epochs: **{e['run']}** ({e['epochs_to_target']:.2f}).")
    missed = [r["run"] for r in rows if r.get("time_to_target_s") is None]
    if missed:
        notes.append(f"Did not reach {100 * target:.0f}%: {', '.join(missed)}.")
    md = [f"# {inv_dir.parent.name} / {inv_dir.name}", "",
          "Times are seconds from each run's start; samples/s counts all workers together; staleness "
          "(PS modes) is in versions of the shard; bytes as counted by the servers.", "", table, ""]
    md += [n for n in notes] + ([""] if notes else [])
    for png in ("convergence", "throughput", "step_time", "staleness"):
        if (inv_dir / "plots" / f"{png}.png").exists():
            md += [f"![{png}](plots/{png}.png)", ""]
    (inv_dir / "comparison.md").write_text("\n".join(md))
    return table, notes


# ---- commands ------------------------------------------------------------------------------
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


def dry_run(points, bins, opts, runs_dir):
    name = read_run_info(points[0][0]).name
    inv = pathlib.Path(runs_dir).resolve() / name / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    say(f"# dry run: {len(points)} run(s); nothing is started or written. Invocation directory would be {inv}")
    for i, (point, label) in enumerate(points):
        info = read_run_info(point)
        run_dir = inv / safe_dir_name(label)
        t = time.time()
        say(f"# run {i + 1}/{len(points)}: {label or '(no sweep)'} -> {run_dir}  "
            f"[launcher {info.launcher}, mode {info.mode}, {info.workers} workers, {info.servers} servers, "
            f"{info.total_steps} steps per worker]")
        if info.launcher == "local":
            say("# local: ports are free ports chosen afresh at launch")
            procs = plan_local(info, run_dir, t, bins)
        elif info.launcher == "ssh":
            procs = plan_ssh(info, run_dir, t, bins, opts.base_port)
        else:
            n = len(process_layout(info))
            say(f"[srun] {shlex.join(srun_command(info, run_dir))}")
            nodes = info.hosts or [f"NODE{i}" for i in range(n)]
            say(f"# slurm: each task runs `launch.py task {run_dir}`, which execs the command below "
                f"(node list here: {'cluster.hosts' if info.hosts else 'placeholders NODEi, one per task'}; "
                f"inside the job: the step's node list)")
            procs = plan_cluster(info, run_dir, t, bins, nodes, opts.base_port)
            for p in procs:
                p.command = p.argv
                say(f"[task{p.index} {p.name}@{p.host}] {shlex.join(p.command)}")
            continue
        for p in procs:
            say(f"[{p.name}@{p.host}] {shlex.join(p.command)}")


def cmd_run(a):
    config = pathlib.Path(a.config)
    if not config.is_file():
        raise UsageError(f"{config}: no such config file")
    bins = find_binaries(a.build_dir)
    runs_dir = pathlib.Path(a.runs_dir) if a.runs_dir else REPO / "runs"
    with tempfile.TemporaryDirectory(prefix="pslab-launch-") as tmp:  # gone before anything starts
        points = expand_sweep(bins, config, a.set or [], pathlib.Path(tmp))
    if a.dry_run:
        dry_run(points, bins, a, runs_dir)
        return 0
    first = read_run_info(points[0][0])
    inv = new_invocation_dir(runs_dir, first.name)
    latest = inv.parent / "latest"
    try:
        if latest.is_symlink() or not latest.exists():
            if latest.is_symlink():
                latest.unlink()
            latest.symlink_to(inv.name)
    except OSError:
        pass
    say(f"launch.py: {len(points)} run(s) of {config} -> {inv}")
    results, failed = [], []
    for i, (point, label) in enumerate(points):
        check_signal()
        dirname = safe_dir_name(label)
        info = read_run_info(point)
        prefix = f"{label or info.mode}" if len(points) == 1 else f"{i + 1}/{len(points)} {label or info.mode}"
        say(f"--- run {i + 1}/{len(points)}: {label or '(no sweep)'}: {info.mode}, {info.workers} workers"
            + (f", {info.servers} server{'s' if info.servers > 1 else ''}" if info.servers else "") + f", {info.total_steps} steps each "
            f"-> {inv / dirname}")
        try:
            s = execute_run(point, label, inv / dirname, bins, a, prefix)
            results.append((dirname, s))
        except RunFailed as e:
            print(f"launch.py: FAILED {dirname}: {e}", file=sys.stderr, flush=True)
            failed.append(dirname)
            try:
                results.append((dirname, json.loads((inv / dirname / "summary.json").read_text())))
            except (OSError, ValueError):
                pass
            if not a.keep_going:
                break
    if results:
        if not a.no_plots and any(s["status"] in COMPLETED for _, s in results):
            run_plot([*(str(inv / d) for d, s in results if s["status"] in COMPLETED), "--out", str(inv / "plots")],
                     quiet=True)
        table, notes = write_comparison(inv, results, first.target_acc)
        say("")
        say(table)
        for n in notes:
            say(n.replace("**", ""))
        say("")
    say(f"launch.py: run directories, comparison.md/.csv and plots/ in {inv}")
    if failed:
        warn(f"{len(failed)} run(s) failed: {', '.join(failed)}")
        return 1
    return 0


def cmd_task(a):
    """One Slurm task: find this task's role, exec its binary (or --print its command)."""
    run_dir = pathlib.Path(a.run_dir).resolve()
    launch = json.loads((run_dir / "launch.json").read_text())
    info = read_run_info(run_dir / "config.toml")
    try:
        procid, ntasks = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    except (KeyError, ValueError) as e:
        raise UsageError(f"task: SLURM_PROCID and SLURM_NTASKS must be set (by srun): {e}")
    n = len(process_layout(info))
    if ntasks != n:
        raise UsageError(f"task: SLURM_NTASKS = {ntasks}, but this run has {n} processes "
                         f"({info.servers} servers + {info.workers} workers + 1 evaluator)")
    if a.hosts:
        nodes = [h for h in a.hosts.split(",") if h]
    else:
        nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise UsageError("task: neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set")
        out = _cmd_out(["scontrol", "show", "hostnames", nodelist])
        if not out:
            raise UsageError(f"task: `scontrol show hostnames {nodelist}` failed")
        nodes = out.split()
    bins = Binaries(pathlib.Path(launch["build_dir"]), pathlib.Path(launch["build_dir"]) / "worker" / "pslab_worker",
                    pathlib.Path(launch["build_dir"]) / "server" / "pslab_server")
    procs = plan_cluster(info, run_dir, launch["run_start"], bins, nodes, launch["base_port"])
    me = procs[procid]
    here = os.environ.get("SLURMD_NODENAME")
    if not a.print and here and nodes and here != me.host and here.split(".")[0] != me.host.split(".")[0]:
        raise UsageError(f"task {procid} ({me.name}) runs on {here}, but the cyclic placement puts it on {me.host}; "
                         f"the launcher's srun uses --distribution=cyclic")
    if a.print:
        print(f"# task {procid}/{ntasks}: {me.name} on {me.host}", file=sys.stderr)
        print(shlex.join(me.argv))
        return 0
    me.log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(me.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.chdir(REPO)
    os.execv(me.argv[0], me.argv)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="launch.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run an experiment config (a sweep: one run per point)",
                       description="Run an experiment config; a sweep runs one point after the other. "
                                   "See `launch.py --help` for the layout and the launchers.")
    r.add_argument("config", help="experiment config (TOML); `pslab_worker config --keys` lists the keys")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key for every run, e.g. --set optimizer.lr=0.05 (TOML value; repeatable); "
                        "applied before the sweep expands, so --set cluster.mode=bsp on a mode sweep runs bsp alone")
    r.add_argument("--runs-dir", help="the directory that holds <name>/<YYYYmmdd-HHMMSS>/ (default: <repo>/runs)")
    r.add_argument("--build-dir", help="build directory with worker/pslab_worker and server/pslab_server "
                                       "(default: $PSLAB_BUILD, else <repo>/build)")
    r.add_argument("--dry-run", action="store_true", help="print every process's command line; start nothing")
    r.add_argument("--no-plots", action="store_true", help="do not draw plots")
    r.add_argument("--keep-going", action="store_true", help="in a sweep, go on with the next run after a failed one")
    r.add_argument("--max-minutes", type=float, default=60.0,
                   help="wall-clock guard per run: stop it and fail after this many minutes (default 60)")
    r.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                   help=f"ssh / slurm: process i listens on BASE + i (default {DEFAULT_BASE_PORT})")
    t = sub.add_parser("task", help="one task of a Slurm run (srun starts it; not for direct use)",
                       description="One task of a Slurm run: reads SLURM_PROCID, SLURM_NTASKS and the node list, "
                                   "and execs the binary of its role with its output in RUN_DIR/logs/.")
    t.add_argument("run_dir", help="the run directory the launcher prepared (config.toml, launch.json)")
    t.add_argument("--print", action="store_true", help="print this task's command instead of running it")
    t.add_argument("--hosts", help="the node list, comma-separated (default: `scontrol show hostnames` of "
                                   "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST)")
    a = ap.parse_args(argv)
    try:
        if a.command == "task":
            return cmd_task(a)
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGTERM, _on_signal)
        return cmd_run(a)
    except UsageError as e:
        msg = str(e)
        print(msg if msg.startswith("pslab_worker:") else f"launch.py: error: {msg}", file=sys.stderr)
        if msg.startswith("pslab_worker:"):
            print("launch.py: the config is invalid; nothing was started", file=sys.stderr)
        return 2
    except Interrupted as e:
        warn(f"interrupted by {e}; every process of the run was stopped")
        return 128 + e.signum


if __name__ == "__main__":
    sys.exit(main())
