"""summary.json of a run (from its metrics files) and the one line said when a run ends.

summary.json's keys:


mode, workers, servers, device, seed, target_acc   from the run's plan (plan.json)
status              "ok", "diverged" (the training loss stopped being finite: see "diverged",
                    {worker, step, epoch} of the earliest), "failed" (see "failure"),
                    "cancelled" (the Slurm job or step was: scancel, time limit) or "interrupted"
failure             failed or interrupted: what failed, how, and the last lines of its log
final_test_acc      the evaluator's last test accuracy (None when the data is not a
                    classification); best_test_acc: the best of all its evaluations;
                    classification: whether it is (a regression's quality is final_test_loss)
time_to_target_s, epochs_to_target   at the first evaluation with test accuracy >= target_acc on
                    the path of the final θ (metrics.last_life: a resumed run's evaluations of
                    work its failure lost are left out, as in the plots)
startup_s           when the first worker's first step began (s from the run's start:
                    processes, data, connections, the start barrier); train_time_to_target_s
                    the time to target counted from then, a resumed run's pauses left out
epochs              of the last evaluation: passes over the training set by all workers
samples_per_s       all workers together = total samples / training span (training_windows):
                    a worker's samples in a metrics window = samples_per_s * window length (t
                    minus its previous line's t; a life's first line: its steps * batch); the
                    span from the earliest first step to the last train line, over each life of
                    a resumed run apart (its pause is no training); train_samples: the total
bytes_pushed, bytes_pulled   as the servers counted them, bad input apart (all-reduce: the bytes each rank
                    all-reduced, summed over the ranks, in both)
pushed_by_codec     PS modes: {codec: {"pushes", "payload_bytes"}}, the accepted pushes and
                    their payload bytes summed over the servers (cluster.codec)
staleness           PS modes: {mean, p99, max, count} (metrics.staleness_stats): the
                    distribution over (push, shard) pairs of the servers' merged histograms,
                    in versions of the shard; count is the number of pushes, each counted
                    once (not once per server); None for all-reduce
workers_lost        PS modes with cluster.on_worker_loss = "continue": the workers the run went on
                    without (workers_lost()); [] when none was lost
pushes_refused      PS modes with cluster.push_guard: {worker: pushes the servers' guard refused
                    (each counted once per server that refused it)}; {} when none was
reconnects          PS modes: sessions the servers moved to a new connection (a connection that was
                    cut and came back; summed over the servers); pushes_duplicate: pushes that came
                    again after such a cut, answered and not applied again (pushed_by_codec counts
                    each push once); workers_back: workers the servers dropped as silent and took
                    back when they spoke again within cluster.reconnect_s (their link came back;
                    counted once per server)
servers_restarted   with cluster.on_server_loss = "restart": [{server, how, log}] per restart of a
                    server that died, from its checkpoint
replicas, copies_ended   PS modes: cluster.replicas; with 2, [{shard, process, how, log}] per server or
                    backup that ended while the other copy of its shard went on (a server that died,
                    or stopped because its backup took over; a backup that died). The counts above
                    are each shard's serving copy's (a backup that took over counts from its start)
updates_lost        the updates those restarts lost (workers' pushes after the checkpoint), over
                    the servers; 0 without restarts
resume_lost_pushes  PS modes: the pushes resumed workers sent again empty, summed over the
                    workers' "resumed" lines (a shard whose checkpoint was behind the others':
                    what it had missed is lost); 0 when none was
wall_s              the run's wall-clock time, from its start to its last process's exit
simulated           true for the virtual cluster (cluster.launcher = "virtual"): every time
                    above but wall_s is simulated; a replay adds replay_of, params_checksums,
                    recorded_params_checksums and replay_identical
final_test_loss, final_is_last_eval (the evaluator's final evaluation after training),
evaluations, steps_per_worker (the plan's total_steps), step_time_ms (mean ms per step of
every worker: compute, comm, wait, delay) and step_time_ms_per_worker
"""
import os

from .metrics import last_life, read_jsonl, staleness_stats


