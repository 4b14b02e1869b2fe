"""CUDA MPS for a run whose processes share a GPU (cluster.mps).

Processes that share a GPU without MPS time-slice it: each gets the whole GPU in turn, and a
worker's step takes several times as long as alone. Under MPS their kernels run side by side in
one GPU context. The local launcher decides before a run starts:
  "auto"  a daemon when two or more of the run's GPU processes would share a GPU (gpu_slots:
          workers and the evaluator, slot mod the GPUs nvidia-smi shows); none otherwise
  "on"    a daemon whenever the run computes on GPUs
  "off"   none
The daemon is the run's own: `nvidia-cuda-mps-control -d` with its pipe directory private to
the run (mode 0700, a short path under /tmp, as Unix sockets need; CUDA_MPS_PIPE_DIRECTORY) and
its log in <run>/mps/ (CUDA_MPS_LOG_DIRECTORY); only the run's processes are pointed at it. It is
stopped when the run ends, fails or is interrupted: "quit" to its control, then whatever still
runs with the run's pipe directory in its environment is killed and the directory removed.
Where MPS cannot start (no nvidia-cuda-mps-control, it fails) the launcher says so in one line
and the run goes on without it. ssh and Slurm runs do not start MPS (yet): said once, for "on".
"""
import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

from .common import say, warn
from .gpus import visible_gpus
from .placement import gpu_slots

CONTROL = "nvidia-cuda-mps-control"
PIPE_VAR, LOG_VAR = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"


def decide_mps(plan, gpus_of=visible_gpus):
    """(start a daemon?, the line that says why or None)."""
    asked = getattr(plan, "mps", "auto")
    if plan.device != "cuda" or plan.virtual or asked == "off":
        return False, None
    if plan.launcher != "local":
        return False, (f'cluster.mps = "on": MPS is started by the local launcher only; the {plan.launcher} run goes '
                       "without it" if asked == "on" else None)
    hosts = ["local"] * len(plan.processes)
    slots = gpu_slots(plan, hosts)
    gpus = gpus_of("local", "local")
    if not gpus:
        if asked == "on":
            return True, 'cluster.mps = "on": a private MPS daemon for the run (its GPUs are not known here)'
        return False, None
    on_gpu = {}
    for i, slot in slots.items():
        on_gpu.setdefault(slot % len(gpus), []).append(plan.processes[i]["name"])
    shared = {g: names for g, names in on_gpu.items() if len(names) > 1}
    if asked == "auto" and not shared:
        return False, None
    where = "; ".join(f"{', '.join(names)} share GPU {g}" for g, names in sorted(shared.items())) or "no GPU is shared"
    return True, f'cluster.mps = "{asked}": {where}: a private MPS daemon for the run'


def _pids_with_pipe(pipe):
    """Live processes of this user whose environment names `pipe` as their MPS pipe directory."""
    want = f"{PIPE_VAR}={pipe}".encode()
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if d.stat().st_uid == os.getuid() and want in (d / "environ").read_bytes().split(b"\0"):
                found.append(int(d.name))
        except OSError:
            continue
    return found


def _stop(control, env, pipe):
    """Asks the daemon to quit; kills what is left of it (and any process still pointed at it)."""
    try:
        subprocess.run([control], input="quit\n", env=env, text=True, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        warn(f"MPS: {control} quit: {e}")
    deadline = time.time() + 10
    while _pids_with_pipe(pipe) and time.time() < deadline:
        time.sleep(0.05)
    for pid in _pids_with_pipe(pipe):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(pipe, ignore_errors=True)


@contextlib.contextmanager
def mps_daemon(plan, run_dir, gpus_of=visible_gpus):
    """The run's MPS daemon while the block runs, if the run wants one (decide_mps): yields the
    environment its processes need ({} without MPS)."""
    wanted, why = decide_mps(plan, gpus_of)
    if why and not wanted:
        say(why)
    if not wanted:
        yield {}
        return
    control = shutil.which(CONTROL)
    if not control:
        warn(f"cluster.mps: {CONTROL} is not on PATH: the run's processes share their GPUs without MPS")
        yield {}
        return
    pipe = tempfile.mkdtemp(prefix="pslab-mps-", dir="/tmp")  # mode 0700
    log = pathlib.Path(run_dir) / "mps"
    mps_env = {PIPE_VAR: pipe, LOG_VAR: str(log)}
    env = {**os.environ, **mps_env}
    try:
        log.mkdir(mode=0o700, exist_ok=True)
        p = subprocess.run([control, "-d"], env=env, text=True, capture_output=True, timeout=30)
        failed = p.returncode != 0 and f"exit {p.returncode}: {(p.stdout + p.stderr).strip()[-300:]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        failed = str(e)
    except BaseException:  # (Ctrl-C while it starts: nothing of it left)
        _stop(control, env, pipe)
        raise
    if failed:
        _stop(control, env, pipe)
        warn(f"MPS could not start ({CONTROL} -d: {failed}): the run goes on without it")
        yield {}
        return
    say(why + f" (pipes in {pipe}, log in {log})")
    try:
        yield mps_env
    finally:
        _stop(control, env, pipe)
