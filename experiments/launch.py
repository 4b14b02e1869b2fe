#!/usr/bin/python3
"""pslab experiment launcher: one config (or a sweep of configs) -> processes -> run directories.

  launch.py run CONFIG [--set key=value ...] [--runs-dir DIR] [--build-dir DIR]
                       [--dry-run] [--no-plots] [--keep-going] [--max-minutes M] [--base-port P]
  launch.py resume RUN_DIR [--no-plots] [--max-minutes M]  (go on with a stopped or failed run)
  launch.py replay RUN_DIR                                  (re-execute an async run's order: same θ)
  launch.py calibrate CONFIG [--steps N] [--out FILE]       (the virtual cluster's cost model, measured)
  launch.py task RUN_DIR [--print] [--hosts H1,H2,...]      (one Slurm task; srun runs it)
  launch.py remote | probe                                  (ssh's far end; the launcher runs them)
(`pslab COMMAND` is the same: experiments/pslab, or installed by cmake --install.)

`run` expands the sweep in CONFIG (a list where one value is expected is swept; the cross
product of all such lists is run, one run after the other), has the pslab_worker binary
validate and plan every point (`pslab_worker config --plan`: processes, steps, data sizes)
before anything starts, and then for each point starts the servers, the workers and the
evaluator, prints a progress line about once a second, and writes

  runs/<name>/<YYYYmmdd-HHMMSS>/            one invocation
    comparison.md, comparison.csv          one row per run
    plots/*.png                            the runs overlaid
    <label>/                               one run (label from the sweep, e.g. mode=ssp_2; "run" without a sweep)
      config.toml plan.json manifest.json summary.json metrics/*.jsonl logs/*.log plots/*.png

Placement (cluster.launcher in the config):
  local  every process on this machine; tcp: on cluster.bind, on free ports (bind to port 0).
  virtual  one process runs every worker, server and the evaluator in simulated time, with the
         real model, gradients and consistency rules ([virtual] is the cost model; calibrate
         measures it): `pslab_worker virtual -c CONFIG -o RUN_DIR`. Its metrics and summary are
         a real run's, marked simulated. With virtual.replay = RUN_DIR it re-executes that real
         run's recorded order instead (launch.py replay).
  ssh    processes round-robin over cluster.hosts (servers first, then workers, then the
         evaluator). First each host is asked, over ssh, for its address and free ports
         (`launch.py probe`): the address named for it (cluster.addresses "HOST=ADDRESS" or
         "HOST=INTERFACE", else cluster.interface), else the address ssh reached it at; ports
         bound to port 0 there, so concurrent runs never share one (--base-port fixes them to
         BASE + process index). Each process then starts as
           ssh -o BatchMode=yes -o ConnectTimeout=10 HOST \
               'cd REPO && exec python3 experiments/launch.py remote --log LOG -- CMD'
         (the ssh client: $PSLAB_SSH, e.g. "ssh -F ~/cluster.ssh"). The remote end runs CMD in a
         process group of its own, writes its log on the host, ends the group when the launcher
         stops the run, dies, or loses the connection, and records how CMD ended (signal or code,
         host, pid), which the launcher reports; ssh's own output goes to logs/NAME.ssh.log.
         Servers, all-reduce rank 0's rendezvous and Gloo listen on their host's address only.
         REPO is this checkout's absolute path, which must be the same on every host, on a
         shared file system (the run directory and the binaries are read and written there).
  slurm  the launcher runs ONE
           srun --ntasks=N --kill-on-bad-exit=1 --distribution=block /usr/bin/python3 experiments/launch.py task RUN_DIR
         (N = S + W + 1; allreduce: W + 1). Each task reads SLURM_PROCID, SLURM_NTASKS, the
         step's node list (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, expanded with
         `scontrol show hostnames`) and its tasks per node (SLURM_STEP_TASKS_PER_NODE: any
         allocation shape, e.g. 3 tasks on one node and 1 on another), takes its role from
         RUN_DIR/plan.json (tasks 0..S-1 servers, then workers, the last one the evaluator;
         allreduce: workers, then the evaluator), derives every endpoint from that layout (a
         node's address: named as for ssh, else its NodeAddr from `scontrol show node`, else
         for its own tasks its route toward the launching node and for the others its name;
         one node: loopback) and ports from the job
         and step ids (--base-port fixes them), and execs its binary with its output in
         RUN_DIR/logs/, whose first line records where it ran (the manifest gathers them). A
         cancelled job or step is reported as such (status "cancelled"). Run it inside an
         allocation (salloc / sbatch) so that srun starts at once: metric times count from the
         launcher's start. Shared file system assumed, as for ssh.

Endpoints (cluster.transport):
  tcp    the listeners (servers; allreduce: rank 0's rendezvous and the evaluator's snapshot
         port) on the ports above.
  ipc    Unix sockets in a private directory made for each run (mode 0700, /tmp/pslab-XXXXXXXX;
         a dry run shows a placeholder and makes nothing), removed when the run ends, however
         it ends: ipc://DIR/server0 ... ipc://DIR/server<S-1>, ipc://DIR/coordinator (allreduce
         rank 0), ipc://DIR/snapshots (allreduce evaluator). Every process must be on one host:
         ssh or slurm over more than one host in cluster.hosts is refused (exit 2); over ssh the
         host makes DIR if it is not there; srun gets --nodes=1.
  shm    as ipc (the same sockets carry the headers); payloads go through shared memory
         (memfd segments, which vanish with the processes, however they end).
  auto   shm when every process is on one host (local; ssh or Slurm with one host), tcp
         otherwise.

GPUs (train.device = "cuda"): the workers and the evaluator of a host get GPU slots 0, 1, 2, ...
and each uses GPU (slot mod the GPUs it sees). In allreduce, cluster.collective says how GPU
ranks all-reduce: "nccl"; "gloo" (through host memory: Gloo, or shared memory on one host); or
"auto" (default): NCCL when every rank of every host has a GPU of its own, else through host
memory. Before anything starts the launcher asks each host for its GPUs (`nvidia-smi -L`; ssh:
over ssh; local: within CUDA_VISIBLE_DEVICES), says what it chose in one line and records it in
the run's config.toml; an explicit "nccl" that would put two ranks on one GPU is refused (exit
2) naming the host, its ranks and its GPUs. Where it cannot know (Slurm, nvidia-smi failing),
"auto" is left to the ranks, which compare their GPUs' PCI bus ids at start.

Workers of your own (worker.kind = "python"): every worker and the evaluator run worker.script
(by worker.python) through worker/python/run_script.py, told their part of the run in PSLAB_*
variables (pslab.launched(); pslab.torch trains a PyTorch module with it); with model.kind =
"external" and no model.sizes, the script is first run once with PSLAB_THETA0 for θ0 and the
sizes (logs/theta0.log). Local, ssh and Slurm alike; resume and replay refuse such runs.

Binaries: <repo>/build/{worker/pslab_worker,server/pslab_server} (experiments/setup.sh builds
them there); --build-dir or the environment variable PSLAB_BUILD point elsewhere. The launcher's
code: experiments/launcher/, one module per concern (plan, placement, scripts, processes, monitor,
metrics, summary, manifest, comparison, run, task, gpus).

Plots: plot.py runs under the first Python that imports matplotlib, of this launcher's, Debian's
/usr/bin/python3 and python3 on PATH (or $PSLAB_PLOT_PYTHON alone, if set). With none, the
launcher says so before the first run and the runs go on without plots.

A run whose training loss stops being finite ends with status "diverged" (its workers say at
which step); that is the experiment's outcome, not a failure.

Exit status: 0 all runs succeeded; 1 a run failed (a process exited non-zero, or the run ran
past --max-minutes); 2 bad config or usage (nothing was started); 130 / 143 stopped by SIGINT
(Ctrl-C) / SIGTERM. In every case no process of the run is left behind (one still there 10 s
after SIGKILL, stuck in the kernel, is named).
"""
import argparse
import os
import pathlib
import sys
import tempfile

