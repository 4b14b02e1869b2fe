#!/usr/bin/python3
"""Plots of pslab runs, one run or several overlaid (the runs of a sweep).

    plot.py RUN_DIR [RUN_DIR ...] [--out DIR]

Reads each RUN_DIR's config.toml, plan.json (runs before it existed: config.toml alone),
metrics/*.jsonl (and manifest.json for its sweep label) and writes into --out (default:
RUN_DIR/plots for one run, ./plots for several):

  convergence.png  test accuracy and training loss vs wall-clock time and vs epochs (2x2);
                   dashed line: target accuracy (eval.target_acc); dot: where a run first reaches it
  seeds.png        when runs repeat over seeds (seed = [1, 2, 3]): test accuracy against epochs and
                   against time since each run's first step (start-ups differ from seed to seed),
                   per run without its seed, as the mean over the seeds with a band from the
                   lowest to the highest
  bytes.png        test accuracy against the bytes pushed so far (the servers' count over the
                   run, spread over its evaluations by the samples applied): what each codec or
                   mode pays on the wire for its accuracy (only when the runs pushed bytes)
  large_batch.png  when the runs span several global batches (workers x batch x train.accumulate;
                   the large-batch study): final test accuracy against the global batch, one
                   line per method (the sweep label without batch, accumulate, workers, seed;
                   the mean over seeds), as in Goyal et al. 2017
  throughput.png   samples/s of every worker over time, one panel per run
  step_time.png    mean time per step of every worker, stacked: compute, communication
                   (comm minus wait), waiting for consistency (wait), injected straggler delay
  staleness.png    staleness of the applied updates (PS runs only; skipped when there is none);
                   mean, p99, max and pushes as in summary.json (launcher.metrics.staleness_stats)
  scaling.png      when the runs have 3 or more worker counts (the virtual cluster's scaling
                   study): mean staleness, final test accuracy and samples/s against the number of
                   workers, one line per mode (--only scaling: this plot alone)

Runs are named by their consistency mode (bsp, ssp:2, ...) when the modes differ, else by
their sweep label. Epochs on the x axes are passes over the training set by all workers
together (evaluator: samples applied; training loss: the mean of the workers' own epochs).
"""
import argparse
import json
import pathlib
import sys
import tomllib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from launcher.metrics import (STALENESS_CAP, read_jsonl, staleness_by_worker, staleness_stats,  # noqa: E402  (stdlib only)
                              whole_shards, without_batch)

COMPONENTS = [  # (train-line key, legend, colour)
    ("compute_ms", "compute (forward + backward)", "#4C72B0"),
    ("comm_ms", "communication (push / pull; all-reduce: incl. waiting for the slowest)", "#55A868"),
    ("wait_ms", "waiting for consistency (pull held)", "#C44E52"),
    ("delay_ms", "injected straggler delay", "#8C8C8C"),
]


