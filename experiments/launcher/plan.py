"""What each run of an invocation is, as the binary plans it: the sweep expanded and every point
validated by `pslab_worker config` (--expand, then --write and --plan per point), the RunPlan the
launcher works from, and the names of run and invocation directories."""
import datetime
import json
import os
import pathlib
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass

from .common import REPO, UsageError, write_file
from .processes import check_signal


@dataclass
class Binaries:
    build: pathlib.Path
    worker: pathlib.Path
    server: pathlib.Path

    @classmethod
    def at(cls, build):
        build = pathlib.Path(build)
        return cls(build, build / "worker" / "pslab_worker", build / "server" / "pslab_server")


def find_binaries(build_dir):
    b = Binaries.at(pathlib.Path(build_dir or os.environ.get("PSLAB_BUILD") or REPO / "build").resolve())
    for path in (b.worker, b.server):
        if not os.access(path, os.X_OK):
            raise UsageError(f"{path} not found; build it with experiments/setup.sh, or point "
                             f"--build-dir / PSLAB_BUILD at a build directory")
    return b


CONFIG_TIMEOUT_S = 120  # pslab_worker config: reads a config, the headers of its data sets


def binary_config(bins, args, named=None):
    """Runs `pslab_worker config ARGS`; returns stdout or raises UsageError with the binary's error
    (named: {a temporary file's path: what to call it there}, e.g. the run's config and label)."""
    try:
        p = subprocess.run([str(bins.worker), "config", *args], capture_output=True, text=True, timeout=CONFIG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{bins.worker} config {shlex.join(args)} did not answer within {CONFIG_TIMEOUT_S} s "
                         f"(it reads the config and its data sets' headers: is a data.path on a file system "
                         f"that hangs?)") from None
    check_signal()  # a Ctrl-C reaches the binary too
    if p.returncode != 0:
        why = (p.stderr or p.stdout).strip() or f"pslab_worker config exited {p.returncode}"
        for path, name in (named or {}).items():
            why = why.replace(path, name)
        raise UsageError(why)
    return p.stdout


@dataclass(frozen=True)
class RunPlan:
    """One run: its resolved config and the binary's plan of it (plan.json), which says how many
    processes of which role, how long and on what data; nothing here is computed from the config."""
    label: str | None   # the sweep label, e.g. "mode=ssp:2"; None without a sweep
    config_text: str    # config.toml of the run: the config, every default filled in
    plan_text: str      # plan.json of the run, as the binary wrote it
    plan: dict          # the same, parsed

    @classmethod
    def from_texts(cls, plan_text, config_text, label=None):
        return cls(label=label, config_text=config_text, plan_text=plan_text, plan=json.loads(plan_text))

    @classmethod
    def load(cls, run_dir):
        """The plan a run directory holds (plan.json, config.toml)."""
        run_dir = pathlib.Path(run_dir)
        try:
            return cls.from_texts((run_dir / "plan.json").read_text(), (run_dir / "config.toml").read_text())
        except (OSError, ValueError, KeyError) as e:
            raise UsageError(f"{run_dir}: not a run directory the launcher prepared (plan.json, config.toml): {e}")

    def write(self, run_dir):
        write_file(run_dir / "config.toml", self.config_text)
        write_file(run_dir / "plan.json", self.plan_text)

    # The plan's keys the launcher uses (`pslab_worker config --plan -` shows them all).
    name = property(lambda self: self.plan["name"])
    mode = property(lambda self: self.plan["mode"])                   # a name, e.g. "ssp:2"
    uses_servers = property(lambda self: self.plan["uses_servers"])   # False: all-reduce
    workers = property(lambda self: self.plan["workers"])
    servers = property(lambda self: self.plan["servers"])             # 0 when uses_servers is false
    replicas = property(lambda self: self.plan.get("replicas") or 1)  # 2: each server has a backup process
    transport = property(lambda self: self.plan["transport"])         # "tcp", "ipc", "shm", "auto"
    # The form of the transport's addresses: "tcp", "ipc" (Unix sockets: every process on one
    # host) or "auto" (ipc when every process is on one host). Plans from before it was written
    # had tcp and ipc alone.
    addresses = property(lambda self: self.plan.get("addresses", self.plan["transport"]))

    @property
    def unix_sockets(self):
        """The listeners are Unix sockets in a directory of the run: ipc and shm always; auto when
        the launcher puts every process on one host (local, or ssh / Slurm with one host)."""
        if self.addresses == "auto":
            return self.launcher == "local" or len(set(self.hosts)) == 1
        return self.addresses == "ipc"

    @property
    def mixes_transports(self):
        """auto with the processes of a parameter-server run over several hosts: each pair talks
        over shm where both are on one host, over TCP otherwise (a server listens on both). An
        all-reduce run over several hosts uses TCP throughout (its collective is Gloo)."""
        return self.addresses == "auto" and self.uses_servers and not self.unix_sockets

    @property
    def socket_dir_needed(self):
        """Listeners bind Unix sockets in a private directory of the run (made on every host)."""
        return not self.virtual and (self.unix_sockets or self.mixes_transports)

    @property
    def virtual(self):
        """cluster.launcher = "virtual": one process, simulated time, nothing listens."""
        return self.launcher == "virtual"

    @property
    def authenticates(self):
        """Whether the run's peers prove its key (cluster.auth): "curve" yes, "none" no, "auto" whenever
        a listener is a TCP port, on loopback too (another user of the host could reach it); not
        when every listener is a Unix socket in the run's private directory."""
        auth = self.plan.get("auth", "none")
        if self.virtual:
            return False
        if auth != "auto":
            return auth == "curve"
        return not self.unix_sockets

    launcher = property(lambda self: self.plan["launcher"])           # "local", "ssh", "slurm" or "virtual"
    hosts = property(lambda self: list(self.plan["hosts"]))
    bind = property(lambda self: self.plan["bind"])                   # the local launcher's listeners
    interface = property(lambda self: self.plan.get("interface", ""))  # ssh, Slurm: every host's (hosts.py)
    host_addresses = property(lambda self: list(self.plan.get("host_addresses", [])))  # "HOST=ADDRESS|INTERFACE"
    device = property(lambda self: self.plan["device"])
    # Who computes the gradients: "builtin" (pslab_worker) or "python" (worker.script, by
    # worker.python, for every worker and the evaluator). Plans from before it was written: builtin.
    worker_kind = property(lambda self: self.plan.get("worker", {}).get("kind", "builtin"))
    worker_script = property(lambda self: self.plan["worker"]["script"])
    worker_python = property(lambda self: self.plan["worker"]["python"])
    collective = property(lambda self: self.plan.get("collective", "auto"))  # allreduce on GPUs
    mps = property(lambda self: self.plan.get("mps", "auto"))                # GPUs shared through MPS (mps.py)
    seed = property(lambda self: self.plan["seed"])
    batch = property(lambda self: self.plan["batch"])                 # per worker and step
    # samples behind one update of every worker: workers x batch x train.accumulate
    global_batch = property(lambda self: self.plan.get("global_batch", self.plan["workers"] * self.plan["batch"]))
    classification = property(lambda self: self.plan["data"]["classification"])
    total_steps = property(lambda self: self.plan["total_steps"])     # per worker
    epochs = property(lambda self: self.plan["epochs"])               # what the total steps amount to
    target_acc = property(lambda self: self.plan["target_acc"])
    processes = property(lambda self: self.plan["processes"])         # [{name, role, rank}] in start order
    # "continue": a worker that dies or falls silent is dropped by the servers and the run goes on
    # (asp, ssp); "fail": it fails the run. Plans from before it was written: "fail".
    on_worker_loss = property(lambda self: self.plan.get("on_worker_loss", "fail"))
    heartbeat_s = property(lambda self: self.plan.get("heartbeat_s"))
    # ssh: how long the launcher and a remote end go without hearing each other (cluster.ssh_alive_s)
    ssh_alive_s = property(lambda self: self.plan.get("ssh_alive_s", 60.0))

    @property
    def checkpoint_every_s(self):
        """checkpoint.every_s, from the run's config (the binary writes every key out)."""
        return tomllib.loads(self.config_text).get("checkpoint", {}).get("every_s", 30.0)
    # "restart": a server that dies is restarted from its checkpoint and the run goes on (asp,
    # ssp over tcp or ipc; not under Slurm); "fail". Plans from before it was written: "fail".
    on_server_loss = property(lambda self: self.plan.get("on_server_loss", "fail"))