from launcher.common import CannotWrite, UsageError, default_runs_dir, say, warn
from launcher.gpus import decide_collective
from launcher.hosts import probe_main
from launcher.placement import check_placement
from launcher.plan import expand_sweep, find_binaries, replan
from launcher.processes import Interrupted, catch_signals
from launcher.scripts import check_workers
from launcher.run import dry_run, replay_run, resume_run, run_all
from launcher.task import run_task


def cmd_run(a):
    config = pathlib.Path(a.config)
    if not config.is_file():
        raise UsageError(f"{config}: no such config file")
    bins = find_binaries(a.build_dir)
    runs_dir = pathlib.Path(a.runs_dir) if a.runs_dir else default_runs_dir()
    if a.calibration:
        from launcher.calibrate import calibration_sets
        a.set = (a.set or []) + calibration_sets(a.calibration)
    with tempfile.TemporaryDirectory(prefix="pslab-launch-") as tmp:  # gone before anything starts
        plans = expand_sweep(bins, config, a.set or [], pathlib.Path(tmp))
        for i, plan in enumerate(plans):
            check_placement(plan)
            check_workers(plan, bins)
            collective, why = decide_collective(plan)
            if why:
                say(why)
            if collective and collective != plan.collective:
                plans[i] = replan(bins, plan, [f'cluster.collective="{collective}"'], tmp)
    if a.dry_run:
        dry_run(plans, bins, a, runs_dir)
        return 0
    return run_all(plans, config, bins, a, runs_dir)


