"""Where each process of a run goes and its command line: local (free ports), ssh (round-robin
over cluster.hosts, fixed ports), Slurm (one srun; task i on node i mod nodes)."""
import pathlib
import shlex
import socket
from dataclasses import dataclass

from .common import REPO

DEFAULT_BASE_PORT = 29500


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


def place(info, run_dir, run_start, bins, hosts_of, port_of, bind_addr, connect_addr, gloo_host=None):
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

    procs = place(info, run_dir, run_start, bins, lambda i: "local", port_of, lambda h: bind, lambda h: connect)
    for p in procs:
        p.command = p.argv
    return procs


def remote_bind(info):
    return "*" if is_loopback(info.bind) else info.bind


def plan_cluster(info, run_dir, run_start, bins, hosts, base_port):
    """ssh and Slurm: process i on hosts[i % len(hosts)], listening on base_port + i."""
    return place(info, run_dir, run_start, bins, lambda i: hosts[i % len(hosts)], lambda i: base_port + i,
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
