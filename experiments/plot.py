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

Runs are named by their sweep label (a variant by its name; a run of no sweep, or of a sweep
of the mode alone, by its mode); runs of other invocations that read alike also name their
invocation (runs/<name>/<stamp>). Runs are one experiment when their configs agree but for the
seed (and, for large_batch.png and scaling.png, the keys that set the global batch or the worker
and server counts) and the code is the same commit: such runs share a colour, each seed its line
style, and seeds.png, bytes.png, large_batch.png and scaling.png take their mean over the seeds.
Epochs on the x axes are passes over the training set by all workers together (evaluator:
samples applied; training loss: the mean of the workers' own epochs). Time is wall-clock, or
simulated for the virtual cluster's runs. A resumed run's evaluations go back to its
checkpoint's epoch: seeds.png and bytes.png take the path of its last life. A diverged run, or
one that ends below the accuracy axis, says so in the legend. Regression runs (no accuracy)
plot the test loss instead.
"""
import argparse
import collections
import copy
import json
import pathlib
import sys
import tomllib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from launcher.metrics import (STALENESS_CAP, last_life, read_jsonl, staleness_by_worker, staleness_stats,  # noqa: E402  (stdlib only)
                              whole_shards)
from launcher.summary import training_windows  # noqa: E402  (stdlib only)

# The keys that set the global batch (besides the seed) and the cluster's size: what the runs of
# one experiment differ in across large_batch.png and scaling.png.
GLOBAL_BATCH_KEYS = ("train.batch", "train.accumulate", "cluster.workers")
SIZE_KEYS = ("cluster.workers", "cluster.servers")
LINE_STYLES = ("-", "--", ":", "-.")

COMPONENTS = [  # (train-line key, legend, colour)
    ("compute_ms", "compute (forward + backward)", "#4C72B0"),
    ("comm_ms", "communication (push / pull; all-reduce: incl. waiting for the slowest)", "#55A868"),
    ("wait_ms", "waiting for consistency (pull held)", "#C44E52"),
    ("delay_ms", "injected straggler delay", "#8C8C8C"),
]


def read_run(d):
    """(config, plan or None, manifest, summary) of run directory d: what it holds of each (runs
    from before plan.json: None; a file missing or cut short: empty)."""
    def load(name, parse):
        try:
            return parse((d / name).read_bytes())
        except (OSError, ValueError):
            return None
    cfg = load("config.toml", lambda b: tomllib.loads(b.decode())) or {}
    return cfg, load("plan.json", json.loads), load("manifest.json", json.loads) or {}, load("summary.json", json.loads) or {}


def experiment_key(d, cfg, manifest, varying=()):
    """What runs of one experiment share: the config but for its name, seed and `varying` (dotted
    keys), and the commit that ran it. A run without config.toml is an experiment of its own."""
    if not cfg:
        return str(d.resolve())
    c = copy.deepcopy(cfg)
    for key in ("name", "seed", *varying):
        *sections, leaf = key.split(".")
        table = c
        for section in sections:
            table = table.get(section, {})
        table.pop(leaf, None)
    return json.dumps([c, manifest.get("git", {}).get("revision")], sort_keys=True, default=str)


def display_name(label, mode, drop=()):
    """A sweep label (seed=1,mode=asp) without the keys in `drop` (as labels name them: the key's
    last part for seed, GLOBAL_BATCH_KEYS and SIZE_KEYS), a variant by its name; the mode where nothing
    else is left."""
    drop = {k.split(".")[-1] for k in drop}
    parts = [p.removeprefix("variant=") for p in (label or "").split(",") if p and p.partition("=")[0] not in drop]
    return mode if parts in ([], [f"mode={mode}"]) else ",".join(parts)


def invocation(d):
    """The invocation a run directory is of: runs/<name>/<stamp>/<label> -> <name>/<stamp>."""
    d = pathlib.Path(d).resolve()
    return f"{d.parent.parent.name}/{d.parent.name}"


def named_groups(members, varying=()):
    """[(name, [member])] of the members (each with .dir, .cfg, .manifest, .label_text, .mode), one
    per experiment (experiment_key, and the same display_name: two variants alike in their
    config stay apart), in first-seen order; named by display_name, and where two read alike, by
    their invocation too."""
    groups = {}
    for m in members:
        name = display_name(m.label_text, m.mode, ("seed", *varying))
        groups.setdefault((name, experiment_key(m.dir, m.cfg, m.manifest, varying)), (name, []))[1].append(m)
    named = list(groups.values())
    alike = collections.Counter(n for n, _ in named)
    return [(f"{n} ({invocation(g[0].dir)})" if alike[n] > 1 else n, g) for n, g in named]


def seeds_text(group):
    """'(3 seeds)', or '(3 runs)' where a seed repeats (the same run twice)."""
    seeds = {m.cfg.get("seed") for m in group}
    return f"({len(group)} seeds)" if len(seeds) == len(group) else f"({len(group)} runs)"


class Run:
    def __init__(self, path):
        self.dir = pathlib.Path(path)
        metrics = self.dir / "metrics"
        if not metrics.is_dir():
            sys.exit(f"plot.py: {self.dir} is not a run directory (no metrics/)")
        self.cfg, plan, self.manifest, self.summary = read_run(self.dir)
        cl = self.cfg.get("cluster", {})
        self.mode = cl.get("mode", "?")
        if plan:
            self.uses_servers, self.classification = plan["uses_servers"], plan["data"]["classification"]
        else:
            self.uses_servers = self.mode != "allreduce"
            self.classification = self.cfg.get("data", {}).get("kind") != "least-squares"
        self.params = (plan or {}).get("params")
        self.label_text = self.manifest.get("label") or ""  # the sweep label ("" without a sweep)
        self.simulated = bool(self.summary.get("simulated"))
        self.target = self.cfg.get("eval", {}).get("target_acc")
        self.stragglers = set(self.cfg.get("straggler", {}).get("workers", [])) \
            if self.cfg.get("straggler", {}).get("slowdown", 1.0) > 1.0 else set()
        self.train, self.evals, self.finals = {}, [], []
        self.worker_rows = {}  # worker -> its "start" and "train" lines, in the file's order
        self.first_step_t = None  # when the first worker began its first step (runs before "start" lines: None)
        for f in sorted(metrics.glob("*.jsonl")):
            for r in read_jsonl(f):
                kind = r.get("kind")
                if kind == "train":
                    self.train.setdefault(r["worker"], []).append(r)
                    self.worker_rows.setdefault(r["worker"], []).append(r)
                elif kind == "eval":
                    self.evals.append(r)
                elif kind == "server_final":
                    self.finals.append(r)
                elif kind == "start":
                    self.worker_rows.setdefault(r.get("worker"), []).append(r)
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
        """{worker: {component: mean ms per step}}, each life of a resumed run apart (as summary.json)."""
        per_worker = training_windows(self.worker_rows, 1)[5]
        return {int(w): {f"{k}_ms": v for k, v in m.items()} for w, m in sorted(per_worker.items(), key=lambda x: int(x[0]))}

    def staleness(self):
        """{worker: counts per staleness} merged over the servers, or None."""
        hist = staleness_by_worker(whole_shards(self.finals))
        return hist if any(sum(c) for c in hist.values()) else None


def name_runs(runs):
    """Each run's legend name: display_name of its sweep label; runs that read alike (of several
    invocations) also name their invocation."""
    for r in runs:
        r.label = display_name(r.label_text, r.mode)
    alike = collections.Counter(r.label for r in runs)
    for r in runs:
        if alike[r.label] > 1:
            r.label += f" ({invocation(r.dir)})"


FACT_ORDER = ("data", "model", "workers", "optimizer", "straggler", "delay")


def model_text(m, d, params):
    """The model in a few words: MLP 784-256-128-10, CNN 16-32, ResNet-20 (width 16), ..."""
    kind = m.get("kind", "?")
    n_in, n_out = {"fashion-mnist": (784, 10), "cifar10": (3072, 10)}.get(d.get("kind"), (d.get("dim"), d.get("outputs")))
    if d.get("kind") in ("arrays", "external"):
        n_in = n_out = None  # (the data's own shape)
    if kind == "mlp":
        text = "MLP " + "-".join(str(x) for x in [n_in, *m.get("hidden", []), n_out] if x is not None)
    elif kind == "linear":
        text = f"linear {n_in}->{n_out}" if n_in else "linear"
    elif kind == "cnn":
        text = "CNN " + "-".join(str(x) for x in m.get("conv_channels", []))
    elif kind == "resnet":
        text = f"ResNet-{m.get('depth')} (width {m.get('width')})"
    elif kind == "external":
        text = "own model"
    else:
        text = kind
    return text + (f", {params:,} parameters" if params else "")


def facts(r):
    """{fact: text} of one run for the titles: data, model, workers x batch, optimizer, straggler."""
    c = r.cfg
    if not c:
        return {}
    m, d, tr, o, cl = (c.get(k, {}) for k in ("model", "data", "train", "optimizer", "cluster"))
    st, sc = c.get("straggler", {}), c.get("schedule", {})
    lr = f"{o.get('kind', '?').upper() if o.get('kind') == 'sgd' else o.get('kind')} lr {o.get('lr', 0):g}"
    if sc.get("scale_lr"):
        lr += f" x (update batch / {sc['base_batch']})"
    if sc.get("kind", "constant") != "constant":
        lr += f", {sc['kind']}"
    if sc.get("warmup_epochs", 0) > 0:
        lr += f", warmup {sc['warmup_epochs']:g} ep"
    out = {"data": {"fashion-mnist": "Fashion-MNIST", "cifar10": "CIFAR-10"}.get(d.get("kind"), d.get("kind")),
           "model": model_text(m, d, r.params),
           "workers": f"{cl.get('workers')} workers x batch {tr.get('batch')}", "optimizer": lr}
    if st.get("workers") and st.get("slowdown", 1) > 1:
        out["straggler"] = f"straggler: worker {','.join(map(str, st['workers']))} computes {st['slowdown']:g}x slower"
    if st.get("delay_ms", 0) > 0:
        out["delay"] = f"+{st['delay_ms']:g} ms per step"
    return out


def describe(runs, only=FACT_ORDER):
    """One line naming what every run shares (of `only`): what differs is in the legend."""
    each = [facts(r) for r in runs]
    if not each or not each[0]:
        return ""
    return ", ".join(each[0][k] for k in only if k in each[0] and all(f.get(k) == each[0][k] for f in each))


def styles(runs):
    """{id(run): (colour, line style)}: a colour per experiment (runs that differ in the seed
    alone share it), a line style per seed of it."""
    groups = named_groups(runs)
    cmap = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    return {id(r): (cmap(i % cmap.N), LINE_STYLES[j % len(LINE_STYLES)])
            for i, (_, g) in enumerate(groups) for j, r in enumerate(g)}


def time_label(runs, since="run start"):
    sim = any(r.simulated for r in runs)
    return f"{'simulated' if sim else 'wall-clock'} time since {since} (s)"


def save(fig, out, name):
    path = out / name
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot.py: wrote {path}")


def log_if_wide(ax):
    """A log y scale where the finite values of the axis's lines span more than 20x (a diverged
    run's loss is inf or huge: it does not flatten the others)."""
    lines = [ln for ln in ax.get_lines() if len(ln.get_ydata())]
    ys = np.concatenate([np.asarray(ln.get_ydata(), dtype=float) for ln in lines]) if lines else np.array([])
    ys = ys[np.isfinite(ys)]
    if len(ys) and ys.min() > 0 and ys.max() / ys.min() > 20:
        ax.set_yscale("log")


