"""Resuming and restarting from checkpoints: Ctrl-C then `launch.py resume` ends like a run never
stopped; a killed asp server is restarted from its checkpoint and the run ends ok.
"""
import json
import os
import re
import signal
import stat
import sys
import time
import unittest

from tests.launcher.helpers import REPO, LauncherTestCase, option, wait_until

sys.path.insert(0, str(REPO / "experiments"))  # (the launcher's own parts, tested alone)
from launcher.placement import shard_checkpoint  # noqa: E402


class Resume(LauncherTestCase):
    """Checkpoints: a run resumed, a server restarted."""

    def test_a_replicated_shard_resumes_from_the_copy_that_served_it_last(self):
        # cluster.replicas = 2: the backup that took over writes backup<k>.ckpt, which resume
        # never read (server<k>.ckpt: the dead primary's older file, or the initial θ of the
        # server started in its place).
        d = self.tmp / "run"
        (d / "checkpoints").mkdir(parents=True)

        def write(name, version):
            head = b"PSLABCKP" + bytes(48) + version.to_bytes(8, "little") + bytes(192)
            (d / "checkpoints" / f"{name}.ckpt").write_bytes(head)
        write("server0", 40)
        write("backup0", 95)
        write("server1", 60)
        write("backup1", 12)
        self.assertEqual(shard_checkpoint(d, 0).name, "backup0.ckpt")
        self.assertEqual(shard_checkpoint(d, 1).name, "server1.ckpt")
        self.assertEqual(shard_checkpoint(d, 2).name, "server2.ckpt")  # (none: the one the error names)

    def test_a_run_that_is_going_on_is_not_resumed(self):
        # A resume of a run whose launcher still runs it was taken: two sets of servers wrote
        # the same checkpoint files.
        p = self.launch_bg("run", self.long_config(), "--runs-dir", self.runs, "--no-plots")
        self.wait_for_processes(4)
        run = self.only_invocation("tiny") / "run"
        r = self.launch("resume", run, "--no-plots")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(f"{run}: the run is going on (another launcher holds {run / 'launcher.lock'})", r.stderr)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130, out + err)
        self.assert_no_processes_left()

    def test_a_run_in_a_mode_that_keeps_theta_on_the_workers_is_refused_before_anything_starts(self):
        # Defect: local:H and easgd runs were resumed (servers started from their checkpoints) and
        # each worker refused then: exit 1 and a rewritten summary, not exit 2.
        p = self.launch_bg("run", self.long_config(), "--runs-dir", self.runs, "--no-plots", "--set", 'cluster.mode="local:2"')
        self.wait_for_processes(4)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130, out + err)
        run = self.only_invocation("tiny") / "run"
        before = (run / "summary.json").read_text()
        r = self.launch("resume", run, "--no-plots")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn('cluster.mode = "local:2" keeps each worker\'s own θ and optimizer state on the worker', r.stderr)
        self.assertEqual((run / "summary.json").read_text(), before)
        self.assert_no_processes_left()

    def test_resume_after_ctrl_c_ends_like_an_uninterrupted_run(self):
        # Ctrl-C mid-run, then `launch.py resume`: ssp:1 over 2 servers (the servers write their
        # checkpoints as they stop) and allreduce (rank 0 wrote one every 0.3 s); each ends with
        # the accuracy of a run never stopped.
        self.subtests_in_fresh_runs("mode", ("ssp:1", "allreduce"), self.check_resume)

    def check_resume(self, mode):
        path = self.tiny_variant("resume.toml", [("steps = 500", "steps = 1200"), ('mode = "bsp"', f'mode = "{mode}"'),
                                                 ("servers = 1", "servers = 2")],
                                 append="\n[checkpoint]\nevery_s = 0.3\n")
        whole = self.launch("run", path, "--runs-dir", self.tmp / f"whole-{mode}", "--no-plots", timeout=120)
        self.assertEqual(whole.returncode, 0, whole.stdout + whole.stderr)
        reference = json.loads(next((self.tmp / f"whole-{mode}").glob("tiny/2*/run/summary.json")).read_text())
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots")
        self.wait_for_processes(5 if mode != "allreduce" else 3)
        self.wait_for_train_lines(["worker0", "worker1"])
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130, out + err)
        run = self.only_invocation("tiny") / "run"
        self.assertEqual(json.loads((run / "summary.json").read_text())["status"], "interrupted")
        self.assertEqual(stat.S_IMODE((run / "checkpoints").stat().st_mode), 0o700)
        writers = ["server0", "server1"] if mode != "allreduce" else ["worker0"]
        written = [json.loads(line) for w in writers for line in (run / "metrics" / f"{w}.jsonl").read_text().splitlines()
                   if '"checkpoint"' in line]
        self.assertTrue(written, "no checkpoint was written")
        if mode != "allreduce":
            self.assertEqual(sorted(c["why"] for c in written if c["why"] == "stopped"), ["stopped", "stopped"], written)
        r = self.launch("resume", run, "--no-plots", timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("resuming", r.stdout)
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        resumed = [json.loads(line) for k in (0, 1) for line in (run / "metrics" / f"worker{k}.jsonl").read_text().splitlines()
                   if '"resumed"' in line]
        self.assertEqual(len(resumed), 2, resumed)
        self.assertTrue(all(0 < x["step"] < 1200 for x in resumed), resumed)
        if mode != "allreduce":  # (the pushes a shard whose checkpoint was behind the others' missed)
            self.assertEqual(s["resume_lost_pushes"], sum(x["lost_pushes"] for x in resumed))
        log = "server0" if mode != "allreduce" else "worker1"
        self.assertIn("resumed from", (run / "logs" / f"{log}.log").read_text())
        self.assertLess(abs(s["final_test_acc"] - reference["final_test_acc"]), 0.02, (s["final_test_acc"], reference["final_test_acc"]))
        self.assert_no_processes_left()
        # A finished run is not resumed.
        again = self.launch("resume", run, "--no-plots")
        self.assertEqual(again.returncode, 2, again.stdout + again.stderr)
        self.assertIn("the run finished (ok); there is nothing to resume", again.stderr)

    def test_a_killed_asp_server_is_restarted_from_its_checkpoint(self):
        # asp over 2 servers, over tcp and over ipc: kill -9 of server 1 mid-run; the launcher
        # restarts it from its checkpoint (written every 0.3 s), the workers and the evaluator
        # rejoin it, the run ends ok and says how many updates were lost.
        self.subtests_in_fresh_runs("transport", ("tcp", "ipc"), self.check_server_restart)

    def start_asp_on_two_servers(self, steps, every_s, *sets):
        """tiny.toml in asp over 2 servers (heartbeat_s 1, a checkpoint every `every_s`), started
        and training: (the launcher, server 1's pid, the run directory)."""
        path = self.tiny_variant("two-servers.toml", [("steps = 500", f"steps = {steps}"), ('mode = "bsp"', 'mode = "asp"'),
                                                      ("servers = 1", "servers = 2")],
                                 append=f"\n[checkpoint]\nevery_s = {every_s}\n")
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots", "--set", "cluster.heartbeat_s=1", *sets)
        procs = self.wait_for_processes(5)
        server1 = [pid for pid, argv in procs.items() if "--shard" in argv and option(argv, "--shard") == "1"]
        self.assertEqual(len(server1), 1, procs)
        self.wait_for_train_lines(["worker0", "worker1"])
        return p, server1[0], self.only_invocation("tiny") / "run"

    def check_server_restart(self, transport):
        p, server1, run = self.start_asp_on_two_servers(1500, 0.3, "--set", f'cluster.transport="{transport}"')
        wait_until(self, (run / "checkpoints" / "server1.ckpt").exists, 20, "server 1 wrote no checkpoint")
        os.kill(server1, signal.SIGKILL)
        out, err = p.communicate(timeout=90)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertRegex(err, r"server1 \(shard 1\) on local was killed by signal 9 \(SIGKILL\); restarting it from its checkpoint")
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertEqual([(r["server"], "SIGKILL" in r["how"]) for r in s["servers_restarted"]], [(1, True)])
        log = (run / "logs" / "server1.log").read_text()
        self.assertIn("server 1: resumed from", log)
        rejoined = re.findall(r"worker (\d) rejoined at clock \d+ \(this server's checkpoint had it at \d+: (\d+) update", log)
        self.assertEqual(sorted(w for w, _ in rejoined), ["0", "1"], log)
        self.assertEqual(s["updates_lost"], sum(int(n) for _, n in rejoined))
        self.assertIn("restarted server 1", out)
        self.assertGreater(s["final_test_acc"], 0.9)
        self.assert_no_processes_left()

    def test_a_resumed_runs_summary_keeps_the_restarts_of_its_earlier_life(self):
        # kill -9 of server 1 (restarted), then Ctrl-C, then resume: the summary listed only the
        # resumed life's restarts, though updates_lost counted every life's.
        p, server1, run = self.start_asp_on_two_servers(100000, 0.3)
        wait_until(self, (run / "checkpoints" / "server1.ckpt").exists, 20, "server 1 wrote no checkpoint")
        os.kill(server1, signal.SIGKILL)
        wait_until(self, lambda: "resumed from" in (run / "logs" / "server1.log").read_text(), 30, "server 1 was not restarted")
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130, out + err)
        self.assertEqual([r["server"] for r in json.loads((run / "summary.json").read_text())["servers_restarted"]], [1])
        r = self.launch("resume", run, "--no-plots", "--max-minutes", "0.1", timeout=120)  # (then stopped: the guard)
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual([x["server"] for x in s["servers_restarted"]], [1], r.stdout + r.stderr)
        self.assert_no_processes_left()

    def test_a_server_killed_before_its_first_checkpoint_restarts_from_the_initial_theta(self):
        # no checkpoint yet (every 1000 s): restarted from the run's initial θ, saying so; the
        # workers rejoin it, the updates its shard had are lost and counted, and the run ends ok
        p, server1, run = self.start_asp_on_two_servers(1500, 1000)
        self.assertFalse((run / "checkpoints" / "server1.ckpt").exists())
        os.kill(server1, signal.SIGKILL)
        out, err = p.communicate(timeout=90)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertIn("restarting it from the run's initial θ: it had written no checkpoint yet (checkpoint.every_s = 1000)", err)
        log = (run / "logs" / "server1.log").read_text()
        self.assertIn("server 1: restarted without a checkpoint (it died before writing one): from the run's initial θ", log)
        rejoined = re.findall(r"worker (\d) rejoined at clock \d+ \(this server's initial state had it at 0: (\d+) update", log)
        self.assertEqual(sorted(w for w, _ in rejoined), ["0", "1"], log)
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertEqual(s["updates_lost"], sum(int(n) for _, n in rejoined))
        self.assertGreater(s["updates_lost"], 0)
        self.assertGreater(s["final_test_acc"], 0.85)
        self.assert_no_processes_left()


if __name__ == "__main__":
    unittest.main()
