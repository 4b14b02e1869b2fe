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

from .common import REPO, cmd_out

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
    rev = cmd_out(["git", "rev-parse", "HEAD"], cwd=REPO)
    status = cmd_out(["git", "--no-optional-locks", "status", "--porcelain"], cwd=REPO)
    return {
        "git": {"revision": rev, "dirty": bool(status) if status is not None else None},
        "host": socket.gethostname(),
        "cpu": {"model": cpu, "cores": os.cpu_count()},
        "gpu": gpu or None,
        "libraries": libs,
    }


def write_manifest(run_dir, plan, procs, run_start, bins, extra=None):
    m = dict(host_facts())
    m.update({
        "name": plan.name,
        "label": plan.label,
        "mode": plan.mode,
        "seed": plan.seed,
        "launcher": plan.launcher,
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
