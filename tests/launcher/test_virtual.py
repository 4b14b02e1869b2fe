"""The virtual cluster (every mode in simulated time, in one process, deterministic) and replay of a
real run's order traces (bit for bit, and a reordered or damaged trace named).
"""
import json
import pathlib
import subprocess
import sys
import unittest

from tests.launcher.helpers import BUILD, TINY, LauncherTestCase

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "experiments"))  # (launcher parts, tested alone)


class Virtual(LauncherTestCase):
    """The virtual cluster and replay."""

    def test_virtual_cluster_runs_every_mode_in_simulated_time(self):
        path = self.tiny_variant("virtual.toml", [('mode = "bsp"', 'mode = ["bsp", "asp", "allreduce"]'),
                                                  ("workers = 2", "workers = 4"), ("servers = 1", "servers = 2"),
                                                  ("[cluster]", '[cluster]\nlauncher = "virtual"'),
                                                  ("[straggler]", "[straggler]\nworkers = [3]\nslowdown = 3.0")],
                                 append="\n[virtual]\ncompute_ms = 2.0\n")
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        inv = self.only_invocation("tiny")
        sums = {}
        for d in inv.iterdir():
            if (d / "summary.json").exists():
                s = json.loads((d / "summary.json").read_text())
                sums[s["mode"]] = s
        self.assertEqual(sorted(sums), ["allreduce", "asp", "bsp"])
        for mode, s in sums.items():
            self.assertEqual((s["status"], s["simulated"]), ("ok", True), mode)
            self.assertGreater(s["final_test_acc"], 0.85, mode)
            # one process ran it all, no socket, no key; the metrics are a real run's, in simulated time
            m = json.loads((inv / f"mode={mode}" / "manifest.json").read_text())
            self.assertEqual([p["name"] for p in m["processes"]], ["virtual"])
            self.assertTrue(m["simulated"])
            self.assertFalse((inv / f"mode={mode}" / "run.key").exists())
        # simulated time: the straggler sets bsp's pace: 500 steps of 3 x 2 ms compute + 5 ms delay + comm
        train = [json.loads(x) for x in (inv / "mode=bsp" / "metrics" / "worker0.jsonl").read_text().splitlines()]
        self.assertGreater(train[-1]["t"], 500 * 11e-3)
        self.assertLess(train[-1]["t"], 500 * 12e-3)
        self.assertAlmostEqual(train[-1]["compute_ms"], 2.0, places=6)
        self.assertEqual(sums["bsp"]["staleness"]["max"], 0)
        self.assertGreater(sums["asp"]["staleness"]["mean"], 0.5)  # the straggler's pushes are stale
        self.assertIn("(simulated)", r.stdout)
        # deterministic: the same config again, the same metrics
        again = self.tmp / "again"
        r = self.launch("run", path, "--runs-dir", again, "--no-plots", "--set", 'cluster.mode="asp"')
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run2 = next(d for d in (again / "tiny").glob("*/run") if not d.parent.is_symlink())
        for name in ("server0.jsonl", "worker3.jsonl"):
            self.assertEqual((inv / "mode=asp" / "metrics" / name).read_text(), (run2 / "metrics" / name).read_text(), name)

    def test_calibrate_measures_the_configs_own_servers_and_fits_the_cost_model(self):
        # A sweep whose first point is an all-reduce run (no servers), as the default comparison's:
        # the asp calibration run still has the 2 servers of the config's PS runs, and the round
        # trip is fitted per shard of 2.
        path = self.tiny_variant("cal.toml", [('mode = "bsp"', 'mode = ["allreduce", "asp"]'),
                                              ("servers = 1", "servers = 2")])
        out = self.tmp / "cal.json"
        r = self.launch("calibrate", path, "--steps", "40", "--runs-dir", self.runs, "--out", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("asp with 2 server(s)", r.stdout)
        c = json.loads(out.read_text())
        self.assertEqual((c["workers"], c["servers"], c["steps"]), (2, 2, 40))
        for key in ("virtual.compute_ms", "virtual.bandwidth_gbps", "virtual.allreduce_ms", "virtual.startup_ms"):
            self.assertGreater(c["set"][key], 0, key)
        # the fit reproduces the measured round trip of one shard (2 latency + 2 b / bw + b / apply)
        # within 1% (the bandwidth was rounded to 4 decimals of GB/s: a tiny shard's, 0.0021 GB/s
        # for a round trip of 0.25 ms, then 0.0 past 10 ms)
        b = 4 * 132 / 2  # bytes of one shard: the tiny model's 4 x (32 + 1) parameters over 2 servers
        s = c["set"]
        rt_ms = 2 * s["virtual.latency_us"] * 1e-3 + 2 * b / (s["virtual.bandwidth_gbps"] * 1e6) + \
            b / (s["virtual.apply_gbps"] * 1e6)
        measured = c["measured_ms_per_step"]["asp"]["comm"]
        self.assertAlmostEqual(rt_ms, measured, delta=0.01 * measured)

    def test_the_virtual_subcommand_is_the_virtual_cluster_whatever_the_configs_launcher(self):
        # Defect: `pslab_worker virtual` with a config of the local launcher decided overlap as a
        # real run does: pushes left during simulated backward (wait_ms over comm_ms).
        out = self.tmp / "v"
        r = subprocess.run([str(BUILD / "worker" / "pslab_worker"), "virtual", "-q", "-c", str(TINY), "-o", str(out),
                            "--set", "train.steps=40", "--set", "virtual.compute_ms=10", "--set", "straggler.workers=[1]",
                            "--set", "straggler.slowdown=4", "--set", "straggler.delay_ms=0"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("overlapped", r.stderr)
        rows = [json.loads(line) for line in (out / "metrics" / "worker0.jsonl").read_text().splitlines()]
        for row in (x for x in rows if x["kind"] == "train"):
            self.assertLessEqual(row["wait_ms"], row["comm_ms"] + 1e-9, row)

    def test_a_round_trip_shorter_than_the_configs_latency_fits_the_latency(self):
        # A round trip under 2 x virtual.latency_us: the bandwidth was set to 100 GB/s and the
        # config's latency kept, a model slower than what was measured.
        from launcher.calibrate import fit_round_trip
        for measured_ms, b in ((0.03, 264.0), (5.0, 4e6), (0.2, 1e3)):
            latency_us, gbps = fit_round_trip(measured_ms, b, 50.0, 5.0)
            rt_ms = 2 * latency_us * 1e-3 + 2 * b / (gbps * 1e6) + b / (5.0 * 1e6)
            self.assertAlmostEqual(rt_ms, measured_ms, delta=1e-3 * measured_ms, msg=(measured_ms, b))
        self.assertEqual(fit_round_trip(5.0, 4e6, 50.0, 5.0)[0], 50.0)  # (room for the bandwidth: latency kept)

    def test_replay_of_a_run_whose_pushes_travel_in_pieces(self):
        # A shard of 516 floats in pieces of 256 (cluster.piece_kib = 1): the trace has one line per
        # push, its pieces follow the first one through (the second piece was held for ever).
        path = self.tiny_variant("pieces.toml", [('mode = "bsp"', 'mode = "asp"'), ("dim = 32", "dim = 128"),
                                                 ("steps = 500", "steps = 100")])
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", "--set", "cluster.piece_kib=1")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_invocation("tiny") / "run"
        r = self.launch("replay", run, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("bit for bit: 1 shard checksum(s) equal", r.stdout)
        # The trace cut short: the replay names where it stood, not only a worker's wait that ran out.
        trace = run / "trace" / "server0.txt"
        lines = trace.read_text().splitlines()
        trace.write_text("\n".join(lines[:len(lines) // 2]) + "\n")
        r = self.launch("replay", run, "--no-plots")
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(r.stdout + r.stderr, r"replay of .*: server 0, operation \d+ \(the end of its trace\): worker \d's "
                                              r"push for step \d+ came after it \(the trace is cut short, or of another run\)")
        # ... or of another run, with more workers.
        trace.write_text("\n".join(lines) + "\npush 7 0 0 32\n")
        r = self.launch("replay", run, "--no-plots")
        self.assertIn(f"{trace}: operation {len(lines) + 1} is worker 7's, not one of this run's 2 (cluster.workers): "
                      "the trace is of another run", r.stdout + r.stderr)

    def test_replay_of_a_real_asp_run_ends_on_its_theta_bit_for_bit(self):
        self.runs = self.tmp / 'runs with "quotes", spaces and \\ in its name'  # (the replay names it in TOML)
        path = self.tiny_variant("asp4.toml", [('mode = "bsp"', 'mode = "asp"'), ("workers = 2", "workers = 4"),
                                               ("servers = 1", "servers = 2")])
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_invocation("tiny") / "run"
        traces = [(run / "trace" / f"server{k}.txt").read_text().splitlines() for k in (0, 1)]
        self.assertEqual(sum(line.startswith("push ") for line in traces[0]), 4 * 500)
        r = self.launch("replay", run, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("bit for bit: 2 shard checksum(s) equal", r.stdout)
        self.assertNotIn("numerics environment differs", r.stderr)
        s = json.loads((run / "replay" / "summary.json").read_text())
        self.assertTrue(s["replay_identical"])
        self.assertEqual(s["params_checksums"], s["recorded_params_checksums"])
        # a replay under another numerics environment than the run's says so, naming the variable
        recorded = json.loads((run / "manifest.json").read_text())["numerics_env"]
        r = self.launch("replay", run, "--no-plots", env=dict(self.env, OMP_SCHEDULE="dynamic"))
        self.assertIn("numerics environment differs from this one's (OMP_SCHEDULE: "
                      f"{recorded.get('OMP_SCHEDULE', '(unset)')} there, dynamic here)", r.stderr)
        # another worker's push moved before a push and pull it followed (worker W's push that asked
        # for θ back, and its answer): the replay serves W at another version than the run did, and
        # says so (the order is checked, not just read). Moved before W's push, not just before its
        # answer: a server answers such a pull as it applies the push, so in between it cannot go.
        lines = traces[0]
        i = next(i for i in range(1, len(lines) - 1)
                 if lines[i - 1].startswith("push ") and lines[i].startswith("pull ") and lines[i + 1].startswith("push ")
                 and lines[i - 1].split()[1] == lines[i].split()[1] != lines[i + 1].split()[1])
        lines.insert(i - 1, lines.pop(i + 1))
        (run / "trace" / "server0.txt").write_text("\n".join(lines) + "\n")
        r = self.launch("replay", run, "--no-plots")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"server 0, operation \d+ \(pull of worker \d, step \d+\): the shard is at version \d+, "
                                   r"the run served \d+")
        # a trace that is not one: named with its line
        (run / "trace" / "server1.txt").write_text("push 0 0 0 32\nnonsense\n")
        r = self.launch("replay", run, "--no-plots")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("server1.txt:2: not an order-trace line", r.stderr)


if __name__ == "__main__":
    unittest.main()
