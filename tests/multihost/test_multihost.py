"""The multi-host tier: the launcher over real ssh across three hosts made of network namespaces,
and under a real Slurm of two nodes in namespaces.

Each host is a network namespace with its own sshd (Debian's openssh-server, installed by this
tier when missing), its own /etc/hosts in which its own name is 127.0.1.1 (Debian's default,
which once broke Gloo), and two links: a management network (10.77.N.0/24, where ssh reaches it)
and a data network (10.78.N.0/24, interface "data0" in every namespace). The hosts share this
machine's file system, as cluster nodes share one. The launcher runs in the root namespace.

Checked: bsp, asp and allreduce across the three hosts; cluster.interface = "data0" puts every
process's traffic on the data network (ZeroMQ and Gloo alike); Ctrl-C of the launcher and a
`kill -9` of a remote worker leave no process in any namespace (`ip netns pids`), the latter
reported as a SIGKILL on that host; two concurrent runs on the same hosts do not collide; a host's
links down for 10 s in an asp and a bsp run lose nothing (asp's servers take back the workers
they dropped, bsp's await them);
the launcher run from one of the hosts (where its own name is 127.0.1.1) places and reaches
every process at its host's address; a replay of an ssh run is bit for bit; a server killed over ssh, before and after its first
checkpoint, is restarted there and the run ends ok.

Slurm: slurmctld here, one slurmd per namespace node (nodeA with 3 CPUs, nodeB with 1), munged
with a key and socket of its own (Debian's slurmctld, slurmd, slurm-client and munge, installed
when missing). Checked: an uneven allocation (`salloc -N 2 -n 4`: 3 tasks on nodeA, 1 on nodeB)
runs with each task where Slurm put it, recorded so in the manifest; allreduce (Gloo) across the
nodes; `scancel` reported as a cancelled job (under salloc and under sbatch), a task killed with
kill -9 reported as that task killed (not as the step's cancellation that follows), with no
process left on either node.

Needs root, iproute2 and network namespaces, sshd and Slurm (installed with apt-get when
missing); skips with the reason otherwise. Run from the repository root:
    PSLAB_BUILD=build PSLAB_MULTIHOST=1 /usr/bin/python3 -m unittest -v tests/multihost/test_multihost.py
"""
import atexit
import json
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from tests.launcher.helpers import BUILD, LAUNCH, PYTHON, REPO, TINY, Launches, wait_for_train_lines_in, wait_until

SSHD = "/usr/sbin/sshd"
HOSTS = ("hostA", "hostB", "hostC")


def sh(*argv, check=True, **kw):
    r = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def undo(made):
    """Removes what a cluster made, newest first: ("link" | "netns", name), ("etc", its
    /etc/netns/NS directory), ("etc-parent", /etc/netns itself, if it is empty)."""
    for kind, what in reversed(made):
        if kind == "etc":
            shutil.rmtree(what, ignore_errors=True)
        elif kind == "etc-parent":
            try:
                os.rmdir(what)
            except OSError:
                pass
        else:
            sh("ip", kind, "del", what, check=False)


def cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"


