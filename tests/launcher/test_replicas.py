"""Replicated shards (cluster.replicas = 2): kill -9 of a server mid-run, in asp and bsp, over tcp
and shm: its backup takes over, the workers and the evaluator go to it, and the run ends ok with
every push applied exactly once (the serving copies' counts), nothing lost, and bsp's final θ bit
for bit the θ of the same run undisturbed. A backup killed: its server goes on, and a new backup
joins it. The server killed, then its backup once a new backup has joined: the shard survives both.
Replay: of a run whose servers served throughout, bit for bit; of one whose server died, refused.
"""
import json
import os
import signal

from tests.launcher.helpers import LauncherTestCase, option, wait_for_train_lines_in, wait_until


def final_checksums(run, names):
    """{name: params_checksum} of the processes' server_final metrics lines."""
    out = {}
    for name in names:
        for row in map(json.loads, (run / "metrics" / f"{name}.jsonl").read_text().splitlines()):
            if row.get("kind") == "server_final":
                out[name] = row["params_checksum"]
    return out


class Replicas(LauncherTestCase):
    """A server or a backup killed: the other copy of its shard goes on, nothing lost."""

    def replicated(self, mode, transport, steps=700):
        return self.tiny_variant(f"replicas-{mode}-{transport}.toml",
                                 [("steps = 500", f"steps = {steps}"), ('mode = "bsp"', f'mode = "{mode}"'),
                                  ("servers = 1", "servers = 2\nreplicas = 2")])

    def start(self, mode, transport, runs, steps=700):
        path = self.replicated(mode, transport, steps)
        return self.launch_bg("run", path, "--runs-dir", runs, "--no-plots", "--set", "cluster.heartbeat_s=1",
                              "--set", f'cluster.transport="{transport}"')

    def pid_of(self, runs, name):
        """The process of `name` (server1, backup1: by its metrics file) of the run under `runs`."""
        procs = self.wait_for_processes(7)  # 2 servers, 2 backups, 2 workers, the evaluator
        pid = [p for p, argv in procs.items() if str(runs) in " ".join(argv) and "--metrics" in argv
               and option(argv, "--metrics").endswith(f"/{name}.jsonl")]
        self.assertEqual(len(pid), 1, procs)
        return pid[0]

    def kill_when_training(self, runs, name):
        """Waits for both workers' first train lines, then kill -9 of process `name` (server1, backup1)."""
        pid = self.pid_of(runs, name)
        wait_for_train_lines_in(self, runs, ["worker0", "worker1"], 30)
        os.kill(pid, signal.SIGKILL)

    def finish(self, p):
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out + err)
        return out, err

    def test_a_killed_server_loses_nothing_and_bsp_ends_bit_for_bit(self):
        for mode in ("asp", "bsp"):
            for transport in ("tcp", "shm"):
                with self.subTest(mode=mode, transport=transport):
                    self.check_failover(mode, transport)

    def check_failover(self, mode, transport):
        runs = self.tmp / f"runs-{mode}-{transport}"
        p = self.start(mode, transport, runs)
        self.kill_when_training(runs, "server1")
        out, err = self.finish(p)
        run = next(runs.glob("tiny/*/run"))
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertEqual([(c["shard"], c["process"], "SIGKILL" in c["how"]) for c in s["copies_ended"]],
                         [(1, "server1", True)], s["copies_ended"])
        self.assertIn("starting a new backup of shard 1 where server1 was", err)
        self.assertRegex(err, r"server1 \(shard 1\) on local was killed by signal 9 \(SIGKILL\); its backup \(backup1")
        backup = (run / "logs" / "backup1.log").read_text()
        self.assertRegex(backup, r"server 1 \(backup\): (worker \d|the evaluator|a new backup) came over, and its primary at \S+ "
                                 r"has been silent for")
        self.assertEqual(s["updates_lost"], 0)
        self.assertEqual(s["workers_lost"], [])
        # Every push applied exactly once on each shard: the serving copies' counts (server0, and
        # backup1, which applied server1's pushes as they came and the rest itself).
        self.assertEqual(s["pushed_by_codec"]["f32"]["pushes"], 2 * 2 * s["steps_per_worker"],
                         f"not every push applied exactly once ({s['pushes_duplicate']} came again)")
        self.assertGreater(s["final_test_acc"], 0.9)
        if (mode, transport) == ("asp", "tcp"):  # each copy recorded only its part of shard 1's order
            r = self.launch("replay", run, "--no-plots")
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("server1 ended and its backup took over (cluster.replicas = 2): the shard's order is split", r.stderr)
        if mode == "bsp":  # the same run undisturbed (over tcp: the transport changes no float) ends on the same θ
            calm_run = self.calm_bsp_run()
            self.assertEqual(final_checksums(run, ["server0"])["server0"], final_checksums(calm_run, ["server0"])["server0"])
            self.assertEqual(final_checksums(run, ["backup1"])["backup1"], final_checksums(calm_run, ["server1"])["server1"])
            self.assertEqual(final_checksums(calm_run, ["backup1"])["backup1"], final_checksums(calm_run, ["server1"])["server1"],
                             "a backup that followed its server holds the same θ")
        self.assert_no_processes_left()

    def calm_bsp_run(self):
        calm = self.tmp / "runs-bsp-calm"
        if not calm.exists():
            self.finish(self.start("bsp", "tcp", calm))
        return next(calm.glob("tiny/*/run"))

    def test_a_killed_backup_leaves_its_server_alone(self):
        runs = self.tmp / "runs-backup"
        p = self.start("asp", "tcp", runs)
        self.kill_when_training(runs, "backup1")
        out, err = self.finish(p)
        run = next(runs.glob("tiny/*/run"))
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertEqual([(c["shard"], c["process"]) for c in s["copies_ended"]], [(1, "backup1")], err)
        self.assertIn("server1 serves its shard", err)
        log = (run / "logs" / "server1.log").read_text()
        self.assertIn("its backup is lost", log)
        self.assertIn("a new backup joined at version", log)  # where backup1 was, sent the shard
        self.assertIn("joined a run under way", (run / "logs" / "backup1.log").read_text())
        self.assertEqual(s["updates_lost"], 0)
        self.assertEqual(s["pushed_by_codec"]["f32"]["pushes"], 2 * 2 * s["steps_per_worker"])
        # the servers served throughout, each recording its shard's whole order: a replay (one copy
        # of each shard, in the virtual cluster) ends on the run's θ
        r = self.launch("replay", run, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("bit for bit: 2 shard checksum(s) equal", r.stdout)
        self.assert_no_processes_left()

    def test_the_shard_outlives_its_server_and_then_its_backup(self):
        runs = self.tmp / "runs-twice"
        p = self.start("asp", "tcp", runs, steps=2500)
        self.kill_when_training(runs, "server1")
        run = next(runs.glob("tiny/*/run"))
        # backup1 took over; the launcher starts a new backup where server1 was, which backup1 sends the shard
        wait_until(self, lambda: "a new backup joined" in (run / "logs" / "backup1.log").read_text(), 30,
                   "no new backup joined backup1")
        os.kill(self.pid_of(runs, "backup1"), signal.SIGKILL)
        out, err = self.finish(p)
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertEqual([(c["shard"], c["process"]) for c in s["copies_ended"]], [(1, "server1"), (1, "backup1")], err)
        self.assertIn("the shard's other copy", (run / "logs" / "worker0.log").read_text())
        self.assertEqual(s["updates_lost"], 0)
        # asp: a shard's version counts the pushes it applied; every push exactly once on both shards
        finals = {name: row for name in ("server0", "server1") for row in
                  map(json.loads, (run / "metrics" / f"{name}.jsonl").read_text().splitlines()) if row.get("kind") == "server_final"}
        self.assertEqual(finals["server1"]["replica"], "took over")
        self.assertEqual([finals[n]["version"] for n in ("server0", "server1")], [2 * s["steps_per_worker"]] * 2)
        self.assertGreater(s["final_test_acc"], 0.9)
        self.assert_no_processes_left()
