"""PyTorch workers (worker.kind = "python", worker/python/pslab/torch.py) on pslab's servers.

Exactness: the PyTorch MLP under bsp with one worker ends on the θ the built-in MLP ends on (the
same θ0, through the API; the same batches; plain SGD; 100 steps), within float32. The launcher:
experiments/configs/torch-mlp.toml compared in bsp, ssp:2, asp and local:4 reaches 85% on
Fashion-MNIST in every mode, asp's servers applying each of the 4 workers' pushes once; a PyTorch
worker killed in asp is dropped and the run goes on. Bad calls raise, naming the problem.
Needs Debian's python3-torch (experiments/setup.sh installs it); skips, saying so, without it.
"""
import contextlib
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from tests.launcher.helpers import (BUILD, REPO, LauncherTestCase, cmdlines_containing, free_base_port, sleeps,
                                    wait_for_train_lines_in)
from tests.launcher.test_slurm import Slurm

os.environ.setdefault("PSLAB_CLIENT_LIB", str(BUILD / "worker" / "libpslab_client.so"))
sys.path.insert(0, str(REPO / "worker" / "python"))
sys.path.insert(0, str(REPO / "experiments"))
try:
    import torch
    import pslab
    import pslab.torch as pt
    sys.path.insert(0, str(REPO / "experiments" / "torch"))
    import mlp as torch_mlp
    NO_TORCH = None
except ImportError as e:  # (experiments/setup.sh installs python3-torch)
    NO_TORCH = f"PyTorch is not installed ({e}): apt-get install python3-torch, or experiments/setup.sh"

from launcher.hosts import free_ports  # noqa: E402

TORCH_MLP = REPO / "experiments" / "configs" / "torch-mlp.toml"
TORCH_RESNET = REPO / "experiments" / "configs" / "torch-resnet.toml"
HIDDEN = 32
EXACT = """name = "exact"
seed = 3
[model]
MODEL
[data]
kind = "fashion-mnist"
train_samples = 2048
test_samples = 256
[optimizer]
kind = "sgd"
lr = 0.05
[train]
batch = 32
steps = 100
log_every = 10
[cluster]
mode = "bsp"
workers = 1
servers = 2
transport = "tcp"
auth = "none"
heartbeat_s = 1.0
timeout_s = 30.0
"""


def builtin_to_torch(theta, features, widths):
    """θ of the built-in MLP (per Linear: W as (in, out) row-major, then b) in PyTorch's layout
    (nn.Linear's weight is (out, in)); torch_to_builtin the other way."""
    out, at = [], 0
    for a, b in zip([features, *widths], widths):
        out += [theta[at:at + a * b].reshape(a, b).T.ravel(), theta[at + a * b:at + a * b + b]]
        at += a * b + b
    return np.concatenate(out).astype(np.float32)


def torch_to_builtin(theta, features, widths):
    out, at = [], 0
    for a, b in zip([features, *widths], widths):
        out += [theta[at:at + a * b].reshape(b, a).T.ravel(), theta[at + a * b:at + a * b + b]]
        at += a * b + b
    return np.concatenate(out).astype(np.float32)