# Statuses of runs whose processes all finished (plotted and compared); "diverged": the
# training loss stopped being finite, which is the experiment's outcome, not a failure.
COMPLETED = ("ok", "diverged")


def pushed_by_codec(finals):
    """{codec: {"pushes", "payload_bytes"}} summed over the servers' final lines."""
    out = {}
    for f in finals:
        for codec, c in (f.get("pushed") or {}).items():
            acc = out.setdefault(codec, {"pushes": 0, "payload_bytes": 0})
            acc["pushes"] += c.get("pushes", 0)
            acc["payload_bytes"] += c.get("payload_bytes", 0)
    return out or None


def pushes_refused(finals):
    """{worker: refusals} summed over the servers' final lines (cluster.push_guard)."""
    out = {}
    for f in finals:
        for w, n in ((f.get("push_guard") or {}).get("refused") or {}).items():
            out[w] = out.get(w, 0) + n
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def workers_lost(finals, lost):
    """[{worker, how, clock, silent_s}] of the workers the run went on without: how (the launcher
    saw the process end: "was killed by signal 9 (SIGKILL)") and when the servers dropped it
    (its clock, the silence they waited; None where none did, e.g. the run ended first)."""
    out = {}
    for f in finals:
        for x in f.get("workers_lost") or []:
            w = out.setdefault(x["worker"], {"worker": x["worker"], "how": None, "clock": None, "silent_s": None})
            w["clock"] = x.get("clock") if w["clock"] is None else max(w["clock"], x.get("clock", 0))
            w["silent_s"] = x.get("silent_s") if w["silent_s"] is None else max(w["silent_s"], x.get("silent_s", 0))
    for x in lost or []:
        w = out.setdefault(x["worker"], {"worker": x["worker"], "how": None, "clock": None, "silent_s": None})
        w["how"] = x["how"]
    return [out[k] for k in sorted(out)]


def training_windows(worker_rows, batch):
    """From every worker's metrics lines: the samples trained (all workers), the training span,
    when training began, the summed step times (ms) and steps, each worker's mean step time, and
    the bytes all-reduced (all-reduce mode; None where a line lacks them).

    A worker's "start" line (its first step began, after the start barrier) opens a life of it; a
    resumed run's processes write one again, at the step they go on from. A life's first train
    line holds its steps * batch samples, each next one samples_per_s * (t - the previous line's
    t). The span is the union of the workers' lives (each from its start to its last train line),
    so a resumed run's pause is no training, whichever lives a worker had (one killed in its first
    step, or done before the run stopped, has fewer). (Metrics without "start" lines: a life
    begins at its first train line's t minus that window's length.)"""
    total_samples, intervals, starts = 0.0, [], []  # [(start, end)] of every worker's lives; every start

    step_ms = {"compute": 0.0, "comm": 0.0, "wait": 0.0, "delay": 0.0}
    n_steps, per_worker, allreduced = 0, {}, 0

    for r, rows in worker_rows.items():
        began_at, prev_t, prev_step, last = None, None, 0, None
        w_steps, w_ms = 0, {k: 0.0 for k in step_ms}

        def close_life():
            nonlocal allreduced
            if last is not None:
                intervals.append((began_at, last["t"]))
                allreduced = None if allreduced is None or last.get("allreduce_bytes") is None \
                    else allreduced + last["allreduce_bytes"]
        for x in rows:
            if x.get("kind") == "start":
                close_life()
                began_at, prev_t, prev_step, last = x["t"], None, x.get("step", 0), None
                starts.append(x["t"])
                continue
            if x.get("kind") != "train":
                continue
            if began_at is None:  # (no "start" line)
                window = x["step"] * batch / x["samples_per_s"] if x["samples_per_s"] > 0 else 0.0
                began_at = x["t"] - window
                starts.append(began_at)
            steps = x["step"] - prev_step
            total_samples += steps * batch if prev_t is None else x["samples_per_s"] * (x["t"] - prev_t)
            for k in step_ms:
                w_ms[k] += x.get(f"{k}_ms", 0.0) * steps
            w_steps += steps
            prev_t, prev_step, last = x["t"], x["step"], x
        close_life()
        if w_steps:
            per_worker[str(r)] = {k: v / w_steps for k, v in w_ms.items()}
            for k in step_ms:
                step_ms[k] += w_ms[k]
            n_steps += w_steps
    spans = []  # the union of the lives, in order
    for start, end in sorted(intervals):
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    span = sum(end - start for start, end in spans)
    began = min(starts) if starts else None
    pauses = [(end, start) for (_, end), (start, _) in zip(spans, spans[1:])]
    return total_samples, span, began, step_ms, n_steps, per_worker, allreduced if starts else None, pauses


