"""CUDA MPS for runs whose processes share a GPU (experiments/launcher/mps.py): when the launcher
starts a daemon of the run's own, that its processes are pointed at it, and that nothing of it is
left when the run ends, fails or is interrupted. This machine has no GPU: nvidia-smi and
nvidia-cuda-mps-control are stand-ins, and the run's GPU workers fail at start (no CUDA device),
which is itself a way for a run to end.
"""
import json
import os
import pathlib
import signal
import sys
import threading
import time
import types
import unittest

from tests.launcher.helpers import REPO, LauncherTestCase

sys.path.insert(0, str(REPO / "experiments"))
from launcher import mps  # noqa: E402

# A stand-in MPS control: `-d` starts a "daemon" (a sleep in a session of its own, with the run's
# pipe directory in its environment, as the real one has) and records its pid; "quit" on stdin
# stops it, unless $MPS_IGNORES_QUIT; $MPS_FAILS makes -d fail, $MPS_SLOW_START return 5 s after
# the daemon started. Every call is logged.
CONTROL = """\
    #!/bin/bash
    echo "$* ${CUDA_MPS_PIPE_DIRECTORY} ${CUDA_MPS_LOG_DIRECTORY}" >> "$MPS_CALLS"
    if [[ $1 == -d ]]; then
      [[ -n $MPS_FAILS ]] && { echo "An instance of this daemon is already running" >&2; exit 1; }
      setsid sleep 600 < /dev/null > /dev/null 2>&1 &
      echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
      [[ -n $MPS_SLOW_START ]] && sleep 5
      exit 0
    fi
    read -r cmd
    echo "stdin: $cmd" >> "$MPS_CALLS"
    [[ $cmd == quit && -z $MPS_IGNORES_QUIT ]] && kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")"
    exit 0
    """

SMI = """\
    #!/bin/bash
    for ((i = 0; i < ${FAKE_GPUS:-1}; i++)); do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
    """


def plan_of(device="cuda", launcher="local", mps_key="auto", workers=2):
    procs = [{"name": "server0", "role": "server", "rank": 0}]
    procs += [{"name": f"worker{r}", "role": "worker", "rank": r} for r in range(workers)]
    procs += [{"name": "evaluator", "role": "evaluator", "rank": -1}]
    return types.SimpleNamespace(device=device, launcher=launcher, mps=mps_key, virtual=False, processes=procs)


def gpus(n):
    return lambda host, launcher: None if n is None else [f"GPU {i}: X" for i in range(n)]


