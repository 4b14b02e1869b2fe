"""tests/gpu.sh's own logic, on a machine without a GPU: its steps in the order --only gives,
each timed into gpu-steps.json, skipped when its estimate no longer fits the --budget, stopped
(with what it started) when the budget ends, a failure named, and no GPU said as exit 77.

A stand-in `nvidia-smi` on PATH says there is a GPU, and PSLAB_GPU_SH_STEP runs a stand-in
step (tests/gpu.sh's hook for this) that prints its number, then sleeps or fails as told.
"""
import json
import os
import pathlib
import signal
import subprocess
import tempfile
import time
import unittest

REPO = pathlib.Path(__file__).resolve().parents[1]
GPU_SH = REPO / "tests" / "gpu.sh"

STAND_IN_STEP = """#!/usr/bin/env bash
# A stand-in step: $1 is its number, then gpu.sh's --quick or --lean if given; STEP_SLEEP_N /
# STEP_FAIL_N say what step N does.
echo "stand-in step $1 ran${2:+ with $2}"
sleep_var=STEP_SLEEP_$1 fail_var=STEP_FAIL_$1
if [[ -n ${!sleep_var:-} ]]; then
  sleep "${!sleep_var}" &
  echo $! > "$STEP_PIDS/$1"
  wait
fi
skip_var=STEP_SKIP_$1
[[ -z ${!skip_var:-} ]] || exit 77
[[ -z ${!fail_var:-} ]]
"""


