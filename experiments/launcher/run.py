"""One invocation of `launch.py run`: the dry run, each run started, watched and summarized, the
plots and the comparison."""
import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from .common import REPO, CannotWrite, RunFailed, UsageError, cmd_out, disk_trouble, numerics_env, say, warn, write_file
from .comparison import write_comparison
from .manifest import write_manifest
from .hosts import probe_hosts
from .mps import decide_mps, mps_daemon
from .monitor import Progress, how_it_ended, monitor, process_failure, srun_failure
from .scripts import needs_theta0, theta0_sets
from .placement import (DRY_RUN_SOCKET_DIR, Proc, checkpoint_path, cluster_hosts, fixed_or_probed_ports, plan_cluster,
                        plan_local, plan_ssh, plan_virtual, ports_wanted, resume_arguments, run_key_path, shard_checkpoint,
                        socket_dir, srun_command, ssh_base, ssh_command)
from .metrics import read_jsonl
from .plan import RunPlan, new_invocation_dir, replan, safe_dir_name
from .processes import (Heartbeat, Interrupted, check_signal, close_stdin, communicate_checked, end_groups, log_tail,
                        start, stop_all)
from .summary import COMPLETED, result_line, summarize

PLOT_PY = REPO / "experiments" / "plot.py"


def plot_interpreters():
    """Where plot.py may run, in the order tried: $PSLAB_PLOT_PYTHON alone if set; else this
    launcher's Python, Debian's /usr/bin/python3, and python3 on PATH."""
    if os.environ.get("PSLAB_PLOT_PYTHON"):
        return [os.environ["PSLAB_PLOT_PYTHON"]]
    found = []
    for c in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if c and os.path.exists(c) and c not in found:
            found.append(c)
    return found


_plot_python = {}  # tuple of candidates -> the first that imports matplotlib, or None


