"""The ssh launcher end to end through a stand-in `ssh` on PATH that runs the command here (Ssh),
and over two hosts made of network namespaces (TwoHosts: needs root and iproute2; run by its own
CTest entry, launcher_two_hosts, which sets PSLAB_TWO_HOSTS=1; skipped, saying why, elsewhere).
"""
import json
import os
import pathlib
import random
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import time
import unittest

from tests.launcher.helpers import LAUNCH, PYTHON, REPO, LauncherTestCase, remote_argv, free_base_port, sleeps, wait_until


class Ssh(LauncherTestCase):
    """Runs over ssh through a local stand-in."""

    def test_ssh_end_to_end_with_a_local_stand_in(self):
        log = self.tmp / "ssh-calls"
        self.fake_bin("ssh", f"""\
            #!/bin/bash
            # stand-in: ssh [-o OPT]... HOST COMMAND -> runs COMMAND here
            while [[ $1 == -o ]]; do shift 2; done
            echo "$1" >> {log}
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"  # what sshd sets: the address reached
            exec bash -c "$2"
            """)
        path = self.ssh_config(["localhost", "127.0.0.1"], servers=1, workers=2)
        base = free_base_port()
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", "--base-port", base)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # each host asked once for its address and free ports, then one ssh per process
        self.assertEqual(sorted(log.read_text().split()), ["127.0.0.1"] * 3 + ["localhost"] * 3)
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual(s["status"], "ok")
        self.assertGreater(s["final_test_acc"], 0.85)
        self.assert_no_processes_left()

    def test_the_socket_directory_made_on_a_host_is_removed_when_the_run_ends(self):
        # ipc over ssh: each host makes the run's socket directory; only the launcher's own copy was
        # removed, and every run left one in each host's /tmp.
        log = self.tmp / "ssh-commands"
        self.fake_bin("ssh", f"""\
            #!/bin/bash
            while [[ $1 == -o ]]; do shift 2; done
            printf '%s\\n' "$2" >> {log}
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"
            exec bash -c "$2"
            """)
        path = self.ssh_config(["localhost"], servers=1, workers=2)
        path.write_text(path.read_text().replace("[cluster]", '[cluster]\ntransport = "ipc"'))
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        made = re.findall(r"mkdir -p -m 700 (/tmp/pslab-\S+) &&", log.read_text())
        self.assertEqual(len(set(made)), 1, log.read_text())
        self.assertIn(f"rm -rf {made[0]}", log.read_text().splitlines())
        self.assertFalse(pathlib.Path(made[0]).exists())
        self.assert_no_processes_left()

    def test_a_remote_end_that_could_not_start_is_named_with_what_ssh_said(self):
        # server0's remote end fails before it can write its record (a log it cannot open): the
        # failure names ssh's exit and what ssh carried back, not an empty log.
        self.fake_bin("ssh", """\
            #!/bin/bash
            while [[ $1 == -o ]]; do shift 2; done
            if [[ $2 == *" remote "*server0.log* ]]; then
              echo "PermissionError: [Errno 13] Permission denied: '/data/runs/server0.log'" >&2; exit 3
            fi
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"
            exec bash -c "$2"
            """)
        path = self.ssh_config(["localhost", "127.0.0.1"], servers=1, workers=2)
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", "--base-port", free_base_port())
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"server0 \(shard 0\) on \S+ exited with code 3 without the remote end's record; ssh said \(\S+server0\.ssh\.log\):\n"
                                   r"    PermissionError: \[Errno 13\] Permission denied: '/data/runs/server0.log'")
        self.assert_no_processes_left()

    def test_a_host_lost_between_the_runs_of_a_sweep_fails_that_run_not_the_sweep(self):
        # Defect: a probe that failed in the second run was a usage error: exit 2 ("nothing was
        # started"), --keep-going ignored, and no comparison of the run that had finished.
        probes = self.tmp / "probes"
        self.fake_bin("ssh", f"""\
            #!/bin/bash
            while [[ $1 == -o ]]; do shift 2; done
            if [[ $2 == *" probe"* && $1 == 127.0.0.1 ]]; then
              echo x >> {probes}
              if (( $(wc -l < {probes}) > 1 )); then echo "ssh: connect to host $1 port 22: No route to host" >&2; exit 255; fi
            fi
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"
            exec bash -c "$2"
            """)
        path = self.ssh_config(["localhost", "127.0.0.1"], servers=1, workers=2)
        path.write_text(path.read_text().replace('mode = "bsp"', 'mode = ["bsp", "asp", "ssp:1"]'))
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", "--keep-going", "--base-port", free_base_port())
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("launch.py: FAILED mode=asp: host 127.0.0.1", r.stderr)
        self.assertIn("launch.py: FAILED mode=ssp_1: host 127.0.0.1", r.stderr)
        md = (self.only_invocation("tiny") / "comparison.md").read_text()
        self.assertIn("| mode=bsp | bsp |", md)
        self.assert_no_processes_left()

    def test_ctrl_c_while_a_host_is_slow_to_answer_its_probe_stops_at_once(self):
        # Defect: the probe's wait (up to 30 s) heard no signal.
        self.fake_bin("ssh", """\
            #!/bin/bash
            while [[ $1 == -o ]]; do shift 2; done
            [[ $2 == *" probe"* && $1 == 127.0.0.1 ]] && exec sleep 67.5
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"
            exec bash -c "$2"
            """)
        path = self.ssh_config(["localhost", "127.0.0.1"], servers=1, workers=2)
        p = subprocess.Popen([PYTHON, str(LAUNCH), "run", str(path), "--runs-dir", str(self.runs), "--no-plots"],
                             cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        wait_until(self, lambda: sleeps("67.5"), 30, "the slow probe")
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=20)
        self.assertLess(time.monotonic() - t0, 5, out)
        self.assertEqual(p.returncode, 130, out)
        wait_until(self, lambda: not sleeps("67.5"), 10, "the probe's ssh, stopped")

    def test_a_host_with_another_version_is_refused_naming_it(self):
        # "old": its launch.py has no probe (argparse refuses it); "other": another protocol
        self.fake_bin("ssh", """\
            #!/bin/bash
            while [[ $1 == -o ]]; do shift 2; done
            if [[ $1 == old ]]; then
              echo "launch.py: error: argument command: invalid choice: 'probe' (choose from 'run', 'resume')" >&2; exit 2
            fi
            if [[ $1 == other ]]; then
              echo '{"hostname": "other", "address": "10.0.0.9", "ports": [1, 2, 3], "protocol": 1, "revision": "abc1234"}'
              exit 0
            fi
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"
            exec bash -c "$2"
            """)
        for host, says in (("old", "an older one, whose launch.py has no 'probe'"),
                           ("other", "launcher protocol 1, revision abc1234")):
            path = self.ssh_config(["localhost", host], servers=1, workers=2)
            r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots")
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn(f"host {host} runs another version of pslab ({says}) than this host (protocol ", r.stderr)
            self.assertIn(f"bring {REPO} on {host} to this revision and build it there", r.stderr)
        # refused before anything started: no run directory is left, and no `latest` points at one
        self.assertEqual(list((self.runs / "tiny").iterdir()) if (self.runs / "tiny").exists() else [], [])
        self.assert_no_processes_left()

    def test_allreduce_over_ssh_with_a_local_stand_in(self):
        # rank 0 and the evaluator listen on endpoints named by host name, as on a real cluster
        self.fake_bin("ssh", """\
            #!/bin/bash
            while [[ $1 == -o ]]; do shift 2; done
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"  # what sshd sets: the address reached
            exec bash -c "$2"
            """)
        path = self.ssh_config([socket.gethostname(), "127.0.0.1"], servers=1, workers=2)
        path.write_text(path.read_text().replace('mode = "bsp"', 'mode = "allreduce"'))
        base = free_base_port()
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", "--base-port", base)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual((s["mode"], s["servers"], s["status"], s["staleness"]), ("allreduce", 0, "ok", None))
        self.assertGreater(s["final_test_acc"], 0.85)
        self.assert_no_processes_left()

    def test_the_remote_ends_hear_the_launcher_all_run_long(self):
        # cluster.ssh_alive_s = 1: each remote end stops its process once it has not heard the
        # launcher's line "alive" for 1 s, and ssh gives up on a host it has not heard as soon. A
        # run of 2000 steps (several seconds) ends ok only if the launcher says it all along.
        calls = self.tmp / "ssh-calls"
        self.fake_bin("ssh", f"""\
            #!/bin/bash
            echo "$*" >> {calls}
            while [[ $1 == -o ]]; do shift 2; done
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"  # what sshd sets: the address reached
            exec bash -c "$2"
            """)
        path = self.ssh_config(["localhost", "127.0.0.1"], servers=1, workers=2)
        path.write_text(path.read_text().replace("steps = 500", "steps = 2000")
                        .replace("[cluster]", "[cluster]\nssh_alive_s = 1\nreconnect_s = 0"))
        started = time.monotonic()
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", "--base-port", free_base_port())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertGreater(time.monotonic() - started, 4, "too short a run to show the launcher heard")
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual(s["status"], "ok")
        runs = [c for c in calls.read_text().splitlines() if " remote " in c]
        self.assertEqual(len(runs), 4, runs)  # a server, two workers, the evaluator
        for c in runs:
            self.assertIn("-o ServerAliveInterval=1 -o ServerAliveCountMax=1 ", c)
            self.assertIn(" --alive-s 1 ", c)
        self.assert_no_processes_left()

    def test_a_remote_end_that_had_no_cpu_reads_the_alive_line_waiting_before_it_stops(self):
        # A remote end starved longer than ssh_alive_s (a busy host) found the launcher's last
        # word too old and stopped its process, though an "alive" line waited on its stdin.
        import io
        import sys
        import types
        sys.path.insert(0, str(REPO / "experiments"))
        from launcher.remote import RemoteEnd
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)
        end = RemoteEnd(types.SimpleNamespace(pid=-1), io.BytesIO(), [], alive_s=0.1, stdin=r)
        end.ssh = types.SimpleNamespace(line=lambda text: None)
        stops = []
        end.stop = lambda: stops.append(True)
        end.heard_at = time.monotonic() - 1.0  # this end had no CPU for a second ...
        os.write(w, b"alive\n")  # ... while the launcher spoke
        end.tick()
        self.assertEqual(stops, [], "a remote end stopped its process with the launcher's line waiting")
        os.read(r, 100)  # (read, and then nothing for 1 s: silent)
        end.tick()
        self.assertEqual(stops, [True])