def expand_sweep(bins, config, sets, tmp):
    """Returns the RunPlan of every sweep point, each validated and planned by the binary.
    The binary applies --set before expanding: a swept key overridden with one value is no
    longer swept."""
    args = ["-c", str(config)]
    for s in list(sets) + absolute_paths(config, sets):
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
    # Each point once more through the binary: its fully resolved form and its plan.
    plans = []
    for i, (path, label) in enumerate(points):
        config_out, plan_out = tmp / f"resolved{i:03d}.toml", tmp / f"plan{i:03d}.json"
        binary_config(bins, ["-c", str(path), "--write", str(config_out), "--plan", str(plan_out)])
        plans.append(RunPlan.from_texts(plan_out.read_text(), config_out.read_text(), label))
    return plans


# Keys naming a file, which every process (on any host, from any directory) must find.
PATH_KEYS = (("worker", "script"), ("model", "theta_file"))


def absolute_paths(config, sets):
    """--set KEY=PATH for each PATH_KEYS file a --set names by a path relative to this directory,
    made absolute (the binary makes the config file's own relative to the file's directory, in
    every variant and sweep point)."""
    out = []
    for section, key in PATH_KEYS:
        given = [s.partition("=")[2].strip().strip('"\'') for s in sets if s.partition("=")[0].strip() == f"{section}.{key}"]
        if given and given[-1] and not os.path.isabs(given[-1]):
            out.append(f"{section}.{key}={json.dumps(str((pathlib.Path.cwd() / given[-1]).resolve()), ensure_ascii=False)}")
    return out


def replan(bins, plan, sets, tmp):
    """The plan with `sets` (KEY=VALUE, as --set) applied, through the binary once more, so that
    the run's config.toml and plan.json record what the launcher decided."""
    tmp = pathlib.Path(tmp)
    src, config_out, plan_out = tmp / "replan-in.toml", tmp / "replan.toml", tmp / "replan.json"
    src.write_text(plan.config_text)
    args = ["-c", str(src)]
    for s in sets:
        args += ["--set", s]
    binary_config(bins, args + ["--write", str(config_out), "--plan", str(plan_out)],
                  named={str(src): f"the run's config{f' [{plan.label}]' if plan.label else ''} with {', '.join(sets)}"})
    return RunPlan.from_texts(plan_out.read_text(), config_out.read_text(), plan.label)


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