def plot_python(candidates=None):
    """The first of `candidates` (default: plot_interpreters()) that can import matplotlib, or
    None; each list is checked once per launcher."""
    key = tuple(plot_interpreters() if candidates is None else candidates)
    if key not in _plot_python:
        _plot_python[key] = None
        for py in key:
            try:
                ok = subprocess.run([py, "-c", "import matplotlib"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, timeout=60).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if ok:
                _plot_python[key] = py
                break
    return _plot_python[key]


def no_plot_python_warning():
    return (f"no Python with matplotlib found (tried: {', '.join(plot_interpreters()) or 'none'}); the runs go on "
            "without plots: apt-get install python3-matplotlib, set PSLAB_PLOT_PYTHON, or pass --no-plots")


def run_plot(args_list, quiet=False):
    """Runs plot.py with an interpreter that has matplotlib (plot_python()); a failure is a warning."""
    py = plot_python()
    if py is None:
        warn(no_plot_python_warning())
        return
    p = subprocess.Popen([py, str(PLOT_PY), *args_list], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL)
    try:
        while True:  # its output read as it comes (a full pipe would stop plot.py), a signal heard
            try:
                out, _ = p.communicate(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                check_signal()
    except Interrupted:
        p.kill()
        p.wait()
        raise
    if p.returncode != 0:
        warn(f"plot.py failed (exit {p.returncode}); the run's data is complete:\n{out.strip()}")
    elif not quiet:
        sys.stdout.write(out)


@contextlib.contextmanager
def running(run_dir):
    """Holds RUN_DIR/launcher.lock while this launcher runs the run (released when it ends, or
    dies): a resume of a run that is going on is refused (both would write its checkpoints)."""
    try:
        f = open(run_dir / "launcher.lock", "a")
    except OSError:  # (a run directory that cannot be written: the run says so, naming the file)
        yield
        return
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise UsageError(f"{run_dir}: the run is going on (another launcher holds {run_dir / 'launcher.lock'}); "
                         "stop it (Ctrl-C) before resuming it") from None
    try:
        yield
    finally:
        f.close()


def execute_run(plan, run_dir, bins, opts, prefix):
    """Starts one run, waits for it and writes its files; returns its summary (raises RunFailed,
    Interrupted). ipc: its socket directory exists while the run does."""
    run_dir.mkdir(parents=True)
    (run_dir / "metrics").mkdir()
    (run_dir / "logs").mkdir()
    (run_dir / "checkpoints").mkdir(mode=0o700)  # the servers' shards or rank 0's θ (--checkpoint), for resuming
    plan.write(run_dir)  # config.toml, plan.json
    if needs_theta0(plan):  # the user's script says θ0 and the model's sizes (scripts.py)
        with tempfile.TemporaryDirectory(prefix="pslab-theta0-") as tmp:
            plan = replan(bins, plan, theta0_sets(plan, run_dir, bins), tmp)
        plan.write(run_dir)
    if plan.authenticates:
        make_run_key(bins, run_dir)
    with running(run_dir), socket_dir(plan) as sockets, mps_daemon(plan, run_dir) as mps_env:
        s = start_and_watch(plan, run_dir, bins, opts, prefix, sockets, mps_env=mps_env)
    say(result_line(prefix, s))
    if not opts.no_plots:
        run_plot([str(run_dir), "--out", str(run_dir / "plots")], quiet=True)
    return s


def resume_run(run_dir, bins, opts):
    """launch.py resume: goes on with a stopped or failed run in its own directory, from the
    servers' checkpoints. Returns the exit status."""
    run_dir = pathlib.Path(run_dir).resolve()
    plan = RunPlan.load(run_dir)
    with running(run_dir):
        return resume_held(run_dir, plan, bins, opts)


def resume_held(run_dir, plan, bins, opts):
    """resume_run's work, this launcher holding the run."""
    try:
        before = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        before = {}
    if before.get("status") in COMPLETED:
        raise UsageError(f"{run_dir}: the run finished ({before['status']}); there is nothing to resume")
    if plan.worker_kind == "python":
        raise UsageError(f"{run_dir}: its workers are a script of yours (worker.kind = \"python\"), which cannot go on "
                         f"from the servers' checkpoints; start the run anew")
    if plan.mode.split(":")[0] in ("local", "easgd"):  # (refused by each worker once started, else)
        raise UsageError(f"{run_dir}: cluster.mode = \"{plan.mode}\" keeps each worker's own θ and optimizer state on "
                         f"the worker, which checkpoints do not hold: a run in this mode cannot be resumed; start it anew")
    needed = ([shard_checkpoint(run_dir, p["rank"]) for p in plan.processes if p["role"] == "server"] if plan.uses_servers
              else [checkpoint_path(run_dir, "allreduce")])
    missing = [str(c) for c in needed if not c.is_file()]
    if missing:
        raise UsageError(f"{run_dir}: no checkpoint to resume from: {', '.join(missing)} missing"
                         + ("" if plan.uses_servers else " (rank 0 writes it every checkpoint.every_s)"))
    try:
        run_start = json.loads((run_dir / "manifest.json").read_text())["run_start_unix_s"]
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"{run_dir}/manifest.json: cannot read the run's start: {e}")
    prefix = plan.label or plan.mode
    if not opts.no_plots and plot_python() is None:
        warn(no_plot_python_warning())
        opts.no_plots = True
    say(f"launch.py: resuming {run_dir} ({plan.mode}, {plan.workers} workers"
        + (f", {plan.servers} server(s)" if plan.uses_servers else "") + ") from "
        f"{run_dir / 'checkpoints'}")
    try:
        with socket_dir(plan) as sockets, mps_daemon(plan, run_dir) as mps_env:
            s = start_and_watch(plan, run_dir, bins, opts, prefix, sockets, resume_from=run_start, mps_env=mps_env)
    except RunFailed as e:
        print(f"launch.py: FAILED {run_dir}: {e}{disk_trouble(run_dir)}", file=sys.stderr, flush=True)
        return 1
    say(result_line(prefix, s))
    if not opts.no_plots:
        run_plot([str(run_dir), "--out", str(run_dir / "plots")], quiet=True)
    return 0


def slurm_job_ended():
    """Why this Slurm job ended, when Slurm ended it ("the Slurm job 12 was cancelled (its time
    limit)"), from `scontrol show job`; None otherwise (a user's Ctrl-C or kill)."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    # A job Slurm is ending says COMPLETING until its final state shows (tens of ms; longer on a
    # loaded controller); a signal from a user leaves it RUNNING.
    deadline = time.monotonic() + 5.0
    while True:
        out = cmd_out(["scontrol", "show", "job", "-o", job])
        state = re.search(r"\bJobState=(\S+)", out or "")
        if not state or state.group(1) != "COMPLETING" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    reason = re.search(r"\bReason=(\S+)", out or "")
    if not state or state.group(1) not in ("CANCELLED", "TIMEOUT", "DEADLINE", "PREEMPTED", "NODE_FAIL"):
        return None
    why = {"CANCELLED": "by scancel", "TIMEOUT": "its time limit", "DEADLINE": "its deadline",
           "PREEMPTED": "preempted", "NODE_FAIL": "a node failed"}[state.group(1)]
    if reason and reason.group(1) not in ("None", "(null)"):
        why += f", {reason.group(1)}"
    return f"the Slurm job {job} was cancelled ({why})"


def probe_slurm_ports(count):
    """{node: `count` ports free there now}, from a first step of one task per node of the
    allocation (launch.py probe --slurm), so that concurrent jobs on a node never share a port;
    None (each task then derives a window from the job's id, saying so) where it cannot ask."""
    nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
    if not (nodes and nodes.isdigit()):
        return None
    argv = ["srun", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "/usr/bin/python3",
            "experiments/launch.py", "probe", "--slurm", "--ports", str(count)]
    try:
        p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL)
        try:
            stdout, stderr = communicate_checked(p, 60)  # (Ctrl-C heard meanwhile)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        found = {}
        for line in stdout.splitlines():
            row = json.loads(line)
            found[row["node"]] = row["ports"]
        if p.returncode == 0 and len(found) == int(nodes):
            return found
        why = f"srun exited {p.returncode}: {stderr.strip()[-300:] or 'no output'}"
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        why = str(e)
    warn(f"could not ask the allocation's nodes for free ports ({why}); each task derives its ports from the job's id")
    return None


def make_run_key(bins, run_dir):
    """The run's key (cluster.auth), mode 0600 in the run directory, for its processes alone."""
    path = run_key_path(run_dir)
    try:
        r = subprocess.run([str(bins.worker), "keygen", str(path)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"cannot make the run's key {path}: {bins.worker} keygen did not answer within 60 s") from None
    if r.returncode != 0:
        raise RunFailed(f"cannot make the run's key {path}: {(r.stderr or r.stdout).strip()}")


def start_and_watch(plan, run_dir, bins, opts, prefix, sockets, resume_from=None, mps_env=None):
    """Starts the run's processes, waits for them all, writes manifest.json and summary.json.
    resume_from: a resumed run's original start (Unix s; metric times go on counting from it);
    mps_env: what points the local processes at the run's MPS daemon (mps.py), if any."""
    return Supervisor(plan, run_dir, bins, opts, sockets, resume_from, mps_env).run(prefix)


class Supervisor:
    """One run's processes from start to end: placed by the launcher (local, virtual, ssh, Slurm),
    started, watched (a worker lost where the run goes on without it, a server restarted from its
    checkpoint), stopped when one fails, then summarized."""

    def earlier_summary(self):
        try:
            return json.loads((self.run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            return {}

    def __init__(self, plan, run_dir, bins, opts, sockets, resume_from, mps_env=None):
        self.plan, self.run_dir, self.bins, self.opts, self.sockets = plan, run_dir, bins, opts, sockets
        self.resume_from = resume_from
        self.env = mps_env or None
        self.run_start = resume_from or time.time()
        self.extra = {"transport": plan.transport, "auth": "curve" if plan.authenticates else "none"}
        if resume_from:
            self.extra["resumed_at_unix_s"] = time.time()
        if sockets:
            self.extra["socket_dir"] = str(sockets)
        if self.env:
            self.extra["mps_pipe_dir"] = self.env["CUDA_MPS_PIPE_DIRECTORY"]
        self.lost = []       # workers that failed while the run went on: {"worker", "how", "log"}
        self.restarted = []  # servers restarted from their checkpoints: {"server", "how", "log"}
        self.failed_over = []  # cluster.replicas = 2: copies of shards that ended: {"shard", "process", "how", "log"}
        # A resumed run's earlier lives' restarts and copies ended, as its summary.json said them
        # (the summary holds every life's, as updates_lost does; the limits count this life's).
        earlier = self.earlier_summary() if resume_from else {}
        self.earlier = (list(earlier.get("servers_restarted") or []), list(earlier.get("copies_ended") or []))
        self.records = None  # the processes' records in the manifest last written
        self.procs, self.started = self.place()  # started: what the launcher starts (Slurm: srun)
        self.launched = []  # of those, the ones started so far (and any started in a dead one's place)
        if resume_from:  # servers from their checkpoints; workers go on from the clocks those hold
            for p in self.procs:
                p.argv += resume_arguments(run_dir, p)
                p.command = ssh_command(p, plan.ssh_alive_s, sockets, append=True) if plan.launcher == "ssh" else p.argv

    def place(self):
        """The run's processes by launcher, and those this launcher starts itself."""
        plan, run_dir, bins, opts, sockets = self.plan, self.run_dir, self.bins, self.opts, self.sockets
        if plan.launcher == "local":
            procs = plan_local(plan, run_dir, self.run_start, bins, sockets)
            return procs, procs
        if plan.virtual:  # one process, simulated time
            self.extra["simulated"] = True
            procs = plan_virtual(plan, run_dir, bins, getattr(opts, "procs_on_host", 1))
            return procs, procs
        if plan.launcher == "ssh":
            where = cluster_hosts(plan, plan.hosts)
            probed = probe_hosts(plan, where, ports_wanted(where) if opts.base_port is None else {}, ssh_base())
            self.extra["hosts"] = probed  # each host's address, and the ports chosen on it
            procs = plan_ssh(plan, run_dir, self.run_start, bins, probed, opts.base_port, sockets, append=bool(self.resume_from))
            return procs, procs
        return self.place_slurm()

    def place_slurm(self):
        """Slurm: one srun; each task finds its role (launch.py task)."""
        plan, run_dir, opts, sockets = self.plan, self.run_dir, self.opts, self.sockets
        n = len(plan.processes)
        nodes = ["<the node>"] * n if plan.unix_sockets else [f"<node of task {i}>" for i in range(n)]
        procs = plan_cluster(plan, run_dir, self.run_start, self.bins, nodes,
                             fixed_or_probed_ports(nodes, None, opts.base_port), lambda h: h, sockets)
        ports = probe_slurm_ports(n) if opts.base_port is None and not plan.unix_sockets else None
        write_file(run_dir / "launch.json", json.dumps({
            "run_start": self.run_start, "build_dir": str(self.bins.build), "base_port": opts.base_port,
            "ports": ports,  # {node: ports free there}, or None: each task derives a window (task.slurm_ports)
            "socket_dir": str(sockets) if sockets else None,
            "resume": bool(self.resume_from)}, indent=2) + "\n")  # each task adds --resume (task.py)
        srun = Proc(name="srun", role="srun", rank=-1, index=-1, host="local", argv=srun_command(plan, run_dir),
                    log=run_dir / "logs" / "srun.log")
        srun.command = srun.argv
        self.extra["srun_command"] = shlex.join(srun.argv)
        return procs, [srun]

    def manifest(self, placed=False, interruptible=False, stopping=False):
        """manifest.json, now; stopping: what never started keeps the records last written."""
        self.records = write_manifest(self.run_dir, self.plan, self.procs, self.run_start, self.bins, self.extra,
                                      placed=placed, interruptible=interruptible,
                                      previous=self.records if stopping else None)

    def tolerate(self, p):
        """A worker's failure in a run that goes on without it (cluster.on_worker_loss), or a
        server's that is restarted from its checkpoint (cluster.on_server_loss): said once."""
        plan = self.plan
        if p.role in ("server", "backup") and plan.replicas > 1:
            return self.fail_over(p)
        if p.role == "server":
            return self.restart_server(p)
        if plan.on_worker_loss != "continue" or p.role != "worker" or len(self.lost) + 1 >= plan.workers:
            return False
        # Died (a signal: -N locally, 128+N through a shell, 255 when ssh lost it), not an error
        # exit: a worker that exits 1 names what went wrong (often a peer), which fails the run;
        # unless the servers had dropped it (it woke up and was told so).
        self.progress.poll()
        if 0 <= p.returncode < 128 and p.rank not in self.progress.dropped:
            return False
        if p.rank not in self.progress.first and p.rank not in self.progress.dropped:
            return False  # it failed before training: a problem with its start, not a loss (unless the servers dropped it)
        self.lost.append({"worker": p.rank, "how": how_it_ended(p), "log": str(p.log)})
        self.progress.forget(p.rank)
        warn(f"{p.describe()} on {p.host} {how_it_ended(p)}; the run goes on without it "
             f"({plan.mode}, cluster.on_worker_loss = \"continue\": the servers drop it after "
             f"cluster.heartbeat_s = {plan.heartbeat_s:g} s of silence); the last lines of {p.log}:\n{log_tail(p.log, 5)}")
        return True

    def act_on_verdict(self):
        """A worker the servers dropped (silent for cluster.heartbeat_s: hung, stopped, cut off;
        or refused by the push guard) whose process still runs: stopped and recorded as lost, so
        that the run ends when training does rather than waiting for it. One dropped as silent
        may come back within cluster.reconnect_s (its link was down): stopped once that has
        passed, or once no server runs."""
        servers_run = any(q.role in ("server", "backup") and q.popen is not None and q.popen.poll() is None for q in self.procs)
        for rank, row in list(self.progress.dropped.items()):
            p = next((q for q in self.procs if q.role == "worker" and q.rank == rank), None)
            if p is None or p.returncode is not None or p.popen is None or p.popen.poll() is not None:
                continue  # gone already: its exit is tolerate()'s to judge
            if servers_run and time.monotonic() - row["seen"] < (row.get("may_return_s") or 0) + 1:
                continue  # it may come back yet
            reason = (f"silent for {row['silent_s']:.1f} s" if row.get("silent_s") is not None
                      else row.get("reason", "dropped"))
            stop_all([p])
            p.returncode = p.popen.returncode
            self.lost.append({"worker": rank, "how": f"was dropped by the servers at clock {row.get('clock')} ({reason}) "
                              "and stopped by the launcher", "log": str(p.log)})
            self.progress.forget(rank)
            warn(f"{p.describe()} on {p.host}: the servers dropped it at clock {row.get('clock')} ({reason}); stopped it, "
                 f"and the run goes on without it (cluster.on_worker_loss = \"continue\")")

    def fail_over(self, p):
        """cluster.replicas = 2: a server or backup that ended while the other copy of its shard runs
        (a server that died, or stopped because its backup took over; a backup that died): the run
        goes on with the other, the workers and the evaluator go to it (PsClient), and a new backup
        starts where the ended copy was (at most 3 per shard), which the other sends the shard."""
        partner = next((q for q in self.procs if q.rank == p.rank and q is not p and q.role in ("server", "backup")), None)
        if partner is None or partner.popen is None or partner.popen.poll() is not None:
            return False  # both copies gone: the shard is lost
        self.failed_over.append({"shard": p.rank, "process": p.name, "how": how_it_ended(p), "log": str(p.log)})
        warn(f"{p.describe()} on {p.host} {how_it_ended(p)}; "
             + (f"its backup ({partner.name} on {partner.host}) has every update it answered and serves its shard "
                if p.role == "server" else f"{partner.name} serves its shard ")
             + "(cluster.replicas = 2)" + (f"; the last lines of {p.log}:\n{log_tail(p.log, 3)}" if 0 < p.returncode < 128 else ""))
        if sum(c["shard"] == p.rank for c in self.failed_over) > 3 or self.progress.training_over():
            return True
        warn(f"starting a new backup of shard {p.rank} where {p.name} was ({p.host}); {partner.name} sends it the shard")
        self.start_in_place_of(p, {"--trace": 1, "--backup-of": 1, "--resume": 1, "--restarted": 0},
                               ["--backup-of", partner.address_from(p.host)], role="backup")
        return True

    def start_in_place_of(self, p, drop, add, **changes):
        """A process started where p ended (its host, address and log, appended to): p's command line
        without the options `drop` ({option: how many values follow it}), with `add`; `changes` to its
        other fields."""
        argv = list(p.argv)
        for flag, values in drop.items():
            if flag in argv:
                del argv[argv.index(flag):argv.index(flag) + 1 + values]
        q = dataclasses.replace(p, argv=argv + add, popen=None, returncode=None, group_ended=False, **changes)
        q.command = ssh_command(q, self.plan.ssh_alive_s, self.sockets, append=True) if self.plan.launcher == "ssh" else q.argv
        start(q, REPO, append_log=True)
        self.started.append(q)
        self.launched.append(q)
        self.procs[self.procs.index(p)] = q
        if self.plan.launcher != "slurm":
            self.manifest()

    def restart_server(self, p):
        """A server that died (a signal) comes back from its checkpoint on the same address; the
        workers and the evaluator rejoin it (PsClient). At most 3 times per server."""
        ckpt = checkpoint_path(self.run_dir, p.name)
        if (self.plan.on_server_loss != "restart" or 0 <= p.returncode < 128
                or sum(r["server"] == p.rank for r in self.restarted) >= 3):
            return False
        # Without a checkpoint (it died before its first: checkpoint.every_s), from the run's initial θ.
        fresh = not ckpt.is_file()
        self.restarted.append({"server": p.rank, "how": how_it_ended(p), "log": str(p.log)})
        warn(f"{p.describe()} on {p.host} {how_it_ended(p)}; restarting it "
             + (f"from the run's initial θ: it had written no checkpoint yet (checkpoint.every_s = {self.plan.checkpoint_every_s:g})"
                if fresh else f"from its checkpoint {ckpt}")
             + " (cluster.on_server_loss = \"restart\": the workers rejoin it, and the updates since are lost, counted in "
             "summary.json)")
        self.start_in_place_of(p, {"--resume": 1, "--restarted": 0}, ["--restarted"] if fresh else ["--resume", str(ckpt)])
        return True

    def run(self, prefix):
        plan, run_dir = self.plan, self.run_dir
        self.manifest(interruptible=True)
        self.progress = Progress(plan, run_dir, prefix)
        failure_of = srun_failure(self.procs, self.started[0], run_dir) if plan.launcher == "slurm" else process_failure
        with Heartbeat(self.started, plan.ssh_alive_s) if plan.launcher == "ssh" else contextlib.nullcontext():
            try:
                for p in self.started:
                    check_signal()
                    start(p, REPO, append_log=bool(self.resume_from), env=self.env)
                    self.launched.append(p)
                if plan.launcher != "slurm":
                    self.manifest(interruptible=True)  # now with pids
                monitor(self.started, self.progress, self.run_start, self.opts.max_minutes * 60, failure_of,
                        self.tolerate, self.act_on_verdict if plan.launcher != "slurm" else lambda: None)
            except BaseException as e:
                self.stopped(e)
                raise
            finally:
                for p in self.launched:
                    close_stdin(p)
                self.remove_remote_socket_dirs()
        end_groups(self.launched)  # (any exit the monitor did not see)
        self.manifest(placed=True)
        s = summarize(plan, run_dir, time.time() - self.run_start, lost=self.lost, restarted=self.earlier[0] + self.restarted,
                      failed_over=self.earlier[1] + self.failed_over)
        if getattr(self.opts, "replay_of", None):
            s.update(replay_verdict(self.opts.replay_of, run_dir, plan))
        write_file(run_dir / "summary.json", json.dumps(s, indent=2) + "\n")
        return s

    def remove_remote_socket_dirs(self):
        """ssh with ipc, shm or auto: each host's copy of the run's socket directory removed once
        its processes ended (the launcher removes its own); a host that does not answer within
        10 s, or cannot, is named."""
        if self.plan.launcher != "ssh" or not self.sockets:
            return
        asked = {h: subprocess.Popen([*ssh_base(), h, f"rm -rf {shlex.quote(str(self.sockets))}"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
                 for h in sorted({p.host for p in self.launched})}
        for host, p in asked.items():
            try:
                err = p.communicate(timeout=10)[1]
            except subprocess.TimeoutExpired:
                p.kill()
                err = p.communicate()[1] + " (no answer within 10 s)"
            if p.returncode:
                warn(f"{host}: the run's socket directory {self.sockets} was not removed: {err.strip()}")

    def stopped(self, e):
        """The run failed or was interrupted: every process stopped, the summary says why."""
        def rewrite_manifest():  # while they stop (seconds for 100000 processes otherwise)
            try:
                if self.launched and self.plan.launcher != "slurm":  # (else the manifest written before the start stands)
                    self.manifest(placed=True, stopping=True)
            except CannotWrite as w:  # said; the run's own failure is what is raised
                warn(str(w))
        if isinstance(e, RunFailed) and self.launched:  # said now: stopping and the summary take seconds
            warn(f"{str(e).split('; the last lines of ')[0].splitlines()[0]}: stopping the run's processes")
        stopped = stop_all(self.launched, meanwhile=rewrite_manifest)
        if not isinstance(e, (RunFailed, Interrupted)):
            return  # a launcher bug: its processes are stopped all the same
        failure = str(e) if isinstance(e, RunFailed) else f"stopped by {e}"
        status = e.status if isinstance(e, RunFailed) else "interrupted"
        cancelled = slurm_job_ended() if isinstance(e, Interrupted) and self.plan.launcher == "slurm" else None
        if cancelled:  # under sbatch, scancel and the time limit reach the launcher as its SIGTERM
            status, failure = "cancelled", f"stopped by {e}: {cancelled}"
            warn(cancelled)
        s = summarize(self.plan, self.run_dir, time.time() - self.run_start, status=status,
                      failure=failure, lost=self.lost, restarted=self.earlier[0] + self.restarted,
                      failed_over=self.earlier[1] + self.failed_over)
        try:
            write_file(self.run_dir / "summary.json", json.dumps(s, indent=2) + "\n")
        except CannotWrite as w:  # said; the run's own failure is what is raised
            warn(str(w))
        if stopped:
            warn(f"stopped {len(stopped)} other process(es): {', '.join(p.name for p in stopped)}")


def shard_checksums(run_dir, plan):
    """{server: params_checksum} from the servers' final metrics lines."""
    found = {}
    for p in plan.processes:
        if p["role"] == "server":
            for row in read_jsonl(pathlib.Path(run_dir) / "metrics" / f"{p['name']}.jsonl"):
                if row.get("kind") == "server_final" and row.get("params_checksum"):
                    found[p["name"]] = row["params_checksum"]
    return found


def replay_verdict(original, replay_dir, plan):
    """Whether a replay ended on the recorded run's θ: every shard's checksum equal."""
    want, got = shard_checksums(original, plan), shard_checksums(replay_dir, plan)
    return {"replay_of": str(original), "params_checksums": got, "recorded_params_checksums": want,
            "replay_identical": bool(want) and want == got}


def replay_run(run_dir, bins, opts):
    """launch.py replay: re-executes a finished parameter-server run's recorded order in the
    virtual cluster, into RUN_DIR/replay/; exit 0 when the final θ is the run's bit for bit."""
    run_dir = pathlib.Path(run_dir).resolve()
    plan = RunPlan.load(run_dir)
    if not plan.uses_servers:
        raise UsageError(f"{run_dir}: an allreduce run has no servers and no order to replay")
    if plan.worker_kind == "python":
        raise UsageError(f"{run_dir}: its gradients came from a script of yours (worker.kind = \"python\"); the "
                         f"virtual cluster replays pslab_worker's models alone")
    if not (run_dir / "trace" / "server0.txt").is_file():
        raise UsageError(f"{run_dir}: no order trace (trace/server0.txt): the run was not recorded "
                         f"(servers record it from this version on)")
    try:
        ended = [c for c in json.loads((run_dir / "summary.json").read_text()).get("copies_ended") or []
                 if c.get("process", "").startswith("server")]
    except (OSError, ValueError):
        ended = []
    if ended:  # cluster.replicas = 2: each copy recorded only its part of the shard's order
        raise UsageError(f"{run_dir}: {ended[0]['process']} ended and its backup took over (cluster.replicas = 2): the "
                         "shard's order is split between the two copies and cannot be replayed")
    if not shard_checksums(run_dir, plan):
        raise UsageError(f"{run_dir}: the servers wrote no final checksum: the run did not finish, there is nothing to compare")
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        worker0 = next(p for p in manifest["processes"] if p["name"] == "worker0")
        argv = shlex.split(worker0["command"])
        opts.procs_on_host = int(argv[argv.index("--procs-on-host") + 1])  # the real workers' BLAS threads
    except (OSError, ValueError, KeyError, StopIteration, IndexError):
        opts.procs_on_host = 1
        manifest = {}
    recorded, here = manifest.get("numerics_env"), numerics_env()
    if recorded is not None and recorded != here:
        differ = sorted(k for k in set(recorded) | set(here) if recorded.get(k) != here.get(k))
        warn("the run's numerics environment differs from this one's (" + ", ".join(
            f"{k}: {recorded.get(k, '(unset)')} there, {here.get(k, '(unset)')} here" for k in differ)
            + "): the replay may run other BLAS kernels and not be bit for bit; set them as the run had them")
    out = run_dir / "replay"
    if out.exists():
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory(prefix="pslab-replay-") as tmp:
        # (one copy of each shard: a backup that only followed its server changed nothing)
        replay = f"virtual.replay={json.dumps(str(run_dir), ensure_ascii=False)}"  # (any path: quoted as TOML)
        rplan = replan(bins, plan, ['cluster.launcher="virtual"', replay, "cluster.replicas=1"], tmp)
    opts.replay_of = run_dir
    say(f"launch.py: replaying {run_dir} ({plan.mode}, {plan.workers} workers, {plan.servers} servers) -> {out}")
    try:
        s = execute_run(rplan, out, bins, opts, f"replay {plan.mode}")
    except RunFailed as e:
        print(f"launch.py: FAILED replay of {run_dir}: {e}", file=sys.stderr, flush=True)
        return 1
    if s["replay_identical"]:
        say(f"launch.py: the replay's final θ is the run's, bit for bit: {len(s['params_checksums'])} shard checksum(s) "
            f"equal ({', '.join(f'{k} {v}' for k, v in s['params_checksums'].items())})")
        return 0
    warn(f"the replay's final θ differs from the run's: replay {s['params_checksums']}, run {s['recorded_params_checksums']}")
    return 1


def dry_run(plans, bins, opts, runs_dir):
    """Prints every process's command line of every point; starts and writes nothing (ipc: the
    socket directory is a placeholder, made afresh for each run at launch)."""
    inv = pathlib.Path(runs_dir).resolve() / plans[0].name / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    say(f"# dry run: {len(plans)} run(s); nothing is started or written. Invocation directory would be {inv}")
    for i, plan in enumerate(plans):
        run_dir = inv / safe_dir_name(plan.label)
        t = time.time()
        ipc = plan.unix_sockets
        sockets = DRY_RUN_SOCKET_DIR if plan.socket_dir_needed else None
        say(f"# run {i + 1}/{len(plans)}: {plan.label or '(no sweep)'} -> {run_dir}  "
            f"[launcher {plan.launcher}, mode {plan.mode}, {plan.workers} workers, {plan.servers} servers, "
            f"{plan.total_steps} steps per worker]")
        if sockets:
            say(f"# {plan.transport}: the sockets go into a private directory made afresh at launch ({sockets} here), "
                f"removed when the run ends")
        if plan.authenticates:
            say(f"# cluster.auth: peers prove the run's key over TCP (CURVE); it is made at launch: "
                f"{run_key_path(run_dir)}, mode 0600")
        wanted, why = decide_mps(plan)
        if why:
            say(f"# {why}" + (" (made at launch, stopped when the run ends)" if wanted else ""))
        if plan.mixes_transports:
            say("# auto over several hosts: each server listens on a socket and a port; a peer on its host uses "
                "the socket (shared memory), the others the port (TCP)")
        if plan.virtual:
            say("# virtual: every worker and server in one process, in simulated time ([virtual] is the cost model)")
            procs = plan_virtual(plan, run_dir, bins)
        elif plan.launcher == "local":
            if not ipc:
                say("# local: ports are free ports chosen afresh at launch")
            procs = plan_local(plan, run_dir, t, bins, sockets)
        elif plan.launcher == "ssh":
            say("# ssh: each host's address and free ports are asked of it at launch (here: placeholders, or "
                "cluster.addresses; --base-port fixes the ports); each process runs under `launch.py remote` there")
            procs = plan_ssh(plan, run_dir, t, bins, None, opts.base_port, sockets)
        else:
            say(f"[srun] {shlex.join(srun_command(plan, run_dir))}")
            n = len(plan.processes)
            if plan.hosts:  # in blocks, as srun --distribution=block with as many tasks on each
                hosts = plan.hosts
                nodes, where = [hosts[i * len(hosts) // n] for i in range(n)], "cluster.hosts, in equal blocks"
            elif ipc:
                nodes, where = ["NODE0"] * n, "placeholder NODE0, the one node of ipc"
            else:
                nodes, where = [f"NODE{i}" for i in range(n)], "placeholders NODEi, one per task"
            say(f"# slurm: each task runs `launch.py task {run_dir}`, which execs the command below "
                f"(nodes here: {where}; inside the job: the step's own layout, and ports from the job id "
                f"unless --base-port)")
            procs = plan_cluster(plan, run_dir, t, bins, nodes, fixed_or_probed_ports(nodes, None, opts.base_port),
                                 lambda h: "127.0.0.1" if len(set(nodes)) == 1 else h, sockets)
            for p in procs:
                p.command = p.argv
                say(f"[task{p.index} {p.name}@{p.host}] {shlex.join(p.command)}")
            continue
        for p in procs:
            say(f"[{p.name}@{p.host}] {shlex.join(p.command)}")


def run_all(plans, config, bins, opts, runs_dir):
    """Runs every point, one after the other, into a new invocation directory; then the plots
    of the completed runs and the comparison. Returns the exit status (0, or 1: a run failed)."""
    inv = new_invocation_dir(runs_dir, plans[0].name)
    latest = inv.parent / "latest"
    before = os.readlink(latest) if latest.is_symlink() else None
    try:
        if latest.is_symlink() or not latest.exists():
            if latest.is_symlink():
                latest.unlink()
            latest.symlink_to(inv.name)
    except OSError:
        pass
    try:
        return run_points(plans, config, bins, opts, inv)
    except UsageError:
        # Refused before any run could start (a host that does not answer, a placement that
        # cannot be): nothing of it is kept, and `latest` points where it did.
        if not any(d.is_dir() and (d / "logs").is_dir() and any((d / "logs").iterdir()) for d in inv.iterdir()):
            shutil.rmtree(inv, ignore_errors=True)
            try:
                if latest.is_symlink() and os.readlink(latest) == inv.name:
                    latest.unlink()
                    if before:
                        latest.symlink_to(before)
            except OSError:
                pass
        raise


def keep_summary(results, inv, dirname):
    """A run that did not end well: its summary.json into `results`, where it wrote one."""
    try:
        results.append((dirname, json.loads((inv / dirname / "summary.json").read_text())))
    except (OSError, ValueError):
        pass


def run_points(plans, config, bins, opts, inv):
    """run_all's runs, one after the other, into `inv`; then the plots and the comparison."""
    say(f"launch.py: {len(plans)} run(s) of {config} -> {inv}")
    if os.environ.get("PSLAB_INVOCATION_OUT"):  # (experiments/quickstart.sh: where this invocation's runs are)
        write_file(pathlib.Path(os.environ["PSLAB_INVOCATION_OUT"]), f"{inv}\n")
    if not opts.no_plots and plot_python() is None:
        warn(no_plot_python_warning())  # said before the runs, not after them
        opts.no_plots = True
    results, failed, used = [], [], set()
    for i, plan in enumerate(plans):
        check_signal()
        label = plan.label
        dirname = safe_dir_name(label)
        if dirname in used:  # a sweep that lists a value twice (repetitions): run-2, run-3, ...
            dirname = next(f"{dirname}-{k}" for k in range(2, len(plans) + 2) if f"{dirname}-{k}" not in used)
        used.add(dirname)
        prefix = f"{label or plan.mode}" if len(plans) == 1 else f"{i + 1}/{len(plans)} {label or plan.mode}"
        say(f"--- run {i + 1}/{len(plans)}: {label or '(no sweep)'}: {plan.mode}, {plan.workers} workers"
            + (f", {plan.servers} server{'s' if plan.servers > 1 else ''}" if plan.servers else "")
            + f", {plan.total_steps} steps each -> {inv / dirname}")
        try:
            try:
                s = execute_run(plan, inv / dirname, bins, opts, prefix)
            except UsageError as e:  # (after runs that ran: a host whose probe fails, ... is this run's failure)
                if not results and not failed:
                    raise
                raise RunFailed(str(e))
            results.append((dirname, s))
        except Interrupted:
            # The runs that ended keep their comparison (without plots: the user asked to stop),
            # the stopped one listed as such.
            if results:
                keep_summary(results, inv, dirname)
                write_comparison(inv, results, plans[0].target_acc)
                warn(f"interrupted: comparison.md/.csv of the {len(results)} run(s) so far in {inv} (no plots)")
            raise
        except RunFailed as e:
            print(f"launch.py: FAILED {dirname}: {e}{disk_trouble(inv / dirname)}", file=sys.stderr, flush=True)
            failed.append(dirname)
            keep_summary(results, inv, dirname)
            if not opts.keep_going:
                break
    if results:
        if not opts.no_plots and any(s["status"] in COMPLETED for _, s in results):
            run_plot([*(str(inv / d) for d, s in results if s["status"] in COMPLETED), "--out", str(inv / "plots")],
                     quiet=True)
        table, notes = write_comparison(inv, results, plans[0].target_acc)
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