class Run:
    def __init__(self, path):
        self.dir = pathlib.Path(path)
        metrics = self.dir / "metrics"
        if not metrics.is_dir():
            sys.exit(f"plot.py: {self.dir} is not a run directory (no metrics/)")
        self.cfg = {}
        if (self.dir / "config.toml").exists():
            with open(self.dir / "config.toml", "rb") as f:
                self.cfg = tomllib.load(f)
        plan = None  # the binary's plan of the run; older runs have none
        if (self.dir / "plan.json").exists():
            plan = json.loads((self.dir / "plan.json").read_text())
        manifest = {}
        if (self.dir / "manifest.json").exists():
            manifest = json.loads((self.dir / "manifest.json").read_text())
        self.summary = {}
        if (self.dir / "summary.json").exists():
            self.summary = json.loads((self.dir / "summary.json").read_text())
        cl = self.cfg.get("cluster", {})
        self.mode = cl.get("mode", "?")
        if plan:
            self.uses_servers, self.classification = plan["uses_servers"], plan["data"]["classification"]
        else:
            self.uses_servers = self.mode != "allreduce"
            self.classification = self.cfg.get("data", {}).get("kind") != "least-squares"
        self.sweep_label = manifest.get("label") or self.dir.name
        self.target = self.cfg.get("eval", {}).get("target_acc")
        self.stragglers = set(self.cfg.get("straggler", {}).get("workers", [])) \
            if self.cfg.get("straggler", {}).get("slowdown", 1.0) > 1.0 else set()
        self.train, self.evals, self.finals = {}, [], []
        self.first_step_t = None  # when the first worker began its first step (runs before "start" lines: None)
        for f in sorted(metrics.glob("*.jsonl")):
            for r in read_jsonl(f):
                kind = r.get("kind")
                if kind == "train":
                    self.train.setdefault(r["worker"], []).append(r)
                elif kind == "eval":
                    self.evals.append(r)
                elif kind == "server_final":
                    self.finals.append(r)
                elif kind == "start":
                    self.first_step_t = min(r["t"], self.first_step_t if self.first_step_t is not None else r["t"])
        for rows in self.train.values():
            rows.sort(key=lambda r: r["t"])
        self.evals.sort(key=lambda r: r["t"])
        self.label = self.mode

    def loss_curve(self):
        """(t, global epoch, training loss): at every time a worker logged, the mean over the
        workers training then of each one's loss interpolated in time; the global epoch is the
        mean of the workers' own epochs (passes over their shards)."""
        workers = [rs for rs in self.train.values() if rs]
        if not workers:
            return None
        t = np.unique(np.concatenate([[r["t"] for r in rs] for rs in workers]))
        total, count, ep = np.zeros_like(t), np.zeros_like(t), np.zeros_like(t)
        for rs in workers:
            wt = np.array([r["t"] for r in rs])
            wl = np.array([r["loss"] if r.get("loss") is not None else np.nan for r in rs], dtype=float)
            covered = (t >= wt[0]) & (t <= wt[-1])
            total[covered] += np.interp(t[covered], wt, wl)
            count[covered] += 1
            ep += np.interp(t, np.concatenate([[0.0], wt]), np.concatenate([[0.0], [r["epoch"] for r in rs]]))
        keep = count > 0
        return t[keep], (ep / len(workers))[keep], (total / np.maximum(count, 1))[keep]

    def first_hit(self):
        if self.target is None:
            return None
        return next((e for e in self.evals if e.get("test_acc", -1) >= self.target), None)

    def step_means(self):
        """{worker: {component: mean ms per step}} weighted by the steps of each window."""
        out = {}
        for w, rows in sorted(self.train.items()):
            prev, sums, n = 0, {k: 0.0 for k, _, _ in COMPONENTS}, 0
            for r in rows:
                steps = r["step"] - prev
                prev = r["step"]
                n += steps
                for k, _, _ in COMPONENTS:
                    sums[k] += r.get(k, 0.0) * steps
            if n:
                out[w] = {k: v / n for k, v in sums.items()}
        return out

    def staleness(self):
        """{worker: counts per staleness} merged over the servers, or None."""
        hist = staleness_by_worker(whole_shards(self.finals))
        return hist if any(sum(c) for c in hist.values()) else None


def name_runs(runs):
    modes = [r.mode for r in runs]
    if len(set(modes)) == len(modes):
        for r in runs:
            r.label = r.mode
    else:
        for r in runs:
            r.label = r.sweep_label.replace("variant=", "")


def describe(runs):
    """One line naming what every run shares: data, model, workers, batch, optimizer, straggler."""
    c = runs[0].cfg
    if not c:
        return ""
    m, d, tr, o, cl, st, sc = c["model"], c["data"], c["train"], c["optimizer"], c["cluster"], c["straggler"], c["schedule"]
    image = d["kind"] == "fashion-mnist"
    n_in, n_out = (784, 10) if image else (d["dim"], d["outputs"])
    if m["kind"] == "mlp":
        arch = "MLP " + "-".join(str(x) for x in [n_in, *m["hidden"], n_out])
    elif m["kind"] == "linear":
        arch = f"linear {n_in}->{n_out}"
    else:
        arch = "CNN " + "-".join(str(x) for x in m["conv_channels"])
    lr = f"{o['kind'].upper() if o['kind'] == 'sgd' else o['kind']} lr {o['lr']:g}"
    if sc.get("scale_lr"):
        lr += f" x (update batch / {sc['base_batch']})"
    if sc.get("kind", "constant") != "constant":
        lr += f", {sc['kind']}"
    if sc.get("warmup_epochs", 0) > 0:
        lr += f", warmup {sc['warmup_epochs']:g} ep"
    parts = [{"fashion-mnist": "Fashion-MNIST"}.get(d["kind"], d["kind"]), arch,
             f"{cl['workers']} workers x batch {tr['batch']}", lr]
    if st["workers"] and st["slowdown"] > 1:
        parts.append(f"straggler: worker {','.join(map(str, st['workers']))} computes {st['slowdown']:g}x slower")
    if st.get("delay_ms", 0) > 0:
        parts.append(f"+{st['delay_ms']:g} ms per step")
    return ", ".join(parts)


