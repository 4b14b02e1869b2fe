"""The comparison of the runs of an invocation: comparison.csv, comparison.md, the table printed."""
import csv


COLUMNS = [("run", "run"), ("mode", "mode"), ("workers", "W"), ("servers", "S"), ("status", "status"),
           ("final_test_acc", "final acc"), ("best_test_acc", "best acc"), ("time_to_target_s", "time to target (s)"),
           ("epochs_to_target", "epochs to target"), ("epochs", "epochs"), ("samples_per_s", "samples/s"),
           ("staleness_mean", "staleness mean"), ("staleness_p99", "p99"), ("staleness_max", "max"),
           ("bytes_pushed", "bytes pushed"), ("bytes_pushed_per_sample", "pushed per sample"), ("bytes_pulled", "bytes pulled"),
           ("wall_s", "wall (s)")]


def comparison_rows(results):
    rows = []
    for label, s in results:
        st = s.get("staleness") or {}
        row = dict(s)
        row.update({"run": label, "staleness_mean": st.get("mean"), "staleness_p99": st.get("p99"),
                    "staleness_max": st.get("max"),
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
        return f"{v / 1e3:.1f} kB"
    if key in ("samples_per_s",):
        return f"{v:,.0f}"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def write_comparison(inv_dir, results, target):
    rows = comparison_rows(results)
    with open(inv_dir / "comparison.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([k for k, _ in COLUMNS])
        for r in rows:
            w.writerow(["" if r.get(k) is None else r.get(k) for k, _ in COLUMNS])
    head = "| " + " | ".join(h for _, h in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [head, sep] + ["| " + " | ".join(fmt_cell(k, r.get(k)) for k, _ in COLUMNS) + " |" for r in rows]
    table = "\n".join(lines)
    ok = [r for r in rows if r.get("time_to_target_s") is not None]
    notes = []
    if ok:
        t = min(ok, key=lambda r: r["time_to_target_s"])
        e = min(ok, key=lambda r: r["epochs_to_target"])
        notes.append(f"First to {100 * target:.0f}% test accuracy in wall-clock time: **{t['run']}** "
                     f"({t['time_to_target_s']:.1f} s); in epochs: **{e['run']}** ({e['epochs_to_target']:.2f}).")
    missed = [r["run"] for r in rows if r.get("time_to_target_s") is None]
    if missed:
        notes.append(f"Did not reach {100 * target:.0f}%: {', '.join(missed)}.")
    md = [f"# {inv_dir.parent.name} / {inv_dir.name}", "",
          "Times are seconds from each run's start; samples/s counts all workers together; staleness "
          "(PS modes) is in versions of the shard; bytes as counted by the servers.", "", table, ""]
    md += [n for n in notes] + ([""] if notes else [])
    for png in ("convergence", "bytes", "throughput", "step_time", "staleness"):
        if (inv_dir / "plots" / f"{png}.png").exists():
            md += [f"![{png}](plots/{png}.png)", ""]
    (inv_dir / "comparison.md").write_text("\n".join(md))
    return table, notes
