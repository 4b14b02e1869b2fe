"""The comparison of the runs of an invocation: comparison.csv, comparison.md, the table printed."""
import csv
import io

from .common import write_file
from .metrics import without_batch
from .summary import COMPLETED


COLUMNS = [("run", "run"), ("mode", "mode"), ("workers", "W"), ("servers", "S"), ("status", "status"),
           ("final_test_acc", "final acc"), ("best_test_acc", "best acc"), ("final_test_loss", "final loss"),
           ("time_to_target_s", "time to target (s)"),
           ("startup_s", "start-up (s)"), ("train_time_to_target_s", "of it training (s)"),
           ("epochs_to_target", "epochs to target"), ("epochs", "epochs"), ("samples_per_s", "samples/s"),
           ("staleness_mean", "staleness mean"), ("staleness_p99", "p99"), ("staleness_max", "max"),
           ("bytes_pushed", "bytes pushed"), ("bytes_pushed_per_sample", "pushed per sample"), ("bytes_pulled", "bytes pulled"),
           ("wall_s", "wall (s)")]


def comparison_rows(results):
    rows = []
    for label, s in results:
        st = s.get("staleness") or {}
        row = dict(s)
        cap = st.get("capped_at")  # (pushes at the servers' last bucket or beyond: bounds, not values)
        row.update({"run": label, "staleness_mean": f"≥{st['mean']:.2f}" if cap else st.get("mean"),
                    "staleness_p99": f"≥{cap}" if cap and st.get("p99") == cap else st.get("p99"),
                    "staleness_max": f"≥{cap}" if cap else st.get("max"),
                    "bytes_pushed_per_sample": s["bytes_pushed"] / s["train_samples"]
                    if s.get("bytes_pushed") and s.get("train_samples") else None})
        rows.append(row)
    return rows


def fmt_cell(key, v):
    if v is None:
        return "-"
    if key in ("final_test_acc", "best_test_acc"):
        return f"{100 * v:.2f}%"
    if key in ("bytes_pushed", "bytes_pulled"):
        return f"{v / 1e6:.1f} MB"
    if key == "bytes_pushed_per_sample":
        return f"{v / 1e3:.1f} kB" if v >= 1000 else f"{v:.0f} B"
    if key == "startup_s":
        v = max(v, 0.0)  # (the first window's start, computed back from its rate: may round below 0)
    if key in ("samples_per_s",):
        return f"{v:,.0f}"
    if key == "final_test_loss":
        return f"{v:.4g}"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


SEED_COLUMNS = [("final_test_acc", "final acc"), ("train_time_to_target_s", "training to target (s)"),
                ("epochs_to_target", "epochs to target"), ("samples_per_s", "samples/s"),
                ("staleness_mean", "staleness mean")]


def without_seed(label):
    """A run's sweep label without its seed: the runs that differ only in the seed share it."""
    parts = [p for p in (label or "run").split(",") if not p.startswith("seed=")]
    return ",".join(parts) or "run"


def completed(rows):
    """The runs that ran to their end (ok or diverged): what the summaries over runs take; a failed
    run's figures (the evaluator's last partial value) are its own row's alone."""
    return [r for r in rows if r.get("status") in COMPLETED]


def seed_table(rows):
    """Where a sweep repeats runs over seeds (seed = [1, 2, 3]): per group, mean ± sd of the
    main columns over its completed seeds (sd: sample standard deviation), with how many failed
    and were left out; None without repeats."""
    groups, failed = {}, {}
    for r in rows:
        groups.setdefault(without_seed(r["run"]), [])
        if r.get("status") in COMPLETED:
            groups[without_seed(r["run"])].append(r)
        else:
            failed[without_seed(r["run"])] = failed.get(without_seed(r["run"]), 0) + 1
    if all(len(g) + failed.get(name, 0) < 2 for name, g in groups.items()):
        return None

    def value(r, key):  # (the row's staleness mean may be text, "≥..." where the histogram capped it)
        return (r.get("staleness") or {}).get("mean") if key == "staleness_mean" else r.get(key)

    def cell(key, rs):
        vals = [value(r, key) for r in rs if value(r, key) is not None]
        if not vals:
            return "-"
        mean = sum(vals) / len(vals)
        sd = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else None
        missing = f" ({len(rs) - len(vals)} of {len(rs)} missing)" if len(vals) < len(rs) else ""

        def spread(fmt):  # (one value: no spread to give, not ± 0)
            return "" if sd is None else " ± " + fmt(sd)
        if key == "final_test_acc":
            return f"{100 * mean:.2f}" + spread(lambda v: f"{100 * v:.2f}") + f"%{missing}"
        if key == "samples_per_s":
            return f"{mean:,.0f}" + spread(lambda v: f"{v:,.0f}") + missing
        capped = "≥" if key == "staleness_mean" and any((r.get("staleness") or {}).get("capped_at") for r in rs) else ""
        return f"{capped}{mean:.2f}" + spread(lambda v: f"{v:.2f}") + missing
    head = "| runs | seeds | " + " | ".join(h for _, h in SEED_COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in range(len(SEED_COLUMNS) + 2)) + "|"
    body = [f"| {name} | {len(rs)}" + (f" ({failed[name]} failed, left out)" if name in failed else "") + " | "
            + " | ".join(cell(k, rs) if rs else "-" for k, _ in SEED_COLUMNS) + " |" for name, rs in groups.items()]
    return "\n".join([head, sep] + body)