class TwoHosts(LauncherTestCase):
    """A run over two hosts made of network namespaces (PSLAB_TWO_HOSTS=1)."""

    def two_namespace_hosts(self):
        """Two network namespaces joined by a veth pair stand in for two hosts: (ip A, ip B), and a
        stand-in ssh on PATH that runs a command "on" an address in its namespace. Skips (saying
        why) where namespaces cannot be made: not root, or no CAP_SYS_ADMIN (some containers)."""
        if os.environ.get("PSLAB_TWO_HOSTS") != "1":
            self.skipTest("two-host test: run by its own CTest entry, launcher_two_hosts (PSLAB_TWO_HOSTS=1)")
        if os.geteuid() != 0 or not shutil.which("ip"):
            self.skipTest("two-host test: needs root and iproute2 to make network namespaces")
        tag = f"{os.getpid() % 10000}{random.randrange(100)}"
        ns, net = (f"pslab-a{tag}", f"pslab-b{tag}"), f"10.231.{random.randrange(1, 250)}"
        ips = (f"{net}.1", f"{net}.2")
        def ip(*args):
            return subprocess.run(["ip", *args], capture_output=True, text=True)
        r = ip("netns", "add", ns[0])
        if r.returncode != 0:
            self.skipTest(f"two-host test: cannot make a network namespace here ({r.stderr.strip()})")
        self.addCleanup(lambda: [ip("netns", "del", n) for n in ns])
        for cmd in (["netns", "add", ns[1]],
                    ["link", "add", f"va{tag}", "netns", ns[0], "type", "veth", "peer", "name", f"vb{tag}", "netns", ns[1]],
                    ["-n", ns[0], "addr", "add", f"{ips[0]}/24", "dev", f"va{tag}"],
                    ["-n", ns[1], "addr", "add", f"{ips[1]}/24", "dev", f"vb{tag}"],
                    ["-n", ns[0], "link", "set", f"va{tag}", "up"], ["-n", ns[1], "link", "set", f"vb{tag}", "up"],
                    ["-n", ns[0], "link", "set", "lo", "up"], ["-n", ns[1], "link", "set", "lo", "up"]):
            r = ip(*cmd)
            if r.returncode != 0:
                self.skipTest(f"two-host test: cannot link the namespaces here (ip {' '.join(cmd)}: {r.stderr.strip()})")
        self.fake_bin("ssh", f"""\
            #!/bin/bash
            # stand-in: ssh [-o OPT]... ADDRESS COMMAND -> COMMAND in that address's namespace
            while [[ $1 == -o ]]; do shift 2; done
            case $1 in {ips[0]}) ns={ns[0]} ;; {ips[1]}) ns={ns[1]} ;; *) echo "no host $1" >&2; exit 255 ;; esac
            export SSH_CONNECTION="$1 40000 $1 22"
            exec ip netns exec $ns bash -c "$2"
            """)
        def bytes_across():  # bytes that went through host A's end of the link, both ways
            out = ip("-n", ns[0], "-s", "-j", "link", "show", f"va{tag}").stdout
            st = json.loads(out)[0]["stats64"]
            return st["rx"]["bytes"] + st["tx"]["bytes"]
        return ips, bytes_across

    def test_a_run_over_two_hosts_uses_tcp_between_them(self):
        """cluster.transport = "auto" across two hosts (network namespaces): in the parameter-server
        run each pair of processes on one host talks over shared memory and each pair across
        hosts over TCP (a server listens on both); the all-reduce run uses TCP and Gloo. Both
        finish, their traffic crossed the link between the hosts, and nothing is left behind."""
        ips, bytes_across = self.two_namespace_hosts()
        path = self.ssh_config(list(ips), servers=2, workers=2)
        path.write_text(path.read_text().replace("[cluster]", '[cluster]\ntransport = "auto"'))
        for mode in ("bsp", "allreduce"):
            path.write_text(re.sub(r'mode = "\w+"', f'mode = "{mode}"', path.read_text()))
            before = bytes_across()
            base = free_base_port()
            r = self.launch("run", path, "--runs-dir", self.runs / mode, "--no-plots", "--base-port", base)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            run = next((self.runs / mode).glob("tiny/*/run"))
            s = json.loads((run / "summary.json").read_text())
            self.assertEqual((s["mode"], s["status"]), (mode, "ok"))
            self.assertGreater(s["final_test_acc"], 0.85)
            manifest = json.loads((run / "manifest.json").read_text())
            procs = {p["name"]: p for p in manifest["processes"]}
            # over two hosts, listeners bind addresses others reach: peers prove the run's key (cluster.auth = "auto")
            self.assertEqual(manifest["auth"], "curve")
            self.assertEqual(stat.S_IMODE((run / "run.key").stat().st_mode), 0o600)
            self.assertTrue(all("--auth-key" in p["command"] for p in procs.values()), procs)
            crossed = bytes_across() - before
            # every step moves the model (132 floats) between the hosts; 500 steps x 2 workers
            self.assertGreater(crossed, 500 * 132 * 4, "the run's traffic did not cross the link between the hosts")
            if mode == "allreduce":
                self.assertNotIn("ipc://", json.dumps(procs))
                log = (run / "logs" / "worker1.log").read_text()
                self.assertIn("allreduce over gloo", log)
                continue
            # round robin: server0, worker0, evaluator on host A; server1, worker1 on host B
            self.assertEqual([procs[n]["host"] for n in ("server0", "server1", "worker0", "worker1", "evaluator")],
                             [ips[0], ips[1], ips[0], ips[1], ips[0]])
            def arg(name, flag):
                argv = shlex.split(procs[name]["command"])  # ssh ... HOST 'cd REPO && ... && exec ARGV'
                argv = remote_argv(argv)
                return argv[argv.index(flag) + 1]
            for k in (0, 1):
                # each server binds its own host's address (the one ssh reached it at), not every interface
                self.assertRegex(arg(f"server{k}", "--bind"), rf"^ipc:///tmp/pslab-[^+]+/server{k}\+tcp://{ips[k]}:{base + k}$")
            sock = arg("server0", "--bind").split("+")[0]
            ipc1 = arg("server1", "--bind").split("+")[0]
            for who, expected in (("worker0", [sock, f"tcp://{ips[1]}:{base + 1}"]),
                                  ("evaluator", [sock, f"tcp://{ips[1]}:{base + 1}"]),
                                  ("worker1", [f"tcp://{ips[0]}:{base}", ipc1])):
                self.assertEqual(arg(who, "--servers").split(","), expected, who)
            self.assertFalse(pathlib.Path(sock).parent.exists(), "the run's socket directory was left behind")
        self.assert_no_processes_left()


if __name__ == "__main__":
    unittest.main()
