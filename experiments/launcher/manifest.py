"""manifest.json of a run: where and how it ran (git revision, host, CPU/GPU, library
versions, every command line)."""
import datetime
import functools
import json
import os
import platform
import shlex
import shutil
import socket
import sys

from .common import REPO, bundle_facts, cmd_out, numerics_env, write_file
from .processes import check_signal
from .remote import markers

LIBRARY_PACKAGES = ["libzmq5", "libopenblas0", "libopenblas0-pthread", "libgloo0", "libflatbuffers2",
                    "libtomlplusplus3", "python3-matplotlib", "python3-numpy"]


@functools.cache
def host_facts():
    """Facts that are the same for every run of an invocation (computed once)."""
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
        gpu = cmd_out(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    libs = {}
    out = cmd_out(["dpkg-query", "-W", "-f=${Package} ${Version}\\n", *LIBRARY_PACKAGES])
    for line in (out or "").splitlines():
        pkg, _, ver = line.partition(" ")
        if ver:
            libs[pkg] = ver
    libs["python"] = platform.python_version()
    bundle = bundle_facts()
    if bundle:  # a bundle: no git, and its binaries load its own libraries (build/lib)
        git = {"revision": bundle.get("revision"), "dirty": bundle.get("dirty"), "bundle_made": bundle.get("made")}
        libs = {"bundled": bundle.get("libraries", {}), "python": libs["python"],
                **{k: v for k, v in libs.items() if k.startswith("python3-")}}
    else:
        status = cmd_out(["git", "--no-optional-locks", "status", "--porcelain"], cwd=REPO)
        git = {"revision": cmd_out(["git", "rev-parse", "HEAD"], cwd=REPO),
               "dirty": bool(status) if status is not None else None}
    return {
        "git": git,
        "host": socket.gethostname(),
        "cpu": {"model": cpu, "cores": os.cpu_count()},
        "gpu": gpu or None,
        "libraries": libs,
    }


def process_record(p, placed):
    """One process in the manifest; placed: from what it said where it ran (the launcher's line at
    the top of its log: ssh's remote end, a Slurm task), its real host, pid and command."""
    r = {"name": p.name, "role": p.role, "rank": p.rank, "host": p.host,
         "pid": p.popen.pid if p.popen else None, "command": shlex.join(p.command or p.argv)}
    # (a local process, started by the launcher itself, writes none: its log is not read)
    told = placed and (p.control or p.popen is None)
    started = [m for m in markers(p.log) if m.get("event") == "started"] if told else []
    if started:
        m = started[-1]
        if p.control:  # ssh: the launcher's pid is the ssh client's
            r.update(ssh_client_pid=r["pid"], hostname=m["host"], pid=m["pid"])
        else:  # a Slurm task: its node and everything on its command line come from the step's layout
            r.update(host=m.get("node", m["host"]), hostname=m["host"], pid=m["pid"], slurm_task=m.get("task"),
                     command=shlex.join(m["argv"]) if m.get("argv") else r["command"])
    return r


def write_manifest(run_dir, plan, procs, run_start, bins, extra=None, placed=False, interruptible=False, previous=None):
    """manifest.json; returns its process records, each as the JSON text written. interruptible:
    a SIGINT or SIGTERM stops it within a second however many processes the run has (Interrupted;
    the file stays as it was). previous: the records last written, kept as they were for the
    processes never started (a run stopped early: only what started is read and encoded again)."""
    def record(i, p):
        if interruptible and i % 1024 == 0:
            check_signal()
        if previous is not None and p.popen is None and plan.launcher != "slurm":
            return previous[i]
        return json.dumps(process_record(p, placed))
    records = [record(i, p) for i, p in enumerate(procs)]
    m = dict(host_facts())
    m.update({
        "name": plan.name,
        "label": plan.label,
        "mode": plan.mode,
        "seed": plan.seed,
        "launcher": plan.launcher,
        "numerics_env": numerics_env(),  # every process's: local ones inherit it, ssh passes it
        "start_time": datetime.datetime.fromtimestamp(run_start).astimezone().isoformat(timespec="seconds"),
        "run_start_unix_s": run_start,
        "build_dir": str(bins.build),
        "launcher_command": shlex.join([sys.executable, *sys.argv]),
        "processes": records,
    })
    if extra:
        m.update(extra)
    write_file(run_dir / "manifest.json", manifest_text(m))
    return records


def manifest_text(m):
    """m as JSON, indented, with one process per line (m["processes"]: each one's JSON text):
    json's indenting encoder is pure Python (seconds for 100000 processes), its compact one is not."""
    one_per_line = ",\n    ".join(m["processes"])
    text = json.dumps(dict(m, processes="@processes@"), indent=2)
    return text.replace('"@processes@"', f"[\n    {one_per_line}\n  ]" if m["processes"] else "[]") + "\n"

