"""Where each process of the plan (plan["processes"], in start order) runs and its command line:
local (free ports), ssh (round-robin over cluster.hosts; each host's address and free ports
asked of it, hosts.py), Slurm (one srun; each task's node from Slurm's own layout); the listeners' endpoints per cluster.transport (tcp: ports; ipc and shm:
sockets in a private directory of the run, every process on one host; auto: sockets on one
host, and over several hosts both, each peer using the one that fits where it runs)."""
import collections
import contextlib
import functools
import math
import os
import pathlib
import shlex
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass

from .common import REPO, UsageError, numerics_env
from .hosts import is_address, named_address
from .scripts import script_argv

DRY_RUN_SOCKET_DIR = pathlib.Path("/tmp/pslab-XXXXXXXX")  # what a dry run shows for ipc
MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path, less its terminating NUL)


@dataclass
class Proc:
    name: str           # server0, worker1, evaluator
    role: str           # server, backup (cluster.replicas = 2), worker, evaluator
    rank: int           # shard or worker rank; -1 for the evaluator
    index: int          # position in start order (servers, workers, evaluator)
    host: str           # where it runs ("local" for the local launcher)
    argv: list          # the pslab binary's command line
    command: list = None  # what the launcher runs (argv, or ssh ... argv)
    control: bool = False   # ssh: a line "stop" (or the end) of its stdin stops the remote process
    ssh_log: pathlib.Path = None  # ssh: the ssh client's own output (its process's log is written remotely)
    popen: object = None
    returncode: int = None
    log: pathlib.Path = None
    address_from: object = None  # a listener's: peer host -> the address a peer there connects to
    group_ended: bool = False  # exited, and what was left in its process group killed (processes.end_group)
    log_from: dict = None  # str(log path) -> its size when this life started (the earlier lives' lines are not read)

    def since(self, path):
        """Where this life's lines begin in `path` (0 for a log the launcher truncated)."""
        return (self.log_from or {}).get(str(path), 0)

    def describe(self):
        return f"{self.name}" + (f" (rank {self.rank})" if self.role == "worker" else
                                 f" (shard {self.rank})" if self.role in ("server", "backup") else "")


def free_port(addr):
    host = "0.0.0.0" if addr in ("*", "0.0.0.0") else addr
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def distinct_free_ports(addr, pick=free_port):
    """port_of(i): a port free on `addr` when process i's is first asked for, none twice (each is
    closed again once chosen, and the kernel may hand a closed one out again)."""
    ports = {}

    def port_of(i):
        while i not in ports:
            port = pick(addr)
            if port not in ports.values():
                ports[i] = port
        return ports[i]
    return port_of


def tcp(host, port):
    return f"tcp://[{host}]:{port}" if ":" in host and host != "*" else f"tcp://{host}:{port}"


class TcpEndpoints:
    """Endpoints of the listeners on TCP: process i listens on port_of(i) of its host hosts[i]."""

    def __init__(self, hosts, port_of, bind_addr, connect_addr):
        self.hosts, self.port_of, self.bind_addr, self.connect_addr = hosts, port_of, bind_addr, connect_addr

    def bind(self, i, name):
        """What listener i binds (name: server0, ..., coordinator, snapshots)."""
        return tcp(self.bind_addr(self.hosts[i]), self.port_of(i))

    def connect(self, i, name, peer_host=None):
        """What its peers (on peer_host) connect to."""
        return tcp(self.connect_addr(self.hosts[i]), self.port_of(i))


class IpcEndpoints:
    """Endpoints of the listeners on ipc: one Unix socket per listener, named after it, in the
    run's socket directory; bound and connected to by the same name."""

    def __init__(self, directory):
        self.directory = pathlib.Path(directory)

    def bind(self, i, name):
        path = str(self.directory / name)
        if len(path.encode()) > MAX_SOCKET_PATH:
            raise UsageError(f"ipc socket path {path} is longer than {MAX_SOCKET_PATH} bytes")
        return "ipc://" + path

    def connect(self, i, name, peer_host=None):
        return self.bind(i, name)