def colours(runs):
    cmap = plt.get_cmap("tab10")
    return {id(r): cmap(i % 10) for i, r in enumerate(runs)}


def save(fig, out, name):
    path = out / name
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot.py: wrote {path}")


def plot_convergence(runs, out):
    col = colours(runs)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (a_t, a_e), (l_t, l_e) = axes
    accs = []
    for r in runs:
        ev = [e for e in r.evals if "test_acc" in e]
        c = col[id(r)]
        if ev:
            t = [e["t"] for e in ev]
            ep = [e["epoch"] for e in ev]
            acc = [100 * e["test_acc"] for e in ev]
            accs += acc
            kw = dict(color=c, lw=1.8, marker="o", ms=2.5, label=r.label)
            a_t.plot(t, acc, **kw)
            a_e.plot(ep, acc, **kw)
            hit = r.first_hit()
            if hit:
                a_t.plot(hit["t"], 100 * hit["test_acc"], "o", color=c, ms=9, mec="black", zorder=5)
                a_e.plot(hit["epoch"], 100 * hit["test_acc"], "o", color=c, ms=9, mec="black", zorder=5)
        lc = r.loss_curve()
        if lc is not None:
            t, ep, loss = lc
            l_t.plot(t, loss, color=c, lw=1.4, label=r.label)
            l_e.plot(ep, loss, color=c, lw=1.4, label=r.label)
    targets = {r.target for r in runs if r.target is not None}
    for ax in (a_t, a_e):
        for tgt in targets:
            ax.axhline(100 * tgt, ls="--", color="black", lw=1, alpha=0.7, label=f"target {100 * tgt:g}%")
        if accs:
            lo = min(np.percentile(accs, 10), 100 * min(targets) - 25 if targets else 100)
            ax.set_ylim(max(0.0, lo), min(100.0, max(accs) + 0.15 * (max(accs) - max(0.0, lo)) + 0.5))
        ax.set_ylabel("test accuracy (%)")
    a_t.set_title("test accuracy vs time (dot: first at target)")
    a_e.set_title("test accuracy vs epochs")
    l_t.set_title("training loss vs time (mean over workers)")
    l_e.set_title("training loss vs epochs")
    for ax in (l_t, l_e):
        ax.set_ylabel("training loss (cross-entropy)" if runs[0].classification else "training loss (MSE)")
        lines = [ln for ln in ax.get_lines() if len(ln.get_ydata())]
        ys = np.concatenate([ln.get_ydata() for ln in lines]) if lines else np.array([])
        if len(ys) and ys.min() > 0 and ys.max() / ys.min() > 20:
            ax.set_yscale("log")
    for ax in (a_t, l_t):
        ax.set_xlabel("wall-clock time since run start (s)")
    for ax in (a_e, l_e):
        ax.set_xlabel("epochs (passes over the training set, all workers)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
        if ax.get_lines():
            ax.legend(fontsize=9, loc="lower right" if ax in (a_t, a_e) else "upper right")
    fig.suptitle(describe(runs), fontsize=11)
    fig.tight_layout()
    save(fig, out, "convergence.png")


def plot_seeds(runs, out):
    """seeds.png: mean and min-max band over the seeds of each group of runs (label without seed)."""
    groups = {}
    for r in runs:
        key = ",".join(p for p in r.sweep_label.split(",") if not p.startswith("seed=")) or r.mode
        groups.setdefault(key.replace("variant=", ""), []).append(r)
    groups = {k: g for k, g in groups.items() if len(g) >= 2}
    if not groups:
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    cmap = plt.get_cmap("tab10")
    for i, (name, rs) in enumerate(sorted(groups.items())):
        curves = [[(e["epoch"], e["t"] - (r.first_step_t or 0.0), 100 * e["test_acc"]) for e in r.evals if "test_acc" in e]
                  for r in rs]
        curves = [c for c in curves if len(c) >= 2]
        if len(curves) < 2:
            continue
        for ax, x_of in ((axes[0], 0), (axes[1], 1)):
            end = min(c[-1][x_of] for c in curves)  # the span every seed covers
            grid = np.linspace(0.0, end, 60)
            ys = np.array([np.interp(grid, [p[x_of] for p in c], [p[2] for p in c]) for c in curves])
            ax.plot(grid, ys.mean(axis=0), color=cmap(i % 10), lw=1.8, label=f"{name} ({len(curves)} seeds)")
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=cmap(i % 10), alpha=0.2)
    for ax, xl in ((axes[0], "epochs (passes over the training set, all workers)"),
                   (axes[1], "wall-clock time since the run's first step (s)")):
        ax.set_xlabel(xl)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9, loc="lower right")
    axes[0].set_title("test accuracy vs epochs: mean over seeds, band: lowest to highest")
    axes[1].set_title("test accuracy vs time: mean over seeds, band: lowest to highest")
    fig.tight_layout()
    save(fig, out, "seeds.png")


