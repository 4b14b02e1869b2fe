"""The evaluator's ticks in real runs: evaluations every so many epochs in every mode, and an
evaluation slower than the ticks losing none. Their bounds are on how late a tick's θ is taken, so
their CTest entry (launcher.Evaluations) runs alone (RUN_SERIAL).
"""
import json
import unittest

from tests.launcher.helpers import LauncherTestCase, TINY


class Evaluations(LauncherTestCase):
    """Evaluations at epoch ticks (timing-sensitive: run alone)."""

    def assert_every_tick_evaluated(self, epochs, every, first=1):
        """Each tick k * every, k >= first, up to the last evaluation's epoch has its evaluation,
        taken at an epoch in [tick, next tick): none lost, none taken early (a step is 1/64 epoch
        here, so a busy machine may take one a few steps late)."""
        for k in range(first, int(epochs[-1] / every + 1e-9) + 1):
            tick = k * every
            self.assertTrue(any(tick - 1e-9 <= e < tick + every - 1e-9 for e in epochs), (tick, epochs))
        self.assertEqual(epochs, sorted(epochs))

    def test_evaluations_every_so_many_epochs_in_every_mode(self):
        # eval.every_epochs = 0.25 over tiny's 7.8 epochs: about 31 evaluations, at ticks 0.25 apart,
        # however fast the run (PS: the evaluator's pulls; allreduce: rank 0's snapshots; virtual)
        for extra in ([], ["--set", 'cluster.mode="allreduce"'], ["--set", 'cluster.launcher="virtual"']):
            with self.subTest(extra=extra):
                runs = self.tmp / f"ee{len(list(self.tmp.glob('ee*')))}"
                r = self.launch("run", TINY, "--set", "eval.every_epochs=0.25", *extra, "--runs-dir", runs, "--no-plots")
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                run = next(d for d in (runs / "tiny").glob("*/run") if not d.parent.is_symlink())
                evals = [x for x in map(json.loads, (run / "metrics" / "evaluator.jsonl").read_text().splitlines())
                         if x.get("kind") == "eval"]
                self.assertGreaterEqual(len(evals), 30, extra)
                self.assertLessEqual(len(evals), 34, extra)
                self.assert_every_tick_evaluated([x["epoch"] for x in evals[:-1]], 0.25)  # the last: the final one
                self.assertTrue(evals[-1].get("final"), extra)
                if "allreduce" in str(extra):  # rank 0 sends θ before the first update (its first came after step 1)
                    self.assertEqual(evals[0]["epoch"], 0.0, extra)
                # t is when the evaluated θ was taken, eval_ms how long after that its evaluation
                # ended: θs are taken in order and evaluated in order
                for a, b in zip(evals, evals[1:]):
                    self.assertGreaterEqual(a["eval_ms"], 0.0, extra)
                    self.assertLessEqual(a["t"], b["t"], (extra, a, b))
                    self.assertLessEqual(a["t"] + a["eval_ms"] / 1e3, b["t"] + b["eval_ms"] / 1e3 + 1e-3, (extra, a, b))

    def test_a_slow_evaluation_loses_no_tick(self):
        # The evaluator takes θ at every 0.1-epoch tick and evaluates the queue at a lower CPU
        # priority: an evaluation slower than the ticks (a large test set in batches of 1) no
        # longer makes it skip ticks. Each line's t is when its θ was taken.
        # Workers at 20 ms a step: a tick is ~130 ms of training, so that a busy machine's late
        # wake-up (the evaluator looks every 20 ms) does not take a tick past the next one.
        r = self.launch("run", TINY, "--set", "eval.every_epochs=0.1", "--set", 'cluster.mode="asp"',
                        "--set", "data.test_samples=400000", "--set", "eval.batch=1", "--set", "straggler.delay_ms=20",
                        "--set", "train.steps=300", "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_invocation("tiny") / "run"
        evals = [x for x in map(json.loads, (run / "metrics" / "evaluator.jsonl").read_text().splitlines())
                 if x.get("kind") == "eval"]
        # The evaluator joins once its 400,000 test samples are made, and the workers do not wait
        # for it: ticks count from the first θ it took.
        epochs = [x["epoch"] for x in evals[:-1]]
        self.assert_every_tick_evaluated(epochs, 0.1, first=int(epochs[0] / 0.1 + 1e-9) + 1)
        self.assertLess(epochs[0], 1.0, "the evaluator's first θ came after a whole epoch")
        # ... and up to the end: ticks lost after the first ones left nothing to check above
        self.assertGreater(epochs[-1], evals[-1]["epoch"] - 0.25, (epochs, evals[-1]["epoch"]))
        self.assertGreater(max(x["eval_ms"] for x in evals), 50.0, "the evaluations were not slower than the ticks")
        ts = [x["t"] for x in evals]
        self.assertEqual(ts, sorted(ts))


if __name__ == "__main__":
    unittest.main()
