"""One task of a Slurm run (`launch.py task RUN_DIR`): its role from SLURM_PROCID and the node
list, then exec its binary with its output in RUN_DIR/logs/."""
import json
import os
import pathlib
import shlex
import sys

from .common import REPO, UsageError, cmd_out
from .placement import cluster_hosts, ensure_socket_dir, plan_cluster, resume_arguments
from .plan import Binaries, RunPlan


def run_task(run_dir, hosts=None, print_only=False):
    """One Slurm task: find this task's role, exec its binary (or --print its command)."""
    run_dir = pathlib.Path(run_dir).resolve()
    plan = RunPlan.load(run_dir)
    try:
        launch = json.loads((run_dir / "launch.json").read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"task: {run_dir}: no launch.json from the launcher: {e}")
    try:
        procid, ntasks = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    except (KeyError, ValueError) as e:
        raise UsageError(f"task: SLURM_PROCID and SLURM_NTASKS must be set (by srun): {e}")
    n = len(plan.processes)
    if ntasks != n:
        raise UsageError(f"task: SLURM_NTASKS = {ntasks}, but this run has {n} processes "
                         f"({plan.servers} servers + {plan.workers} workers + 1 evaluator)")
    if hosts:
        nodes = [h for h in hosts.split(",") if h]
    else:
        nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise UsageError("task: neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set")
        out = cmd_out(["scontrol", "show", "hostnames", nodelist])
        if not out:
            raise UsageError(f"task: `scontrol show hostnames {nodelist}` failed")
        nodes = out.split()
    sockets = launch.get("socket_dir")
    if plan.socket_dir_needed and not sockets:
        raise UsageError(f"task: {run_dir}/launch.json names no socket directory, but cluster.transport is {plan.transport}")
    if plan.unix_sockets:
        if len(set(cluster_hosts(plan, nodes))) > 1:
            raise UsageError(f'task: cluster.transport = "{plan.transport}" needs every task on one node, but the node list is '
                             f'{",".join(nodes)}; the launcher\'s srun uses --nodes=1')
    bins = Binaries.at(launch["build_dir"])
    procs = plan_cluster(plan, run_dir, launch["run_start"], bins, nodes, launch["base_port"], sockets)
    me = procs[procid]
    if launch.get("resume"):  # launch.py resume: from the checkpoints, logs appended to
        me.argv += resume_arguments(run_dir, me)
    here = os.environ.get("SLURMD_NODENAME")
    if not print_only and here and nodes and here != me.host and here.split(".")[0] != me.host.split(".")[0]:
        raise UsageError(f"task {procid} ({me.name}) runs on {here}, but the cyclic placement puts it on {me.host}; "
                         f"the launcher's srun uses --distribution=cyclic")
    if print_only:
        print(f"# task {procid}/{ntasks}: {me.name} on {me.host}", file=sys.stderr)
        print(shlex.join(me.argv))
        return 0
    if sockets:
        ensure_socket_dir(sockets)
    me.log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(me.log, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if launch.get("resume") else os.O_TRUNC), 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.chdir(REPO)
    os.execv(me.argv[0], me.argv)
