"""Which GPUs each host has and what that means for an all-reduce on them (cluster.collective).

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so with train.device = "cuda" the
launcher decides before anything starts:
  "auto"  NCCL when every rank of every host has a GPU of its own, else through host memory
          (Gloo, or pslab's shared-memory collective on one host); said once, at start
  "nccl"  refused, naming the host, its ranks and its GPUs, when two ranks would share a GPU
  "gloo"  through host memory, always
The decision goes into the run's config (cluster.collective), so every rank (also a Slurm task
reading the run directory) and the record of the run say the same. Where the GPUs of a host
cannot be known here (Slurm nodes, a host ssh cannot ask), "auto" is left to the ranks, which
decide the same way from the GPUs they actually got (comm/collective.h)."""
import concurrent.futures
import os
import subprocess
import tomllib

from .common import UsageError
from .placement import cluster_hosts, gpu_slots, ssh_base
from .processes import check_signal


def visible_gpus(host, launcher, why=None):
    """The GPUs a process pslab starts on `host` would see, as `nvidia-smi -L` names them
    ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)"), in CUDA's order; None when unknown here,
    and then `why` (a list) gets the reason (ssh's or nvidia-smi's own words)."""
    if launcher == "local":
        argv = ["nvidia-smi", "-L"]
    elif launcher == "ssh":
        argv = [*ssh_base(), host, "nvidia-smi -L"]  # ($PSLAB_SSH, as the run's processes are started)
    else:  # Slurm: the nodes are the job's, not reachable from here before it runs
        return None
    what = "nvidia-smi -L" if launcher == "local" else f"ssh {host} nvidia-smi -L"
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except OSError as e:
        return unknown(why, f"{what}: {e.strerror}")
    except subprocess.TimeoutExpired:
        return unknown(why, f"{what}: no answer within 30 s")
    if p.returncode != 0:  # no driver, no nvidia-smi there, or ssh failed
        said = (p.stderr.strip() or p.stdout.strip()).splitlines()
        return unknown(why, f"{what} exited {p.returncode}" + (f": {said[-1].strip()}" if said else ""))
    gpus = [line.strip() for line in p.stdout.splitlines() if line.startswith("GPU ")]
    return restrict_to_visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")) if launcher == "local" else gpus


def ask_hosts(hosts, launcher, gpus_of):
    """{host: (gpus or None, [why])}: every host asked at once (a silent one costs its 30 s once,
    not once per host before it), a Ctrl-C heard meanwhile."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(16, max(1, len(hosts))))
    try:
        whys = {h: [] for h in hosts}
        futures = {h: pool.submit(gpus_of, h, launcher, whys[h]) for h in hosts}
        while not all(f.done() for f in futures.values()):
            check_signal()
            concurrent.futures.wait(futures.values(), timeout=0.1)
        return {h: (f.result(), whys[h]) for h, f in futures.items()}
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # (interrupted: the probes end at their own timeout)


def unknown(why, reason):
    if why is not None:
        why.append(reason)
    return None


def restrict_to_visible(gpus, cuda_visible_devices):
    """The GPUs of `gpus` (nvidia-smi -L lines) that CUDA_VISIBLE_DEVICES leaves visible, in its
    order: indices or UUIDs (or their prefixes), up to the first that names none."""
    if cuda_visible_devices is None:
        return gpus
    out = []
    for item in (s.strip() for s in cuda_visible_devices.split(",")):
        found = None
        if item.isdigit() and int(item) < len(gpus):
            found = gpus[int(item)]
        elif item.startswith(("GPU-", "MIG-")):
            found = next((g for g in gpus if f"UUID: {item}" in g), None)
        if found is None:
            break  # CUDA stops at the first invalid entry
        out.append(found)
    return out


def rank_hosts(plan):
    """Process index -> host, as the launcher will place them; None when unknown before the run."""
    if plan.launcher == "local":
        return ["local"] * len(plan.processes)
    if plan.hosts:
        return cluster_hosts(plan, plan.hosts)
    return None  # Slurm without cluster.hosts: the job's nodes


def decide_collective(plan, gpus_of=visible_gpus):
    """(value, line): what cluster.collective becomes for this run and the line that says why;
    (None, None) where there is nothing to decide (PS modes, CPU workers). Raises UsageError for
    an explicit "nccl" that cannot work. gpus_of(host, launcher, why) -> [GPU names] or None (why: the reason)."""
    if plan.uses_servers or plan.device != "cuda":
        return None, None
    asked = plan.collective
    if asked == "gloo":
        return "gloo", 'allreduce: cluster.collective = "gloo": GPU buffers are all-reduced through host memory'
    if asked == "auto" and tomllib.loads(plan.config_text).get("cluster", {}).get("overlap") is True:
        return "gloo", ('allreduce: cluster.collective = "auto" with cluster.overlap = true: through host memory, '
                        "which overlaps with backward (NCCL's all-reduce does not yet)")
    hosts = rank_hosts(plan)
    if hosts is None:
        return asked, (f'allreduce: cluster.collective = "{asked}": the nodes are not known before the job; '
                       + ("each rank checks at start that no two share a GPU" if asked == "auto" else
                          "NCCL fails at start if two ranks share a GPU"))
    slots = gpu_slots(plan, hosts)
    ranks_of = {}  # host -> [(rank, slot)]
    for i, p in enumerate(plan.processes):
        if p["role"] == "worker":
            ranks_of.setdefault(hosts[i], []).append((p["rank"], slots[i]))
    not_known, shared = [], []  # (host, why); (host, ranks, gpus) where ranks share a GPU
    answers = ask_hosts(list(ranks_of), plan.launcher, gpus_of)
    for host, ranks in ranks_of.items():
        gpus, why = answers[host]
        if gpus is None:
            not_known.append((host, "; ".join(why) or "no answer"))
            continue
        on_gpu = {}
        for rank, slot in ranks:
            on_gpu.setdefault(slot % len(gpus) if gpus else None, []).append(rank)
        if not gpus or any(len(r) > 1 for r in on_gpu.values()):
            shared.append((host, [r for r, _ in ranks], gpus))
    where = "; ".join(f"host {h} runs ranks {', '.join(map(str, r))} on "
                      + (f"{len(g)} GPU{'s' if len(g) != 1 else ''} ({', '.join(g)})" if g else "no visible GPU")
                      for h, r, g in shared)
    if asked == "nccl" and shared:
        raise UsageError(f'{plan.label + ": " if plan.label else ""}cluster.collective = "nccl" needs a GPU of its own '
                         f'for every all-reduce rank (NCCL refuses two ranks on one GPU), but {where}; use '
                         f'cluster.collective = "auto" or "gloo" (through host memory), or fewer workers per host')
    if shared:
        return "gloo", (f'allreduce: cluster.collective = "auto": {where}, so GPU buffers are all-reduced '
                        f'through host memory, not NCCL')
    if not_known:
        return asked, (f'allreduce: cluster.collective = "{asked}": the GPUs of {", ".join(h for h, _ in not_known)} are '
                       f'not known here ({"; ".join(w for _, w in not_known)}); '
                       + ("the ranks decide at start" if asked == "auto" else "NCCL fails at start if two ranks share a GPU"))
    return "nccl", f'allreduce: cluster.collective = "{asked}": NCCL, every rank has a GPU of its own'
