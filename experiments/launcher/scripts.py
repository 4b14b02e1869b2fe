"""Workers of the user's own (worker.kind = "python"): every worker and the evaluator run
worker.script by worker.python through worker/python/run_script.py (which finds the pslab
package beside it), handed their part of the run in PSLAB_* variables (pslab.launched()).

θ0 and the model's shape: a config with model.kind = "external" and neither model.sizes nor
model.theta_file leaves them to the script. Before the servers start, the launcher runs it once
with PSLAB_THETA0=FILE (seeded with the run's seed): pslab.torch writes the module's initial
parameters there, and their tensors' sizes to FILE.json, and exits; the run then goes on with
model.sizes and model.theta_file set to them (its config.toml says so)."""
import json
import pathlib
import shutil
import subprocess

from .common import REPO, RunFailed, UsageError
from .processes import run_in_group

THETA0_TIMEOUT_S = 300  # the script's start: imports, data, the module


def client_library(bins):
    return bins.build / "worker" / "libpslab_client.so"


def script_env(plan, run_dir, bins, rank, servers="", backups="", auth_key="", run_start=0.0, procs_on_host=1, gpu_slot=0):
    """What a process of the script is told (pslab.launched() reads it)."""
    return {"PSLAB_CONFIG": str(run_dir / "config.toml"), "PSLAB_RANK": str(rank), "PSLAB_SERVERS": servers,
            "PSLAB_BACKUPS": backups, "PSLAB_AUTH_KEY": str(auth_key), "PSLAB_RUN_DIR": str(run_dir),
            "PSLAB_RUN_START": f"{run_start:.6f}", "PSLAB_SEED": str(plan.seed), "PSLAB_PROCS_ON_HOST": str(procs_on_host),
            "PSLAB_GPU_SLOT": str(gpu_slot), "PSLAB_CLIENT_LIB": str(client_library(bins))}


def script_command(plan, env):
    return ["/usr/bin/env", *(f"{k}={v}" for k, v in env.items() if v != ""), plan.worker_python,
            str(REPO / "worker" / "python" / "run_script.py"), plan.worker_script]


def script_argv(plan, run_dir, run_start, bins, rank, eps, procs_on_host, gpu_slot, auth_key):
    """The command line of worker `rank` or of the evaluator (rank -1); eps: its --servers [--backups]."""
    servers = eps[eps.index("--servers") + 1]
    backups = eps[eps.index("--backups") + 1] if "--backups" in eps else ""
    return script_command(plan, script_env(plan, run_dir, bins, rank, servers, backups, auth_key, run_start, procs_on_host,
                                           gpu_slot))


def check_workers(plan, bins):
    """Refuses, before anything starts, workers that cannot run: a model pslab_worker does not compute
    (model.kind = "external") without workers of the user's; a script or interpreter not there
    (local), a client library not built (worker.kind = "python")."""
    point = f"{plan.label}: " if plan.label else ""
    if plan.worker_kind != "python":
        if plan.plan.get("model_kind") == "external":
            raise UsageError(f'{point}model.kind = "external" is trained by workers of your own: set worker.kind = '
                             f'"python" and worker.script (pslab.torch; docs/usage.md)')
        return
    lib = client_library(bins)
    if not lib.is_file():
        raise UsageError(f"{point}worker.kind = \"python\" needs {lib}: build pslab (experiments/setup.sh)")
    if plan.launcher == "local" and not pathlib.Path(plan.worker_script).is_file():
        raise UsageError(f"{point}worker.script: {plan.worker_script}: no such file")
    if plan.launcher == "local" and not shutil.which(plan.worker_python):
        raise UsageError(f"{point}worker.python: {plan.worker_python}: no such interpreter on this host")


def needs_theta0(plan):
    """Whether the script is to say θ0 and the model's sizes (see the module's docstring)."""
    return plan.worker_kind == "python" and plan.plan.get("model_kind") == "external" and plan.plan.get("params") == 0


def theta0_sets(plan, run_dir, bins):
    """Runs the script once for θ0 (on this host, its output in logs/theta0.log); returns the --set
    lines that give the run its model.sizes and model.theta_file. Raises RunFailed naming the
    log when the script fails or writes nothing."""
    out = run_dir / "theta0.f32"
    log = run_dir / "logs" / "theta0.log"
    env = script_env(plan, run_dir, bins, -1)
    env.update({"PSLAB_THETA0": str(out), "PSLAB_SERVERS": ""})
    with open(log, "wb") as f:
        try:
            rc = run_in_group(script_command(plan, env), THETA0_TIMEOUT_S, stdout=f, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, cwd=REPO)
        except subprocess.TimeoutExpired:
            raise RunFailed(f"worker.script {plan.worker_script} did not write θ0 within {THETA0_TIMEOUT_S} s "
                             f"(PSLAB_THETA0; its output: {log})") from None
    try:
        sizes = json.loads(pathlib.Path(f"{out}.json").read_text())["sizes"]
    except (OSError, ValueError, KeyError):
        sizes = None
    if rc != 0 or not sizes or not out.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise RunFailed(f"worker.script {plan.worker_script} was to write θ0 (PSLAB_THETA0: pslab.torch.Worker or "
                         f"evaluate does) and " + (f"exited {rc}" if rc else "wrote none") +
                         f"; its output ({log}):\n  " + "\n  ".join(tail))
    if out.stat().st_size != 4 * sum(sizes):
        raise RunFailed(f"{out}: {out.stat().st_size} bytes, the sizes in {out}.json add up to {sum(sizes)} floats")
    return [f"model.sizes={json.dumps(sizes)}", f"model.theta_file={json.dumps(str(out), ensure_ascii=False)}"]
