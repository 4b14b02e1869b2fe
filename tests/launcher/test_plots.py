"""plot.py on run directories written here (no binaries): which runs a plot takes as one
experiment, how it names them, and what it draws for diverged, regression, all-reduce, resumed
and scaling runs. Each test reads the figures plot.py would save (save() is caught)."""
import json
import math
import pathlib
import sys
import tempfile
import unittest

from .helpers import REPO

sys.path.insert(0, str(REPO / "experiments"))
import plot  # noqa: E402

CONFIG = """name = "{name}"
seed = {seed}
[model]
kind = "{model}"
hidden = [256, 128]
conv_channels = [16, 32]
depth = 20
width = 16
[data]
kind = "{data}"
dim = 32
outputs = 4
[optimizer]
kind = "sgd"
lr = {lr}
[schedule]
kind = "constant"
[train]
batch = 64
epochs = 3.0
accumulate = 1
[cluster]
mode = "{mode}"
workers = {workers}
servers = 1
codec = "{codec}"
[eval]
target_acc = 0.85
[straggler]
workers = []
slowdown = 1.0
"""


def write_run(d, label=None, seed=1, lr=0.1, mode="asp", workers=2, codec="f32", model="mlp", data="fashion-mnist",
              acc=lambda ep: 0.9 - 0.5 * math.exp(-2 * ep), loss=lambda ep: 2.0 * math.exp(-ep) + 0.3,
              status="ok", summary=None, lives=((0, 300, 0.0),), bytes_in=1_000_000, revision="abc"):
    """A run directory as the launcher leaves it: config.toml, manifest.json, summary.json,
    metrics/ (worker 0's start and train lines per life (first step, last step, t0), the
    evaluator's evaluations every 20 steps of each life, a server's final line unless all-reduce)."""
    d = pathlib.Path(d)
    (d / "metrics").mkdir(parents=True)
    (d / "config.toml").write_text(CONFIG.format(name="x", seed=seed, lr=lr, mode=mode, workers=workers, codec=codec,
                                                 model=model, data=data))
    (d / "manifest.json").write_text(json.dumps({"label": label, "git": {"revision": revision}}))
    steps_per_epoch = 100
    worker, evaluator = [], []
    for first, last, t0 in lives:
        worker.append({"t": t0, "kind": "start", "worker": 0, "step": first})
        for step in range(first + 20, last + 1, 20):
            ep, t = step / steps_per_epoch, t0 + (step - first) * 0.01
            loss_value = loss(ep)
            worker.append({"t": t, "kind": "train", "worker": 0, "step": step, "epoch": ep,
                           "loss": loss_value if math.isfinite(loss_value) else None, "samples_per_s": 6400.0,
                           "compute_ms": 10.0 if t0 == 0 else 30.0, "comm_ms": 2.0, "wait_ms": 0.0, "delay_ms": 0.0})
            e = {"t": t, "kind": "eval", "step": step, "epoch": ep, "test_loss": loss(ep)}
            if data != "least-squares":
                e["test_acc"] = acc(ep)
            evaluator.append(e)
    (d / "metrics" / "worker0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in worker))
    (d / "metrics" / "evaluator.jsonl").write_text("".join(json.dumps(x) + "\n" for x in evaluator))
    if mode != "allreduce":
        (d / "metrics" / "server0.jsonl").write_text(json.dumps({"t": 3.0, "kind": "server_final", "shard": 0,
                                                                 "bytes_in": bytes_in, "bytes_out": bytes_in}) + "\n")
    s = {"mode": mode, "workers": workers, "servers": 0 if mode == "allreduce" else 1, "status": status,
         "global_batch": 64 * workers, "final_test_acc": evaluator[-1].get("test_acc"), "samples_per_s": 1000.0 * workers,
         "staleness": {"mean": 1.0} if mode != "allreduce" else None, "simulated": False}
    s.update(summary or {})
    (d / "summary.json").write_text(json.dumps(s))
    return d


class Plots(unittest.TestCase):
    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="pslab-plots-"))
        self.figures = {}
        self.saved = plot.save
        plot.save = lambda fig, out, name: self.figures.__setitem__(name, fig)

    def tearDown(self):
        plot.save = self.saved
        plot.plt.close("all")
        import shutil
        shutil.rmtree(self.tmp, ignore_errors=True)

    def draw(self, dirs, *only):
        """The figures plot.py draws of these run directories, caught: {name: figure}."""
        self.figures.clear()
        plot.plot_scaling(dirs, self.tmp)
        runs = [plot.Run(d) for d in dirs]
        plot.name_runs(runs)
        for f in (plot.plot_convergence, plot.plot_seeds, plot.plot_bytes, plot.plot_large_batch, plot.plot_step_time):
            f(runs, self.tmp)
        return self.figures

    @staticmethod
    def legend(ax):
        return [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []

    def test_runs_of_two_invocations_are_not_seeds_of_one_and_are_told_apart(self):
        # Two runs without a sweep, other learning rates, both seed 1: seeds.png averaged them as
        # "run (2 seeds)", and the legend called both "run".
        a = write_run(self.tmp / "runs/a/20260101-000000/run", lr=0.1)
        b = write_run(self.tmp / "runs/b/20260102-000000/run", lr=0.01, acc=lambda ep: 0.6)
        figs = self.draw([a, b])
        self.assertNotIn("seeds.png", figs)
        self.assertEqual(self.legend(figs["convergence.png"].axes[1])[:2],
                         ["asp (a/20260101-000000)", "asp (b/20260102-000000)"])
        # The same config at seeds 1 and 2, from two invocations: one experiment over two seeds.
        c = write_run(self.tmp / "runs/c/20260103-000000/run", lr=0.01, seed=2, acc=lambda ep: 0.62)
        figs = self.draw([a, b, c])
        self.assertEqual(self.legend(figs["seeds.png"].axes[0]), ["asp (b/20260102-000000) (2 seeds)"])
        # The same config and seed from another commit is another experiment.
        d = write_run(self.tmp / "runs/d/20260104-000000/run", lr=0.01, seed=2, revision="def")
        self.assertNotIn("seeds.png", self.draw([b, d]))

    def test_a_variant_is_named_by_its_name_and_a_mode_sweep_by_the_mode(self):
        inv = self.tmp / "runs/m/20260101-000000"
        dirs = [write_run(inv / "variant=asp+topk", label="variant=asp+topk", codec="topk:0.01"),
                write_run(inv / "variant=local:4", label="variant=local:4", mode="local:4"),
                write_run(inv / "mode=bsp", label="mode=bsp", mode="bsp")]
        figs = self.draw(dirs)
        self.assertEqual(self.legend(figs["convergence.png"].axes[1])[:3], ["asp+topk", "local:4", "bsp"])

    def test_a_diverged_run_is_named_and_does_not_flatten_the_others(self):
        inv = self.tmp / "runs/lr/20260101-000000"
        dirs = [write_run(inv / f"lr={i}", label=f"lr={i}", lr=0.01 * (i + 1)) for i in range(10)]
        dirs.append(write_run(inv / "lr=big", label="lr=big", lr=10, status="diverged",
                              acc=lambda ep: 0.1, loss=lambda ep: math.inf if ep > 1 else 1e18))
        figs = self.draw(dirs)
        acc_ax, loss_ax = figs["convergence.png"].axes[0], figs["convergence.png"].axes[2]
        self.assertIn("lr=big (diverged) (ends at 10%, below the axis)", self.legend(acc_ax))
        self.assertIn("lr=big (diverged)", self.legend(loss_ax))
        self.assertEqual(loss_ax.get_yscale(), "log")  # (the others' loss, 2.3 to 0.35, stays readable)
        # Eleven runs: no two experiments share a colour.
        colours = [tuple(ln.get_color()) for ln in acc_ax.get_lines() if ln.get_label().startswith("lr=")]
        self.assertEqual(len(set(colours)), 11)

    def test_a_regression_plots_its_test_loss(self):
        d = write_run(self.tmp / "runs/ls/20260101-000000/run", model="linear", data="least-squares")
        ax = self.draw([d])["convergence.png"].axes[0]
        self.assertEqual(ax.get_ylabel(), "test loss (MSE)")
        self.assertEqual(len(ax.get_lines()[0].get_ydata()), 15)

    def test_a_regressions_seeds_plot_its_test_loss_and_its_comparison_its_final_loss(self):
        # Regression runs over two seeds: seeds.png was saved with no line (accuracy only), and
        # the comparison had no quality column and said they missed an accuracy target.
        inv = self.tmp / "runs/ls/20260101-000000"
        dirs = [write_run(inv / f"seed={k}", label=f"seed={k}", seed=k, model="linear", data="least-squares",
                          loss=lambda ep, k=k: 2.0 * math.exp(-ep) + 0.1 * k) for k in (1, 2)]
        ax = self.draw(dirs)["seeds.png"].axes[0]
        self.assertEqual(ax.get_ylabel(), "test loss")
        self.assertEqual(len(ax.get_lines()), 1)
        from launcher.comparison import write_comparison
        results = [(f"seed={k}", {"status": "ok", "mode": "asp", "workers": 2, "servers": 1, "final_test_acc": None,
                                  "final_test_loss": 0.1234 * k, "classification": False, "time_to_target_s": None,
                                  "target_acc": 0.85}) for k in (1, 2)]
        table, notes = write_comparison(inv, results, 0.85)
        self.assertIn("| final loss |", table)
        self.assertIn("| 0.1234 |", table)
        self.assertEqual([n for n in notes if "reach" in n], [], notes)

    def test_an_allreduce_run_has_its_bytes_drawn(self):
        inv = self.tmp / "runs/m/20260101-000000"
        dirs = [write_run(inv / "mode=allreduce", label="mode=allreduce", mode="allreduce",
                          summary={"bytes_pushed": 2_000_000}),
                write_run(inv / "mode=asp", label="mode=asp")]
        self.assertEqual(self.legend(self.draw(dirs)["bytes.png"].axes[0]), ["allreduce", "asp"])

    def test_a_resumed_runs_steps_and_evaluations_are_of_each_life(self):
        # Life 1: steps 0-300 at 10 ms compute; resumed from a checkpoint at step 200: steps
        # 200-400 at 30 ms. The second life's first window is 20 steps, not 20 - 300.
        d = write_run(self.tmp / "runs/r/20260101-000000/run", lives=((0, 300, 0.0), (200, 400, 100.0)))
        run = plot.Run(d)
        self.assertAlmostEqual(run.step_means()[0]["compute_ms"], (300 * 10 + 200 * 30) / 500)
        epochs = [e["epoch"] for e in plot.last_life(run.evals)]
        self.assertEqual(epochs, sorted(epochs))
        self.assertEqual((epochs[0], epochs[-1], len(epochs)), (0.2, 4.0, 20))  # life 1 to step 200, then life 2

    def test_scaling_draws_one_line_per_experiment_through_the_mean_over_seeds(self):
        # Worker counts 2, 4, 8 x seeds 1-3 x two variants of one mode: one "asp" line zigzagged
        # through all 18 runs.
        dirs = []
        for workers in (2, 4, 8):
            inv = self.tmp / f"runs/scale/w{workers}"
            for seed in (1, 2, 3):
                for name, codec, base in (("asp", "f32", 0.88), ("asp+topk", "topk:0.01", 0.72)):
                    label = f"seed={seed},variant={name}"
                    dirs.append(write_run(inv / label, label=label, seed=seed, workers=workers, codec=codec,
                                          summary={"final_test_acc": base + 0.01 * seed}))
        ax = self.draw(dirs)["scaling.png"].axes[1]
        self.assertEqual(self.legend(ax), ["asp (mean of 3 seeds)", "asp+topk (mean of 3 seeds)"])
        means = [list(c.lines[0].get_ydata()) for c in ax.containers]
        self.assertEqual(len(means), 2)
        for got, want in zip(means, (90.0, 74.0)):
            self.assertEqual([round(y, 6) for y in got], [want] * 3)

    def test_the_title_names_what_every_run_shares_and_nothing_else(self):
        inv = self.tmp / "runs/t/20260101-000000"
        r = plot.Run(write_run(inv / "a", label="lr=0.1", model="resnet", data="cifar10"))
        self.assertEqual(plot.describe([r]), "CIFAR-10, ResNet-20 (width 16), 2 workers x batch 64, SGD lr 0.1")
        other = plot.Run(write_run(inv / "b", label="lr=0.4", lr=0.4, model="resnet", data="cifar10"))
        self.assertEqual(plot.describe([r, other]), "CIFAR-10, ResNet-20 (width 16), 2 workers x batch 64")


if __name__ == "__main__":
    unittest.main()
