"""One task of a Slurm run (`launch.py task RUN_DIR`): its role from SLURM_PROCID, every task's
node from the step's own layout, then exec its binary with its output in RUN_DIR/logs/."""
import json
import os
import pathlib
import re
import shlex
import socket
import sys

from .common import REPO, UsageError, cmd_out
from .hosts import is_address, named_address, own_address, route_source
from .placement import ensure_socket_dir, plan_cluster, resume_arguments
from .plan import Binaries, RunPlan
from .remote import MARK


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
    where = task_nodes(n, nodes)
    if plan.unix_sockets and len(set(where)) > 1:
        raise UsageError(f'task: cluster.transport = "{plan.transport}" needs every task on one node, but the step\'s '
                         f'tasks are on {",".join(sorted(set(where)))}; the launcher\'s srun uses --nodes=1')
    here = os.environ.get("SLURMD_NODENAME")
    if not print_only and here and not same_node(here, where[procid]):
        raise UsageError(f"task {procid} runs on {here}, but the step's layout (SLURM_STEP_TASKS_PER_NODE "
                         f"{os.environ.get('SLURM_STEP_TASKS_PER_NODE')!r}, block distribution) puts it on {where[procid]}")
    address_of = node_addresses(plan, where, where[procid], print_only)
    bins = Binaries.at(launch["build_dir"])
    port_of = slurm_ports(launch.get("base_port"), launch.get("ports"), where)
    procs = plan_cluster(plan, run_dir, launch["run_start"], bins, where, port_of, address_of, sockets)
    me = procs[procid]
    if launch.get("resume"):  # launch.py resume: from the checkpoints, logs appended to
        me.argv += resume_arguments(run_dir, me)
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
    # What really runs, for the manifest (the launcher reads it from this log when the run ends).
    print(MARK + json.dumps({"event": "started", "host": socket.gethostname(), "node": where[procid], "pid": os.getpid(),
                             "task": procid, "argv": me.argv}), flush=True)
    os.chdir(REPO)
    os.execv(me.argv[0], me.argv)


def same_node(a, b):
    return a == b or a.split(".")[0] == b.split(".")[0]


def tasks_per_node(text, nodes):
    """Slurm's compressed counts ("3,1", "2(x3),1") -> one count per node."""
    counts = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise UsageError(f"task: cannot read the tasks per node {text!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if len(counts) != len(nodes):
        raise UsageError(f"task: tasks per node {text!r} names {len(counts)} node(s), the node list {len(nodes)}")
    return counts


def task_nodes(n, nodes):
    """The node of each of the step's n tasks: srun's block distribution puts consecutive tasks on
    a node, as many as SLURM_STEP_TASKS_PER_NODE says, in node-list order; any allocation shape."""
    text = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
    if not text:
        if len(nodes) == 1:
            return nodes * n
        raise UsageError("task: SLURM_STEP_TASKS_PER_NODE is not set: cannot tell which task runs where")
    where = [node for node, count in zip(nodes, tasks_per_node(text, nodes)) for _ in range(count)]
    if len(where) != n:
        raise UsageError(f"task: tasks per node {text!r} count {len(where)} tasks, the step has {n}")
    return where


def node_addresses(plan, where, mine, print_only=False):
    """address_of(node) for a task on node `mine`: one node: loopback; else an address named for
    the node (cluster.addresses, or for its own node an interface, resolved here), else the node's
    NodeAddr in Slurm's own configuration when that is an address (what slurmctld reaches it at),
    else for its own node its route toward the launching node and for the others their names.
    ZeroMQ binds addresses, not names."""
    if len(set(where)) == 1:
        return lambda node: "127.0.0.1"
    node_addr = slurm_node_addrs(sorted(set(where)))

    def own():
        named = named_address(plan, mine)
        if named:
            return own_address(named)
        if is_address(node_addr.get(mine, "")):
            return node_addr[mine]
        toward = os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
        if toward:
            return route_source(toward)
        if print_only:
            return mine
        raise UsageError(f"task on {mine}: cannot tell this node's address (no NodeAddr from scontrol, "
                         f"SLURM_LAUNCH_NODE_IPADDR not set): name it with cluster.interface or cluster.addresses")
    mine_at = own()

    def address_of(node):
        if same_node(node, mine):
            return mine_at
        named = named_address(plan, node)
        if named and is_address(named):
            return named
        return node_addr[node] if is_address(node_addr.get(node, "")) else node
    return address_of


def slurm_node_addrs(nodes):
    """{node: NodeAddr} from `scontrol show node -o` ({} where scontrol cannot say)."""
    out = cmd_out(["scontrol", "show", "node", "-o", ",".join(nodes)]) or ""
    found = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields and "NodeAddr" in fields:
            found[fields["NodeName"]] = fields["NodeAddr"]
    return found


def slurm_ports(base_port, probed=None, where=None):
    """port_of(i): BASE + i with --base-port; else the ports the launcher's probe step found free
    on each node ({node: ports}: process i takes its node's j-th, j its place among the node's
    processes); else a window of ports in 20000-31999 chosen from the job and step ids, 64 ports
    (or the next multiple of 64 that holds the most processes of one node), process i taking its
    place among its node's processes (two jobs whose windows collide share ports: the probe
    avoids that)."""
    if base_port is not None:
        return lambda i: base_port + i
    place = _places_on_nodes(where) if where else None
    if probed and where and all(node in probed for node in where):
        return lambda i: probed[where[i]][place[i]]
    job, step = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_STEP_ID", "0")
    most = max(place) + 1 if place else 64
    window = -(-most // 64) * 64

    def port_of(i):  # asked for only where a process listens on TCP
        if not job.isdigit():
            raise UsageError("task: SLURM_JOB_ID is not set: ports cannot be chosen (pass --base-port)")
        if window > 12000:
            raise UsageError(f"task: {most} processes on one node do not fit in ports 20000-31999 (pass --base-port)")
        start = 20000 + ((int(job) * 31 + int(step or 0)) % (12000 // window)) * window
        return start + (place[i] if place else i)
    return port_of


def _places_on_nodes(where):
    """Each process's place among the processes of its node (0, 1, ...)."""
    seen, place = {}, []
    for node in where:
        place.append(seen.get(node, 0))
        seen[node] = place[-1] + 1
    return place
