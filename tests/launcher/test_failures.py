"""Runs that fail or are stopped: a killed or failing process, Ctrl-C, SIGTERM and the wall-clock
guard stop everything and leave nothing (Failures); a hung or stopped process named within the
heartbeat (Heartbeats: bounds in seconds, so its CTest entry runs alone); shared-memory segments and
a failed sweep point's processes gone (Cleanup: it looks at every process and at /dev/shm of the
machine, so its CTest entry runs alone too); a full disk and a read-only runs directory
(DiskTrouble: needs root, to mount a small tmpfs; skips elsewhere, saying so).
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import types
import unittest
import unittest.mock

from tests.launcher.helpers import (LAUNCH, PYTHON, REPO, TINY, LauncherTestCase, cmdlines_containing, option, pslab_processes, sleeps, wait_until,
                                    wait_for_train_lines_in)

sys.path.insert(0, str(REPO / "experiments"))  # (the launcher's own parts, tested alone)


class TimedLines(list):
    """[(monotonic time, line)] of a process's stderr, read on the thread `reader`."""
    reader = None


class Failures(LauncherTestCase):
    """A killed or failing process, signals and the wall-clock guard: the run stops (or goes on), nothing is left."""

    def test_killed_worker_fails_the_run_and_stops_everything(self):
        p = self.launch_bg("run", self.long_config(), "--runs-dir", self.runs, "--no-plots")
        procs = self.wait_for_processes(4)
        worker1 = [pid for pid, argv in procs.items() if argv[1] == "ps" and option(argv, "--rank") == "1"]
        self.assertEqual(len(worker1), 1, procs)
        # training has started: worker 0 and the evaluator have written metrics
        wait_until(self, lambda: all(any(m.stat().st_size for m in self.runs.glob(f"tiny/*/run/metrics/{n}.jsonl"))
                                     for n in ("worker0", "evaluator")), 30, "worker 0 and the evaluator wrote no metrics")
        os.kill(worker1[0], signal.SIGKILL)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 1, out + err)
        self.assertRegex(err, r"worker1 \(rank 1\) .*killed by signal 9 \(SIGKILL\)")
        self.assertIn("logs/worker1.log", err)
        self.assert_no_processes_left()
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual(s["status"], "failed")
        self.assertIn("worker1", s["failure"])
        self.assertGreater(len(s["failure"].splitlines()), 1, "the failure keeps the last lines of the process's log")
        # the processes the launcher stopped say so in their logs
        logs = self.only_invocation("tiny") / "run" / "logs"
        self.assertIn("pslab_worker: worker 0: stopped by SIGTERM", (logs / "worker0.log").read_text())
        self.assertIn("pslab_worker: evaluator: stopped by SIGTERM", (logs / "evaluator.log").read_text())

    def test_asp_and_ssp_runs_go_on_without_a_killed_worker(self):
        # cluster.on_worker_loss = "auto" is "continue" in asp and ssp: worker 1 is killed while
        # training; the servers drop it after heartbeat_s of silence, worker 0 trains to the end.
        self.subtests_in_fresh_runs("mode", ("asp", "ssp:2"), self.check_run_goes_on_without_a_killed_worker)

    def check_run_goes_on_without_a_killed_worker(self, mode):
        path = self.tiny_variant("loss.toml", [("steps = 500", "steps = 1200"), ('mode = "bsp"', f'mode = "{mode}"')])
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots", "--set", "cluster.heartbeat_s=1")
        procs = self.wait_for_processes(4)
        worker1 = [pid for pid, argv in procs.items() if argv[1] == "ps" and option(argv, "--rank") == "1"]
        self.assertEqual(len(worker1), 1, procs)
        self.wait_for_train_lines(["worker0", "worker1"])
        os.kill(worker1[0], signal.SIGKILL)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertRegex(err, r"worker1 \(rank 1\) on local was killed by signal 9 \(SIGKILL\); the run goes on without it")
        self.assert_no_processes_left()
        run = self.only_invocation("tiny") / "run"
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertEqual(len(s["workers_lost"]), 1, s["workers_lost"])
        lost = s["workers_lost"][0]
        self.assertEqual(lost["worker"], 1)
        self.assertIn("SIGKILL", lost["how"])
        self.assertGreaterEqual(lost["silent_s"], 1.0)  # the servers waited heartbeat_s, no less
        self.assertLess(lost["clock"], 1200)
        self.assertIn("went on without worker 1", out)
        self.assertIn("worker 1 lost: silent for", (run / "logs" / "server0.log").read_text())
        self.assertGreater(s["final_test_acc"], 0.5)  # worker 0 trained on

    def test_failing_process_log_is_shown(self):
        # every process that loads data fails on a data path that does not exist
        path = self.tiny_variant("bad.toml", [('kind = "logistic"', 'kind = "fashion-mnist"\npath = "/nonexistent"')])
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", timeout=60)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"(server\d \(shard \d\)|worker\d \(rank \d\)|evaluator) on \S+ exited with code [1-9]")
        self.assertIn("/nonexistent", r.stderr)  # the tail of the failing process's log
        self.assert_no_processes_left()

    def test_sigint_stops_everything(self):
        p = self.launch_bg("run", self.long_config(), "--runs-dir", self.runs, "--no-plots")
        self.wait_for_processes(4)
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130, out + err)
        self.assertIn("SIGINT", err)
        self.assert_no_processes_left()

    def test_sigterm_stops_everything(self):
        p = self.launch_bg("run", self.long_config(), "--runs-dir", self.runs, "--no-plots")
        self.wait_for_processes(4)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 143, out + err)
        self.assert_no_processes_left()

    def test_wall_clock_guard(self):
        p = self.launch_bg("run", self.long_config(), "--runs-dir", self.runs, "--no-plots", "--max-minutes", "0.05")
        out, err = p.communicate(timeout=40)
        self.assertEqual(p.returncode, 1, out + err)
        self.assertIn("--max-minutes", err)
        self.assert_no_processes_left()