def main(argv=None, prog="launch.py"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for add in (add_run, add_resume, add_calibrate, add_replay, add_task, add_remote, add_probe):
        add(sub)
    a = ap.parse_args(argv)
    try:
        return dispatch(a)
    except UsageError as e:
        msg = str(e)
        print(msg if msg.startswith("pslab_worker:") else f"launch.py: error: {msg}", file=sys.stderr)
        if msg.startswith("pslab_worker:"):
            print("launch.py: the config is invalid; nothing was started", file=sys.stderr)
        return 2
    except Interrupted as e:
        warn(f"interrupted by {e}; every process of the run was stopped")
        return 128 + e.signum
    except CannotWrite as e:  # a full disk, a read-only run directory: one line, no traceback
        warn(f"error: {e}")
        return 1
    except OSError as e:
        if e.filename is None:
            raise
        warn(f"error: {e.filename}: {e.strerror}")
        return 1


def add_run(sub):
    r = sub.add_parser("run", help="run an experiment config (a sweep: one run per point)",
                       description="Run an experiment config; a sweep runs one point after the other. "
                                   "See `launch.py --help` for the run directories, the launchers, the "
                                   "transports and the exit status.")
    r.add_argument("config", help="experiment config (TOML); `pslab_worker config --keys` lists the keys")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key for every run, e.g. --set optimizer.lr=0.05 (TOML value; repeatable); "
                        "applied before the sweep expands, so --set cluster.mode=bsp on a mode sweep runs bsp alone")
    r.add_argument("--runs-dir", help="the directory that holds <name>/<YYYYmmdd-HHMMSS>/ (default: ./runs, where the launcher is started)")
    r.add_argument("--build-dir", help="build directory with worker/pslab_worker and server/pslab_server "
                                       "(default: $PSLAB_BUILD, else <repo>/build)")
    r.add_argument("--dry-run", action="store_true", help="print every process's command line; start, create or write nothing")
    r.add_argument("--no-plots", action="store_true", help="do not draw plots")
    r.add_argument("--keep-going", action="store_true", help="in a sweep, go on with the next run after a failed one")
    r.add_argument("--max-minutes", type=float, default=60.0,
                   help="wall-clock guard per run: stop it and fail after this many minutes (default 60)")
    r.add_argument("--calibration", metavar="FILE",
                   help="the virtual cluster's cost model measured by `launch.py calibrate` (applied as --set)")
    r.add_argument("--base-port", type=int, default=None,
                   help="ssh / slurm: process i listens on BASE + i (default: ports chosen per run: ssh: free ports "
                        "asked of each host; Slurm: a window of 64 ports in 20000-31999 from the job and step ids)")


def add_resume(sub):
    u = sub.add_parser("resume", help="go on with a stopped or failed run from its servers' checkpoints",
                       description="Go on with a run that was stopped (Ctrl-C) or failed, in its own directory: "
                                   "the servers start from RUN_DIR/checkpoints/ (written every checkpoint.every_s "
                                   "and when they stop), each worker from the clock they hold for it; metrics and "
                                   "logs are appended to, summary.json is rewritten. allreduce: every rank from "
                                   "rank 0's last checkpoint (written every checkpoint.every_s; not when stopped). "
                                   "Local, ssh and Slurm runs (under Slurm, run it inside an allocation as for run).")
    u.add_argument("run_dir", help="the run's directory (runs/<name>/<YYYYmmdd-HHMMSS>/<label>)")
    u.add_argument("--build-dir", help="build directory (default: $PSLAB_BUILD, else <repo>/build)")
    u.add_argument("--no-plots", action="store_true", help="do not draw plots")
    u.add_argument("--max-minutes", type=float, default=60.0,
                   help="wall-clock guard on this resumed part of the run (default 60)")
    u.add_argument("--base-port", type=int, default=None, help="ssh / slurm: process i listens on BASE + i "
                                                                   "(default: ports chosen per run, as for run)")