def first_at_target(evals, target):
    """The first evaluation on the final θ's path (last_life) with test accuracy >= target, or
    None: one of the work a resumed run's failure lost does not count."""
    return next((x for x in last_life(evals, repeats=True) if x.get("test_acc", -1.0) >= target), None)


def training_time_to(t, began, pauses):
    """Seconds of training from `began` to metric time t, less the pauses between lives before it
    (0 for a target θ0 already met: evaluated before the first step began)."""
    return max(0.0, t - began - sum(min(t, start) - end for end, start in pauses if end < t))


def summarize(plan, run_dir, wall_s, status="ok", failure=None, lost=None, restarted=None, failed_over=None):
    """summary.json of a run (its keys: the module's docstring)."""
    metrics = run_dir / "metrics"
    batch = plan.batch
    # The workers that wrote metrics (a run stopped early: few of many), in rank order.
    present = sorted(int(n[6:-6]) for n in (os.listdir(metrics) if metrics.is_dir() else [])
                     if n.startswith("worker") and n.endswith(".jsonl") and n[6:-6].isdigit())
    worker_rows = {r: read_jsonl(metrics / f"worker{r}.jsonl") for r in present if r < plan.workers}
    # A worker whose loss stopped being finite wrote one "diverged" line; the earliest counts.
    diverged = min((x for rows in worker_rows.values() for x in rows if x.get("kind") == "diverged"),
                   key=lambda x: x.get("epoch", 0.0), default=None)
    if diverged and status == "ok":
        status = "diverged"
    evals = [x for x in read_jsonl(metrics / "evaluator.jsonl") if x.get("kind") == "eval"]
    # Each shard's copy that served it (cluster.replicas = 2: a backup that took over; not one that
    # only followed its server, whose counts repeat the server's).
    servers = [p["name"] for p in plan.processes if p["role"] in ("server", "backup")]
    finals = [x for name in servers for x in read_jsonl(metrics / f"{name}.jsonl")
              if x.get("kind") == "server_final" and x.get("replica") != "backup"]

    total_samples, span, began, step_ms, n_steps, per_worker, allreduced, pauses = training_windows(worker_rows, batch)

    acc = [x for x in evals if "test_acc" in x]
    final = evals[-1] if evals else None
    hit = first_at_target(evals, plan.target_acc)
    classification = plan.classification
    s = {
        "mode": plan.mode,
        "workers": plan.workers,
        "servers": plan.servers,
        "device": plan.device,
        "seed": plan.seed,
        "global_batch": plan.global_batch,
        "final_test_acc": final.get("test_acc") if final and classification else None,
        "best_test_acc": max(x["test_acc"] for x in acc) if acc else None,
        "target_acc": plan.target_acc,
        "classification": classification,
        "time_to_target_s": hit["t"] if hit else None,
        # start-up (processes, data, connections) apart from training: when the first training
        # window began, and the time to target counted from there
        "startup_s": began,
        "train_time_to_target_s": training_time_to(hit["t"], began, pauses) if hit and began is not None else None,
        "epochs_to_target": hit["epoch"] if hit else None,
        "epochs": final["epoch"] if final else None,
        "samples_per_s": total_samples / span if span > 0 else None,
        "bytes_pushed": sum(f.get("bytes_in", 0) for f in finals) if finals else None,
        "bytes_pulled": sum(f.get("bytes_out", 0) for f in finals) if finals else None,
        "staleness": staleness_stats(finals) if plan.uses_servers else None,
        "pushed_by_codec": pushed_by_codec(finals) if plan.uses_servers else None,
        "workers_lost": workers_lost(finals, lost),
        "pushes_refused": pushes_refused(finals),
        "reconnects": sum(f.get("reconnects", 0) for f in finals) if plan.uses_servers else None,
        "pushes_duplicate": sum(f.get("pushes_duplicate", 0) for f in finals) if plan.uses_servers else None,
        "workers_back": sum(f.get("workers_back", 0) for f in finals) if plan.uses_servers else None,
        "servers_restarted": list(restarted or []),
        "replicas": plan.replicas if plan.uses_servers else None,
        "copies_ended": list(failed_over or []),  # cluster.replicas = 2: a server or backup that ended, the other went on
        "updates_lost": sum(f.get("updates_lost", 0) for f in finals) if finals else 0,
        "resume_lost_pushes": sum(x.get("lost_pushes", 0) for rows in worker_rows.values() for x in rows
                                  if x.get("kind") == "resumed") if plan.uses_servers else None,
        "wall_s": wall_s,
        # extras
        "status": status,
        "simulated": plan.virtual,
        "final_test_loss": final.get("test_loss") if final else None,
        "final_is_last_eval": bool(final and final.get("final")),
        "evaluations": len(evals),
        "steps_per_worker": plan.total_steps,
        "step_time_ms": {k: v / n_steps for k, v in step_ms.items()} if n_steps else None,
        "step_time_ms_per_worker": per_worker or None,
        "train_samples": total_samples,
    }
    if not plan.uses_servers and allreduced is not None:
        s["bytes_pushed"] = s["bytes_pulled"] = allreduced
    if diverged:
        s["diverged"] = {k: diverged.get(k) for k in ("worker", "step", "epoch")}
    if failure:
        s["failure"] = failure
    return s