def gone_within(pid, seconds):
    """True once `pid` has ended (a zombie not yet reaped counts as ended) within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


class GpuSh(unittest.TestCase):
    def setUp(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="pslab-gpu-sh-"))
        self.addCleanup(subprocess.run, ["rm", "-rf", str(self.dir)])
        bin_dir = self.dir / "bin"
        bin_dir.mkdir()
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho 'GPU 0: Stand-in GPU (UUID: GPU-0)'\n")
        step = self.dir / "step.sh"
        step.write_text(STAND_IN_STEP)
        for f in (smi, step):
            f.chmod(0o755)
        (self.dir / "pids").mkdir()
        (self.dir / "build").mkdir()
        self.env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PSLAB_GPU_SH_STEP=str(step),
                        STEP_PIDS=str(self.dir / "pids"))

    def run_gpu_sh(self, *args, env=None):
        t0 = time.monotonic()
        p = subprocess.run([str(GPU_SH), "--build-dir", str(self.dir / "build"), "--out", str(self.dir / "out"), *args],
                           env=env or self.env, capture_output=True, text=True, timeout=120)
        return p, time.monotonic() - t0

    def steps(self):
        return json.loads((self.dir / "out" / "gpu-steps.json").read_text())["steps"]

    def test_steps_run_in_the_order_asked_each_timed(self):
        p, _ = self.run_gpu_sh("--only", "8,1,2", env=dict(self.env, STEP_SLEEP_1="1"))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        ran = [line for line in p.stdout.splitlines() if line.startswith("stand-in step")]
        self.assertEqual(ran, ["stand-in step 8 ran", "stand-in step 1 ran", "stand-in step 2 ran"])
        steps = self.steps()
        self.assertEqual([(s["step"], s["status"]) for s in steps], [(8, "ok"), (1, "ok"), (2, "ok")])
        self.assertGreaterEqual(steps[1]["seconds"], 1)
        self.assertIn("stand-in step 1 ran", (self.dir / "out" / "gpu-step1.log").read_text())
        self.assertIn("every GPU check that ran passed", p.stdout)

    def test_a_failed_step_is_named_and_the_next_still_runs(self):
        p, _ = self.run_gpu_sh("--only", "1,2", env=dict(self.env, STEP_FAIL_1="1"))
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("FAILED: step 1", p.stdout)
        self.assertEqual([(s["step"], s["status"]) for s in self.steps()], [(1, "failed"), (2, "ok")])

    def test_a_step_with_nothing_to_run_it_is_listed_as_skipped_not_ok(self):
        # (step 7 without a PyTorch with CUDA): it was listed "ok", and "every check that ran passed"
        p, _ = self.run_gpu_sh("--only", "7,1", env=dict(self.env, STEP_SKIP_7="1"))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual([(s["step"], s["status"]) for s in self.steps()], [(7, "skipped"), (1, "ok")])
        self.assertIn("not run (the budget, or nothing here to run it with): step 7", p.stdout)

    def test_a_step_whose_estimate_does_not_fit_the_budget_is_skipped(self):
        p, _ = self.run_gpu_sh("--only", "1,3,2", "--budget", "60", "--estimate", "1=5", "--estimate", "3=100",
                               "--estimate", "2=5")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("step 3 skipped: about 100 s", p.stdout)
        self.assertIn("not run (the budget, or nothing here to run it with): step 3", p.stdout)
        self.assertEqual([(s["step"], s["status"]) for s in self.steps()], [(1, "ok"), (3, "skipped"), (2, "ok")])

    def test_a_step_still_running_when_the_budget_ends_is_stopped_with_what_it_started(self):
        p, took = self.run_gpu_sh("--only", "1,2", "--budget", "3", "--estimate", "1=1", "--estimate", "2=1",
                                  env=dict(self.env, STEP_SLEEP_1="60"))
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertLess(took, 30)
        self.assertIn("step 1 (stopped at the budget's end", p.stdout)
        self.assertEqual([(s["step"], s["status"]) for s in self.steps()], [(1, "stopped"), (2, "skipped")])
        sleeper = int((self.dir / "pids" / "1").read_text())
        self.assertTrue(gone_within(sleeper, 5.0), "the step's child outlived the budget")

    def test_ctrl_c_stops_the_running_step_and_what_it_started(self):
        # A terminal's Ctrl-C reaches gpu.sh's process group; `timeout` put the step in a group of
        # its own, so the step (and its GPU processes) ran on after gpu.sh had gone.
        for budget in (["--budget", "300"], []):
            with self.subTest(budget=budget):
                for f in (self.dir / "pids").iterdir():
                    f.unlink()
                p = subprocess.Popen([str(GPU_SH), "--build-dir", str(self.dir / "build"), "--out", str(self.dir / "out"),
                                      "--only", "1,2", "--estimate", "1=1", "--estimate", "2=1", *budget],
                                     env=dict(self.env, STEP_SLEEP_1="60"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
                pid_file = self.dir / "pids" / "1"
                deadline = time.monotonic() + 30
                while not (pid_file.exists() and pid_file.read_text().endswith("\n")) and time.monotonic() < deadline:
                    time.sleep(0.05)  # (the shell makes the file, then writes the pid)
                self.assertTrue(pid_file.exists(), "the stand-in step never started")
                sleeper = int(pid_file.read_text())
                os.killpg(p.pid, signal.SIGINT)
                try:
                    out, _ = p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    os.kill(sleeper, signal.SIGKILL)
                    self.fail("gpu.sh went on after Ctrl-C")
                alive = not gone_within(sleeper, 5.0)
                if alive:
                    os.kill(sleeper, signal.SIGKILL)
                self.assertFalse(alive, "the step's child outlived Ctrl-C")
                self.assertEqual(p.returncode, 130, out)
                self.assertIn("interrupted during step 1", out)
                self.assertNotIn("stand-in step 2 ran", out)

    def test_lean_steps_are_told_so_and_budgeted_with_their_own_estimates(self):
        p, _ = self.run_gpu_sh("--lean", "--only", "4,2", "--budget", "60")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("stand-in step 4 ran with --lean", p.stdout)
        self.assertIn("step 2 skipped: about 200 s", p.stdout)
        p, _ = self.run_gpu_sh("--only", "4", "--budget", "60")  # the full step 4: about 90 s
        self.assertIn("step 4 skipped: about 90 s", p.stdout)
        p, _ = self.run_gpu_sh("--quick", "--only", "4")
        self.assertIn("stand-in step 4 ran with --quick", p.stdout)

    def test_no_gpu_is_exit_77_and_bad_arguments_exit_2(self):
        no_gpu = dict(self.env, PATH="/usr/bin:/bin")  # (the build machine has no nvidia-smi)
        (self.dir / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
        p, _ = self.run_gpu_sh("--only", "1")
        self.assertEqual(p.returncode, 77, p.stdout + p.stderr)
        self.assertIn("no GPU here", p.stdout)
        for args, says in ((["--only", "9"], "step numbers 1-8"), (["--budget", "ten"], "whole seconds"),
                           (["--estimate", "2"], "STEP=SECONDS"), (["--quick", "--lean"], "not both")):
            p, _ = self.run_gpu_sh(*args, env=no_gpu)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn(says, p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