@unittest.skipIf(NO_TORCH, NO_TORCH)
class TorchExactness(unittest.TestCase):
    """Against real servers on 127.0.0.1, started by the test."""

    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="pslab-torch-"))
        self.started = []

    def tearDown(self):
        for s in self.started:
            if s.poll() is None:
                s.kill()
            s.wait()
            s.stderr.close()
        subprocess.run(["rm", "-rf", str(self.tmp)], check=False)

    def servers(self, config):
        addresses = [f"tcp://127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2)]
        procs = [subprocess.Popen([str(BUILD / "server" / "pslab_server"), "-c", str(config), "--shard", str(k), "--bind",
                                   addresses[k], "--wait-for-shutdown"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for k in range(2)]
        self.started += procs
        return addresses, procs

    def theta_then_shutdown(self, config, addresses, procs, evaluator=None):
        """θ as the servers hold it, taken by an evaluator (a new one, or `evaluator`), which then
        shuts them down."""
        with evaluator or self.evaluator(config, addresses) as c:
            theta = np.zeros(c.num_params, np.float32)
            c.pull(0, theta)
            c.shutdown()
        for k, s in enumerate(procs):
            _, err = s.communicate(timeout=30)
            self.assertEqual(s.returncode, 0, f"server {k}: {err.decode()[-2000:]}")
        return theta

    @staticmethod
    def evaluator(config, addresses):
        c = pslab.Client(config, pslab.EVALUATOR, addresses)
        c.connect()
        return c

    def test_the_pytorch_mlp_ends_on_the_builtin_mlps_theta(self):
        builtin = self.tmp / "builtin.toml"
        builtin.write_text(EXACT.replace("MODEL", f'kind = "mlp"\nhidden = [{HIDDEN}]'))
        addresses, procs = self.servers(builtin)
        spy = self.evaluator(builtin, addresses)  # θ0 before the worker starts (the evaluator's pulls wait for no one)
        theta0 = np.zeros(spy.num_params, np.float32)
        spy.pull(0, theta0)
        r = subprocess.run([str(BUILD / "worker" / "pslab_worker"), "ps", "-c", str(builtin), "--rank", "0", "--servers",
                            ",".join(addresses), "-o", str(self.tmp / "cpp"), "-q"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        theta_cpp = self.theta_then_shutdown(builtin, addresses, procs, spy)

        # The same network in PyTorch (experiments/torch/mlp.py), from the same θ0
        features, widths = 784, [HIDDEN, 10]
        builtin_to_torch(theta0, features, widths).tofile(self.tmp / "theta0.f32")
        model = torch_mlp.MLP(features, 10, hidden=(HIDDEN,))
        external = self.tmp / "external.toml"
        external.write_text(EXACT.replace("MODEL", f'kind = "external"\nsizes = {pt.sizes_of(model)}\n'
                                                   f'theta_file = "{self.tmp / "theta0.f32"}"'))
        addresses, procs = self.servers(external)
        client = pslab.Client(external, 0, addresses)
        client.metrics(self.tmp / "py")
        x, y, _, _ = pt.data(client)
        worker = pt.Worker(model, client)
        np.testing.assert_array_equal(torch_to_builtin(worker.flat.theta_np, features, widths), theta0, "θ0 came through")
        losses = []
        for idx in worker.batches():
            model.zero_grad(set_to_none=True)  # (a PyTorch habit, and PyTorch 2's default: the .grad views are dropped)
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            losses.append(loss.item())
            worker.step(loss, len(idx))
        worker.end()
        theta_torch = torch_to_builtin(self.theta_then_shutdown(external, addresses, procs), features, widths)

        self.assertEqual(len(losses), 100)
        self.assertLess(np.mean(losses[-10:]), 0.6 * np.mean(losses[:10]), "it learned")
        moved = np.abs(theta_cpp - theta0).max()
        diff = np.abs(theta_torch - theta_cpp).max()
        print(f"100 steps: θ moved {moved:.3g} at most; PyTorch's and the built-in θ differ by {diff:.3g} at most",
              file=sys.stderr)
        self.assertGreater(moved, 0.05)
        self.assertLess(diff, 1e-5, f"after 100 steps the θs differ by {diff:.3g} (θ moved {moved:.3g})")
        # the same metrics lines as pslab_worker's, the same losses
        cpp = [json.loads(line) for line in (self.tmp / "cpp" / "metrics" / "worker0.jsonl").read_text().splitlines()]
        py = [json.loads(line) for line in (self.tmp / "py" / "metrics" / "worker0.jsonl").read_text().splitlines()]
        self.assertEqual([(row["kind"], sorted(row)) for row in py], [(row["kind"], sorted(row)) for row in cpp])
        np.testing.assert_allclose([row["loss"] for row in py if row["kind"] == "train"],
                                   [row["loss"] for row in cpp if row["kind"] == "train"], rtol=1e-4)

    def test_data_comes_as_tensors_of_classes_or_targets(self):
        # pt.data(): pslab's data sets as tensors, labels for classes, float targets for regression
        for kind, y_shape, dtype in (("logistic", (300,), torch.int64), ("least-squares", (300, 3), torch.float32)):
            config = self.tmp / f"{kind}.toml"
            config.write_text(f'name = "d"\n[model]\nkind = "linear"\n[data]\nkind = "{kind}"\ntrain_samples = 300\n'
                              f'test_samples = 40\ndim = 6\noutputs = 3\n')
            with pslab.Client(config, 0, None) as c:  # (no servers: the data alone)
                x, y, x_test, y_test = pt.data(c)
                self.assertEqual((tuple(x.shape), tuple(y.shape), y.dtype), ((300, 6), y_shape, dtype), kind)
                self.assertEqual((tuple(x_test.shape), y_test.shape[0]), ((40, 6), 40), kind)
                raw, _, _ = c.train_set()
                self.assertEqual(x[17, 2].item(), raw[17 * 6 + 2], "the loader's own values")
                with self.assertRaisesRegex(pslab.PslabError, "connect: this client was opened without servers"):
                    c.connect()

    def test_bad_calls_raise_naming_the_problem(self):
        config = self.tmp / "bad.toml"
        model = torch_mlp.MLP(784, 10, hidden=(HIDDEN,))
        config.write_text(EXACT.replace("MODEL", f'kind = "external"\nsizes = {pt.sizes_of(model)}'))
        nowhere = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]  # (nothing is sent before the start barrier)
        with pslab.Client(config, 0, nowhere) as c:
            with self.assertRaisesRegex(pslab.PslabError, r"the module has 7850 parameters \(tensors \[7840, 10\]\), this run's "
                                                          r"θ has 25450"):
                pt.Worker(torch.nn.Linear(784, 10), c)
            with self.assertRaisesRegex(pslab.PslabError, r"θ is float32: these parameters are not \(hidden.0.weight "
                                                          r"\(torch.float64\)"):
                pt.Worker(torch_mlp.MLP(784, 10, hidden=(HIDDEN,)).double(), c)
            with self.assertRaisesRegex(pslab.PslabError, r"worker 0 is not the evaluator \(rank -1\)"):
                pt.evaluate(model, lambda m: 0.0, c)
        with pslab.Client(config, pslab.EVALUATOR, nowhere) as c:
            with self.assertRaisesRegex(pslab.PslabError, "this process is the run's evaluator, which trains nothing"):
                pt.Worker(model, c)
            with self.assertRaisesRegex(pslab.PslabError, "next θ: .*|eval: no θ taken"):
                c.eval(0.5, 0.5)
        # the θ0 run, on the launcher's host, may have no GPU: its module on the CPU (θ0 is the same)
        cuda = self.tmp / "cuda.toml"
        cuda.write_text(EXACT.replace("MODEL", f'kind = "external"\nsizes = {pt.sizes_of(model)}')
                        .replace("[train]", '[train]\ndevice = "cuda"'))
        theta0 = pslab.launched({"PSLAB_CONFIG": str(cuda), "PSLAB_RANK": "-1", "PSLAB_THETA0": str(self.tmp / "t0")})
        self.assertEqual(pt.device(theta0), torch.device("cpu"))
        if not torch.cuda.is_available():
            with self.assertRaisesRegex(pslab.PslabError, 'train.device = "cuda", but this PyTorch .* sees no GPU'):
                pt.device(pslab.launched({"PSLAB_CONFIG": str(cuda), "PSLAB_RANK": "0", "PSLAB_SERVERS": "tcp://x:1"}))
        # an evaluator's batch norm never updated (its statistics are not in θ) is said once
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            pt._warn_untrained_batch_norm(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
        self.assertIn("[evaluator] batch norm 1: running statistics never updated in this process", err.getvalue())
        c = pslab.Client(config, 0, nowhere)
        c.close()
        with self.assertRaisesRegex(pslab.PslabError, "worker 0: the client is closed"):
            pt.Worker(model, c)
        with self.assertRaisesRegex(pslab.PslabError, "PSLAB_CONFIG, PSLAB_RANK, PSLAB_SERVERS not set: .* started by "
                                                      "experiments/launch.py"):
            pslab.launched({})
        # a training step out of turn, on real servers
        addresses, procs = self.servers(config)
        with pslab.Client(config, 0, addresses) as c:
            with self.assertRaisesRegex(pslab.PslabError, "step: pslab_client_begin first"):
                c.train_step(0, 1.0, 32, 0.0, np.zeros(c.num_params, np.float32), np.zeros(c.num_params, np.float32))
            worker = pt.Worker(model, c)
            with self.assertRaisesRegex(pslab.PslabError, r"step 100 is not in \[0, 100\)"):
                c.train_step(100, 1.0, 32, 0.0, worker.flat.grad_np, worker.flat.theta_np)
            with self.assertRaisesRegex(ValueError, "grad holds 3 floats; this run's θ has 25450"):
                c.train_step(0, 1.0, 32, 0.0, np.zeros(3, np.float32), worker.flat.theta_np)
        for s in procs:
            s.kill()
        # model.sizes in another order than the module's tensors (the same total): lars and lamb
        # would take the wrong slices for layers
        reordered = self.tmp / "reordered.toml"
        reordered.write_text(EXACT.replace("MODEL", f'kind = "external"\nsizes = {pt.sizes_of(model)[::-1]}'))
        with pslab.Client(reordered, 0, nowhere) as c:
            with self.assertRaisesRegex(pslab.PslabError, r"the module's parameter tensors are \[25088, 32, 320, 10\] floats, "
                                                          r"model.sizes says \[10, 320, 32, 25088\] \(first difference: tensor 0\)"):
                pt.Worker(model, c)

    def test_every_process_builds_what_theta_does_not_hold_alike(self):
        # Defect: each process was seeded with the seed + 1 + rank at import: a frozen (or other
        # non-θ) layer was built differently in every worker and in the evaluator.
        built = set()
        for rank in (-1, 0, 1):
            env = dict(os.environ, PSLAB_SEED="3", PSLAB_RANK=str(rank),
                       PYTHONPATH=os.pathsep.join([str(REPO / "worker" / "python"), os.environ.get("PYTHONPATH", "")]))
            out = subprocess.run([sys.executable, "-c", "import pslab.torch, torch\nprint(torch.nn.Linear(3, 1).weight.tolist())"],
                                 env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            built.add(out.stdout.strip())
        self.assertEqual(len(built), 1, built)

    def test_a_step_takes_the_gradient_whatever_became_of_grad_and_no_nan_from_an_empty_batch(self):
        config = self.tmp / "steps.toml"
        model = torch_mlp.MLP(784, 10, hidden=(HIDDEN,))
        config.write_text(EXACT.replace("MODEL", f'kind = "external"\nsizes = {pt.sizes_of(model)}')
                          .replace("log_every = 10", "log_every = 1"))
        addresses, procs = self.servers(config)
        x = torch.randn(32, 784)
        y = torch.arange(32) % 10
        with pslab.Client(config, 0, addresses) as c:
            c.metrics(self.tmp / "steps")
            worker = pt.Worker(model, c)
            before = worker.flat.theta_np.copy()
            model.zero_grad(set_to_none=True)
            worker.step(torch.nn.functional.cross_entropy(model(x), y), 32)
            self.assertGreater(np.abs(worker.flat.theta_np - before).max(), 0, "the push was zeros: θ did not move")
            before = worker.flat.theta_np.copy()
            worker.step(torch.nn.functional.cross_entropy(model(x[:0]), y[:0]), 0)  # an epoch's empty last batch
            np.testing.assert_array_equal(worker.flat.theta_np, before, "an empty batch moved θ")
            # an optimizer of one's own, stepped besides worker.step: θ moved where no server has it
            torch.optim.SGD(model.parameters(), lr=0.1).step()
            with self.assertRaisesRegex(pslab.PslabError, r"parameter hidden.0.weight was changed in place since θ came "
                                                          r"from the servers \(an optimizer's step\(\)"):
                worker.step(torch.nn.functional.cross_entropy(model(x), y), 32)
            worker.flat.versions = [p._version for p in worker.flat.params]  # (as if it had not)
            first = pt.parameters(model)[0]
            first.data = first.data.clone()  # (as .to() or .cpu() would: no longer θ's buffer)
            with self.assertRaisesRegex(pslab.PslabError, r"parameter hidden.0.weight no longer lies in θ's buffer"):
                worker.step(torch.nn.functional.cross_entropy(model(x), y), 32)
        for s in procs:
            s.kill()
        rows = [json.loads(line) for line in (self.tmp / "steps" / "metrics" / "worker0.jsonl").read_text().splitlines()]
        losses = [row["loss"] for row in rows if row["kind"] == "train"]
        self.assertEqual(len(losses), 2, rows)
        self.assertTrue(np.isfinite(losses[0]), losses)
        self.assertIsNone(losses[1], "the empty batch's window has no loss (no NaN, and no 0 to pull a mean down)")


@unittest.skipIf(NO_TORCH, NO_TORCH)
class TorchRuns(LauncherTestCase):
    """experiments/configs/torch-mlp.toml through the launcher."""
    launch_timeout = 240

    def test_every_mode_reaches_85_percent_and_asp_applies_every_push_once(self):
        r = self.launch("run", TORCH_MLP, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        inv = self.only_invocation("torch-mlp")
        for mode in ("bsp", "ssp_2", "asp", "local_4"):
            s = json.loads((inv / f"mode={mode}" / "summary.json").read_text())
            self.assertEqual(s["status"], "ok", mode)
            self.assertGreaterEqual(s["final_test_acc"], 0.85, f"{mode}: {s['final_test_acc']:.2%}")
            self.assertGreater(s["evaluations"], 3, mode)
        # asp: each of the 4 workers' 470 pushes applied once by each server, none twice; a push the
        # guard refuses (a rare early spike of an honest gradient: cluster.push_guard) is applied as
        # an empty one, which moves neither θ nor the version
        run = inv / "mode=asp"
        plan = json.loads((run / "plan.json").read_text())
        self.assertEqual(plan["worker"]["kind"], "python")
        self.assertGreater(plan["params"], 200000, "the sizes the script gave at launch")
        for k in (0, 1):
            final = [json.loads(line) for line in (run / "metrics" / f"server{k}.jsonl").read_text().splitlines()
                     if '"server_final"' in line][0]
            refused = sum(final["push_guard"]["refused"].values())
            self.assertLessEqual(refused, 3, f"server {k}: the guard refused honest pushes: {final['push_guard']}")
            self.assertEqual((final["pushes"], final["version"], final["pushes_duplicate"], final["updates_lost"]),
                             (4 * 470, 4 * 470 - refused, 0, 0), f"server {k}, {refused} refused")
            self.assertLessEqual(final["samples_applied"], 2 * 60000)
            self.assertGreaterEqual(final["samples_applied"], 2 * 60000 - 64 * refused, f"server {k}")
        # the comparison and the metrics are those of built-in runs
        self.assertIn("| mode=local_4 | local:4 |", (inv / "comparison.md").read_text())
        train = [json.loads(line) for line in (run / "metrics" / "worker3.jsonl").read_text().splitlines()]
        self.assertTrue(any(row["kind"] == "train" and row["comm_ms"] > 0 for row in train))
        self.assert_no_processes_left()

    def test_the_resnet_example_trains_with_batch_norm(self):
        # a few steps of experiments/torch/resnet.py (its θ: convolutions, batch norm's scales and
        # shifts, the head; the evaluator measures batch norm's statistics afresh)
        r = self.launch("run", TORCH_RESNET, "--runs-dir", self.runs, "--no-plots", "--set", 'cluster.mode="asp"',
                        "--set", "cluster.workers=2", "--set", "train.steps=12", "--set", "eval.every_epochs=0")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_invocation("torch-resnet") / "run"
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok")
        model = __import__("resnet").ResNet(1, 10)
        plan = json.loads((run / "plan.json").read_text())
        self.assertEqual(plan["params"], sum(pt.sizes_of(model)))
        self.assertGreater(s["final_test_acc"], 0.15, "12 steps of 2 workers (in the warm-up) learn something: 10% is chance")
        self.assert_no_processes_left()

    def test_what_a_script_leaves_running_ends_with_the_run(self):
        # a worker.script that starts a child and leaves it (as a data loader's workers can outlive
        # the script): the θ0 run's, the workers' and the evaluator's children end with them
        mlp = REPO / "experiments" / "torch" / "mlp.py"
        script = self.write("leaves.py", f"""import runpy, subprocess, sys
subprocess.Popen(["sleep", "65.5"])  # left behind
sys.path.insert(0, {str(mlp.parent)!r})
runpy.run_path({str(mlp)!r}, run_name="__main__")
""")
        self.addCleanup(lambda: [os.kill(pid, signal.SIGKILL) for pid in sleeps("65.5")])
        r = self.launch("run", TORCH_MLP, "--runs-dir", self.runs, "--no-plots", "--set", f'worker.script="{script}"',
                        "--set", 'cluster.mode="asp"', "--set", "cluster.workers=2", "--set", "train.steps=12",
                        "--set", "eval.every_epochs=0")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(sleeps("65.5"), {}, "what the script left is still running")
        self.assert_no_processes_left()

    def test_over_ssh_and_under_slurm_as_locally(self):
        # the same script through a local stand-in of ssh (2 hosts, TCP, the run's key: CURVE)
        # and of Slurm: the workers and the evaluator find their part of the run in PSLAB_*
        self.fake_bin("ssh", """\
            #!/bin/bash
            while [[ $1 == -o ]]; do shift 2; done
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"
            exec bash -c "$2"
            """)
        Slurm.install_fake_slurm(self)
        short = ["--set", 'cluster.mode="asp"', "--set", "cluster.workers=2", "--set", "train.steps=40",
                 "--set", "eval.every_epochs=0"]
        for launcher, more in (("ssh", ['cluster.hosts=["localhost", "127.0.0.1"]', 'cluster.transport="tcp"']),
                               ("slurm", [])):
            with self.subTest(launcher=launcher):
                sets = [x for m in more for x in ("--set", m)]
                r = self.launch("run", TORCH_MLP, "--runs-dir", self.runs / launcher, "--no-plots", "--base-port",
                                free_base_port(), "--set", f'cluster.launcher="{launcher}"', *short, *sets)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                run = next((self.runs / launcher / "torch-mlp").glob("2*/run"))
                s = json.loads((run / "summary.json").read_text())
                self.assertEqual(s["status"], "ok", s.get("failure"))
                self.assertGreater(s["final_test_acc"], 0.6)
                worker0 = next(q for q in json.loads((run / "manifest.json").read_text())["processes"]
                               if q["name"] == "worker0")
                self.assertIn("PSLAB_RANK=0", worker0["command"])
                if launcher == "ssh":  # (TCP between the hosts: the peers prove the run's key)
                    self.assertIn(f"PSLAB_AUTH_KEY={run / 'run.key'}", worker0["command"])
        self.assert_no_processes_left()

    def test_a_killed_torch_worker_in_asp_is_dropped_and_the_run_goes_on(self):
        p = self.launch_bg("run", TORCH_MLP, "--runs-dir", self.runs, "--no-plots", "--set", "cluster.mode=asp",
                           "--set", "train.steps=1500", "--set", "cluster.heartbeat_s=1")
        wait_for_train_lines_in(self, self.runs, ["worker0", "worker1"], 60)
        def environ(pid):
            try:
                return pathlib.Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:  # (a process that ended meanwhile)
                return b""
        worker1 = [pid for pid in cmdlines_containing(str(self.runs)) if b"PSLAB_RANK=1\0" in environ(pid)]
        self.assertEqual(len(worker1), 1)
        os.kill(worker1[0], signal.SIGKILL)
        out, err = p.communicate(timeout=180)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertRegex(err, r"worker1 \(rank 1\) on local was killed by signal 9 \(SIGKILL\); the run goes on without it")
        s = json.loads((self.only_invocation("torch-mlp") / "run" / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertEqual([w["worker"] for w in s["workers_lost"]], [1])
        self.assertLess(s["workers_lost"][0]["clock"], 1500)
        self.assertGreater(s["final_test_acc"], 0.8)  # the other three trained on
        self.assert_no_processes_left()


if __name__ == "__main__":
    unittest.main()