def result_line(label, s):
    def pct(v):
        return f"{100 * v:.2f}%" if v is not None else "-"
    sim = " (simulated)" if s.get("simulated") else ""
    if s.get("classification") is False:  # (a regression: its test loss, no accuracy target)
        loss = s.get("final_test_loss")
        parts = [f"[{label}] {s['status']}{sim}: final test loss " + (f"{loss:.4g}" if loss is not None else "-")]
    else:
        parts = [f"[{label}] {s['status']}{sim}: final test acc {pct(s['final_test_acc'])} (best {pct(s['best_test_acc'])})"]
        if s["time_to_target_s"] is not None:
            parts.append(f"{pct(s['target_acc'])} reached at {s['time_to_target_s']:.1f} s, epoch {s['epochs_to_target']:.2f}")
        else:
            parts.append(f"{pct(s['target_acc'])} not reached")
    if s.get("diverged"):
        parts.append(f"training diverged at epoch {s['diverged']['epoch']:.2f} (loss not finite: lower "
                     "optimizer.lr or lengthen schedule.warmup_epochs)")
    if s.get("servers_restarted"):
        parts.append("restarted server " + ", ".join(str(r["server"]) for r in s["servers_restarted"])
                     + f" ({s.get('updates_lost', 0)} updates lost)")
    if s.get("copies_ended"):
        parts.append("shard " + ", ".join(f"{c['shard']} went on without {c['process']}" for c in s["copies_ended"])
                     + f" (cluster.replicas = 2; {s.get('updates_lost', 0)} updates lost)")
    if s.get("resume_lost_pushes"):
        parts.append(f"resumed with {s['resume_lost_pushes']} push(es) sent again empty (a shard's checkpoint was "
                     "behind the others': what it missed is lost)")
    if s.get("pushes_refused"):
        parts.append("refused pushes of worker " + ", ".join(f"{w} ({n})" for w, n in s["pushes_refused"].items())
                     + " (cluster.push_guard)")
    if s.get("reconnects"):
        parts.append(f"{s['reconnects']} connection(s) cut and back")
    if s.get("workers_lost"):
        parts.append("went on without worker " + ", ".join(str(w["worker"]) for w in s["workers_lost"]))
    if s["samples_per_s"]:
        parts.append(f"{s['samples_per_s']:,.0f} samples/s")
    parts.append(f"wall {s['wall_s']:.1f} s")
    return ", ".join(parts)