class Mps(LauncherTestCase):

    def test_decisions(self):
        wanted, why = mps.decide_mps(plan_of(), gpus(1))
        self.assertTrue(wanted)
        self.assertEqual(why, 'cluster.mps = "auto": worker0, worker1, evaluator share GPU 0: a private MPS daemon for the run')
        self.assertEqual(mps.decide_mps(plan_of(), gpus(3)), (False, None))  # a GPU each
        self.assertTrue(mps.decide_mps(plan_of(workers=3), gpus(3))[0])    # 4 GPU processes on 3 GPUs
        self.assertTrue(mps.decide_mps(plan_of(mps_key="on"), gpus(8))[0])
        self.assertEqual(mps.decide_mps(plan_of(mps_key="off"), gpus(1)), (False, None))
        self.assertEqual(mps.decide_mps(plan_of(device="cpu"), gpus(1)), (False, None))
        self.assertEqual(mps.decide_mps(plan_of(), gpus(None)), (False, None))  # GPUs unknown: no guess
        self.assertTrue(mps.decide_mps(plan_of(mps_key="on"), gpus(None))[0])
        wanted, why = mps.decide_mps(plan_of(launcher="ssh", mps_key="on"), gpus(1))
        self.assertFalse(wanted)
        self.assertIn("local launcher only", why)

    def gpu_run(self, **env):
        """tiny.toml on "cuda" (its 2 workers and evaluator on this one stand-in GPU): it fails at
        start here. Returns (launch result, the control's calls, the run directory)."""
        self.fake_bin("nvidia-smi", SMI)
        self.fake_bin("nvidia-cuda-mps-control", CONTROL)
        calls = self.tmp / "mps-calls.log"
        self.env.update(MPS_CALLS=str(calls), **env)
        path = self.tiny_variant("gpu.toml", [("[train]", '[train]\ndevice = "cuda"')])
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots")
        runs = [p.parent for p in self.runs.glob("*/*/run/summary.json")] or [p.parent for p in self.runs.glob("*/*/summary.json")]
        return r, calls.read_text() if calls.exists() else "", runs[0] if runs else None

    def assert_nothing_left(self, pipe):
        self.assertFalse(os.path.exists(pipe), f"the MPS pipe directory {pipe} is left")
        self.assertEqual(mps._pids_with_pipe(pipe), [], "a process of the run's MPS daemon is left")

    def test_a_run_that_ends_leaves_no_daemon(self):
        r, calls, run = self.gpu_run()
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)  # no CUDA device here: the workers fail
        self.assertIn('cluster.mps = "auto": worker0, worker1, evaluator share GPU 0: a private MPS daemon', r.stdout)
        lines = calls.splitlines()
        self.assertEqual(lines[0].split()[0], "-d", calls)
        pipe, log = lines[0].split()[1:3]
        self.assertTrue(pipe.startswith("/tmp/pslab-mps-"), pipe)
        self.assertEqual(pathlib.Path(log).resolve(), (run / "mps").resolve())
        self.assertIn("stdin: quit", calls)
        self.assertEqual(json.loads((run / "manifest.json").read_text()).get("mps_pipe_dir"), pipe)
        self.assert_nothing_left(pipe)
        self.assert_no_processes_left()

    def test_a_dry_run_says_it_and_starts_none(self):
        self.fake_bin("nvidia-smi", SMI)
        self.fake_bin("nvidia-cuda-mps-control", CONTROL)
        calls = self.tmp / "mps-calls.log"
        self.env.update(MPS_CALLS=str(calls))
        path = self.tiny_variant("gpu.toml", [("[train]", '[train]\ndevice = "cuda"')])
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn('# cluster.mps = "auto": worker0, worker1, evaluator share GPU 0: a private MPS daemon for the run '
                      "(made at launch, stopped when the run ends)", r.stdout)
        self.assertFalse(calls.exists())
        self.assertFalse(self.runs.exists())

    def test_a_daemon_that_ignores_quit_is_killed(self):
        r, calls, _ = self.gpu_run(MPS_IGNORES_QUIT="1")
        pipe = calls.splitlines()[0].split()[1]
        self.assertIn("stdin: quit", calls)
        self.assert_nothing_left(pipe)

    def test_one_process_per_gpu_or_off_starts_none(self):
        self.fake_bin("nvidia-smi", SMI)
        self.fake_bin("nvidia-cuda-mps-control", CONTROL)
        calls = self.tmp / "mps-calls.log"
        for fake_gpus, key in (("3", ""), ("1", 'mps = "off"\n')):
            with self.subTest(gpus=fake_gpus, key=key):
                self.env.update(MPS_CALLS=str(calls), FAKE_GPUS=fake_gpus)
                path = self.tiny_variant("gpu.toml", [("[train]", '[train]\ndevice = "cuda"'), ("[cluster]", "[cluster]\n" + key)])
                r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots")
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertNotIn("MPS", r.stdout + r.stderr)
                self.assertFalse(calls.exists(), calls.read_text() if calls.exists() else "")

    def test_mps_that_cannot_start_is_said_in_one_line_and_the_run_goes_on(self):
        r, calls, run = self.gpu_run(MPS_FAILS="1")
        warning = [l for l in r.stderr.splitlines() if "MPS could not start" in l]
        self.assertEqual(len(warning), 1, r.stderr)
        self.assertIn("already running", warning[0])
        self.assertIn("the run goes on without it", warning[0])
        self.assertIsNotNone(run, "the run did not go on")
        self.assertNotIn("mps_pipe_dir", json.loads((run / "manifest.json").read_text()))
        self.assert_nothing_left(calls.splitlines()[0].split()[1])

    def test_no_mps_control_is_one_line_and_the_run_goes_on(self):
        if mps.shutil.which(mps.CONTROL, path=self.env["PATH"]):
            self.skipTest(f"{mps.CONTROL} is installed here")
        self.fake_bin("nvidia-smi", SMI)
        path = self.tiny_variant("gpu.toml", [("[train]", '[train]\ndevice = "cuda"')])
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)  # the workers: no CUDA device here
        self.assertEqual([l for l in r.stderr.splitlines() if "MPS" in l],
                         [f"launch.py: cluster.mps: {mps.CONTROL} is not on PATH: the run's processes share "
                          "their GPUs without MPS"], r.stderr)

    def test_an_interrupt_while_the_daemon_starts_leaves_nothing(self):
        # Defect: only the block was guarded; a Ctrl-C during `-d` (which may take seconds) left
        # the daemon running and its pipe directory behind.
        self.fake_bin("nvidia-cuda-mps-control", CONTROL)
        calls = self.tmp / "mps-calls.log"
        saved = dict(os.environ)
        os.environ.update(PATH=self.env["PATH"], MPS_CALLS=str(calls), MPS_SLOW_START="1")
        ctrl_c = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))
        try:
            with self.assertRaises(KeyboardInterrupt):
                ctrl_c.start()
                with mps.mps_daemon(plan_of(mps_key="on"), self.tmp, gpus(1)):
                    self.fail("the block ran before the daemon's start returned")
        finally:
            ctrl_c.cancel()
            os.environ.clear()
            os.environ.update(saved)
        self.assert_nothing_left(calls.read_text().split()[1])

    def test_an_interrupted_block_stops_the_daemon(self):
        self.fake_bin("nvidia-cuda-mps-control", CONTROL)
        calls = self.tmp / "mps-calls.log"
        saved = dict(os.environ)
        os.environ.update(PATH=self.env["PATH"], MPS_CALLS=str(calls))
        try:
            with self.assertRaises(KeyboardInterrupt):
                with mps.mps_daemon(plan_of(mps_key="on"), self.tmp, gpus(1)) as env:
                    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
                    # (The stand-in's daemon is a background sleep, which may still be between
                    # exec()s when its starter returns: under load, give it a moment.)
                    deadline = time.time() + 10
                    while not mps._pids_with_pipe(pipe) and time.time() < deadline:
                        time.sleep(0.05)
                    self.assertEqual(len(mps._pids_with_pipe(pipe)), 1, "the daemon did not start")
                    self.assertEqual(os.stat(pipe).st_mode & 0o777, 0o700)
                    raise KeyboardInterrupt
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.assert_nothing_left(pipe)


if __name__ == "__main__":
    unittest.main()