def plot_bytes(runs, out):
    """bytes.png: test accuracy against bytes pushed, one line per run (runs with servers' counts);
    runs repeated over seeds: one line per group, the mean over its seeds (bytes and accuracy
    at each evaluation epoch)."""
    groups = {}
    for r in runs:
        pushed = sum(f.get("bytes_in", 0) for f in r.finals if f.get("replica") != "backup")  # (as summary.json)
        applied = max((e.get("epoch") or 0.0 for e in r.evals), default=0.0)
        acc = [(e["epoch"], e["test_acc"]) for e in r.evals if "test_acc" in e and e.get("epoch") is not None]
        if pushed and applied > 0 and acc:
            key = ",".join(p for p in r.sweep_label.split(",") if not p.startswith("seed=")) or r.label
            groups.setdefault(key, []).append((r, [(ep / applied * pushed, ep, a) for ep, a in acc]))
    if not groups:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colour = colours(runs)
    for name, members in groups.items():
        r = members[0][0]
        if len(members) == 1:
            pts, label = [(b, a) for b, _, a in members[0][1]], r.label
        else:  # the mean over the seeds, on the epochs every seed covers
            end = min(p[-1][1] for _, p in members)
            grid_ep = np.linspace(0.0, end, 40)
            b = np.mean([np.interp(grid_ep, [x[1] for x in p], [x[0] for x in p]) for _, p in members], axis=0)
            a = np.mean([np.interp(grid_ep, [x[1] for x in p], [x[2] for x in p]) for _, p in members], axis=0)
            pts, label = list(zip(b, a)), f"{name.removeprefix('variant=')} ({len(members)} seeds)"
        pts = [(x, y) for x, y in pts if x > 0]
        ax.plot([x / 1e6 for x, _ in pts], [100 * y for _, y in pts], marker="o", markersize=3, label=label,
                color=colour[id(r)])
    ax.set_xscale("log")
    ax.set_xlabel("bytes pushed so far (MB, all workers; log scale)")
    ax.set_ylabel("test accuracy (%)")
    first = next(iter(groups.values()))[0][0]
    if first.target is not None:
        ax.axhline(100 * first.target, color="grey", linestyle="--", linewidth=0.8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("accuracy against bytes on the wire (pushes)", fontsize=11)
    fig.tight_layout()
    save(fig, out, "bytes.png")


def plot_large_batch(runs, out):
    """large_batch.png: final test accuracy against the global batch (log 2), one line per method."""
    lines = {}
    for r in runs:
        gb, acc = r.summary.get("global_batch"), r.summary.get("final_test_acc")
        if gb and acc is not None:
            lines.setdefault(without_batch(r.sweep_label), {}).setdefault(gb, []).append(acc)
    if len({gb for by in lines.values() for gb in by}) < 2:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (name, by) in enumerate(lines.items()):
        xs = sorted(by)
        ax.plot(xs, [100 * sum(by[x]) / len(by[x]) for x in xs], marker="o", label=name, color=plt.cm.tab10(i % 10))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({gb for by in lines.values() for gb in by}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("global batch (workers x batch x accumulate)")
    ax.set_ylabel("final test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    shared = describe(runs).split(", ")[:2]  # data and model (the variants differ in the rest)
    epochs = runs[0].cfg.get("train", {}).get("epochs")
    ax.set_title(", ".join(shared + ([f"{epochs:g} epochs"] if epochs else [])) + ": final accuracy against the global batch",
                 fontsize=9)
    fig.tight_layout()
    save(fig, out, "large_batch.png")


def grid(n):
    cols = min(n, 2) if n <= 4 else 3
    rows = (n + cols - 1) // cols
    return rows, cols


def plot_throughput(runs, out):
    runs = [r for r in runs if r.train]
    if not runs:
        return
    nr, nc = grid(len(runs))
    fig, axes = plt.subplots(nr, nc, figsize=(6.5 * nc, 3.8 * nr), squeeze=False, sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, r in zip(axes.flat, runs):
        W = max(r.train) + 1
        for w, rows in sorted(r.train.items()):
            straggler = w in r.stragglers
            ax.plot([x["t"] for x in rows], [x["samples_per_s"] for x in rows], lw=1.3,
                    color="#C44E52" if straggler else cmap(w / max(1, W)),
                    label=f"worker {w}" + (" (straggler)" if straggler else ""))
        rate = r.summary.get("samples_per_s")
        ax.set_title(f"{r.label}: {rate:,.0f} samples/s, all workers over the run" if rate else r.label, fontsize=10)
        ax.set_xlabel("wall-clock time since run start (s)")
        ax.set_ylabel("samples/s per worker")
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    # one y scale for all panels; a single window's spike (e.g. the last, short one) may be cut
    rates = np.array([x["samples_per_s"] for r in runs for rows in r.train.values() for x in rows])
    axes.flat[0].set_ylim(0, 1.1 * float(np.percentile(rates, 99)) if len(rates) else 1)
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    fig.suptitle("throughput per worker over time (one point per train.log_every steps)", fontsize=11)
    fig.tight_layout()
    save(fig, out, "throughput.png")


def plot_step_time(runs, out):
    data = [(r, r.step_means()) for r in runs]
    data = [(r, m) for r, m in data if m]
    if not data:
        return
    width = 0.8
    fig, ax = plt.subplots(figsize=(max(7.0, 1.0 + 0.55 * sum(len(m) + 1 for _, m in data)), 5.5))
    x0, ticks, ticklabels, tops = 0.0, [], [], []
    for r, means in data:
        xs = []
        for w, m in means.items():
            x = x0 + len(xs)
            xs.append(x)
            parts = [m["compute_ms"], max(0.0, m["comm_ms"] - m["wait_ms"]), m["wait_ms"], m["delay_ms"]]
            bottom = 0.0
            for (key, legend, colour), v in zip(COMPONENTS, parts):
                ax.bar(x, v, width, bottom=bottom, color=colour, label=legend if x0 == 0 and w == min(means) else None,
                       edgecolor="white", lw=0.5)
                bottom += v
            tops.append(bottom)
            ax.text(x, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=7)
            ticks.append(x)
            ticklabels.append(f"w{w}" + ("*" if w in r.stragglers else ""))
        ax.annotate(r.label, xy=((xs[0] + xs[-1]) / 2, 0), xycoords=("data", "axes fraction"), xytext=(0, -26),
                    textcoords="offset points", ha="center", va="top", fontsize=10, fontweight="bold")
        x0 += len(xs) + 1
    ax.set_xticks(ticks, ticklabels, fontsize=8)
    ax.set_ylabel("mean time per step (ms)")
    ax.set_ylim(0, max(tops) * 1.12 if tops else 1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    any_straggler = any(r.stragglers for r in runs)
    ax.set_title("where a step's time goes, per worker" + (" (* = straggler)" if any_straggler else ""), fontsize=11)
    fig.tight_layout()
    save(fig, out, "step_time.png")


def plot_staleness(runs, out):
    data = [(r, r.staleness()) for r in runs if r.uses_servers]
    data = [(r, h) for r, h in data if h]
    if not data:
        return
    nr, nc = grid(len(data))
    fig, axes = plt.subplots(nr, nc, figsize=(6.0 * nc, 3.8 * nr), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, (r, hist) in zip(axes.flat, data):
        smax = max(len(c) for c in hist.values())
        total = sum(sum(c) for c in hist.values())
        bottom = np.zeros(smax)
        W = max(hist) + 1
        for w, counts in sorted(hist.items()):
            v = np.zeros(smax)
            v[:len(counts)] = counts
            straggler = w in r.stragglers
            ax.bar(np.arange(smax), 100 * v / total, bottom=100 * bottom / total, width=0.85,
                   color="#C44E52" if straggler else cmap(w / max(1, W)),
                   label=f"worker {w}" + (" (straggler)" if straggler else ""))
            bottom += v
        st = staleness_stats(r.finals)
        cap = st.get("capped_at")  # (the servers count every staleness from it on as it: bounds)
        at_least = "≥" if cap else ""
        ax.set_title(f"{r.label}: mean {at_least}{st['mean']:.2f}, p99 {'≥' if cap and st['p99'] == cap else ''}{st['p99']}, "
                     f"max {at_least}{st['max']} ({st['count']:,} pushes)", fontsize=10)
        ax.set_xlabel("staleness of an applied update (shard versions behind)")
        ax.set_ylabel("% of all applied updates")
        ax.set_xlim(-0.6, max(smax, 3) - 0.4)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    fig.suptitle("staleness histograms (all servers), stacked by the worker that pushed", fontsize=11)
    fig.tight_layout()
    save(fig, out, "staleness.png")


def plot_scaling(run_dirs, out):
    """scaling.png from the runs' summary.json (one point per run): x = workers (log scale)."""
    points = {}
    for d in run_dirs:
        try:
            s = json.loads((pathlib.Path(d) / "summary.json").read_text())
        except (OSError, ValueError):
            continue
        if s.get("status") in ("ok", "diverged"):  # (a failed run's figures are partial)
            points.setdefault(s["mode"], []).append(s)
    if len({s["workers"] for ss in points.values() for s in ss}) < 3:
        return
    sim = any(s.get("simulated") for ss in points.values() for s in ss)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = [("mean staleness (shard versions behind)", lambda s: (s.get("staleness") or {}).get("mean"), "symlog"),
              ("final test accuracy (%)", lambda s: 100 * s["final_test_acc"] if s.get("final_test_acc") is not None else None, "linear"),
              ("samples/s" + (" (simulated)" if sim else ""), lambda s: s.get("samples_per_s"), "log")]
    colour = {m: plt.cm.tab10(i) for i, m in enumerate(sorted(points))}
    for ax, (title, value, scale) in zip(axes, panels):
        for mode, ss in sorted(points.items()):
            ss = sorted(ss, key=lambda s: s["workers"])
            xy = [(s["workers"], value(s)) for s in ss if value(s) is not None]
            if xy:  # bsp and allreduce coincide in accuracy: the same updates; dashed lines show both
                ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=mode, color=colour[mode],
                        linestyle="--" if mode == "allreduce" else "-")
            capped = [(s["workers"], value(s)) for s in ss if scale == "symlog" and (s.get("staleness") or {}).get("capped_at")]
            if capped:  # a lower bound: pushes past the servers' last histogram bucket count as it
                ax.scatter([x for x, _ in capped], [y for _, y in capped], s=140, facecolors="none", edgecolors="black",
                           zorder=5, label=f"{mode}: at least (staleness past {STALENESS_CAP} counted as {STALENESS_CAP})")
        ax.set_xscale("log", base=2)
        ax.set_yscale(scale)
        if scale == "symlog":
            ax.set_ylim(bottom=0)
        ax.set_xlabel("workers")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    servers = sorted({(s["workers"], s["servers"]) for ss in points.values() for s in ss if s["servers"]})
    fig.suptitle(("virtual cluster: " if sim else "") + "the modes against the number of workers (servers: " +
                 ", ".join(f"{w}->{k}" for w, k in servers) + ")", fontsize=11)
    fig.tight_layout()
    save(fig, out, "scaling.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (each with metrics/ and config.toml)")
    ap.add_argument("--out", help="where to write the PNGs (default: RUN_DIR/plots for one run, ./plots for several)")
    ap.add_argument("--only", choices=["scaling"], help="draw this plot alone")
    a = ap.parse_args()
    out = pathlib.Path(a.out) if a.out else (pathlib.Path(a.runs[0]) / "plots" if len(a.runs) == 1 else pathlib.Path("plots"))
    out.mkdir(parents=True, exist_ok=True)
    plot_scaling(a.runs, out)
    if a.only:
        return
    runs = [Run(r) for r in a.runs]
    name_runs(runs)
    plot_convergence(runs, out)
    plot_seeds(runs, out)
    plot_bytes(runs, out)
    plot_large_batch(runs, out)
    plot_throughput(runs, out)
    plot_step_time(runs, out)
    plot_staleness(runs, out)


if __name__ == "__main__":
    main()