def large_batch_table(rows):
    """Where the runs span several global batches (workers x batch x accumulate): final test
    accuracy per method (row) and global batch (column), the mean over seeds; None otherwise."""
    rows = completed(rows)
    batches = sorted({r["global_batch"] for r in rows if r.get("global_batch")})
    if len(batches) < 2:
        return None
    cells = {}
    for r in rows:
        if r.get("global_batch") and r.get("final_test_acc") is not None:
            cells.setdefault(without_batch(r["run"]), {}).setdefault(r["global_batch"], []).append(r["final_test_acc"])
    if not cells:
        return None

    def cell(vals):
        return "-" if not vals else f"{100 * sum(vals) / len(vals):.2f}%"
    head = "| final test acc | " + " | ".join(f"{b:,}" for b in batches) + " |"
    sep = "|" + "|".join("---" for _ in range(len(batches) + 1)) + "|"
    body = [f"| {name} | " + " | ".join(cell(by.get(b, [])) for b in batches) + " |" for name, by in cells.items()]
    return "\n".join([head, sep] + body)


def target_notes(rows, target):
    """Which completed run reached its target accuracy first (wall clock, epochs), and which did
    not; per target where the runs' targets differ (a sweep over eval.target_acc)."""
    by_target = {}
    for r in completed(rows):
        if r.get("classification") is False:  # (a regression: no accuracy to reach)
            continue
        by_target.setdefault(r.get("target_acc") or target, []).append(r)
    notes = []
    for goal, rs in sorted(by_target.items()):
        # (simulated times, of virtual-cluster runs, are compared with each other only)
        for clock in ("wall-clock", "simulated"):
            ok = [r for r in rs if r.get("time_to_target_s") is not None and bool(r.get("simulated")) == (clock == "simulated")]
            if ok:
                t = min(ok, key=lambda r: r["time_to_target_s"])
                e = min(ok, key=lambda r: r["epochs_to_target"])
                notes.append(f"First to {100 * goal:.0f}% test accuracy in {clock} time: **{t['run']}** "
                             f"({t['time_to_target_s']:.1f} s); in epochs: **{e['run']}** ({e['epochs_to_target']:.2f}).")
        missed = [r["run"] for r in rs if r.get("time_to_target_s") is None]
        if missed:
            notes.append(f"Did not reach {100 * goal:.0f}%: {', '.join(missed)}.")
    return notes


def write_comparison(inv_dir, results, target):
    rows = comparison_rows(results)
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow([k for k, _ in COLUMNS])
    for r in rows:
        w.writerow(["" if r.get(k) is None else r.get(k) for k, _ in COLUMNS])
    write_file(inv_dir / "comparison.csv", out.getvalue())
    head = "| " + " | ".join(h for _, h in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [head, sep] + ["| " + " | ".join(fmt_cell(k, r.get(k)) for k, _ in COLUMNS) + " |" for r in rows]
    table = "\n".join(lines)
    over_seeds = seed_table(rows)
    if over_seeds:
        table += "\n\nOver seeds (mean ± sd):\n\n" + over_seeds
    by_batch = large_batch_table(rows)
    if by_batch:
        table += "\n\nBy global batch (workers x batch x accumulate):\n\n" + by_batch
    notes = target_notes(rows, target)
    failed = [f"{r['run']} ({r.get('status')})" for r in rows if r.get("status") not in COMPLETED]
    if failed:
        notes.append(f"Did not run to the end, left out of the summaries above and of the plots: {', '.join(failed)}.")
    simulated = any(r.get("simulated") for r in rows)
    md = [f"# {inv_dir.parent.name} / {inv_dir.name}", "",
          "Times are seconds from each run's start" + (" (simulated: the virtual cluster's; wall (s) is real)" if simulated
                                                       else "") + "; samples/s counts all workers together; staleness "
          "(PS modes) is in versions of the shard; bytes as counted by the servers.", "", table, ""]
    md += [n for n in notes] + ([""] if notes else [])
    for png in ("convergence", "seeds", "bytes", "large_batch", "throughput", "step_time", "staleness"):
        if (inv_dir / "plots" / f"{png}.png").exists():
            md += [f"![{png}](plots/{png}.png)", ""]
    write_file(inv_dir / "comparison.md", "\n".join(md))
    return table, notes