def why_not():
    """None where the tier can run here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    if not shutil.which("ip"):
        return "needs iproute2 (ip netns)"
    probe = f"pslab-probe{os.getpid()}"
    r = sh("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot make a network namespace here: {r.stderr.strip()}"
    sh("ip", "netns", "del", probe, check=False)
    if not os.access(SSHD, os.X_OK):
        r = sh("apt-get", "install", "-y", "--no-install-recommends", "openssh-server", "openssh-client", check=False,
               env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        if r.returncode != 0 or not os.access(SSHD, os.X_OK):
            return f"no sshd, and apt-get install openssh-server failed: {(r.stderr or r.stdout).strip()[-300:]}"
    return None


class Cluster:
    """Three namespace hosts with sshd; `ssh_env` makes the launcher's ssh reach them."""

    def __init__(self, tmp):
        self.tmp = tmp
        tag = f"{os.getpid() % 1000}{random.randrange(100)}"
        self.net = random.randrange(1, 250)
        self.ns = {h: f"pslab-{h[-1].lower()}{tag}" for h in HOSTS}
        self.bridges = (f"pmg{tag}", f"pda{tag}")  # management, data
        self.mgmt = {h: f"10.77.{self.net}.{2 + i}" for i, h in enumerate(HOSTS)}
        self.data = {h: f"10.78.{self.net}.{2 + i}" for i, h in enumerate(HOSTS)}
        self.sshd_pids = {}
        self.made = []

    def up(self):
        for br, prefix in zip(self.bridges, ("10.77", "10.78")):
            sh("ip", "link", "add", br, "type", "bridge")
            self.made.append(("link", br))
            sh("ip", "addr", "add", f"{prefix}.{self.net}.1/24", "dev", br)
            sh("ip", "link", "set", br, "up")
        for i, h in enumerate(HOSTS):
            ns = self.ns[h]
            sh("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            for br, dev, addr in ((self.bridges[0], "mgmt0", self.mgmt[h]), (self.bridges[1], "data0", self.data[h])):
                peer = f"{br[:3]}{ns[-5:]}{i}"[:15]
                sh("ip", "link", "add", peer, "type", "veth", "peer", "name", dev, "netns", ns)
                sh("ip", "link", "set", peer, "master", br)
                sh("ip", "link", "set", peer, "up")
                sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                sh("ip", "-n", ns, "link", "set", dev, "up")
            # Debian's /etc/hosts: the host's own name is 127.0.1.1 (ip netns exec mounts this over /etc/hosts)
            etc = pathlib.Path("/etc/netns") / ns
            if not etc.parent.exists():
                self.made.append(("etc-parent", str(etc.parent)))  # removed last, if empty
            etc.mkdir(parents=True, exist_ok=True)
            self.made.append(("etc", str(etc)))
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {h}\n")
        key = self.tmp / "id"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.tmp / "hostkey"))
        (self.tmp / "authorized_keys").write_text((self.tmp / "id.pub").read_text())
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        for h in HOSTS:
            cfg = self.tmp / f"sshd-{h}.conf"
            cfg.write_text(f"ListenAddress {self.mgmt[h]}\nHostKey {self.tmp / 'hostkey'}\n"
                           f"PidFile {self.tmp / f'sshd-{h}.pid'}\nAuthorizedKeysFile {self.tmp / 'authorized_keys'}\n"
                           "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                           "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nMaxStartups 100\n"
                           "MaxSessions 100\nLogLevel ERROR\n")
            # its own UTS namespace: `hostname` on the host says its name
            sh("ip", "netns", "exec", self.ns[h], "unshare", "--uts", "sh", "-c",
               f"hostname {h} && exec {SSHD} -f {cfg}")
            pidfile, deadline = self.tmp / f"sshd-{h}.pid", time.monotonic() + 10
            while not pidfile.exists() or not pidfile.read_text().strip():  # written once it has daemonized
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {h} wrote no {pidfile}")
                time.sleep(0.05)
            self.sshd_pids[h] = int(pidfile.read_text())
        conf = self.tmp / "ssh_config"
        conf.write_text("".join(f"Host {h}\n  HostName {self.mgmt[h]}\n" for h in HOSTS) +
                        f"Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
                        "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        self.ssh_env = {"PSLAB_SSH": f"ssh -F {conf}"}
        for h in HOSTS:  # sshd answers
            deadline = time.monotonic() + 10
            while sh("ssh", "-F", str(conf), "-o", "BatchMode=yes", h, "true", check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {h} does not answer")
                time.sleep(0.1)

    def down(self):
        for pid in self.sshd_pids.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for h, ns in self.ns.items():  # anything else left there (a failed test)
            for pid in self.pids(h, sshd=True):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        undo(self.made)

    def pids(self, host, sshd=False):
        """The processes in host's namespace (its sshd daemon left out unless sshd)."""
        out = sh("ip", "netns", "pids", self.ns[host], check=False).stdout.split()
        return [int(p) for p in out if sshd or int(p) != self.sshd_pids.get(host)]

    def set_links(self, host, up, bridges=None):
        """Takes `host`'s links (both, management and data, or those to `bridges`) down or up, at the
        bridge's end, as a cable pulled out: its connections stay open, their packets go nowhere."""
        i = HOSTS.index(host)
        for br in bridges or self.bridges:
            sh("ip", "link", "set", f"{br[:3]}{self.ns[host][-5:]}{i}"[:15], "up" if up else "down")

    def data_bytes(self):
        total = 0
        for h in HOSTS:
            st = json.loads(sh("ip", "-n", self.ns[h], "-s", "-j", "link", "show", "data0").stdout)[0]["stats64"]
            total += st["rx"]["bytes"] + st["tx"]["bytes"]
        return total


def stopped_by_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


class ClusterTestCase(unittest.TestCase):
    """Tests on one cluster of namespace hosts, made for the class (cluster_type(tmp).up(), in a
    temporary directory named tmp_prefix...) and taken down after it; skipped, saying why, where
    why_not() says it cannot be made. Each test's runs go to self.runs."""
    tier = "multi-host tier"
    tmp_prefix = "pslab-test-multihost-"

    @classmethod
    def setUpClass(cls):
        reason = cls.why_not()
        if reason:
            raise unittest.SkipTest(f"{cls.tier}: {reason}")
        cls.tmp = pathlib.Path(tempfile.mkdtemp(prefix=cls.tmp_prefix))
        cls.cluster = cls.cluster_type(cls.tmp)
        # Stopped by SIGTERM (ctest, a CI job) or Ctrl-C, unittest leaves tearDownClass out: the
        # hosts' daemons and namespaces are taken down at the process's exit instead (SIGTERM
        # raised as KeyboardInterrupt, which unittest lets through).
        atexit.register(cls.take_down)
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, stopped_by_sigterm)
        try:
            cls.cluster.up()
        except Exception:
            cls.take_down()
            raise

    @classmethod
    def take_down(cls):
        """The cluster's daemons, namespaces and directory gone (once)."""
        atexit.unregister(cls.take_down)
        cluster, cls.cluster = getattr(cls, "cluster", None), None
        if cluster is not None:
            cluster.down()
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        cls.take_down()

    def setUp(self):
        self.runs = self.tmp / f"runs-{self._testMethodName}"

    def assert_no_process_left_on(self, places, what, grace=8.0):
        """No process but the cluster's own daemons in the namespaces of `places` (hosts or nodes)
        once `grace` s have passed."""
        end = time.monotonic() + grace
        while any(self.cluster.pids(x) for x in places) and time.monotonic() < end:
            time.sleep(0.1)
        left = {x: [cmdline(p) for p in self.cluster.pids(x)] for x in places}
        self.assertEqual({x: v for x, v in left.items() if v}, {}, f"processes left on the {what}")


@unittest.skipIf(os.environ.get("PSLAB_MULTIHOST") != "1", "the multi-host tier runs from its CTest entry, "
                 "multihost (PSLAB_MULTIHOST=1)")
class MultiHostTest(Launches, ClusterTestCase):
    cluster_type = Cluster
    why_not = staticmethod(why_not)
    launch_timeout = 120

    def setUp(self):
        super().setUp()
        self.env = dict(os.environ, PSLAB_BUILD=str(BUILD), **self.cluster.ssh_env)
        self.launchers = []

    def tearDown(self):
        self.stop_launchers()

    def config(self, name, mode="bsp", servers=2, workers=3, steps=500, extra=""):
        text = (TINY.read_text().replace("servers = 1", f"servers = {servers}")
                .replace("workers = 2", f"workers = {workers}").replace('mode = "bsp"', f'mode = "{mode}"')
                .replace("steps = 500", f"steps = {steps}"))
        text = text.replace("[cluster]", f'[cluster]\nlauncher = "ssh"\nhosts = {json.dumps(list(HOSTS))}\n{extra}')
        path = self.tmp / name
        path.write_text(text)
        return path

    def runs_of(self, runs):
        return sorted(d for d in runs.glob("tiny/*/*") if not d.parent.is_symlink() and (d / "plan.json").exists())

    def assert_no_process_on_any_host(self):
        self.assert_no_process_left_on(HOSTS, "hosts")

    def wait_for_train_lines(self, runs, names, timeout=60):
        wait_for_train_lines_in(self, runs, names, timeout, runs_glob="tiny/*/*")

    # ---- the tests -----------------------------------------------------------------------------
    def test_every_mode_across_three_hosts(self):
        for mode in ("bsp", "asp", "allreduce"):
            with self.subTest(mode=mode):
                runs = self.runs / mode
                r = self.launch("run", self.config(f"{mode}.toml", mode), "--runs-dir", runs, "--no-plots")
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                run, = self.runs_of(runs)
                s = json.loads((run / "summary.json").read_text())
                self.assertEqual((s["mode"], s["status"]), (mode, "ok"))
                self.assertGreater(s["final_test_acc"], 0.85)
                m = json.loads((run / "manifest.json").read_text())
                # the manifest records where each process really ran: its host's name and its pid there
                self.assertEqual({p["hostname"] for p in m["processes"]}, set(HOSTS))
                for p in m["processes"]:
                    self.assertEqual(p["hostname"], p["host"])
                    self.assertIsInstance(p["pid"], int)
                    self.assertNotEqual(p["pid"], p["ssh_client_pid"])
                # each host reached at its management address, ports chosen there for this run
                self.assertEqual({h: v["address"] for h, v in m["hosts"].items()}, self.cluster.mgmt)
                if mode == "allreduce":  # Gloo listens on the host's address, not its name's 127.0.1.1
                    log = (run / "logs" / "worker1.log").read_text()
                    self.assertIn("allreduce over gloo", log)
                    self.assertIn(f"--host {self.cluster.mgmt['hostB']}", next(
                        p["command"] for p in m["processes"] if p["name"] == "worker1"))
                self.assert_no_process_on_any_host()

    def test_an_interface_per_host_carries_zeromq_and_gloo(self):
        # cluster.interface = "data0": every host listens, and is reached, on its data network
        for mode in ("bsp", "allreduce"):
            with self.subTest(mode=mode):
                runs = self.runs / mode
                before = self.cluster.data_bytes()
                r = self.launch("run", self.config(f"if-{mode}.toml", mode, extra='interface = "data0"'),
                                "--runs-dir", runs, "--no-plots")
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                run, = self.runs_of(runs)
                self.assertEqual(json.loads((run / "summary.json").read_text())["status"], "ok")
                m = json.loads((run / "manifest.json").read_text())
                self.assertEqual({h: v["address"] for h, v in m["hosts"].items()}, self.cluster.data)
                commands = " ".join(p["command"] for p in m["processes"])
                self.assertNotIn("10.77.", commands)  # no listener or peer on the management network
                crossed = self.cluster.data_bytes() - before
                self.assertGreater(crossed, 500 * 132 * 4, "the run's traffic did not use the data network")
                self.assert_no_process_on_any_host()
        # an interface a host does not have: refused before anything starts, naming host and interface
        r = self.launch("run", self.config("if-bad.toml", extra='addresses = ["hostB=nosuch0"]'),
                        "--runs-dir", self.runs / "bad", "--no-plots")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("hostB", r.stderr)
        self.assertIn("'nosuch0'", r.stderr)
        self.assert_no_process_on_any_host()

    def test_ctrl_c_leaves_no_process_on_any_host(self):
        p = self.launch_bg("run", self.config("long.toml", steps=100000), "--runs-dir", self.runs, "--no-plots")
        self.wait_for_train_lines(self.runs, ["worker0", "worker1", "worker2"])
        self.assertTrue(all(self.cluster.pids(h) for h in HOSTS), "not every host runs a process")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 130, out + err)
        self.assert_no_process_on_any_host()
        run, = self.runs_of(self.runs)
        self.assertEqual(json.loads((run / "summary.json").read_text())["status"], "interrupted")
        # each remote end said how its process ended: stopped by the SIGTERM it sent
        self.assertIn('"name": "SIGTERM"', (run / "logs" / "worker1.log").read_text())

    def test_kill_9_of_the_launcher_leaves_no_process_on_any_host(self):
        # its ssh clients go with it (PR_SET_PDEATHSIG); each remote end, its connection gone,
        # stops its process
        p = self.launch_bg("run", self.config("kill9.toml", steps=100000), "--runs-dir", self.runs, "--no-plots")
        self.wait_for_train_lines(self.runs, ["worker0", "worker1", "worker2"])
        p.kill()
        p.communicate(timeout=10)
        self.assert_no_process_on_any_host()
        run, = self.runs_of(self.runs)
        self.assertIn('"name": "SIGTERM"', (run / "logs" / "worker1.log").read_text())

    def test_kill_9_of_a_remote_worker_is_reported_and_nothing_is_left(self):
        p = self.launch_bg("run", self.config("kill.toml", steps=100000), "--runs-dir", self.runs, "--no-plots")
        self.wait_for_train_lines(self.runs, ["worker1"])
        run, = self.runs_of(self.runs)
        started = [json.loads(line.split(" ", 1)[1]) for line in (run / "logs" / "worker1.log").read_text().splitlines()
                   if line.startswith("[pslab-launch] ")]
        pid = started[0]["pid"]
        self.assertIn(pid, self.cluster.pids(started[0]["host"]), "worker1 is not in its host's namespace")
        os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=90)
        self.assertEqual(p.returncode, 1, out + err)
        self.assertIn(f"worker1 (rank 1) on {started[0]['host']} was killed by signal 9 (SIGKILL) on "
                      f"{started[0]['host']} (pid {pid})", err)
        self.assert_no_process_on_any_host()

    def test_a_link_down_for_ten_seconds_loses_nothing(self):
        # asp and bsp across the three hosts; the links of the host running worker 2 go down for
        # 10 s. asp: the servers elsewhere drop the workers they no longer hear after heartbeat_s
        # and take them back when the link returns (cluster.reconnect_s, 30 s across hosts). bsp:
        # the servers await them as long. Workers and the evaluator wait for their silent servers
        # meanwhile. The run ends ok, nobody lost, every push applied once.
        for mode in ("asp", "bsp"):
            with self.subTest(mode=mode):
                runs = self.runs / mode
                p = self.launch_bg("run", self.config(f"link-{mode}.toml", mode, steps=3000, extra="heartbeat_s = 2"),
                                   "--runs-dir", runs, "--no-plots")
                self.wait_for_train_lines(runs, ["worker0", "worker1", "worker2"])
                run, = self.runs_of(runs)
                host = next(q["host"] for q in json.loads((run / "manifest.json").read_text())["processes"]
                            if q["name"] == "worker2")
                self.cluster.set_links(host, False)
                try:
                    time.sleep(10)
                finally:
                    self.cluster.set_links(host, True)
                out, err = p.communicate(timeout=240)
                self.assertEqual(p.returncode, 0, out + err)
                s = json.loads((run / "summary.json").read_text())
                self.assertEqual(s["status"], "ok", s)
                self.assertEqual(s["workers_lost"], [])
                self.assertEqual(s["updates_lost"], 0)
                self.assertEqual(s["pushed_by_codec"]["f32"]["pushes"], 3 * 2 * 3000)
                logs = " ".join(f.read_text() for f in (run / "logs").glob("server*.log"))
                if mode == "asp":
                    self.assertGreaterEqual(s["workers_back"], 1, "no server dropped and took back a worker")
                else:
                    self.assertIn("more for it to come back (cluster.reconnect_s; bsp cannot train on without it)", logs)
                self.assert_no_process_on_any_host()

    def test_a_host_the_launcher_cannot_reach_is_left_with_nothing_running(self):
        # bsp over the data network; the management link of server0's host goes down (ssh's
        # network): the run could go on, but the launcher cannot reach that host's processes to
        # stop them. The remote ends there, hearing nothing from the launcher for cluster.ssh_alive_s
        # = 4, stop their processes while the link is still down (the servers writing their
        # checkpoints as they stop); ssh gives up on the host as soon; the run fails naming a
        # process there. With the link back, `resume` ends it ok.
        runs = self.runs / "cut"
        p = self.launch_bg("run", self.config("cut.toml", "bsp", steps=3000,
                                              extra='interface = "data0"\nreconnect_s = 2\nssh_alive_s = 4'),
                           "--runs-dir", runs, "--no-plots")
        self.wait_for_train_lines(runs, ["worker0", "worker1", "worker2"])
        run, = self.runs_of(runs)
        placed = json.loads((run / "manifest.json").read_text())["processes"]
        host = next(q["host"] for q in placed if q["name"] == "server0")
        there = [q["name"] for q in placed if q["host"] == host]
        self.cluster.set_links(host, False, bridges=self.cluster.bridges[:1])
        try:
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 1, out + err)
            # (ssh's exit 255, or the remote end's own record where the log is on a shared file system)
            self.assertRegex(err, rf"FAILED run: ({'|'.join(there)}) \(.*\) on {host} "
                                  rf"(lost its ssh connection \(ssh exit 255\)|exited with code 1 on {host})")
            end = time.monotonic() + 10  # (sshd's own sessions there wait for the link)
            while self.run_processes_on(host) and time.monotonic() < end:
                time.sleep(0.1)
            self.assertEqual(self.run_processes_on(host), [], f"the run's processes on {host}, cut off")
        finally:
            self.cluster.set_links(host, True)
        for name in there:
            self.assertIn("heard nothing from the launcher for 4 s (cluster.ssh_alive_s)",
                          (run / "logs" / f"{name}.log").read_text())
        self.assert_no_process_on_any_host()
        r = self.launch("resume", run, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertGreater(s["final_test_acc"], 0.85)
        self.assertIn("resumed from", (run / "logs" / "server0.log").read_text())
        self.assert_no_process_on_any_host()

    def run_processes_on(self, host):
        """The command lines of the processes on `host` but sshd's."""
        found = []
        for pid in self.cluster.pids(host):
            try:
                if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != "sshd":
                    found.append(cmdline(pid))
            except OSError:
                pass
        return found

    def test_replay_of_an_ssh_run_is_bit_for_bit(self):
        # the remote processes got the launcher's numerics environment (BLAS core type, thread
        # counts), recorded in the manifest, so a replay here computes what they computed
        r = self.launch("run", self.config("replay.toml", "asp"), "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run, = self.runs_of(self.runs)
        self.assertIn("numerics_env", json.loads((run / "manifest.json").read_text()))
        r = self.launch("replay", run, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("bit for bit: 2 shard checksum(s) equal", r.stdout)
        self.assertNotIn("numerics environment differs", r.stderr)

    def test_a_server_killed_over_ssh_comes_back(self):
        # asp over tcp across the hosts: kill -9 of the remote server 1, before its first
        # checkpoint (from the run's initial θ) and after one (from it); the launcher restarts it
        # on its host over ssh, the workers rejoin it, the run ends ok and counts what was lost
        for every_s, how in ((1000, "from the run's initial θ"), (0.3, "from its checkpoint")):
            with self.subTest(checkpoint_every_s=every_s):
                runs = self.runs / str(every_s)
                path = self.config(f"kill-server-{every_s}.toml", "asp", steps=3000,
                                   extra='transport = "tcp"\nheartbeat_s = 1\n')
                path.write_text(path.read_text() + f"\n[checkpoint]\nevery_s = {every_s}\n")
                p = self.launch_bg("run", path, "--runs-dir", runs, "--no-plots")
                self.wait_for_train_lines(runs, ["worker0", "worker1", "worker2"])
                run, = self.runs_of(runs)
                if every_s < 1:
                    wait_until(self, (run / "checkpoints" / "server1.ckpt").exists, 20, "server 1 wrote no checkpoint")
                started = [json.loads(line.split(" ", 1)[1]) for line in (run / "logs" / "server1.log").read_text().splitlines()
                           if line.startswith("[pslab-launch] ")]
                os.kill(started[0]["pid"], signal.SIGKILL)
                out, err = p.communicate(timeout=120)
                self.assertEqual(p.returncode, 0, out + err)
                self.assertIn(f"restarting it {how}", err)
                s = json.loads((run / "summary.json").read_text())
                self.assertEqual(s["status"], "ok", s.get("failure"))
                self.assertEqual([r["server"] for r in s["servers_restarted"]], [1])
                self.assertGreater(s["final_test_acc"], 0.85)
                self.assert_no_process_on_any_host()

    def test_a_server_killed_over_ssh_with_its_backup_on_another_host_loses_nothing(self):
        # cluster.replicas = 2, asp over tcp across the hosts: backup k runs on the host after
        # server k's; kill -9 of the remote server 1 mid-run: the workers go to its backup, which
        # takes over with every update; a new backup starts where server 1 was; nothing lost
        runs = self.runs / "replicas"
        path = self.config("replicas.toml", "asp", steps=3000, extra='transport = "tcp"\nheartbeat_s = 1\nreplicas = 2\n')
        p = self.launch_bg("run", path, "--runs-dir", runs, "--no-plots")
        self.wait_for_train_lines(runs, ["worker0", "worker1", "worker2"])
        run, = self.runs_of(runs)
        hosts = {q["name"]: q["host"] for q in json.loads((run / "manifest.json").read_text())["processes"]}
        self.assertNotEqual(hosts["server1"], hosts["backup1"])
        started = [json.loads(line.split(" ", 1)[1]) for line in (run / "logs" / "server1.log").read_text().splitlines()
                   if line.startswith("[pslab-launch] ")]
        os.kill(started[0]["pid"], signal.SIGKILL)
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out + err)
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertEqual(s["updates_lost"], 0)
        self.assertEqual([c["process"] for c in s["copies_ended"]], ["server1"])
        self.assertGreater(s["final_test_acc"], 0.85)
        self.assert_no_process_on_any_host()

    def test_the_launcher_on_one_of_the_hosts(self):
        # the launcher run from hostA itself (its name there is 127.0.1.1), placing processes on all
        # three hosts, hostA included, over ssh: every process is reached at its host's address
        for mode in ("asp", "allreduce"):
            with self.subTest(mode=mode):
                runs = self.runs / mode
                r = subprocess.run(["ip", "netns", "exec", self.cluster.ns["hostA"], PYTHON, str(LAUNCH), "run",
                                    str(self.config(f"on-a-{mode}.toml", mode)), "--runs-dir", str(runs), "--no-plots"],
                                   cwd=REPO, env=self.env, capture_output=True, text=True, timeout=180)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                run, = self.runs_of(runs)
                self.assertEqual(json.loads((run / "summary.json").read_text())["status"], "ok")
                m = json.loads((run / "manifest.json").read_text())
                self.assertEqual({p["hostname"] for p in m["processes"]}, set(HOSTS))
                self.assertNotIn("127.0.1.1", " ".join(p["command"] for p in m["processes"]))
                self.assert_no_process_on_any_host()

    def test_a_stale_checkout_on_one_host_is_refused_naming_it(self):
        # hostC as reached through a second sshd there, in a mount namespace whose checkout at
        # REPO is older (another launcher protocol): the run is refused before anything starts
        # anywhere, naming the host and what to do
        stale = self.tmp / "stale-checkout"
        shutil.copytree(REPO / "experiments", stale / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
        common = stale / "experiments" / "launcher" / "common.py"
        text = common.read_text()
        now = int(text.split("LAUNCHER_PROTOCOL = ")[1].split()[0])
        common.write_text(text.replace(f"LAUNCHER_PROTOCOL = {now}", f"LAUNCHER_PROTOCOL = {now - 1}"))
        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
        conf, pidfile = self.tmp / "sshd-stale.conf", self.tmp / "sshd-stale.pid"
        conf.write_text((self.tmp / "sshd-hostC.conf").read_text()
                        .replace(f"ListenAddress {self.cluster.mgmt['hostC']}", f"ListenAddress {self.cluster.mgmt['hostC']}:{port}")
                        .replace(str(self.tmp / "sshd-hostC.pid"), str(pidfile)))
        sh("ip", "netns", "exec", self.cluster.ns["hostC"], "unshare", "--mount", "--uts", "sh", "-c",
           f"mount --bind {stale} {REPO} && hostname hostC && exec {SSHD} -f {conf}")
        wait_until(self, lambda: pidfile.exists() and pidfile.read_text().strip(), 10, "the second sshd wrote no pid file")
        stale_sshd = int(pidfile.read_text())

        def stop_stale_sshd():
            try:
                os.kill(stale_sshd, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.addCleanup(stop_stale_sshd)
        ssh_conf = self.tmp / "ssh_config-stale"
        ssh_conf.write_text(f"Host staleC\n  HostName {self.cluster.mgmt['hostC']}\n  Port {port}\n" +
                            (self.tmp / "ssh_config").read_text())
        path = self.config("stale.toml", "asp").read_text().replace(json.dumps(list(HOSTS)), '["hostA", "staleC"]')
        (self.tmp / "stale.toml").write_text(path)
        self.env["PSLAB_SSH"] = f"ssh -F {ssh_conf}"
        r = self.launch("run", self.tmp / "stale.toml", "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(f"host staleC runs another version of pslab (launcher protocol {now - 1}", r.stderr)
        self.assertIn(f"bring {REPO} on staleC to this revision and build it there", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertFalse(list(self.runs.glob("tiny/*/*/manifest.json")), "a refused run started something")
        stop_stale_sshd()
        self.assert_no_process_on_any_host()

    def test_two_concurrent_runs_on_the_same_hosts(self):
        path = self.config("concurrent.toml", "asp", steps=800)
        a = self.launch_bg("run", path, "--runs-dir", self.runs / "a", "--no-plots")
        b = self.launch_bg("run", path, "--runs-dir", self.runs / "b", "--no-plots")
        for name, p in (("a", a), ("b", b)):
            out, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, f"run {name}: {out}{err}")
        ports = []
        for name in ("a", "b"):
            run, = self.runs_of(self.runs / name)
            self.assertEqual(json.loads((run / "summary.json").read_text())["status"], "ok")
            ports.append({(h, port) for h, v in json.loads((run / "manifest.json").read_text())["hosts"].items()
                          for port in v["ports"]})
        self.assertFalse(ports[0] & ports[1], "the two runs shared a port")
        self.assert_no_process_on_any_host()


SLURM_NODES = ("nodeA", "nodeB")


def why_not_slurm():
    """None where a Slurm cluster can be made here, else why not (after why_not())."""
    need = ["/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun", "/usr/bin/salloc"]
    if not all(os.access(x, os.X_OK) for x in need):
        r = sh("apt-get", "install", "-y", "--no-install-recommends", "slurmctld", "slurmd", "slurm-client", "munge",
               check=False, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        if r.returncode != 0 or not all(os.access(x, os.X_OK) for x in need):
            return f"no Slurm, and apt-get install slurmctld slurmd slurm-client munge failed: {(r.stderr or r.stdout).strip()[-300:]}"
    return None


class SlurmCluster:
    """Two Slurm nodes in network namespaces (nodeA: 3 CPUs, nodeB: 1, so that `salloc -N 2 -n 4`
    is uneven), a slurmctld in this namespace and a munged of its own; all of it in foreground
    processes this object owns. `env` makes salloc, srun and scontrol use this cluster."""

    def __init__(self, tmp):
        self.tmp = tmp
        tag = f"{os.getpid() % 1000}{random.randrange(100)}"
        self.net = random.randrange(1, 250)
        self.ns = {n: f"pslab-s{n[-1].lower()}{tag}" for n in SLURM_NODES}
        self.bridge = f"psl{tag}"
        self.addr = {n: f"10.79.{self.net}.{2 + i}" for i, n in enumerate(SLURM_NODES)}
        self.daemons = []
        self.made = []

    def up(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        sh("ip", "addr", "add", f"10.79.{self.net}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, n in enumerate(SLURM_NODES):
            ns = self.ns[n]
            sh("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            peer = f"psv{ns[-4:]}{i}"[:15]
            sh("ip", "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", peer, "master", self.bridge)
            sh("ip", "link", "set", peer, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.addr[n]}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            etc = pathlib.Path("/etc/netns") / ns  # Debian's /etc/hosts: its own name is 127.0.1.1
            if not etc.parent.exists():
                self.made.append(("etc-parent", str(etc.parent)))  # removed last, if empty
            etc.mkdir(parents=True, exist_ok=True)
            self.made.append(("etc", str(etc)))
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {n}\n")
        d = self.tmp
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = d / "munge.sock"
        self.start(["/usr/sbin/munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                    f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"])
        self.wait_for(lambda: sock.exists(), "munged's socket")
        with socket.socket() as s1, socket.socket() as s2:
            s1.bind(("0.0.0.0", 0))
            s2.bind(("0.0.0.0", 0))
            ctld_port, slurmd_port = s1.getsockname()[1], s2.getsockname()[1]
        for sub in ("ctld", "spool-nodeA", "spool-nodeB"):
            (d / sub).mkdir()
        conf = d / "slurm.conf"
        conf.write_text(f"""ClusterName=pslabtest
SlurmctldHost={socket.gethostname()}(10.79.{self.net}.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={d / 'ctld'}
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
KillWait=10
NodeName=nodeA NodeAddr={self.addr['nodeA']} CPUs=3 State=UNKNOWN
NodeName=nodeB NodeAddr={self.addr['nodeB']} CPUs=1 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        self.env = {"SLURM_CONF": str(conf)}
        env = dict(os.environ, **self.env)
        self.start(["/usr/sbin/slurmctld", "-D", "-i"], env=env)
        for n in SLURM_NODES:
            # `ip netns exec` remounts /sys: slurmd's cgroup plugin needs a (v1) tree there
            mount = ("mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/freezer /sys/fs/cgroup/systemd && "
                     "mount -t cgroup -o freezer freezer /sys/fs/cgroup/freezer && "
                     "mount -t cgroup -o none,name=systemd systemd /sys/fs/cgroup/systemd")
            self.start(["ip", "netns", "exec", self.ns[n], "sh", "-c", f"{mount} && exec /usr/sbin/slurmd -D -N {n}"],
                       env=env)
        self.wait_for(lambda: sh("sinfo", "-h", "-o", "%T", check=False, env=env).stdout.split() == ["idle"],
                      "both Slurm nodes idle", timeout=30)

    def start(self, argv, env=None):
        log = open(self.tmp / f"{pathlib.Path(argv[0]).name}-{len(self.daemons)}.out", "wb")
        self.daemons.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env))
        log.close()

    def wait_for(self, ok, what, timeout=10):
        deadline = time.monotonic() + timeout
        while not ok():
            for p in self.daemons:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited ({p.returncode}) before {what}: see {self.tmp}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} after {timeout} s; logs in {self.tmp}")
            time.sleep(0.1)

    def down(self):
        for n in SLURM_NODES:  # the tasks of any job still running there, then the daemons
            for pid in self.pids(n):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in reversed(self.daemons):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        undo(self.made)

    def pids(self, node):
        """The processes in node's namespace but its slurmd (and the `ip netns exec` shell before it)."""
        out = sh("ip", "netns", "pids", self.ns[node], check=False).stdout.split()
        daemons = {p.pid for p in self.daemons}
        found = []
        for pid in map(int, out):
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            if pid not in daemons and not exe.endswith("/slurmd"):
                found.append(pid)
        return found


@unittest.skipIf(os.environ.get("PSLAB_MULTIHOST") != "1", "the multi-host tier runs from its CTest entry, "
                 "multihost (PSLAB_MULTIHOST=1)")
class SlurmTest(ClusterTestCase):
    """The launcher under a real Slurm (slurmctld, two slurmd in namespaces, munge)."""
    tier = "multi-host tier (Slurm)"
    tmp_prefix = "pslab-test-slurm-"
    cluster_type = SlurmCluster
    why_not = staticmethod(lambda: why_not() or why_not_slurm())

    def setUp(self):
        super().setUp()
        self.env = dict(os.environ, PSLAB_BUILD=str(BUILD), **self.cluster.env)

    def config(self, name, mode="bsp", steps=500):
        text = TINY.read_text().replace('mode = "bsp"', f'mode = "{mode}"').replace("steps = 500", f"steps = {steps}")
        path = self.tmp / name
        path.write_text(text.replace("[cluster]", '[cluster]\nlauncher = "slurm"'))
        return path

    def salloc(self, tasks, *args):
        return ["salloc", "-N", "2", "-n", str(tasks), "--quiet", PYTHON, str(LAUNCH), *map(str, args)]

    def run_of(self, runs=None):
        """The one run under `runs` (default: self.runs)."""
        runs = sorted(d for d in (runs or self.runs).glob("tiny/*/*")
                      if not d.parent.is_symlink() and (d / "plan.json").exists())
        self.assertEqual(len(runs), 1, runs)
        return runs[0]

    def assert_no_process_on_any_node(self):
        self.assert_no_process_left_on(SLURM_NODES, "nodes")

    def test_an_uneven_allocation_runs_where_slurm_put_each_task(self):
        # salloc -N 2 -n 4 on nodes of 3 CPUs and 1: three tasks on nodeA, one on nodeB
        r = subprocess.run(self.salloc(4, "run", self.config("bsp.toml"), "--runs-dir", self.runs, "--no-plots"),
                           cwd=REPO, env=self.env, capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.run_of()
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok")
        self.assertGreater(s["final_test_acc"], 0.85)
        m = {p["name"]: p for p in json.loads((run / "manifest.json").read_text())["processes"]}
        self.assertEqual([m[n]["host"] for n in ("server0", "worker0", "worker1", "evaluator")],
                         ["nodeA", "nodeA", "nodeA", "nodeB"])
        self.assertIn("--procs-on-host 3", m["worker1"]["command"])
        self.assertIn("--gpu-slot 1", m["worker1"]["command"])
        self.assertIn("--procs-on-host 1", m["evaluator"]["command"])
        # the server listens on nodeA's address (its NodeAddr), not its name's 127.0.1.1 nor every interface
        self.assertIn(f"--bind tcp://{self.cluster.addr['nodeA']}:", m["server0"]["command"])
        # its port came from the probe step (one task per node: ports free there), not the job id
        ports = json.loads((run / "launch.json").read_text())["ports"]
        self.assertEqual(sorted(ports), ["nodeA", "nodeB"])
        self.assertIn(f"--bind tcp://{self.cluster.addr['nodeA']}:{ports['nodeA'][0]} ", m["server0"]["command"] + " ")
        self.assertNotIn("could not ask the allocation's nodes", r.stderr)
        self.assert_no_process_on_any_node()

    def test_allreduce_across_nodes(self):
        r = subprocess.run(self.salloc(3, "run", self.config("ar.toml", "allreduce"), "--runs-dir", self.runs, "--no-plots"),
                           cwd=REPO, env=self.env, capture_output=True, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.run_of()
        self.assertEqual(json.loads((run / "summary.json").read_text())["status"], "ok")
        m = {p["name"]: p for p in json.loads((run / "manifest.json").read_text())["processes"]}
        self.assertEqual(m["evaluator"]["host"], "nodeB")
        self.assertIn(f"--host {self.cluster.addr['nodeA']}", m["worker1"]["command"])  # Gloo on nodeA's address
        self.assert_no_process_on_any_node()

    def start_long_run(self, name):
        """A run far longer than a test under `salloc -N 2 -n 4`, once worker 1 is training: its salloc."""
        p = subprocess.Popen(self.salloc(4, "run", self.config(name, steps=100000), "--runs-dir", self.runs, "--no-plots"),
                             cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (p.kill(), p.communicate()) if p.poll() is None else None)
        wait_for_train_lines_in(self, self.runs, ["worker1"], 60, runs_glob="tiny/*/*")
        return p

    def test_ctrl_c_of_the_launcher_leaves_no_task_on_any_node(self):
        p = self.start_long_run("ctrl-c.toml")
        self.assertTrue(all(self.cluster.pids(n) for n in SLURM_NODES), "not every node runs a task")
        # the launcher itself (salloc's child), as a terminal's Ctrl-C reaches it
        launcher = next(pid for pid in map(int, sh("pgrep", "-P", str(p.pid)).stdout.split())
                        if "launch.py" in cmdline(pid))
        os.kill(launcher, signal.SIGINT)
        out, err = p.communicate(timeout=60)
        self.assertIn("interrupted by SIGINT", err)
        self.assertEqual(json.loads((self.run_of() / "summary.json").read_text())["status"], "interrupted")
        self.assert_no_process_on_any_node()

    def test_kill_9_of_the_launcher_in_an_allocation_it_outlives_leaves_no_task(self):
        # an interactive allocation (salloc's shell) outlives the launcher, killed by SIGKILL (the
        # OOM killer): its srun goes with it (PR_SET_PDEATHSIG), and the nodes end the step's
        # tasks, srun gone, while the allocation goes on
        launcher_pid = self.tmp / "launcher.pid"
        shell = (f"{PYTHON} {LAUNCH} run {self.config('kill9.toml', steps=100000)} --runs-dir {self.runs} --no-plots "
                 f"& echo $! > {launcher_pid}; wait; sleep 60")
        p = subprocess.Popen(["salloc", "-N", "2", "-n", "4", "--quiet", "sh", "-c", shell], cwd=REPO, env=self.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (p.kill(), p.wait()) if p.poll() is None else None)
        wait_for_train_lines_in(self, self.runs, ["worker1"], 60, runs_glob="tiny/*/*")
        self.assertTrue(all(self.cluster.pids(n) for n in SLURM_NODES), "not every node runs a task")
        os.kill(int(launcher_pid.read_text()), signal.SIGKILL)
        self.assert_no_process_left_on(SLURM_NODES, "nodes", grace=20)  # (KillWait = 10 s)
        self.assertIsNone(p.poll(), "the allocation ended: it, not srun, would have ended the step")

    def test_a_cancelled_job_is_reported_as_cancelled(self):
        p = self.start_long_run("long.toml")
        jobs = sh("squeue", "-h", "-o", "%i", env=self.env).stdout.split()
        self.assertEqual(len(jobs), 1, jobs)
        sh("scancel", jobs[0], env=self.env)
        out, err = p.communicate(timeout=90)
        self.assertNotEqual(p.returncode, 0)
        run = self.run_of()
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "cancelled", s.get("failure"))
        self.assertIn("was cancelled", err)
        self.assertNotIn("task 1 = server", err)
        self.assert_no_process_on_any_node()

    def test_a_killed_task_is_reported_as_killed_not_cancelled(self):
        # kill -9 of worker 1's task: srun's --kill-on-bad-exit then cancels the step, a consequence;
        # the run is reported as what happened first, the task killed
        p = self.start_long_run("killed.toml")
        worker1 = [pid for n in SLURM_NODES for pid in self.cluster.pids(n)
                   if "pslab_worker ps" in cmdline(pid) and "--rank 1 " in cmdline(pid) + " "]
        self.assertEqual(len(worker1), 1, [cmdline(pid) for n in SLURM_NODES for pid in self.cluster.pids(n)])
        os.kill(worker1[0], signal.SIGKILL)
        out, err = p.communicate(timeout=90)
        self.assertNotEqual(p.returncode, 0)
        s = json.loads((self.run_of() / "summary.json").read_text())
        self.assertEqual(s["status"], "failed", s.get("failure"))
        self.assertRegex(s["failure"], r"task \d+ = worker1 \(rank 1\) on node[AB] failed first \(Killed\)")
        self.assertNotIn("was cancelled", err)
        self.assert_no_process_on_any_node()

    def sbatch(self, config, runs, *args):
        """`sbatch -N 2 -n 4` of launch.py run `config` into `runs`: the job's id."""
        cmd = " ".join([PYTHON, str(LAUNCH), "run", str(config), "--runs-dir", str(runs), "--no-plots"])
        runs.parent.mkdir(parents=True, exist_ok=True)  # for its output file
        r = sh("sbatch", "-N", "2", "-n", "4", "-o", str(runs) + ".out", *args, "--wrap", cmd, env=self.env, cwd=REPO)
        job = r.stdout.split()[-1]
        self.addCleanup(lambda: sh("scancel", job, check=False, env=self.env))
        return job

    def test_batch_jobs_at_once_one_cancelled_by_scancel_one_by_its_time_limit(self):
        # three jobs on the same two nodes at once (the partition shares CPUs): their ports come
        # from each job's probe step, so they cannot collide. Under sbatch, scancel and the time
        # limit reach the launcher as its SIGTERM; it asks Slurm why and says so: the long job
        # passes its time limit (1 minute, Slurm's least), another is cancelled by scancel
        # meanwhile, a short one ends ok meanwhile
        queue = lambda: sh("squeue", "-h", "-o", "%i", env=self.env).stdout.split()
        long_runs, short_runs, cancelled_runs = self.runs / "long", self.runs / "short", self.runs / "cancelled"
        long_job = self.sbatch(self.config("limit.toml", steps=100000), long_runs, "--time=1")
        wait_for_train_lines_in(self, long_runs, ["worker1"], 60, runs_glob="tiny/*/*")
        short_job = self.sbatch(self.config("short.toml", steps=500), short_runs)
        cancelled_job = self.sbatch(self.config("batch.toml", steps=100000), cancelled_runs)
        wait_until(self, lambda: short_job not in queue(), 90, f"job {short_job} did not end")
        short_run = self.run_of(short_runs)
        self.assertEqual(json.loads((short_run / "summary.json").read_text())["status"], "ok",
                         pathlib.Path(str(short_runs) + ".out").read_text())
        wait_for_train_lines_in(self, cancelled_runs, ["worker1"], 60, runs_glob="tiny/*/*")
        sh("scancel", cancelled_job, env=self.env)
        wait_until(self, lambda: cancelled_job not in queue(), 90, f"job {cancelled_job} did not end after scancel")
        self.assertIn(long_job, queue(), "the long job ended before the others: they did not run at once")
        for job, runs, why in ((cancelled_job, cancelled_runs, "by scancel"), (long_job, long_runs, "its time limit")):
            wait_until(self, lambda: job not in queue(), 150, f"job {job} did not end ({why})")
            summary = self.run_of(runs) / "summary.json"  # written as the launcher stops, after the job left squeue
            wait_until(self, summary.exists, 30, f"no summary.json after {why}: " +
                       pathlib.Path(str(runs) + ".out").read_text())
            s = json.loads(summary.read_text())
            self.assertEqual(s["status"], "cancelled", f"job {job}, {why}: {s.get('failure')}")
            self.assertIn(f"the Slurm job {job} was cancelled ({why}", s["failure"])
        ports = [{(n, p) for n, v in json.loads((self.run_of(r) / "launch.json").read_text())["ports"].items() for p in v}
                 for r in (long_runs, short_runs, cancelled_runs)]
        self.assertTrue(all(ports))
        self.assertFalse(ports[0] & ports[1] or ports[0] & ports[2] or ports[1] & ports[2], "two jobs shared a port on a node")
        self.assert_no_process_on_any_node()


if __name__ == "__main__":
    unittest.main()