class MixedEndpoints:
    """auto over several hosts: listener i binds both its Unix socket and its TCP port
    (ipc:///DIR/NAME+tcp://BIND:PORT); a peer on the same host connects to the socket (shared
    memory), a peer elsewhere to the port."""

    def __init__(self, ipc, tcp_endpoints):
        self.ipc, self.tcp = ipc, tcp_endpoints

    def bind(self, i, name):
        return self.ipc.bind(i, name) + "+" + self.tcp.bind(i, name)

    def connect(self, i, name, peer_host=None):
        beside = peer_host is not None and peer_host == self.tcp.hosts[i]
        return self.ipc.connect(i, name) if beside else self.tcp.connect(i, name)


@contextlib.contextmanager
def socket_dir(plan):
    """ipc, shm, auto: a new private directory for the run's sockets (mode 0700, a short path under
    /tmp), removed when the block ends, however it ends; tcp: None."""
    if not plan.socket_dir_needed:
        yield None
        return
    path = pathlib.Path(tempfile.mkdtemp(prefix="pslab-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def ensure_socket_dir(path):
    """A Slurm task on ipc: the launcher made the socket directory on its own host; create it on
    this node if it is not there (mode 0700) and check that it is this user's private directory."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise UsageError(f"task: cannot create the ipc socket directory {path}: {e}")
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise UsageError(f"task: {path} is not a private directory of this user (ipc sockets go there)")


def check_placement(plan):
    """Refuses, before anything starts, a placement the transport cannot serve: ipc or shm over more
    than one host (ssh: cluster.hosts as used round-robin; Slurm: cluster.hosts when given)."""
    if plan.addresses != "ipc" or plan.launcher == "local" or not plan.hosts:
        return
    hosts = sorted(set(cluster_hosts(plan, plan.hosts)))
    if len(hosts) > 1:
        point = f"{plan.label}: " if plan.label else ""
        raise UsageError(f'{point}cluster.transport = "{plan.transport}" needs every process on one host, but '
                         f'cluster.launcher = "{plan.launcher}" places them on {len(hosts)} hosts '
                         f'({", ".join(hosts)}); use cluster.transport = "tcp", or one host in cluster.hosts')


def run_key_path(run_dir):
    """The run's key (cluster.auth): a CURVE key pair, mode 0600, made by `pslab_worker keygen`."""
    return pathlib.Path(run_dir) / "run.key"


def gpu_slots(plan, hosts):
    """The GPU slot of each process (index -> slot; servers have none): workers and the evaluator
    count up per host in start order. A process runs on GPU (slot mod the GPUs it sees)."""
    slots, used = {}, {}
    for i, p in enumerate(plan.processes):
        if p["role"] not in ("server", "backup"):
            slots[i] = used.get(hosts[i], 0)
            used[hosts[i]] = slots[i] + 1
    return slots


def place(plan, run_dir, run_start, bins, hosts, endpoints, gloo_address=None):
    """The command line of every process of a run, in the plan's start order.

    hosts[i]: the host of process i; endpoints.bind(i, name) / .connect(i, name, peer_host): what
    listener i (a server, all-reduce rank 0, the all-reduce evaluator) binds / its peers on
    peer_host connect to;
    gloo_address(host): all-reduce ranks' Gloo connections listen on their host's address (multi-host).
    """
    layout = plan.processes
    per_host = collections.Counter(hosts)
    servers_on = collections.Counter(h for h, p in zip(hosts, layout) if p["role"] in ("server", "backup"))
    cfg = str(run_dir / "config.toml")
    common = ["-o", str(run_dir), "--run-start", f"{run_start:.6f}"]
    servers = [(i, p["name"]) for i, p in enumerate(layout) if p["role"] == "server"]
    backups = [(i, p["name"]) for i, p in enumerate(layout) if p["role"] == "backup"]  # cluster.replicas = 2

    @functools.cache  # per host, not per process: placement stays linear in processes
    def server_eps(peer_host):
        eps = ["--servers", ",".join(endpoints.connect(i, name, peer_host) for i, name in servers)]
        return eps + (["--backups", ",".join(endpoints.connect(i, name, peer_host) for i, name in backups)] if backups else [])

    if not plan.uses_servers:
        rank0 = next(i for i, p in enumerate(layout) if p["role"] == "worker" and p["rank"] == 0)
        evaluator = next(i for i, p in enumerate(layout) if p["role"] == "evaluator")
        coordinator = endpoints.connect(rank0, "coordinator")  # rank 0 listens on it
        snapshots = endpoints.connect(evaluator, "snapshots")  # the evaluator listens on it
    if plan.authenticates:  # the launcher writes the run's key there before anything starts
        common += ["--auth-key", str(run_key_path(run_dir))]
    procs = []
    slots = gpu_slots(plan, hosts)
    for i, p in enumerate(layout):
        name, role, rank, host = p["name"], p["role"], p["rank"], hosts[i]
        poh = ["--procs-on-host", str(per_host[host]), "-q"]
        if role not in ("server", "backup"):
            poh += ["--gpu-slot", str(slots[i])]
        if role in ("server", "backup"):
            argv = [str(bins.server), "-c", cfg, "--shard", str(rank), "--bind", endpoints.bind(i, name),
                    "--metrics", str(run_dir / "metrics" / f"{name}.jsonl"), "--run-start", f"{run_start:.6f}",
                    "--wait-for-shutdown", "--procs-on-host", str(per_host[host]), "--servers-on-host", str(servers_on[host]),
                    "--checkpoint", str(checkpoint_path(run_dir, name))]
            if role == "server":
                argv += ["--trace", str(run_dir / "trace" / f"{name}.txt")]  # the order it applied and served in
            else:  # its server sends it every update (server/replication.cpp)
                primary = servers[rank][0]
                argv += ["--backup-of", endpoints.connect(primary, layout[primary]["name"], host)]
            if plan.authenticates:
                argv += ["--auth-key", str(run_key_path(run_dir))]
        elif plan.worker_kind == "python":  # (a worker or the evaluator: the user's script)
            argv = script_argv(plan, run_dir, run_start, bins, rank, server_eps(host), per_host[host], slots[i],
                               run_key_path(run_dir) if plan.authenticates else "")
        elif role == "worker" and plan.uses_servers:
            argv = [str(bins.worker), "ps", "-c", cfg, "--rank", str(rank), *server_eps(host), *common, *poh]
        elif role == "worker":
            argv = [str(bins.worker), "allreduce", "-c", cfg, "--rank", str(rank), "--coordinator", coordinator,
                    "--snapshots", snapshots, "--checkpoint", str(checkpoint_path(run_dir, "allreduce")),
                    *common, *poh]
            if gloo_address:  # multi-host: Gloo listens on this rank's host's address
                argv += ["--host", str(gloo_address(host))]
        else:
            where = server_eps(host) if plan.uses_servers else ["--snapshots", snapshots]
            argv = [str(bins.worker), "eval", "-c", cfg, *where, *common, *poh]
        procs.append(Proc(name=name, role=role, rank=rank, index=i, host=host, argv=argv,
                          log=run_dir / "logs" / f"{name}.log",
                          address_from=functools.partial(endpoints.connect, i, name) if role in ("server", "backup") else None))
    return procs


def plan_virtual(plan, run_dir, bins, procs_on_host=1):
    """cluster.launcher = "virtual": one process runs every worker and server in simulated time."""
    argv = [str(bins.worker), "virtual", "-c", str(run_dir / "config.toml"), "-o", str(run_dir),
            "--procs-on-host", str(procs_on_host)]
    p = Proc(name="virtual", role="virtual", rank=-1, index=0, host="local", argv=argv,
             log=run_dir / "logs" / "virtual.log")
    p.command = argv
    return [p]


def checkpoint_path(run_dir, name):
    """A server's checkpoint ("server0"), or the all-reduce ranks' ("allreduce", rank 0 writes it)."""
    return run_dir / "checkpoints" / f"{name}.ckpt"


def checkpoint_version(path):
    """The version a server's checkpoint file holds (its header), or None where there is none."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    return int.from_bytes(head[56:64], "little", signed=True) if len(head) == 64 and head[:8] == b"PSLABCKP" else None


def shard_checkpoint(run_dir, rank):
    """Shard `rank`'s checkpoint to resume from: server<k>'s, or its backup's where that holds a
    later version (cluster.replicas = 2: the backup that took over writes backup<k>.ckpt, and
    the server started in its place writes server<k>.ckpt only once it holds the shard)."""
    paths = [checkpoint_path(run_dir, f"server{rank}"), checkpoint_path(run_dir, f"backup{rank}")]
    versions = [checkpoint_version(p) for p in paths]
    if versions[1] is not None and (versions[0] is None or versions[1] > versions[0]):
        return paths[1]
    return paths[0]


def resume_arguments(run_dir, proc):
    """What a process of a resumed run adds to its command line (local, ssh, Slurm's tasks)."""
    if proc.role == "backup":  # (it joins its resumed server, which sends it the shard)
        return []
    return ["--resume", str(shard_checkpoint(run_dir, proc.rank))] if proc.role == "server" else ["--resume"]


def plan_local(plan, run_dir, run_start, bins, sockets=None):
    """Every process on this machine; listeners on free ports of cluster.bind (tcp) or in the
    socket directory `sockets` (ipc)."""
    hosts = ["local"] * len(plan.processes)
    if plan.unix_sockets:
        procs = place(plan, run_dir, run_start, bins, hosts, IpcEndpoints(sockets))
        for p in procs:
            p.command = p.argv
        return procs
    bind = plan.bind
    connect = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind, bind)
    procs = place(plan, run_dir, run_start, bins, hosts,
                  TcpEndpoints(hosts, distinct_free_ports(bind), lambda h: bind, lambda h: connect))
    for p in procs:
        p.command = p.argv
    return procs


def cluster_hosts(plan, hosts):
    """ssh: process i runs on hosts[i % len(hosts)] (round-robin); the backup of shard k (cluster.replicas
    = 2) on the host after its server's (server k is process k), another host where there is one."""
    where = [hosts[i % len(hosts)] for i in range(len(plan.processes))]
    if plan.replicas > 1:
        for i in range(plan.servers, 2 * plan.servers):  # the backups follow the servers
            where[i] = hosts[(plan.processes[i]["rank"] + 1) % len(hosts)]
    return where


def plan_cluster(plan, run_dir, run_start, bins, where, port_of, address_of, sockets=None):
    """ssh and Slurm: process i on host where[i], listening on port_of(i) (tcp) of its host's
    address address_of(host) (bound there, connected to by its peers, and Gloo's), in the socket
    directory `sockets` (ipc: one host, see check_placement), or both (auto over several hosts:
    shm between processes on one host, TCP between hosts)."""
    tcp_endpoints = TcpEndpoints(where, port_of, address_of, address_of)
    if plan.unix_sockets:
        endpoints = IpcEndpoints(sockets)
    elif plan.mixes_transports:
        endpoints = MixedEndpoints(IpcEndpoints(sockets), tcp_endpoints)
    else:
        endpoints = tcp_endpoints
    return place(plan, run_dir, run_start, bins, where, endpoints, gloo_address=address_of)


def ssh_base():
    """The ssh client and its options: $PSLAB_SSH (e.g. "ssh -F ~/cluster.ssh"), else ssh."""
    return [*shlex.split(os.environ.get("PSLAB_SSH") or "ssh"), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


def ssh_command(proc, alive_s, sockets=None, append=False):
    """ssh HOST 'cd REPO && exec python3 experiments/launch.py remote --log LOG --alive-s S -- ARGV':
    the remote end (remote.py) runs ARGV in a process group it ends when the launcher stops, the
    connection drops or the launcher is not heard for alive_s (cluster.ssh_alive_s; the launcher's
    heartbeat, processes.Heartbeat), writes the log on the host, and says how ARGV ended. ssh's own
    keep-alive gives up on the host as soon. ipc: the socket directory is made there first (on this
    machine the launcher has made it already)."""
    mkdir = f"mkdir -p -m 700 {shlex.quote(str(sockets))} && " if sockets else ""
    # The launcher's numerics environment (BLAS core type, threads), as local processes have it:
    # ssh gives the remote end its own, and a replay here would run other kernels.
    env = ["env", *(f"{k}={v}" for k, v in numerics_env().items())] if numerics_env() else []
    wrapper = ["python3", "experiments/launch.py", "remote", "--log", str(proc.log), "--alive-s", f"{alive_s:g}",
               *(["--append"] if append else []), "--"]
    remote = f"cd {shlex.quote(str(REPO))} && {mkdir}exec {shlex.join(env + wrapper + proc.argv)}"
    return [*ssh_base(), *ssh_keep_alive(alive_s), proc.host, remote]


def ssh_keep_alive(alive_s):
    """ssh's options to give up on a host it has not heard for about alive_s (a network partition:
    the connection stays open, its packets go nowhere)."""
    every = max(1, int(alive_s // 6))
    return ["-o", f"ServerAliveInterval={every}", "-o", f"ServerAliveCountMax={max(1, math.ceil(alive_s / every))}"]


def plan_ssh(plan, run_dir, run_start, bins, probed=None, base_port=None, sockets=None, append=False):
    """ssh: round-robin over cluster.hosts. probed: {host: {"address", "ports"}} (hosts.probe_hosts;
    None in a dry run: placeholders); base_port: fixed ports BASE + i instead of the probed ones."""
    where = cluster_hosts(plan, plan.hosts)
    if probed is None:
        def address_of(h):
            return named_address(plan, h) if is_address(named_address(plan, h) or "") else f"<address of {h}>"
    else:
        def address_of(h):
            return probed[h]["address"]
    port_of = fixed_or_probed_ports(where, probed, base_port)
    procs = plan_cluster(plan, run_dir, run_start, bins, where, port_of, address_of, sockets)
    for p in procs:
        p.command = ssh_command(p, plan.ssh_alive_s, sockets, append)
        p.control = True
        p.ssh_log = run_dir / "logs" / f"{p.name}.ssh.log"
    return procs


def fixed_or_probed_ports(where, probed, base_port):
    """port_of(i): BASE + i, or the next of the ports probed on process i's host, or a placeholder."""
    if base_port is not None:
        return lambda i: base_port + i
    if probed is None:
        return lambda i: f"<port {i}>"
    seen, index = collections.Counter(), []  # (process i's place among its host's processes)
    for h in where:
        index.append(seen[h])
        seen[h] += 1
    return lambda i: probed[where[i]]["ports"][index[i]]


def ports_wanted(where):
    """How many ports to choose on each host: one per process there."""
    return dict(collections.Counter(where))


def srun_command(plan, run_dir):
    """One srun for every task, laid out in blocks (consecutive tasks share a node: the task's node
    follows from the step's tasks per node); ipc: all of them on one node."""
    one_node = ["--nodes=1"] if plan.unix_sockets else []
    return ["srun", f"--ntasks={len(plan.processes)}", *one_node, "--kill-on-bad-exit=1", "--distribution=block",
            "/usr/bin/python3", "experiments/launch.py", "task", str(run_dir)]
