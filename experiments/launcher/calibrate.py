"""`launch.py calibrate CONFIG`: the virtual cluster's cost model ([virtual]) measured on the
machine at hand, by two short real runs of the config's own cluster (its workers, servers,
transport, placement and stragglers, as they share the machine's cores): one asp run (a
worker's step and its round trip to the servers) and one allreduce run (a step without servers
beside it, and the all-reduce). What they measured and the cost model fitted
to it go to a JSON file; `launch.py run CONFIG --calibration FILE` applies it (as --set).

The fit: virtual.compute_ms = the asp workers' mean compute per step (as the run's processes
shared the machine's cores), virtual.allreduce_compute_ms the allreduce ranks'; a round trip of one shard (bytes b each way) = 2 x latency +
2 b / bandwidth + b / apply rate, with latency_us and apply_gbps kept at their values in the
config and bandwidth_gbps solved from the measured round trip (where the round trip is shorter
than that latency allows, bandwidth 100 GB/s and latency_us solved); virtual.allreduce_ms = the
all-reduce alone: the least communication per step of any rank (the last to arrive waits for
no one); virtual.startup_ms = what each run's training span (samples / samples/s) holds beyond
its slowest worker's steps (first-step and connection costs), the mean of the two runs."""
import json
import pathlib
import tempfile

from .common import RunFailed, UsageError, default_runs_dir, say, write_file
from .plan import expand_sweep, new_invocation_dir, replan
from .run import execute_run

STEPS = 200  # per calibration run: enough for steady means, a few seconds


def calibrate(config, bins, opts):
    runs_dir = pathlib.Path(opts.runs_dir) if opts.runs_dir else default_runs_dir()
    with tempfile.TemporaryDirectory(prefix="pslab-calibrate-") as tmp:
        tmp = pathlib.Path(tmp)
        points = expand_sweep(bins, config, opts.set or [], tmp)
        base = points[0]
        off = [f"train.steps={opts.steps}"]
        launcher = [] if base.launcher != "virtual" else ['cluster.launcher="local"']
        # The servers of the config's PS runs (an all-reduce point has none: the first point of
        # the default comparison is one); the round trip is fitted per shard of that many.
        servers = next((p.servers for p in points if p.uses_servers), 0) or 1
        asp = replan(bins, base, off + launcher + ['cluster.mode="asp"', f"cluster.servers={servers}"], tmp)
        allreduce = replan(bins, base, off + launcher + ['cluster.mode="allreduce"'], tmp)
    inv = new_invocation_dir(runs_dir / "calibration", base.name)
    say(f"launch.py: calibrating the virtual cluster for {config}: two real runs of {opts.steps} steps "
        f"({asp.workers} workers; asp with {asp.servers} server(s), then allreduce) -> {inv}")
    opts.no_plots = True
    try:
        s_asp = execute_run(asp, inv / "asp", bins, opts, "calibrate asp")
        s_ar = execute_run(allreduce, inv / "allreduce", bins, opts, "calibrate allreduce")
    except RunFailed as e:
        raise UsageError(f"calibration run failed: {e}")
    cfg = base.plan
    virtual = dict(cfg.get("virtual") or {})
    latency_us = float(virtual.get("latency_us", 50.0))
    apply_gbps = float(virtual.get("apply_gbps", 5.0))
    ms_asp, ms_ar = s_asp["step_time_ms"], s_ar["step_time_ms"]
    # The all-reduce alone: the rank that arrives last waits for no one (the others' comm
    # includes waiting for it).
    allreduce_ms = min(w["comm"] for w in (s_ar["step_time_ms_per_worker"] or {}).values() if w) \
        if s_ar.get("step_time_ms_per_worker") else ms_ar["comm"]
    shard_bytes = 4 * asp.plan["params"] / asp.servers
    latency_us, bandwidth_gbps = fit_round_trip(ms_asp["comm"], shard_bytes, latency_us, apply_gbps)
    model = {"virtual.compute_ms": round(ms_asp["compute"], 4), "virtual.latency_us": latency_us,
             "virtual.bandwidth_gbps": float(f"{bandwidth_gbps:.4g}"), "virtual.apply_gbps": apply_gbps,
             "virtual.allreduce_ms": round(allreduce_ms, 4), "virtual.allreduce_compute_ms": round(ms_ar["compute"], 4),
             "virtual.startup_ms": round((startup_ms(s_asp, opts.steps) + startup_ms(s_ar, opts.steps)) / 2, 3)}
    out = pathlib.Path(opts.out) if opts.out else inv / "calibration.json"
    write_file(out, json.dumps({
        "config": str(config), "workers": asp.workers, "servers": asp.servers, "transport": asp.transport,
        "launcher": asp.launcher, "steps": opts.steps,
        "measured_ms_per_step": {"asp": ms_asp, "allreduce": ms_ar},
        "set": model}, indent=2) + "\n")
    say(f"launch.py: measured per step: compute {ms_asp['compute']:.3f} ms, round trip to the servers "
        f"{ms_asp['comm']:.3f} ms (asp), all-reduce {allreduce_ms:.3f} ms (its last rank's)")
    say(f"launch.py: cost model -> {out}\n  " + " ".join(f"--set {k}={v}" for k, v in model.items()))
    say(f"launch.py: use it: launch.py run {config} --set cluster.launcher=virtual --calibration {out}")
    return 0


def fit_round_trip(round_trip_ms, shard_bytes, latency_us, apply_gbps, most_gbps=100.0):
    """(latency_us, bandwidth_gbps) that make 2 latency + 2 b / bandwidth + b / apply the measured
    round trip: the bandwidth solved with the config's latency; where the round trip is shorter
    than that latency and the apply alone (a small shard on a fast link), the bandwidth is
    `most_gbps` and the latency solved instead (said, as the config's latency is not kept)."""
    fixed_s = 2 * shard_bytes / (most_gbps * 1e9) + shard_bytes / (apply_gbps * 1e9)
    left_s = round_trip_ms * 1e-3 - 2 * latency_us * 1e-6 - shard_bytes / (apply_gbps * 1e9)
    if left_s > 2 * shard_bytes / (most_gbps * 1e9):
        return latency_us, 2 * shard_bytes / left_s / 1e9
    fitted_us = max(0.0, (round_trip_ms * 1e-3 - fixed_s) / 2 * 1e6)
    say(f"launch.py: the round trip ({round_trip_ms:.4f} ms) is shorter than virtual.latency_us = {latency_us:g} "
        f"allows: bandwidth taken as {most_gbps:g} GB/s and the latency fitted, {fitted_us:.2f} us")
    return round(fitted_us, 3), most_gbps


def startup_ms(s, steps):
    """What a real run's training span holds beyond its steps: the span (train samples / samples/s)
    less the slowest worker's steps (compute + comm + delay per step, times the steps)."""
    per_worker = [w for w in (s.get("step_time_ms_per_worker") or {}).values() if w]
    if not per_worker or not s.get("samples_per_s"):
        return 0.0
    span_ms = 1e3 * s["train_samples"] / s["samples_per_s"]
    slowest_ms = max(steps * (w["compute"] + w["comm"] + w["delay"]) for w in per_worker)
    return max(0.0, span_ms - slowest_ms)


def calibration_sets(path):
    """The --set options a calibration file holds."""
    try:
        model = json.loads(pathlib.Path(path).read_text())["set"]
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"{path}: not a calibration file (launch.py calibrate writes one): {e}")
    return [f"{k}={v}" for k, v in model.items()]