def add_calibrate(sub):
    c = sub.add_parser("calibrate", help="measure the virtual cluster's cost model on this machine",
                       description=__import__("launcher.calibrate", fromlist=["x"]).__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("config", help="experiment config (TOML): its workers, servers, transport and placement are measured")
    c.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key (as for run)")
    c.add_argument("--steps", type=int, default=200, help="steps per calibration run (default 200)")
    c.add_argument("--runs-dir", help="where runs/calibration/<name>/<stamp>/ goes (default: ./runs, where the launcher is started)")
    c.add_argument("--out", help="the calibration file (default: calibration.json in the calibration runs' directory)")
    c.add_argument("--build-dir", help="build directory (default: $PSLAB_BUILD, else <repo>/build)")
    c.add_argument("--max-minutes", type=float, default=10.0, help="wall-clock guard per run (default 10)")
    c.add_argument("--base-port", type=int, default=None, help="ssh / slurm: fixed ports (as for run)")


def add_replay(sub):
    y = sub.add_parser("replay", help="re-execute a finished parameter-server run's recorded order; same final θ",
                       description="Re-executes, in the virtual cluster (one process), the order in which each server "
                                   "of a finished bsp/ssp/asp run applied pushes and served pulls (RUN_DIR/trace/, "
                                   "recorded by every real run), with the same model, data and gradients, into "
                                   "RUN_DIR/replay/. Exit 0 when the final θ equals the run's bit for bit (each "
                                   "shard's checksum, CPU backend), 1 otherwise. Runs with a lost worker, a restarted "
                                   "server or a resume cannot be replayed.")
    y.add_argument("run_dir", help="the run's directory (runs/<name>/<YYYYmmdd-HHMMSS>/<label>)")
    y.add_argument("--build-dir", help="build directory (default: $PSLAB_BUILD, else <repo>/build)")
    y.add_argument("--no-plots", action="store_true", help="do not draw plots")
    y.add_argument("--max-minutes", type=float, default=60.0, help="wall-clock guard (default 60)")


def add_task(sub):
    t = sub.add_parser("task", help="one task of a Slurm run (srun starts it; not for direct use)",
                       description="One task of a Slurm run: reads SLURM_PROCID, SLURM_NTASKS and the node list, "
                                   "and execs the binary of its role with its output in RUN_DIR/logs/.")
    t.add_argument("run_dir", help="the run directory the launcher prepared (config.toml, plan.json, launch.json)")
    t.add_argument("--print", action="store_true", help="print this task's command instead of running it")
    t.add_argument("--hosts", help="the node list, comma-separated (default: `scontrol show hostnames` of "
                                   "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST)")


def add_remote(sub):
    m = sub.add_parser("remote", help="the far end of an ssh-started process (ssh runs it; not for direct use)",
                       description="Runs ARGV in a process group of its own with its output in LOG, ends the group "
                                   "when stdin says \"stop\" or ends (the launcher stopped or the connection dropped), "
                                   "when stdin is silent for --alive-s, or on SIGHUP/SIGINT/SIGTERM, and says how ARGV "
                                   "ended on the last line.")
    m.add_argument("--log", required=True, help="the process's log on this host (the run directory's logs/NAME.log)")
    m.add_argument("--append", action="store_true", help="append to LOG (a resumed run)")
    m.add_argument("--alive-s", type=float, default=None, metavar="S",
                   help="stop the group when nothing comes on stdin for S seconds (the launcher sends a line "
                        "\"alive\" more often: cluster.ssh_alive_s); default: no such limit")
    m.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command")


def add_probe(sub):
    q = sub.add_parser("probe", help="print this host's address and free ports as JSON (ssh runs it; not for direct use)")
    q.add_argument("--ports", type=int, default=0, help="how many free ports to choose")
    q.add_argument("--address", help="the address or interface named for this host (cluster.addresses, cluster.interface)")
    q.add_argument("--slurm", action="store_true",
                   help="as a task of a Slurm step: ports free on every address, and the node's Slurm name")


def dispatch(a):
    """Runs the parsed subcommand; returns the exit status."""
    if a.command == "task":
        return run_task(a.run_dir, a.hosts, a.print)
    if a.command == "remote":
        argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        if not argv:
            raise UsageError("remote: no command after --")
        from launcher.remote import run_remote
        return run_remote(argv, a.log, a.append, a.alive_s)
    if a.command == "probe":
        return probe_main(a.address, a.ports, a.slurm)
    catch_signals()
    if a.command == "resume":
        return resume_run(a.run_dir, find_binaries(a.build_dir), a)
    if a.command == "calibrate":
        from launcher.calibrate import calibrate
        return calibrate(pathlib.Path(a.config), find_binaries(a.build_dir), a)
    if a.command == "replay":
        return replay_run(a.run_dir, find_binaries(a.build_dir), a)
    return cmd_run(a)


if __name__ == "__main__":
    code = main()
    if code > 128:  # interrupted (every process stopped, the summary written): leave at once, without
        sys.stdout.flush()  # freeing the objects of a run of 100000 processes one by one
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
