"""tests/bench/bench_against.py's own logic (no timing asserted): both builds run in turn round
by round, every invocation kept, each figure summarised with its per-round ratio; bad calls
refused with exit 2, naming what was wrong. The base here is this build itself (--base-build),
so no second tree is built.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

REPO = pathlib.Path(__file__).resolve().parents[1]
TOOL = REPO / "tests" / "bench" / "bench_against.py"
BUILD = pathlib.Path(os.environ.get("PSLAB_BUILD", REPO / "build"))


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=240)


class BenchAgainst(unittest.TestCase):
    def test_both_builds_run_in_turn_and_every_figure_gets_its_ratio(self):
        with tempfile.TemporaryDirectory() as d:
            out = pathlib.Path(d) / "against.json"
            p = run("HEAD", "--base-build", str(BUILD), "--quick", "--rounds", "2", "--only", "train,ps-shm", "--json", str(out))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            result = json.loads(out.read_text())
        self.assertEqual(sorted(result["benchmarks"]), ["ps-shm", "train"])
        train = result["benchmarks"]["train"]
        self.assertEqual(train["command"][0], "bench_train")
        self.assertEqual(len(train["rounds"]), 2)
        for r in train["rounds"]:
            self.assertEqual(sorted(r), ["base", "new"])
            self.assertGreater(r["base"]["json"]["median_samples_per_s"], 0)
            self.assertGreater(r["new"]["json"]["median_samples_per_s"], 0)
        s = train["summary"]["samples/s"]
        self.assertEqual(s["rounds"], 2)
        self.assertTrue(s["min"] <= s["speed_per_round"] <= s["max"])
        # push+pull: time, lower is better: the ratio is base's time over this build's
        r0 = result["benchmarks"]["ps-shm"]["rounds"][0]
        b, n = (r0[k]["json"]["results"][0]["pslab"]["push_pull_us"] for k in ("base", "new"))
        fig = result["benchmarks"]["ps-shm"]["summary"]["push+pull 4 KiB, us"]
        self.assertEqual(fig["rounds"], 2)
        self.assertTrue(fig["min"] <= b / n <= fig["max"])
        self.assertIn("speed this/base per round", p.stdout)

    def test_bad_calls_are_refused_naming_what_was_wrong(self):
        for args, says in [(["no-such-commit"], "'no-such-commit' is not a commit"),
                           (["HEAD", "--only", "train,gpu"], "unknown benchmark gpu"),
                           (["HEAD", "--rounds", "0"], "--rounds must be at least 1"),
                           (["HEAD", "--base-build", "/nonexistent", "--only", "cnn"], "has no bench_train in /nonexistent/tests")]:
            p = run(*args)
            self.assertEqual(p.returncode, 2, f"{args}: {p.stdout}{p.stderr}")
            self.assertIn(says, p.stderr, args)


if __name__ == "__main__":
    unittest.main()