def plot_convergence(runs, out):
    """convergence.png: test accuracy (regression: test loss) and training loss against time and epochs."""
    style = styles(runs)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (a_t, a_e), (l_t, l_e) = axes
    accuracy = any("test_acc" in e for r in runs for e in r.evals)
    metric, scale = ("test_acc", 100.0) if accuracy else ("test_loss", 1.0)
    curves = [(r, [e for e in r.evals if e.get(metric) is not None]) for r in runs]
    values = [scale * e[metric] for _, ev in curves for e in ev]
    targets = {r.target for r in runs if r.target is not None} if accuracy else set()
    lo = None
    if accuracy and values:  # the axis's floor: most points, and 25 below the target, above it
        lo = max(0.0, min(np.percentile(values, 10), 100 * min(targets) - 25 if targets else 100))
    for r, ev in curves:
        c, ls = style[id(r)]
        label = r.label + (" (diverged)" if r.summary.get("status") == "diverged" else "")
        if ev:
            last = scale * ev[-1][metric]
            below = f" (ends at {last:.0f}%, below the axis)" if lo is not None and last < lo else ""
            kw = dict(color=c, ls=ls, lw=1.8, marker="o", ms=2.5, label=label + below)
            a_t.plot([e["t"] for e in ev], [scale * e[metric] for e in ev], **kw)
            a_e.plot([e["epoch"] for e in ev], [scale * e[metric] for e in ev], **kw)
            hit = r.first_hit() if accuracy else None
            if hit:
                a_t.plot(hit["t"], 100 * hit["test_acc"], "o", color=c, ms=9, mec="black", zorder=5)
                a_e.plot(hit["epoch"], 100 * hit["test_acc"], "o", color=c, ms=9, mec="black", zorder=5)
        lc = r.loss_curve()
        if lc is not None:
            t, ep, loss = lc
            l_t.plot(t, loss, color=c, ls=ls, lw=1.4, label=label)
            l_e.plot(ep, loss, color=c, ls=ls, lw=1.4, label=label)
    loss_name = "cross-entropy" if runs[0].classification else "MSE"
    for ax in (a_t, a_e):
        for tgt in targets:
            ax.axhline(100 * tgt, ls="--", color="black", lw=1, alpha=0.7, label=f"target {100 * tgt:g}%")
        if lo is not None:
            top = max(values)
            ax.set_ylim(lo, min(100.0, top + 0.15 * (top - lo) + 0.5))
        elif not accuracy:
            log_if_wide(ax)
        ax.set_ylabel("test accuracy (%)" if accuracy else f"test loss ({loss_name})")
    what = "test accuracy" if accuracy else "test loss"
    a_t.set_title(f"{what} vs time" + (" (dot: first at target)" if targets else ""))
    a_e.set_title(f"{what} vs epochs")
    l_t.set_title("training loss vs time (mean over workers)")
    l_e.set_title("training loss vs epochs")
    for ax in (l_t, l_e):
        ax.set_ylabel(f"training loss ({loss_name})")
        log_if_wide(ax)
    for ax in (a_t, l_t):
        ax.set_xlabel(time_label(runs))
    for ax in (a_e, l_e):
        ax.set_xlabel("epochs (passes over the training set, all workers)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
        if ax.get_lines():
            ax.legend(fontsize=9, loc="lower right" if accuracy and ax in (a_t, a_e) else "upper right")
    fig.suptitle(describe(runs), fontsize=11)
    fig.tight_layout()
    save(fig, out, "convergence.png")


def plot_seeds(runs, out):
    """seeds.png: mean and min-max band over the seeds of each experiment (named_groups)."""
    groups = [(n, g) for n, g in named_groups(runs) if len(g) >= 2]
    if not groups:
        return
    # Accuracy; a regression's runs (no test_acc) their test loss.
    key = "test_acc" if any("test_acc" in e for r in runs for e in r.evals) else "test_loss"
    quality = "test accuracy" if key == "test_acc" else "test loss"
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    cmap = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    drawn = 0
    for i, (name, rs) in enumerate(groups):
        curves = [[(e["epoch"], e["t"] - (r.first_step_t or 0.0), (100 if key == "test_acc" else 1) * e[key])
                   for e in last_life(r.evals) if e.get(key) is not None] for r in rs]
        curves = [c for c in curves if len(c) >= 2]
        if len(curves) < 2:
            continue
        drawn += 1
        for ax, x_of in ((axes[0], 0), (axes[1], 1)):
            end = min(c[-1][x_of] for c in curves)  # the span every seed covers
            grid = np.linspace(0.0, end, 60)
            ys = np.array([np.interp(grid, [p[x_of] for p in c], [p[2] for p in c]) for c in curves])
            colour = cmap(i % cmap.N)
            ax.plot(grid, ys.mean(axis=0), color=colour, lw=1.8, label=f"{name} {seeds_text(rs)}")
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=colour, alpha=0.2)
    for ax, xl in ((axes[0], "epochs (passes over the training set, all workers)"),
                   (axes[1], time_label(runs, "the run's first step"))):
        ax.set_xlabel(xl)
        ax.set_ylabel("test accuracy (%)" if key == "test_acc" else "test loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9, loc="lower right" if key == "test_acc" else "upper right")
    axes[0].set_title(f"{quality} vs epochs: mean over seeds, band: lowest to highest")
    axes[1].set_title(f"{quality} vs time: mean over seeds, band: lowest to highest")
    fig.tight_layout()
    if not drawn:  # (no group with two curves of two points: no figure)
        plt.close(fig)
        return
    save(fig, out, "seeds.png")


def pushed_bytes(r):
    """The bytes r pushed (all-reduce: all-reduced) over the run, as summary.json counts them."""
    if r.summary.get("bytes_pushed") is not None:
        return r.summary["bytes_pushed"]
    return sum(f.get("bytes_in", 0) for f in r.finals if f.get("replica") != "backup")  # (runs before summary.json)


def plot_bytes(runs, out):
    """bytes.png: test accuracy against bytes pushed, one line per run; runs repeated over seeds:
    one line per experiment, the mean over its seeds (bytes and accuracy at each evaluation epoch)."""
    groups = []
    for name, rs in named_groups(runs):
        members = []
        for r in rs:
            pushed, evals = pushed_bytes(r), last_life(r.evals)
            applied = evals[-1]["epoch"] if evals else 0.0
            acc = [(e["epoch"], e["test_acc"]) for e in evals if "test_acc" in e]
            if pushed and applied > 0 and acc:
                members.append((r, [(ep / applied * pushed, ep, a) for ep, a in acc]))
        if members:
            groups.append((name, members))
    if not groups:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    style = styles(runs)
    for name, members in groups:
        r = members[0][0]
        if len(members) == 1:
            pts, label = [(b, a) for b, _, a in members[0][1]], r.label
        else:  # the mean over the seeds, on the epochs every seed covers
            end = min(p[-1][1] for _, p in members)
            grid_ep = np.linspace(0.0, end, 40)
            b = np.mean([np.interp(grid_ep, [x[1] for x in p], [x[0] for x in p]) for _, p in members], axis=0)
            a = np.mean([np.interp(grid_ep, [x[1] for x in p], [x[2] for x in p]) for _, p in members], axis=0)
            pts, label = list(zip(b, a)), f"{name} {seeds_text([m for m, _ in members])}"
        pts = [(x, y) for x, y in pts if x > 0]
        ax.plot([x / 1e6 for x, _ in pts], [100 * y for _, y in pts], marker="o", markersize=3, label=label,
                color=style[id(r)][0])
    ax.set_xscale("log")
    ax.set_xlabel("bytes pushed so far (MB, all workers; all-reduce: all-reduced; log scale)")
    ax.set_ylabel("test accuracy (%)")
    first = groups[0][1][0][0]
    if first.target is not None:
        ax.axhline(100 * first.target, color="grey", linestyle="--", linewidth=0.8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("accuracy against bytes on the wire (pushes)", fontsize=11)
    fig.tight_layout()
    save(fig, out, "bytes.png")


def plot_large_batch(runs, out):
    """large_batch.png: final test accuracy against the global batch (log 2), one line per method
    (the runs that differ in the global batch and the seed alone), the mean over its seeds."""
    lines = []
    for name, rs in named_groups([r for r in runs if r.summary.get("status") in ("ok", "diverged")], GLOBAL_BATCH_KEYS):
        by = {}
        for r in rs:
            gb, acc = r.summary.get("global_batch"), r.summary.get("final_test_acc")
            if gb and acc is not None:
                by.setdefault(gb, []).append(acc)
        if by:
            lines.append((name, by))
    if len({gb for _, by in lines for gb in by}) < 2:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    cmap = plt.get_cmap("tab10" if len(lines) <= 10 else "tab20")
    for i, (name, by) in enumerate(lines):
        xs = sorted(by)
        ax.plot(xs, [100 * sum(by[x]) / len(by[x]) for x in xs], marker="o", label=name, color=cmap(i % cmap.N))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({gb for _, by in lines for gb in by}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("global batch (workers x batch x accumulate)")
    ax.set_ylabel("final test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    epochs = {r.cfg.get("train", {}).get("epochs") for r in runs}
    shared = describe(runs, ("data", "model")) + (f", {epochs.pop():g} epochs" if len(epochs) == 1 and None not in epochs else "")
    ax.set_title(shared + ": final accuracy against the global batch (mean over seeds)", fontsize=9)
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
        ax.set_xlabel(time_label([r]))
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


class Point:
    """A run of the scaling study: its summary.json, config and manifest (no metrics read)."""
    def __init__(self, d):
        self.dir = pathlib.Path(d)
        self.cfg, _, self.manifest, self.summary = read_run(self.dir)
        self.mode = self.summary.get("mode", "?")
        self.label_text = self.manifest.get("label") or ""


def plot_scaling(run_dirs, out):
    """scaling.png from the runs' summary.json: x = workers (log scale), one line per experiment
    (the runs that differ in the worker and server counts and the seed alone), the mean over its
    seeds with bars from the lowest to the highest."""
    points = [p for p in map(Point, run_dirs) if p.summary.get("status") in ("ok", "diverged")]  # (a failed run's figures are partial)
    if len({p.summary["workers"] for p in points}) < 3:
        return
    groups = named_groups(points, SIZE_KEYS)
    sim = any(p.summary.get("simulated") for p in points)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = [("mean staleness (shard versions behind)", lambda s: (s.get("staleness") or {}).get("mean"), "symlog"),
              ("final test accuracy (%)", lambda s: 100 * s["final_test_acc"] if s.get("final_test_acc") is not None else None, "linear"),
              ("samples/s" + (" (simulated)" if sim else ""), lambda s: s.get("samples_per_s"), "log")]
    cmap = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    for ax, (title, value, scale) in zip(axes, panels):
        for i, (name, ps) in enumerate(groups):
            by = {}
            for p in ps:
                if value(p.summary) is not None:
                    by.setdefault(p.summary["workers"], []).append(value(p.summary))
            if not by:
                continue
            xs = sorted(by)
            mean = np.array([np.mean(by[x]) for x in xs])
            spread = np.array([[mean[j] - min(by[x]), max(by[x]) - mean[j]] for j, x in enumerate(xs)]).T
            # bsp and allreduce coincide in accuracy: the same updates; dashed lines show both
            seeds = max(len(v) for v in by.values())
            ax.errorbar(xs, mean, yerr=spread if seeds > 1 else None, marker="o", capsize=3,
                        label=name + (f" (mean of {seeds} seeds)" if seeds > 1 else ""), color=cmap(i % cmap.N),
                        linestyle="--" if ps[0].mode == "allreduce" else "-")
            capped = sorted({p.summary["workers"] for p in ps if scale == "symlog" and (p.summary.get("staleness") or {}).get("capped_at")})
            if capped:  # a lower bound: pushes past the servers' last histogram bucket count as it
                ax.scatter(capped, [mean[xs.index(x)] for x in capped], s=140, facecolors="none", edgecolors="black",
                           zorder=5, label=f"{name}: at least (staleness past {STALENESS_CAP} counted as {STALENESS_CAP})")
        ax.set_xscale("log", base=2)
        ax.set_yscale(scale)
        if scale == "symlog":
            ax.set_ylim(bottom=0)
        ax.set_xlabel("workers")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    servers = sorted({(p.summary["workers"], p.summary["servers"]) for p in points if p.summary.get("servers")})
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