class Heartbeats(LauncherTestCase):
    """A hung or stopped process is named within the heartbeat (timing-sensitive: run alone)."""

    def test_a_hung_bsp_worker_is_named_within_the_heartbeat(self):
        # bsp cannot go on without a worker: a stopped (SIGSTOP) worker fails the run within about
        # heartbeat_s, and the error names it, not the worker waiting for it.
        p = self.launch_bg("run", self.long_config(), "--runs-dir", self.runs, "--no-plots", "--set", "cluster.heartbeat_s=1")
        out, err, stopped = self.stop_worker1_and_wait(p, timeout=30)
        self.assertEqual(p.returncode, 1, out + err)
        self.assertLess(time.monotonic() - stopped, 6.0, err)
        self.assertRegex(err, r"server0 \(shard 0\) on local exited with code 1")
        self.assertRegex(err, r"worker 1 lost: silent for 1\.\d s at clock \d+ \(cluster\.heartbeat_s = 1\); bsp cannot train on without it")
        self.assert_no_processes_left()

    def test_a_stopped_asp_worker_is_stopped_once_the_servers_drop_it(self):
        # asp goes on without a hung worker: the servers drop it after heartbeat_s, and the launcher,
        # reading their verdict, stops it and records it as lost; the run ends ok when training
        # does (not when the hung process would), within heartbeat_s + 4 s of its last step (the
        # final evaluation, the checkpoints written and synced, the stops: seconds on a busy machine).
        path = self.tiny_variant("asp.toml", [('mode = "bsp"', 'mode = "asp"'), ("steps = 500", "steps = 1500")])
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots", "--set", "cluster.heartbeat_s=1")
        out, err, _ = self.stop_worker1_and_wait(p, timeout=60)
        self.assertEqual(p.returncode, 0, out + err)
        run = next(self.runs.glob("tiny/*/run"))
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok")
        self.assertEqual([w["worker"] for w in s["workers_lost"]], [1], s["workers_lost"])
        self.assertIn("was dropped by the servers at clock", s["workers_lost"][0]["how"])
        self.assertIn("the servers dropped it", err)
        trained = [json.loads(line) for line in (run / "metrics" / "worker0.jsonl").read_text().splitlines()]
        last_step_t = max(r["t"] for r in trained if r.get("kind") == "train")
        self.assertLess(s["wall_s"] - last_step_t, 1 + 4, "the run waited for the hung worker")
        self.assert_no_processes_left()

    def stop_worker1_and_wait(self, p, timeout):
        """SIGSTOPs worker 1 of launcher p once both workers train; waits for p (at most `timeout`
        s) and returns its stdout, stderr and when the SIGSTOP was sent (time.monotonic()); worker
        1 is killed after, whatever happened."""
        procs = self.wait_for_processes(4)
        worker1 = [pid for pid, argv in procs.items() if argv[1] == "ps" and option(argv, "--rank") == "1"]
        self.wait_for_train_lines(["worker0", "worker1"])
        os.kill(worker1[0], signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            return (*p.communicate(timeout=timeout), stopped)
        finally:
            try:
                os.kill(worker1[0], signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stderr_with_times(self, p):
        """Reads p's stderr on a thread: returns [(monotonic time, line)], filled as lines come
        (its .reader ends at the end of p's stderr)."""
        lines = TimedLines()
        def read():
            for line in p.stderr:
                lines.append((time.monotonic(), line))
        lines.reader = threading.Thread(target=read, daemon=True)
        lines.reader.start()
        self.addCleanup(lines.reader.join, 5)
        return lines

    def stop_until_the_run_fails(self, p, pid, lines):
        """SIGSTOPs pid and waits for the launcher to fail the run (exit 1); returns its stderr,
        its first line saying why (said as it starts stopping the run's processes, before the
        FAILED line that follows their stop and the summary) and how many seconds after the
        SIGSTOP that line came."""
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            p.wait(timeout=30)
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        lines.reader.join(10)  # (the last lines)
        err = "".join(line for _, line in lines)
        self.assertEqual(p.returncode, 1, err)
        first = next(((t, line) for t, line in lines if "stopping the run's processes" in line), None)
        self.assertIsNotNone(first, err)
        return err, first[1], first[0] - stopped

    def test_a_stopped_allreduce_rank_is_named_within_two_heartbeats(self):
        # SIGSTOP of rank 1: the other rank's group watch names it, and that is the launcher's
        # first error, within 2 x cluster.heartbeat_s.
        path = self.tiny_variant("ar.toml", [("steps = 500", "steps = 100000"), ('mode = "bsp"', 'mode = "allreduce"')])
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots", "--set", "cluster.heartbeat_s=1")
        lines = self.stderr_with_times(p)
        procs = self.wait_for_processes(3)
        rank1 = [pid for pid, argv in procs.items() if argv[1] == "allreduce" and option(argv, "--rank") == "1"]
        self.assertEqual(len(rank1), 1, procs)
        self.wait_for_train_lines(["worker0", "worker1"])
        err, first, after = self.stop_until_the_run_fails(p, rank1[0], lines)
        self.assertRegex(first, r"worker0 \(rank 0\) on local exited with code 1")
        self.assertLess(after, 2 * 1.0, err)
        self.assertRegex(err, r"all-reduce rank 0: rank 1 lost: silent for 1\.\d s at step \d+ \(cluster\.heartbeat_s = 1\)")
        self.assert_no_processes_left()

    def test_a_stopped_server_is_named_by_its_workers_within_two_heartbeats(self):
        # SIGSTOP of the server of an asp run: a worker whose push has no answer names it (the
        # server is not holding it, or it would beat), and that is not a lost worker. The
        # evaluator's pull or progress poll may be the first to wait on it: then the evaluator
        # names it. (With cluster.on_server_loss = "restart", the asp default, the workers would
        # first wait some seconds for a restart: "fail" here.)
        path = self.tiny_variant("asp.toml", [("steps = 500", "steps = 100000"), ('mode = "bsp"', 'mode = "asp"')])
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots", "--set", "cluster.heartbeat_s=1",
                           "--set", "cluster.on_server_loss=fail")
        lines = self.stderr_with_times(p)
        procs = self.wait_for_processes(4)
        server = [pid for pid, argv in procs.items() if "--shard" in argv]
        self.assertEqual(len(server), 1, procs)
        self.wait_for_train_lines(["worker0", "worker1"])
        err, first, after = self.stop_until_the_run_fails(p, server[0], lines)
        self.assertNotIn("goes on without it", err)
        self.assertRegex(first, r"(worker\d \(rank \d\)|evaluator) on local exited with code 1")
        self.assertLess(after, 2 * 1.0, err)
        self.assertRegex(err, r"server 0 at \S+: silent for 1\.\d s while (Push|Pull) \((clock \d+|progress only)\) "
                              r"waited for its reply")
        self.assert_no_processes_left()


class CutConnections(LauncherTestCase):
    """Every TCP connection to the servers cut for real (ss -K: the kernel resets both ends, as a
    failing link does) three times mid-run: the workers and the evaluator say Hello again on the
    connections ZeroMQ makes anew and send again what was under way; the run ends ok with every
    push applied once (the servers' count) and nothing lost. Needs root (CAP_NET_ADMIN) and a
    kernel with socket destroy; skips saying so otherwise."""

    def test_asp_ssp_and_bsp_runs_survive_three_cuts(self):
        if os.geteuid() != 0:
            self.skipTest("SKIPPED: cutting connections with ss -K needs root")
        for mode in ("asp", "ssp:2", "bsp"):
            with self.subTest(mode=mode):
                self.run_with_cuts(mode)

    def run_with_cuts(self, mode):
        runs = self.tmp / ("runs-" + mode.replace(":", ""))
        path = self.tiny_variant(f"cut-{mode.replace(':', '')}.toml",
                                 [('mode = "bsp"', f'mode = "{mode}"'), ("servers = 1", "servers = 2")])
        p = self.launch_bg("run", path, "--runs-dir", runs, "--no-plots", "--set", "cluster.transport=tcp",
                           "--set", "cluster.heartbeat_s=2")
        try:
            def servers():
                return [a for a in pslab_processes(str(runs)).values() if "--bind" in a]
            wait_until(self, lambda: len(servers()) == 2, 30, "the two servers did not start")
            ports = [option(a, "--bind").rsplit(":", 1)[1] for a in servers()]
            wait_for_train_lines_in(self, runs, ["worker0", "worker1"], 30)
            for _ in range(3):
                for port in ports:
                    r = subprocess.run(["ss", "-K", "-t", f"( sport = :{port} or dport = :{port} )"],
                                       capture_output=True, text=True)
                    if r.returncode != 0:
                        self.skipTest(f"SKIPPED: ss -K cannot cut connections here: {r.stderr.strip()}")
                time.sleep(0.4)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        self.assertEqual(p.returncode, 0, out + err)
        s = json.loads(next(runs.glob("tiny/*/run/summary.json")).read_text())
        self.assertEqual(s["status"], "ok", s)
        self.assertGreaterEqual(s["reconnects"], 3, "the cuts did not reach the run")
        self.assertEqual(s["pushed_by_codec"]["f32"]["pushes"], 2 * 2 * s["steps_per_worker"],
                         f"not every push applied exactly once ({s['pushes_duplicate']} came again)")
        self.assertEqual(s["updates_lost"], 0)
        self.assertEqual(s["workers_lost"], [])
        self.assertIn("connection(s) cut and back", out + err)
        self.assert_no_processes_left()
        if mode == "asp":
            # The order the servers recorded, requests sent again included, replays bit for bit; but
            # a push+pull whose answer was lost is answered again later than its push, which a
            # replay cannot re-execute: refused, saying so.
            run = next(runs.glob("tiny/*/run"))
            again = any(line.startswith("again ") for t in (run / "trace").glob("server*.txt")
                        for line in t.read_text().splitlines())
            r = self.launch("replay", run, "--no-plots")
            if again:
                self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("answered again later): its order cannot be replayed", r.stderr)
            else:
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("bit for bit", r.stdout)


class Cleanup(LauncherTestCase):
    """Nothing of a run is left anywhere on the machine (checks every process and /dev/shm: run alone)."""

    def test_shm_run_and_a_killed_server_leave_no_segment(self):
        # shm: payloads through memfd segments, which go with the processes; the sockets' directory
        # goes with the run. A finished run, then one whose server is killed mid-run.
        def pslab_segments():
            held = set()
            for fd_dir in pathlib.Path("/proc").glob("[0-9]*/fd"):
                try:
                    for fd in fd_dir.iterdir():
                        if os.readlink(fd).startswith("/memfd:pslab-shm"):
                            held.add(fd_dir.parent.name)
                except OSError:
                    pass
            return held
        dev_shm = set(os.listdir("/dev/shm"))
        ok = self.tiny_variant("shm.toml", [("steps = 500", "steps = 60"), ("[cluster]", '[cluster]\ntransport = "shm"')])
        r = self.launch("run", ok, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_invocation("tiny") / "run"
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok")
        self.assertEqual(s["pushed_by_codec"]["f32"]["pushes"], 2 * 60)
        sockets = json.loads((run / "manifest.json").read_text())["socket_dir"]
        self.assertFalse(os.path.exists(sockets), sockets)

        p = self.launch_bg("run", self.tiny_variant("shm-long.toml", [("steps = 500", "steps = 100000"),
                                                                      ("[cluster]", '[cluster]\ntransport = "shm"')]),
                           "--runs-dir", self.runs, "--no-plots")
        procs = self.wait_for_processes(4)
        end = time.monotonic() + 20
        while len(pslab_segments() & set(map(str, procs))) < 3 and time.monotonic() < end:
            time.sleep(0.1)  # until the server and both workers have sent a payload
        self.assertGreaterEqual(len(pslab_segments() & set(map(str, procs))), 3, "segments of the run")
        server = [pid for pid, argv in procs.items() if "--shard" in argv]
        self.assertEqual(len(server), 1, procs)
        os.kill(server[0], signal.SIGKILL)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 1, out + err)
        self.assertRegex(err, r"server0 \(shard 0\) on local was killed by signal 9")
        self.assert_no_processes_left()
        self.assertEqual(pslab_segments() & set(map(str, procs)), set())
        self.assertEqual(set(os.listdir("/dev/shm")) - dev_shm, set(), "something was left in /dev/shm")
        killed = [m for m in (self.runs / "tiny").glob("*/run/manifest.json")
                  if m.parent != run and not m.parent.parent.is_symlink()]
        self.assertEqual(len(killed), 1, killed)
        sockets = json.loads(killed[0].read_text())["socket_dir"]
        self.assertFalse(os.path.exists(sockets), sockets)

    def test_the_remote_end_stops_what_closed_its_output_and_ends_with_what_its_child_left(self):
        # The far end of an ssh-started process (launch.py remote): a process that closed its
        # output was waited for, deaf to the launcher's stop (it went on after the run); a child
        # that exited leaving a process that holds its output open was never seen to exit.
        def remote(script, log):
            p = subprocess.Popen([PYTHON, str(LAUNCH), "remote", "--log", str(self.tmp / log), "--", "sh", "-c", script],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
            return p

        def kill_left():  # (should this test fail: nothing of it left running)
            for seconds in ("61.25", "62.5"):
                for pid in sleeps(seconds):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self.addCleanup(kill_left)

        quiet = remote("exec >/dev/null 2>&1; exec sleep 61.25", "quiet.log")
        time.sleep(1.0)
        self.assertIsNone(quiet.poll())
        quiet.stdin.write("stop\n")
        quiet.stdin.flush()
        out, _ = quiet.communicate(timeout=20)
        self.assertEqual(quiet.returncode, 128 + 15, out)  # its SIGTERM
        self.assertEqual(sleeps("61.25"), {})
        left = remote("(exec sleep 62.5) & echo started it", "left.log")
        left.wait(timeout=20)  # (its stdin stays open, as the launcher's ssh keeps it)
        out = left.stdout.read()
        left.stdin.close()
        self.assertEqual(left.returncode, 0, out)
        self.assertIn("started it", out)
        self.assertIn('"event": "exit"', out)
        self.assertEqual(sleeps("62.5"), {})

    def test_the_remote_end_stops_its_process_when_the_launcher_falls_silent(self):
        # A network partition: ssh's connection stays open and nothing comes. The remote end hears
        # the launcher's "alive" lines and goes on; silent for --alive-s, it stops its process.
        self.addCleanup(lambda: [os.kill(pid, signal.SIGKILL) for pid in sleeps("63.75")])
        p = subprocess.Popen([PYTHON, str(LAUNCH), "remote", "--log", str(self.tmp / "silent.log"), "--alive-s", "1.5",
                              "--", "sleep", "63.75"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        for _ in range(10):  # 3 s, twice --alive-s: heard all along
            p.stdin.write("alive\n")
            p.stdin.flush()
            silent_at = time.monotonic()  # (the last word)
            time.sleep(0.3)
        self.assertIsNone(p.poll(), "stopped while the launcher was heard")
        self.assertEqual(len(sleeps("63.75")), 1)
        p.wait(timeout=15)  # (its stdin still open)
        out = p.stdout.read()
        self.assertEqual(p.returncode, 128 + 15, out)
        self.assertGreater(time.monotonic() - silent_at, 1.4)
        self.assertIn("launch.py remote: heard nothing from the launcher for 1.5 s (cluster.ssh_alive_s): stopping pid", out)
        self.assertIn('"signal": 15', out)
        self.assertEqual(sleeps("63.75"), {})
        self.assertIn("heard nothing from the launcher", (self.tmp / "silent.log").read_text())

        # A stalled connection too: 1 MiB of output ssh does not take (a pipe nobody reads) does
        # not stop the remote end hearing the clock.
        self.addCleanup(lambda: [os.kill(pid, signal.SIGKILL) for pid in sleeps("64.5")])
        stalled = subprocess.Popen([PYTHON, str(LAUNCH), "remote", "--log", str(self.tmp / "stalled.log"), "--alive-s",
                                    "1.5", "--", "sh", "-c", "head -c 1048576 /dev/zero; exec sleep 64.5"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: stalled.poll() is None and (stalled.kill(), stalled.wait()))
        stalled.wait(timeout=15)
        self.assertEqual(stalled.returncode, 128 + 15)
        self.assertEqual(sleeps("64.5"), {})
        self.assertEqual((self.tmp / "stalled.log").read_bytes().count(b"\0"), 1 << 20)

    def test_the_remote_end_loses_nothing_that_ssh_takes_late(self):
        # Defect: with ssh's pipe full, the remote end wrote what fit of each chunk of output and
        # dropped the rest: lines cut, and the exit record the launcher reads lost or glued to one.
        lines = 20000  # 0.5 MB of numbered lines, far past what a pipe holds
        p = subprocess.Popen([PYTHON, str(LAUNCH), "remote", "--log", str(self.tmp / "late.log"), "--", "sh", "-c",
                              f"seq -f 'line %06g of the output' 1 {lines}; exit 3"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        time.sleep(1.0)  # ssh slow to take it: the child has exited meanwhile
        out = p.stdout.read().decode()
        p.wait(timeout=20)
        self.assertEqual(p.returncode, 3, out[-2000:])
        got = out.splitlines()
        self.assertEqual(got[1:-1], [f"line {i:06d} of the output" for i in range(1, lines + 1)])
        self.assertTrue(got[-1].startswith("[pslab-launch] "), got[-3:])
        record = json.loads(got[-1][len("[pslab-launch] "):])
        self.assertEqual((record["event"], record["code"]), ("exit", 3), record)
        self.assertEqual((self.tmp / "late.log").read_text().splitlines()[1:-1], got[1:-1])

    def test_progress_and_the_guard_of_a_resumed_or_virtual_run(self):
        # Defects: the --max-minutes guard counted from the run's first start (a resume a day later
        # failed at once); the ETA took the pause for pace (21h for 90 s); lines more than 5 s apart
        # read 0 samples/s; the virtual cluster's simulated times were set against real ones.
        from launcher.common import RunFailed
        from launcher.monitor import Progress, monitor
        run_dir = self.tmp / "progress"
        (run_dir / "metrics").mkdir(parents=True)
        plan = types.SimpleNamespace(workers=1, servers=1, replicas=1, uses_servers=False, total_steps=2000,
                                     epochs=2, virtual=False)

        def lines(*rows):
            (run_dir / "metrics" / "worker0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

        def train(step, t, rate=160.0):
            return {"kind": "train", "worker": 0, "step": step, "t": t, "epoch": step / 1000, "loss": 0.5,
                    "samples_per_s": rate}
        lines({"kind": "start", "worker": 0, "step": 0}, train(100, 10), train(1000, 100),
              {"kind": "start", "worker": 0, "step": 1000}, train(1050, 86405), train(1100, 86410))
        p = Progress(plan, run_dir, "r")
        p.poll()
        eta = p.line(86412).split("ETA ")[1]
        self.assertIn(eta, ("1m28s", "1m27s", "1m29s"))
        lines(train(100, 0), train(200, 8), train(300, 16))  # a line every 8 s, the newest 6 s old
        p = Progress(plan, run_dir, "r")
        p.poll()
        self.assertIn(" 160 samples/s", p.line(22))
        plan.virtual = True  # simulated seconds 1..10, 100 real seconds on
        lines(train(100, 1.0, 5000.0), train(1000, 10.0, 5000.0))
        p = Progress(plan, run_dir, "r")
        p.poll()
        self.assertIn(" 5,000 samples/s (simulated, at 10s)", p.line(100))
        self.assertIn("ETA 1m40s", p.line(100))  # (from the real pace: 1000 steps in 100 s)

        quiet = types.SimpleNamespace(poll=lambda: None, line=lambda elapsed: "")
        ends = time.monotonic() + 1.5
        proc = types.SimpleNamespace(name="worker0", returncode=None, group_ended=True,
                                     popen=types.SimpleNamespace(poll=lambda: 0 if time.monotonic() > ends else None))
        monitor([proc], quiet, time.time() - 7200, 3600, lambda p: RunFailed("failed"))  # (no RunFailed)
        self.assertEqual(proc.returncode, 0)
        proc = types.SimpleNamespace(name="worker0", returncode=None, group_ended=True,
                                     popen=types.SimpleNamespace(poll=lambda: None))
        with self.assertRaisesRegex(RunFailed, "exceeded --max-minutes 0.01 .*still running: worker0"):
            monitor([proc], quiet, time.time(), 0.6, lambda p: RunFailed("failed"))

    def test_a_resumed_run_is_judged_by_what_its_own_life_wrote_to_the_appended_logs(self):
        # Defect: srun.log and NAME.ssh.log are appended to on resume; the first "CANCELLED" of the
        # earlier life's Ctrl-C made a task's failure read "cancelled", and an earlier life's exit
        # record made a lost ssh connection read "killed by signal 15".
        from launcher.monitor import how_it_ended, srun_failure
        from launcher.placement import Proc
        from launcher.processes import start
        from launcher.remote import MARK
        logs = self.tmp / "appended"
        logs.mkdir()
        srun = Proc(name="srun", role="srun", rank=-1, index=-1, host="local", argv=[], log=logs / "srun.log")
        srun.log.write_text("slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-11-29T10:00:00 ***\n")
        srun.command = ["sh", "-c", "echo 'srun: error: n1: task 1: Exited with exit code 1'; exit 1"]
        start(srun, self.tmp, append_log=True)
        srun.returncode = srun.popen.wait(timeout=10)
        tasks = [Proc(name=f"worker{i}", role="worker", rank=i, index=i, host="n1", argv=[]) for i in range(2)]
        e = srun_failure(tasks, srun, self.tmp)(srun)
        self.assertEqual(e.status, "failed", str(e))
        self.assertIn("task 1 = worker1 (rank 1) on n1 failed first (Exited with exit code 1)", str(e))

        over_ssh = Proc(name="server0", role="server", rank=0, index=0, host="h1", argv=[], control=True,
                        log=logs / "server0.log", ssh_log=logs / "server0.ssh.log")
        over_ssh.ssh_log.write_text(MARK + json.dumps({"event": "exit", "host": "h1", "pid": 11, "signal": 15,
                                                       "name": "SIGTERM"}) + "\n")
        over_ssh.command = ["sh", "-c", "echo 'Connection to h1 closed by remote host.'; exit 255"]
        start(over_ssh, self.tmp, append_log=True)
        over_ssh.popen.stdin.close()
        over_ssh.returncode = over_ssh.popen.wait(timeout=10)
        self.assertIn("lost its ssh connection", how_it_ended(over_ssh))

    def test_what_the_launcher_runs_does_not_read_its_stdin(self):
        # Defect: `ssh HOST nvidia-smi -L`, srun's probe step and `ssh HOST tail` read the launcher's
        # stdin: `while read c; do launch.py run "$c"; done < configs.txt` lost the rest of the list.
        seen = self.tmp / "seen"
        script = (f"import subprocess, sys; sys.path.insert(0, {str(REPO / 'experiments')!r})\n"
                  "from launcher.common import cmd_out\nfrom launcher.processes import run_in_group\n"
                  f"cmd_out(['sh', '-c', 'cat >> {seen}'])\nrun_in_group(['sh', '-c', 'cat >> {seen}'], 10)\n"
                  "print(sys.stdin.read().split())\n")
        configs = self.tmp / "configs.txt"
        configs.write_text("a.toml\nb.toml\n")
        with open(configs) as stdin:
            out = subprocess.run([PYTHON, "-c", script], stdin=stdin, capture_output=True, text=True, timeout=30)
        self.assertEqual(out.stdout.strip(), "['a.toml', 'b.toml']", out.stderr)
        self.assertEqual(seen.read_text(), "")

    def test_a_process_that_outlives_its_sigkill_is_named_not_waited_for_for_ever(self):
        # (one stuck in the kernel: a log on a hard-mounted NFS whose server is gone; stood in for by
        # a process never sent the signal) the launcher's last wait had no timeout: it hung.
        import contextlib
        import io
        from launcher import processes
        stuck = subprocess.Popen(["sleep", "60"])
        self.addCleanup(lambda: (stuck.kill(), stuck.wait()))
        err = io.StringIO()
        with unittest.mock.patch.object(processes, "REAP_S", 0.3), contextlib.redirect_stderr(err):
            t0 = time.monotonic()
            processes.reap(stuck, "server0 (shard 0) on h1")
        self.assertLess(time.monotonic() - t0, 5)
        self.assertIn(f"server0 (shard 0) on h1 (pid {stuck.pid}) did not end 0.3 s after SIGKILL (state S", err.getvalue())

    def test_local_listeners_never_share_a_port_the_kernel_handed_out_twice(self):
        # Each port is closed once chosen; the kernel may give a closed one to the next bind(0), and
        # two listeners of the run were told the same port (one then failed to bind).
        from launcher.placement import distinct_free_ports
        handed = iter([41000, 41000, 41001, 41000, 41002])
        port_of = distinct_free_ports("127.0.0.1", pick=lambda addr: next(handed))
        self.assertEqual([port_of(i) for i in (0, 1, 0, 2)], [41000, 41001, 41000, 41002])

    def test_the_heartbeat_goes_on_while_the_launcher_waits_on_something_else(self):
        # Defect: the "alive" lines came from the monitor loop alone: a stop's grace (up to 3 s) or
        # a manifest written meanwhile left every remote end without them for as long, and with
        # cluster.ssh_alive_s = 1 they stopped their processes.
        from launcher.processes import Heartbeat, close_stdin
        counter = subprocess.Popen([PYTHON, "-c", "import sys, time\n"
                                    "t = [time.monotonic() for _ in sys.stdin]\n"
                                    "print(len(t), max((b - a for a, b in zip(t, t[1:])), default=99))"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: counter.poll() is None and (counter.kill(), counter.wait()))
        os.set_blocking(counter.stdin.fileno(), False)  # (as start() makes an ssh client's)
        proc = types.SimpleNamespace(control=True, popen=counter)
        with Heartbeat([proc], 0.8):  # a line every 0.2 s
            time.sleep(1.6)  # the launcher's main thread busy elsewhere
        close_stdin(proc)
        lines, longest_gap = counter.stdout.read().split()
        counter.wait(timeout=10)
        self.assertGreaterEqual(int(lines), 4)
        self.assertLess(float(longest_gap), 0.8)

    def test_a_process_group_is_ended_once_its_leader_exits_and_never_signalled_again(self):
        # Defect: every exited process's group was killed again at each stop and at the run's end,
        # hours after it emptied: its number may belong to another group by then (pids wrap).
        from launcher.processes import end_group
        self.addCleanup(lambda: [os.kill(pid, signal.SIGKILL) for pid in {**sleeps("65.5"), **sleeps("66.25")}])
        leader = subprocess.Popen(["sh", "-c", "sleep 65.5 & exit 0"], start_new_session=True)
        leader.wait(timeout=10)
        proc = types.SimpleNamespace(popen=leader, group_ended=False)
        # what it left in its group (once it has become `sleep`: forked by sh, it may not have exec'd yet)
        wait_until(self, lambda: len(sleeps("65.5")) == 1, 10, "the leader left no sleep in its group")
        end_group(proc)
        wait_until(self, lambda: not sleeps("65.5"), 10, "what the leader left in its group, killed")
        other = subprocess.Popen(["sleep", "66.25"], start_new_session=True)  # its number, reused
        self.addCleanup(lambda: other.poll() is None and (other.kill(), other.wait()))
        proc.popen = types.SimpleNamespace(pid=other.pid, poll=lambda: 0)
        end_group(proc)
        time.sleep(0.3)
        self.assertIsNone(other.poll(), "a group signalled again after it had been ended")

    def test_failed_run_is_cleaned_up_before_the_next_one(self):
        # --keep-going: while the sweep's second run trains, nothing of the failed first run is left
        path = self.tiny_variant("sweep.toml", [('mode = "bsp"', 'mode = ["bsp", "asp"]'), ("steps = 500", "steps = 100000")])
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots", "--keep-going")
        procs = self.wait_for_processes(4)
        self.assertTrue(all("mode=bsp" in " ".join(argv) for argv in procs.values()), procs)
        server = [pid for pid, argv in procs.items() if "pslab_server" in argv[0]]
        time.sleep(0.3)
        os.kill(server[0], signal.SIGKILL)
        wait_until(self, lambda: any("mode=asp" in " ".join(a) for a in pslab_processes(str(self.runs)).values()), 20,
                   "the second run did not start")
        left = {pid: a for pid, a in cmdlines_containing(str(self.runs)).items() if "mode=bsp" in " ".join(a)}
        self.assertEqual(left, {}, "processes of the failed run are still there")  # (this test's: others may run beside it)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130, out + err)
        self.assertRegex(err, r"FAILED mode=bsp: server0 \(shard 0\) on local was killed by signal 9")
        self.assert_no_processes_left()


class DiskTrouble(LauncherTestCase):
    """A full disk or a read-only runs directory: exit 1 with a line naming the path and the
    system's reason, no traceback, no 0-byte or cut file, nothing left running."""

    def mount_tmpfs(self, size, read_only=False):
        if os.geteuid() != 0:
            self.skipTest("SKIPPED: mounting a small tmpfs needs root")
        mnt = self.tmp / "disk"
        mnt.mkdir()
        opts = f"size={size}" + (",ro" if read_only else "")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest(f"SKIPPED: cannot mount a tmpfs here: {r.stderr.strip()}")
        self.mounted = mnt
        return mnt

    def tearDown(self):
        self.stop_launchers()
        if getattr(self, "mounted", None):  # before the test's directory is removed
            subprocess.run(["umount", "-l", str(self.mounted)], check=False)
        super().tearDown()

    def test_a_full_disk_is_one_clear_line_and_nothing_is_cut(self):
        mnt = self.mount_tmpfs("48k")
        r = self.launch("run", TINY, "--runs-dir", mnt / "runs", "--no-plots", timeout=120)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertRegex(r.stderr, rf"{mnt}/runs/\S+: (cannot write metrics: |cannot write the order trace: )?No space left on device"
                         rf"|cannot write {mnt}/runs/\S+: No space left on device")
        files = [f for f in mnt.rglob("*") if f.is_file()]
        self.assertEqual([f for f in files if f.suffix == ".json" and f.stat().st_size == 0], [], "an empty JSON file")
        self.assertEqual([f for f in files if f.name.endswith(".tmp")], [], "a temporary file was left")
        for f in files:
            if f.suffix in (".json", ".jsonl"):
                text = f.read_text()
                self.assertTrue(text == "" or text.endswith("\n"), f"{f} is cut: ...{text[-40:]!r}")
                for line in text.splitlines() if f.suffix == ".jsonl" else [text]:
                    json.loads(line)
        self.assert_no_processes_left()

    def test_a_read_only_runs_directory_is_one_clear_line(self):
        mnt = self.mount_tmpfs("1m", read_only=True)
        r = self.launch("run", TINY, "--runs-dir", mnt / "runs", "--no-plots", timeout=60)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(r.stderr.strip(), f"launch.py: error: {mnt}/runs: Read-only file system")
        self.assert_no_processes_left()


if __name__ == "__main__":
    unittest.main()
