"""What the tests of the launcher (experiments/launch.py) share: tests/launcher/test_*.py and the
multi-host tier (tests/multihost/test_multihost.py).

The paths (the repository, launch.py, tiny.toml, the build in PSLAB_BUILD), running launch.py
(Launches), finding processes and free ports, and LauncherTestCase: the base of the launcher's
test classes, each test in a temporary directory of its own, removed with every process started
in it.
"""
import contextlib
import json
import os
import pathlib
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

REPO = pathlib.Path(__file__).resolve().parents[2]
LAUNCH = REPO / "experiments" / "launch.py"
TINY = REPO / "experiments" / "configs" / "tiny.toml"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
BUILD = pathlib.Path(os.environ.get("PSLAB_BUILD") or REPO / "build").resolve()
WORKER_BIN = BUILD / "worker" / "pslab_worker"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cmdlines_containing(marker):
    """{pid: argv} of every live process whose command line, or environment, mentions `marker` (a
    script of worker.kind = "python" has its run directory in PSLAB_* variables)."""
    found = {}
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            raw = (d / "cmdline").read_bytes()
            environ = (d / "environ").read_bytes() if marker.encode() not in raw else b""
        except OSError:
            continue
        if marker.encode() in raw + environ:
            found[int(d.name)] = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    return found


def pslab_processes(marker):
    return {pid: argv for pid, argv in cmdlines_containing(marker).items()
            if any(os.path.basename(a).startswith("pslab_") for a in argv[:3])}


def dry_run_commands(stdout):
    """{process name: argv} from the `[name@host] command` lines of a dry run (last run wins)."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"^\[([\w ]+?)(?:@([^\]]+))?\] (.*)$", line)
        if m:
            out[m.group(1)] = (m.group(2), shlex.split(m.group(3)))
    return out


def remote_argv(ssh_argv):
    """The binary's command line inside an ssh command line
    (ssh ... HOST 'cd REPO && exec python3 experiments/launch.py remote --log LOG -- ARGV')."""
    remote = shlex.split(ssh_argv[-1])
    return remote[remote.index("--") + 1:]


def sleeps(seconds):
    """{pid: argv} of the processes running `sleep SECONDS` (a test's marker child)."""
    return {pid: argv for pid, argv in cmdlines_containing(seconds).items() if argv == ["sleep", seconds]}


def option(argv, name):
    return argv[argv.index(name) + 1]


def free_base_port(count=10):
    """A random base port for --base-port, below the ephemeral ports, whose `count` ports from it
    are free on this host now (tests that run at once take different ones)."""
    while True:
        base = random.randrange(20000, 32000, 10)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + count):
                    held.enter_context(socket.socket()).bind(("", port))
            return base
        except OSError:
            continue


def wait_until(test, ready, timeout, what):
    """Until ready() is true, looking every 50 ms; fails `test`, saying `what`, after `timeout` s."""
    end = time.monotonic() + timeout
    while not ready():
        test.assertLess(time.monotonic(), end, what)
        time.sleep(0.05)


def wait_for_train_lines_in(test, runs, names, timeout, runs_glob="*/*/run"):
    """Until each metrics file of `names` (e.g. "worker1") of a run under `runs` (its run
    directories: runs_glob) holds a train line; fails `test` after `timeout` s."""
    wait_until(test, lambda: all(any('"train"' in m.read_text() for m in runs.glob(f"{runs_glob}/metrics/{n}.jsonl"))
                                 for n in names), timeout, f"{names} wrote no train line")


