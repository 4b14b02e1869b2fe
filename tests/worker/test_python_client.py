"""The Python client (worker/python/pslab over libpslab_client.so, worker/pslab_client.h) against
real pslab_server processes on 127.0.0.1: workers in Python push gradients whose effect is known
(plain SGD, constant values), so θ after each round is checked exactly: bsp applies the
batch-weighted mean of a clock's pushes, asp every push once; an external model starts from its
file; workers share out the samples; softmax regression in NumPy trains as pslab_worker does
(the same loss at every step, within float32); bad calls raise, naming the problem. Needs NumPy (python3-numpy, which the plots need too)."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("PSLAB_BUILD", REPO / "build"))
os.environ.setdefault("PSLAB_CLIENT_LIB", str(BUILD / "worker" / "libpslab_client.so"))
sys.path.insert(0, str(REPO / "worker" / "python"))
sys.path.insert(0, str(REPO / "experiments"))

import pslab  # noqa: E402
from launcher.hosts import free_ports  # noqa: E402

LR = 0.5
CONFIG = f"""name = "pyclient"
seed = 1
[model]
kind = "linear"
[data]
kind = "logistic"
train_samples = 256
test_samples = 64
dim = 32
outputs = 4
[optimizer]
kind = "sgd"
lr = {LR}
momentum = 0.0
[train]
batch = 16
steps = 3
[cluster]
mode = "MODE"
workers = 2
servers = 2
transport = "tcp"
auth = "none"
heartbeat_s = 1.0
timeout_s = 20.0
"""
P = 32 * 4 + 4  # the linear model's θ: a 32 x 4 weight and 4 biases


class PythonClient(unittest.TestCase):
    def start_servers(self, mode, model=None, edit=lambda text: text):
        """Two real servers of a run in `mode` (of `model`: its [model] section's lines, else the
        linear model's; `edit`: what else changes in the config); returns (config path, their
        addresses)."""
        self.tmp = getattr(self, "tmp", None) or pathlib.Path(tempfile.mkdtemp(prefix="pslab-pyclient-"))
        config = self.tmp / f"{mode}.toml"
        config.write_text(edit(CONFIG.replace("MODE", mode).replace('[model]\nkind = "linear"', f"[model]\n{model}" if model else
                                                                    '[model]\nkind = "linear"')))
        addresses = [f"tcp://127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2)]
        self.servers = [subprocess.Popen([str(BUILD / "server" / "pslab_server"), "-c", str(config), "--shard", str(k),
                                          "--bind", addresses[k]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                        for k in range(2)]
        self.started = getattr(self, "started", []) + self.servers
        return config, addresses

    def tearDown(self):
        for s in getattr(self, "started", []):
            if s.poll() is None:
                s.send_signal(signal.SIGKILL)
            s.wait()
            if s.stderr:
                s.stderr.close()
        if getattr(self, "tmp", None):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def servers_end(self):
        for k, s in enumerate(self.servers):
            _, err = s.communicate(timeout=30)
            self.assertEqual(s.returncode, 0, f"server {k}: {err.decode()[-2000:]}")

    def run_workers(self, config, addresses, body, params=P):
        """body(client, theta) in two threads, one client each; what they raise is raised here."""
        errors = []

        def worker(rank):
            try:
                with pslab.Client(config, rank, addresses) as c:
                    self.assertEqual(c.num_params, params)
                    theta = np.zeros(params, np.float32)
                    c.connect()
                    c.pull(0, theta)
                    body(c, theta)
            except BaseException as e:  # noqa: BLE001 (handed to the test's thread)
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]

    def test_bsp_applies_the_batch_weighted_mean_of_each_clocks_pushes(self):
        config, addresses = self.start_servers("bsp")
        # clock 0: both push over 16 samples, values 1 and 3 -> mean 2; clock 1: 2 over 4 samples
        # and 5 over 12 -> (8 + 60) / 16 = 4.25; clock 2: one pushes an empty batch -> the other's
        pushes = {0: [(16, 1.0), (4, 2.0), (16, 7.0)], 1: [(16, 3.0), (12, 5.0), (0, 100.0)]}
        means = [2.0, 4.25, 7.0]
        thetas = {}

        def body(c, theta):
            start = theta.copy()
            seen = []
            for clock, (batch, value) in enumerate(pushes[c.rank]):
                info = c.push(clock, batch, np.full(P, value, np.float32), theta if clock < 2 else None)
                if clock < 2:
                    seen.append(theta.copy())
                    self.assertEqual((info.min_version, info.max_version), (clock + 1, clock + 1))
            c.pull(3, theta)
            seen.append(theta.copy())
            c.bye(3)
            thetas[c.rank] = (start, seen)

        self.run_workers(config, addresses, body)
        self.servers_end()
        start, seen = thetas[0]
        np.testing.assert_array_equal(start, thetas[1][0], "both workers pulled the same θ0")
        expect = start.copy()
        for clock, mean in enumerate(means):
            expect = (expect - np.float32(LR) * np.float32(mean)).astype(np.float32)
            np.testing.assert_allclose(seen[clock], expect, rtol=0, atol=1e-6, err_msg=f"θ after clock {clock}")
            np.testing.assert_array_equal(seen[clock], thetas[1][1][clock], f"both workers see θ after clock {clock}")

    def test_asp_applies_every_push_once(self):
        config, addresses = self.start_servers("asp")
        final = {}

        def body(c, theta):
            start = theta.copy()
            barrier.wait(30)  # both workers pulled θ0 (asp holds no one: the other could have pushed already)
            for clock in range(3):
                c.push(clock, 16, np.full(P, 1.0 + c.rank, np.float32))  # acknowledged, nothing comes back
            barrier.wait(30)  # both workers' pushes are in
            info = c.pull(3, theta)
            final[c.rank] = (start, theta.copy(), info)
            c.bye(3)

        barrier = threading.Barrier(2)
        self.run_workers(config, addresses, body)
        self.servers_end()
        start, theta, info = final[0]
        self.assertEqual(info.min_version, 6, "each of the 6 pushes applied once, on every shard")
        np.testing.assert_allclose(theta, start - LR * 3 * (1.0 + 2.0), rtol=0, atol=1e-5)

    def test_an_external_model_starts_from_its_theta_file(self):
        # model.kind = "external": the servers know only its tensors' sizes and θ0 (a file of
        # float32); the workers are the user's
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="pslab-pyclient-"))
        theta0 = (np.arange(128, dtype=np.float32) * np.float32(0.01) - np.float32(0.5)).astype(np.float32)
        theta0.tofile(self.tmp / "theta0.f32")
        config, addresses = self.start_servers(
            "bsp", f'kind = "external"\nsizes = [100, 20, 8]\ntheta_file = "{self.tmp / "theta0.f32"}"')
        pulled = {}

        def body(c, theta):
            pulled[c.rank] = theta.copy()
            c.push(0, 16, np.full(128, 2.0 + 2 * c.rank, np.float32), theta)  # the mean: 3
            pulled[(c.rank, 1)] = theta.copy()
            c.bye(1)

        self.run_workers(config, addresses, body, params=128)
        self.servers_end()
        np.testing.assert_array_equal(pulled[0], theta0)
        np.testing.assert_array_equal(pulled[1], theta0)
        np.testing.assert_allclose(pulled[(0, 1)], theta0 - np.float32(LR) * np.float32(3.0), rtol=0, atol=1e-6)
        # pslab_worker does not train it, and says whose workers it needs
        r = subprocess.run([str(BUILD / "worker" / "pslab_worker"), "ps", "-c", str(config), "--rank", "0",
                            "--servers", ",".join(addresses), "-o", str(self.tmp / "out")], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('model.kind = "external": its workers are your own', r.stderr)

    def test_workers_share_out_each_epoch_as_pslab_worker_does(self):
        # 256 samples, 2 workers, batch 16: 8 steps an epoch each; per epoch the two workers'
        # batches are disjoint and cover every sample; another epoch, another permutation; the
        # same rank draws the same batches (the run's seed); data.kind = "external" counts samples
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="pslab-pyclient-"))
        config = self.tmp / "share.toml"
        config.write_text(CONFIG.replace("MODE", "asp").replace("steps = 3", "epochs = 2.0"))
        addresses = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]  # (nothing is sent)
        clients = [pslab.Client(config, r, addresses) for r in (0, 1)]
        self.assertEqual([(c.steps_per_epoch, c.total_steps) for c in clients], [(8, 16)] * 2)
        epochs = []
        for epoch in (0, 1):
            drawn = [list(c.batch(step)) for c in clients for step in range(8 * epoch, 8 * epoch + 8)]
            self.assertEqual([len(b) for b in drawn], [16] * 16)
            self.assertEqual(sorted(i for b in drawn for i in b), list(range(256)))
            epochs.append(drawn)
        self.assertNotEqual(epochs[0], epochs[1])
        again = pslab.Client(config, 1, addresses)
        self.assertEqual(list(again.batch(9)), list(clients[1].batch(9)))
        with self.assertRaisesRegex(pslab.PslabError, "step -1 < 0"):
            again.batch(-1)
        for c in clients + [again]:
            c.close()
        external = self.tmp / "external-data.toml"
        external.write_text(config.read_text().replace('[model]\nkind = "linear"', '[model]\nkind = "external"\nsizes = [10]')
                            .replace('kind = "logistic"', 'kind = "external"').replace("train_samples = 256", "train_samples = 1000"))
        with pslab.Client(external, 0, addresses) as c:
            self.assertEqual((c.num_params, c.steps_per_epoch), (10, 32), "1000 samples over 2 workers, batch 16")
        with self.assertRaisesRegex(pslab.PslabError, 'data.kind: "external" .* needs model.kind = "external"'):
            pslab.Client(self.write("mixed.toml", config.read_text().replace('kind = "logistic"', 'kind = "external"')), 0,
                         addresses)

    def write(self, name, text):
        path = self.tmp / name
        path.write_text(text)
        return path

    def test_softmax_regression_in_numpy_trains_as_pslab_worker_does(self):
        # bsp, one worker, 100 steps of plain SGD on pslab's logistic data: pslab_worker (C++,
        # OpenBLAS) and a NumPy worker of the same model (its batches from batch(), its data from
        # train_set(), θ0 from the servers) give the same loss at every step, within float32
        def one_worker(text):
            return text.replace("workers = 2", "workers = 1").replace("steps = 3", "steps = 100\nlog_every = 1")
        config, addresses = self.start_servers("bsp", edit=one_worker)
        out = self.tmp / "cpp"
        r = subprocess.run([str(BUILD / "worker" / "pslab_worker"), "ps", "-c", str(config), "--rank", "0", "--servers",
                            ",".join(addresses), "-o", str(out), "-q"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.servers_end()
        rows = [json.loads(line) for line in (out / "metrics" / "worker0.jsonl").read_text().splitlines()]
        cpp = [row["loss"] for row in rows if row.get("kind") == "train"]
        self.assertEqual(len(cpp), 100)

        _, addresses = self.start_servers("bsp", edit=one_worker)  # the same config, new servers
        losses = []
        with pslab.Client(config, 0, addresses) as c:
            x, labels, features = c.train_set()
            x = np.frombuffer(x, np.float32).reshape(-1, features)
            labels = np.frombuffer(labels, np.int32)
            theta = np.zeros(c.num_params, np.float32)
            W, b = theta[:features * 4].reshape(features, 4), theta[features * 4:]  # views: Linear's (in, out), then bias
            c.metrics(self.tmp / "py")
            c.connect()
            info = c.pull(0, theta)
            for step in range(c.total_steps):
                t0 = time.perf_counter()
                idx = np.frombuffer(c.batch(step), np.uint32)
                xb, yb = x[idx], labels[idx]
                z = xb @ W + b
                z = z - z.max(axis=1, keepdims=True)
                p = np.exp(z)
                p /= p.sum(axis=1, keepdims=True)
                losses.append(float(-np.log(p[np.arange(len(idx)), yb]).mean()))
                p[np.arange(len(idx)), yb] -= 1
                p /= np.float32(len(idx))
                grad = np.concatenate([(xb.T @ p).ravel(), p.sum(axis=0)]).astype(np.float32)
                t1 = time.perf_counter()
                version = info.min_version
                info = c.push(step, len(idx), grad, theta if step + 1 < c.total_steps else None)
                c.step(step, losses[-1], len(idx), t1 - t0, time.perf_counter() - t1, info.held_us * 1e-6, version)
            c.bye(c.total_steps)
        self.servers_end()
        self.assertLess(losses[-1], 0.5 * losses[0], "it learned")
        np.testing.assert_allclose(losses, cpp, rtol=1e-5, atol=0)  # (4e-7 measured)
        # and its metrics are pslab_worker's: the same lines, fields and steps
        py = [json.loads(line) for line in (self.tmp / "py" / "metrics" / "worker0.jsonl").read_text().splitlines()]
        self.assertEqual([(row["kind"], sorted(row)) for row in py], [(row["kind"], sorted(row)) for row in rows])
        self.assertEqual([row["step"] for row in py if row["kind"] == "train"], [row["step"] for row in rows if row["kind"] == "train"])
        np.testing.assert_allclose([row["loss"] for row in py if row["kind"] == "train"], cpp, rtol=1e-5, atol=0)

    def test_ctrl_c_ends_a_call_waiting_on_the_servers(self):
        # Defect: Python runs its SIGINT handler only once the C call returns, and the waits inside
        # went on to their timeout (timeout_s: 20 s here, 60 s by default; the evaluator's, none).
        config, addresses = self.start_servers("bsp", edit=lambda t: t + "[eval]\ninterval_s = 1000\nevery_epochs = 0\n")
        env = dict(os.environ, PYTHONPATH=str(REPO / "worker" / "python"))
        evaluator = (f"c.metrics({str(self.tmp / 'ev')!r}); c.connect(); c.next_theta(theta); c.eval(1.0, 0.5); "
                     f"c.next_theta(theta)")  # (the first θ is taken at once; the next is due in 1000 s)
        for rank, call in ((0, "c.begin(theta)"), (-1, evaluator)):  # (the start barrier: worker 1 never comes)
            with self.subTest(rank=rank):
                script = (f"import numpy as np, pslab\nc = pslab.Client({str(config)!r}, {rank}, {addresses!r})\n"
                          f"theta = np.zeros(c.num_params, np.float32)\nprint('waiting', flush=True)\n{call}\n")
                p = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
                self.addCleanup(lambda p=p: p.poll() is None and (p.kill(), p.wait()))
                self.assertEqual(p.stdout.readline().strip(), "waiting")
                time.sleep(0.5)  # (inside the call)
                p.send_signal(signal.SIGINT)
                try:
                    _, err = p.communicate(timeout=5)
                except subprocess.TimeoutExpired:
                    self.fail("the call went on waiting after Ctrl-C")
                self.assertIn("KeyboardInterrupt", err, (p.returncode, err))

    def test_a_ctrl_c_caught_between_calls_ends_no_later_call(self):
        # A script that catches KeyboardInterrupt (to finish cleanly) calls on: a Ctrl-C that came
        # outside any call is Python's, not the next call's wait's to end.
        config, addresses = self.start_servers("asp", edit=lambda t: t.replace("workers = 2", "workers = 1"))
        env = dict(os.environ, PYTHONPATH=str(REPO / "worker" / "python"))
        script = (f"import os, signal, time, numpy as np, pslab\nc = pslab.Client({str(config)!r}, 0, {addresses!r})\n"
                  "theta = np.zeros(c.num_params, np.float32)\n"
                  "try:\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(5)\nexcept KeyboardInterrupt:\n    pass\n"
                  "c.begin(theta)\nprint('began', flush=True)\n")
        p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("began", p.stdout)

    def test_the_package_is_python_3_9(self):
        # pslab's Python side promises CPython >= 3.9: its grammar (this machine runs 3.11)
        import ast
        for path in [*(REPO / "worker" / "python").rglob("*.py"), *(REPO / "experiments" / "torch").glob("*.py")]:
            with self.subTest(path=path.name):
                ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))

    def test_bad_calls_raise_naming_the_problem(self):
        config, addresses = self.start_servers("asp")
        with self.assertRaisesRegex(pslab.PslabError, r"rank 7 is not in \[0, cluster.workers = 2\)"):
            pslab.Client(config, 7, addresses)
        with self.assertRaisesRegex(pslab.PslabError, "1 server address"):
            pslab.Client(config, 0, addresses[:1])
        with self.assertRaisesRegex(pslab.PslabError, "no-such.toml"):
            pslab.Client(self.tmp / "no-such.toml", 0, addresses)
        c = pslab.Client(config, 0, addresses)
        with self.assertRaisesRegex(ValueError, f"grad holds 5 floats; this run's θ has {P}"):
            c.push(0, 16, np.zeros(5, np.float32))
        with self.assertRaisesRegex(TypeError, "float32 values are needed"):
            c.push(0, 16, np.zeros(P, np.float64))
        with self.assertRaisesRegex(TypeError, "a buffer of float32 values is needed"):
            c.pull(0, [0.0] * P)
        with self.assertRaisesRegex(ValueError, "read-only"):
            ro = np.zeros(P, np.float32)
            ro.setflags(write=False)
            c.pull(0, ro)
        c.close()
        with self.assertRaisesRegex(pslab.PslabError, "worker 0: the client is closed"):
            c.pull(0, np.zeros(P, np.float32))
        # a worker whose config is not the servers': refused by them, saying so
        with pslab.Client(config, 0, addresses, overrides=["optimizer.lr=0.25"]) as c:
            with self.assertRaisesRegex(pslab.PslabError, r"server \d at tcp://127.0.0.1:\d+: config: peer's config differs"):
                c.connect()
        # servers that are not there: named, with their addresses, once cluster.timeout_s is over
        dead = [f"tcp://127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2)]
        quick = self.tmp / "quick.toml"
        quick.write_text(config.read_text().replace("timeout_s = 20.0", "timeout_s = 2.0"))
        with pslab.Client(quick, 0, dead) as c:
            with self.assertRaisesRegex(pslab.PslabError, dead[0].replace(".", r"\.")):
                c.connect()


if __name__ == "__main__":
    unittest.main()