class Launches:
    """launch.py run from the repository root with self.env: launch() waits for it (at most
    launch_timeout s), launch_bg() starts it in the background (self.launchers), and
    stop_launchers() kills those still running (a tearDown calls it)."""
    launch_timeout = 90

    def launch(self, *args, timeout=None, env=None):
        return subprocess.run([PYTHON, str(LAUNCH), *map(str, args)], cwd=REPO, env=env or self.env,
                              capture_output=True, text=True,
                              timeout=self.launch_timeout if timeout is None else timeout)

    def launch_bg(self, *args):
        p = subprocess.Popen([PYTHON, str(LAUNCH), *map(str, args)], cwd=REPO, env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.launchers.append(p)
        return p

    def stop_launchers(self):
        for p in self.launchers:
            if p.poll() is None:
                p.kill()
                p.wait()
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()


class LauncherTestCase(Launches, unittest.TestCase):
    """A test of the launcher on this host: self.tmp (removed after it, with every process whose
    command line names it), self.runs under it, self.env with PSLAB_BUILD."""

    @classmethod
    def setUpClass(cls):
        if not os.access(WORKER_BIN, os.X_OK):
            raise RuntimeError(f"{WORKER_BIN} is missing: build first, or set PSLAB_BUILD to the build directory")

    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="pslab-test-launcher-"))
        self.runs = self.tmp / "runs"
        self.launchers = []
        self.env = dict(os.environ, PSLAB_BUILD=str(BUILD))

    def tearDown(self):
        self.stop_launchers()
        for pid in cmdlines_containing(str(self.tmp)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["rm", "-rf", str(self.tmp)], check=False)

    def write(self, name, text):
        path = self.tmp / name
        path.write_text(textwrap.dedent(text))
        return path

    def tiny_variant(self, name, replace=(), append=""):
        text = TINY.read_text()
        for old, new in replace:
            self.assertIn(old, text, "tiny.toml changed; update the test")
            text = text.replace(old, new)
        return self.write(name, text + append)

    def long_config(self):
        # 100000 steps with 5 ms of sleep each: far longer than any test waits.
        return self.tiny_variant("long.toml", [("steps = 500", "steps = 100000")])

    def ssh_config(self, hosts, servers=2, workers=2):
        text = TINY.read_text().replace("servers = 1", f"servers = {servers}").replace("workers = 2", f"workers = {workers}")
        text = text.replace("[cluster]", f'[cluster]\nlauncher = "ssh"\nhosts = {json.dumps(hosts)}')
        return self.write("ssh.toml", text)

    def slurm_config(self, mode="bsp"):
        text = TINY.read_text().replace('mode = "bsp"', f'mode = "{mode}"')
        text = text.replace("[cluster]", '[cluster]\nlauncher = "slurm"')
        return self.write("slurm.toml", text)

    def fake_bin(self, name, script):
        """A stand-in for the command `name` (ssh, srun, nvidia-smi, ...) first on self.env's PATH."""
        d = self.tmp / "bin"
        d.mkdir(exist_ok=True)
        path = d / name
        path.write_text(textwrap.dedent(script))
        path.chmod(0o755)
        self.env["PATH"] = f"{d}:{self.env['PATH']}"
        return path

    def wait_for_processes(self, n, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            procs = pslab_processes(str(self.runs))
            if len(procs) >= n:
                return procs
            time.sleep(0.1)
        self.fail(f"{n} pslab processes did not appear in {timeout} s: {pslab_processes(str(self.runs))}")

    def wait_for_train_lines(self, names, timeout=30):
        """Until each metrics file of `names` (e.g. "worker1") holds a train line."""
        wait_for_train_lines_in(self, self.runs, names, timeout)

    def assert_no_processes_left(self, grace=2.0):
        end = time.monotonic() + grace
        while cmdlines_containing(str(self.runs)) and time.monotonic() < end:
            time.sleep(0.05)
        self.assertEqual(cmdlines_containing(str(self.runs)), {}, "processes of the run were left behind")

    def only_invocation(self, name):
        invs = [d for d in (self.runs / name).iterdir() if not d.is_symlink()]
        self.assertEqual(len(invs), 1, invs)
        return invs[0]

    def subtests_in_fresh_runs(self, name, values, check):
        """check(value) for each of `values`, a subtest named name=value, each with self.runs empty."""
        for value in values:
            with self.subTest(**{name: value}):
                shutil.rmtree(self.runs, ignore_errors=True)
                check(value)
