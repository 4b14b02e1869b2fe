"""Tests of the experiment launcher (experiments/launch.py) through its command line.

Run from the repository root, with PSLAB_BUILD pointing at a build directory:
    PSLAB_BUILD=build /usr/bin/python3 -m unittest -v tests/test_launcher.py

Real runs use experiments/configs/tiny.toml (synthetic logistic regression, seconds). ssh and
Slurm cannot run here: their dry runs are checked line by line, and each is also run end to
end through a stand-in `ssh` / `srun` / `scontrol` on PATH that starts the command locally.
Every test cleans up its temporary directory and any process it started.
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
import sys
import tempfile
import textwrap
import threading
import time
import tomllib
import unittest

REPO = pathlib.Path(__file__).resolve().parent.parent
LAUNCH = REPO / "experiments" / "launch.py"
TINY = REPO / "experiments" / "configs" / "tiny.toml"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
BUILD = pathlib.Path(os.environ.get("PSLAB_BUILD") or REPO / "build").resolve()
WORKER_BIN = BUILD / "worker" / "pslab_worker"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cmdlines_containing(marker):
    """{pid: argv} of every live process whose command line mentions `marker`."""
    found = {}
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            raw = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in raw:
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


def option(argv, name):
    return argv[argv.index(name) + 1]


class LauncherTest(unittest.TestCase):
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
        for p in self.launchers:
            if p.poll() is None:
                p.kill()
                p.wait()
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        for pid in cmdlines_containing(str(self.tmp)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["rm", "-rf", str(self.tmp)], check=False)

    # ---- helpers ---------------------------------------------------------------------------
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

    def launch(self, *args, timeout=90, env=None):
        return subprocess.run([PYTHON, str(LAUNCH), *map(str, args)], cwd=REPO, env=env or self.env,
                              capture_output=True, text=True, timeout=timeout)

    def launch_bg(self, *args):
        p = subprocess.Popen([PYTHON, str(LAUNCH), *map(str, args)], cwd=REPO, env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.launchers.append(p)
        return p

    def wait_for_processes(self, n, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            procs = pslab_processes(str(self.runs))
            if len(procs) >= n:
                return procs
            time.sleep(0.1)
        self.fail(f"{n} pslab processes did not appear in {timeout} s: {pslab_processes(str(self.runs))}")

    def assert_no_processes_left(self, grace=2.0):
        end = time.monotonic() + grace
        while cmdlines_containing(str(self.runs)) and time.monotonic() < end:
            time.sleep(0.05)
        self.assertEqual(cmdlines_containing(str(self.runs)), {}, "processes of the run were left behind")

    def only_invocation(self, name):
        invs = [d for d in (self.runs / name).iterdir() if not d.is_symlink()]
        self.assertEqual(len(invs), 1, invs)
        return invs[0]

    def long_config(self):
        # 100000 steps with 5 ms of sleep each: far longer than any test waits.
        return self.tiny_variant("long.toml", [("steps = 500", "steps = 100000")])

    # ---- config validation -----------------------------------------------------------------
    def assert_config_error(self, path, key):
        r = self.launch("run", path, "--runs-dir", self.runs)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(str(path), r.stderr)
        self.assertRegex(r.stderr, rf"pslab_worker: error: .*: {re.escape(key)}: ")
        self.assertIn("nothing was started", r.stderr)
        self.assertFalse(self.runs.exists(), "a run directory was created for an invalid config")

    def test_config_missing_key(self):
        path = self.tiny_variant("noname.toml", [('name = "tiny"', "")])
        self.assert_config_error(path, "name")

    def test_config_wrong_type(self):
        path = self.tiny_variant("type.toml", [("batch = 32", 'batch = "thirty-two"')])
        self.assert_config_error(path, "train.batch")

    def test_config_unknown_mode(self):
        path = self.tiny_variant("mode.toml", [('mode = "bsp"', 'mode = "gossip"')])
        self.assert_config_error(path, "cluster.mode")

    def test_config_bad_sweep_point_stops_everything(self):
        path = self.tiny_variant("sweep.toml", [('mode = "bsp"', 'mode = ["bsp", "ssp:-1"]')])
        self.assert_config_error(path, "cluster.mode")

    def test_config_error_from_set(self):
        r = self.launch("run", TINY, "--set", "cluster.workers=0", "--runs-dir", self.runs)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("cluster.workers", r.stderr)

    def test_set_on_a_swept_key_replaces_the_sweep(self):
        path = self.tiny_variant("sweep.toml", [('mode = "bsp"', 'mode = ["bsp", "asp"]')])
        r = self.launch("run", path, "--set", "cluster.mode=ssp:1", "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(len(re.findall(r"^# run \d+/1: ", r.stdout, re.M)), 1, r.stdout)
        self.assertIn("ssp:1", r.stdout)
        self.assertNotIn("mode=asp", r.stdout)
        ok = self.launch("run", path, "--set", "straggler.workers=[1]", "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertEqual(len(re.findall(r"^# run \d+/2: ", ok.stdout, re.M)), 2, ok.stdout)

    def test_missing_config_file(self):
        r = self.launch("run", self.tmp / "nope.toml", "--runs-dir", self.runs)
        self.assertEqual(r.returncode, 2)
        self.assertIn("nope.toml", r.stderr)

    # ---- dry runs --------------------------------------------------------------------------
    def test_sweep_dry_run(self):
        path = self.tiny_variant("sweep.toml", [('mode = "bsp"', 'mode = ["bsp", "ssp:1"]'),
                                                ("workers = 2", "workers = [1, 3]"), ("servers = 1", "servers = 2")])
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(self.runs.exists(), "a dry run wrote files")
        headers = re.findall(r"^# run (\d)/4: (\S+) -> (\S+)", r.stdout, re.M)
        self.assertEqual([h[1] for h in headers],
                         ["mode=bsp,workers=1", "mode=bsp,workers=3", "mode=ssp:1,workers=1", "mode=ssp:1,workers=3"])
        self.assertEqual(os.path.basename(headers[3][2]), "mode=ssp_1,workers=3")
        # the last run (ssp:1, 3 workers, 2 servers): every process, consistent endpoints
        cmds = dry_run_commands(r.stdout.split("# run 4/4")[1])
        self.assertEqual(sorted(cmds), ["evaluator", "server0", "server1", "worker0", "worker1", "worker2"])
        binds = [option(cmds[f"server{k}"][1], "--bind") for k in range(2)]
        self.assertEqual(len(set(binds)), 2)
        for k in range(2):
            self.assertEqual(option(cmds[f"server{k}"][1], "--shard"), str(k))
        for w in range(3):
            argv = cmds[f"worker{w}"][1]
            self.assertEqual(argv[1], "ps")
            self.assertEqual(option(argv, "--rank"), str(w))
            self.assertEqual(option(argv, "--servers"), ",".join(binds))
            self.assertEqual(option(argv, "--procs-on-host"), "6")
            run_dir = option(argv, "-o")
            self.assertEqual(option(argv, "-c"), run_dir + "/config.toml")
        self.assertEqual(cmds["evaluator"][1][1], "eval")
        self.assertEqual(option(cmds["evaluator"][1], "--servers"), ",".join(binds))

    def test_allreduce_dry_run(self):
        path = self.tiny_variant("ar.toml", [('mode = "bsp"', 'mode = "allreduce"'), ("workers = 2", "workers = 3")])
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        cmds = dry_run_commands(r.stdout)
        self.assertEqual(sorted(cmds), ["evaluator", "worker0", "worker1", "worker2"])
        coord = {option(cmds[f"worker{w}"][1], "--coordinator") for w in range(3)}
        snaps = {option(cmds[f"worker{w}"][1], "--snapshots") for w in range(3)}
        self.assertEqual(len(coord), 1)
        self.assertEqual(snaps, {option(cmds["evaluator"][1], "--snapshots")})
        self.assertNotEqual(coord, snaps)
        for w in range(3):
            self.assertEqual(cmds[f"worker{w}"][1][1], "allreduce")
            self.assertEqual(option(cmds[f"worker{w}"][1], "--rank"), str(w))

    def ssh_config(self, hosts, servers=2, workers=2):
        text = TINY.read_text().replace("servers = 1", f"servers = {servers}").replace("workers = 2", f"workers = {workers}")
        text = text.replace("[cluster]", f'[cluster]\nlauncher = "ssh"\nhosts = {json.dumps(hosts)}')
        return self.write("ssh.toml", text)

    def test_ssh_dry_run(self):
        path = self.ssh_config(["hostA", "hostB"])
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        cmds = dry_run_commands(r.stdout)
        placement = {name: host for name, (host, _) in cmds.items()}
        self.assertEqual(placement, {"server0": "hostA", "server1": "hostB", "worker0": "hostA",
                                     "worker1": "hostB", "evaluator": "hostA"})
        for name, (host, argv) in cmds.items():
            self.assertEqual(argv[:6], ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host])
            self.assertEqual(len(argv), 7, argv)
            remote = argv[6]
            self.assertTrue(remote.startswith(f"cd {shlex.quote(str(REPO))} && exec "), remote)
        inner = {name: remote_argv(argv) for name, (_, argv) in cmds.items()}
        self.assertIn(" exec python3 experiments/launch.py remote --log ", cmds["server0"][1][6])
        # each host's address and ports are asked of it at launch: placeholders here
        self.assertEqual(option(inner["server0"], "--bind"), "tcp://<address of hostA>:<port 0>")
        self.assertEqual(option(inner["worker0"], "--servers"),
                         "tcp://<address of hostA>:<port 0>,tcp://<address of hostB>:<port 1>")
        # addresses named per host, fixed ports: each server binds its own host's address
        path.write_text(path.read_text().replace("[cluster]", '[cluster]\naddresses = ["hostA=10.1.0.1", "hostB=10.1.0.2"]'))
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run", "--base-port", 29500)
        self.assertEqual(r.returncode, 0, r.stderr)
        inner = {name: remote_argv(argv) for name, (_, argv) in dry_run_commands(r.stdout).items()}
        self.assertEqual(option(inner["server0"], "--bind"), "tcp://10.1.0.1:29500")
        self.assertEqual(option(inner["server1"], "--bind"), "tcp://10.1.0.2:29501")
        for w in ("worker0", "worker1", "evaluator"):
            self.assertEqual(option(inner[w], "--servers"), "tcp://10.1.0.1:29500,tcp://10.1.0.2:29501")
        self.assertEqual(option(inner["worker0"], "--procs-on-host"), "3")  # server0, worker0, evaluator
        self.assertEqual(option(inner["worker1"], "--procs-on-host"), "2")
        self.assertEqual(option(inner["worker1"], "--rank"), "1")
        # GPU slots count the GPU processes (workers, evaluator) per host: distinct GPUs there
        self.assertEqual([option(inner[w], "--gpu-slot") for w in ("worker0", "evaluator", "worker1")], ["0", "1", "0"])
        self.assertNotIn("--gpu-slot", inner["server0"])

    def slurm_config(self, mode="bsp"):
        text = TINY.read_text().replace('mode = "bsp"', f'mode = "{mode}"')
        text = text.replace("[cluster]", '[cluster]\nlauncher = "slurm"')
        return self.write("slurm.toml", text)

    def test_slurm_dry_run(self):
        r = self.launch("run", self.slurm_config(), "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        srun = [shlex.split(line[len("[srun] "):]) for line in r.stdout.splitlines() if line.startswith("[srun] ")]
        self.assertEqual(len(srun), 1)
        argv = srun[0]
        self.assertEqual(argv[0], "srun")
        self.assertIn("--ntasks=4", argv)  # 1 server + 2 workers + 1 evaluator
        self.assertIn("--kill-on-bad-exit=1", argv)
        tail = argv[argv.index("/usr/bin/python3"):]
        self.assertEqual(tail[:3], ["/usr/bin/python3", "experiments/launch.py", "task"])
        self.assertTrue(tail[3].startswith(str(self.runs.resolve() / "tiny")), tail)
        tasks = re.findall(r"^\[task(\d) (\w+)@", r.stdout, re.M)
        self.assertEqual(tasks, [("0", "server0"), ("1", "worker0"), ("2", "worker1"), ("3", "evaluator")])
        self.assertFalse(self.runs.exists())

    def launch_watching_mkdir(self, *args):
        """launch.py ARGS in a Python that reports every directory it creates (audit hook):
        (completed process, [paths])."""
        code = textwrap.dedent("""\
            import json, runpy, sys
            made = []
            sys.addaudithook(lambda event, a: made.append(str(a[0])) if event == "os.mkdir" else None)
            sys.argv = sys.argv[1:]
            sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])
            try:
                runpy.run_path(sys.argv[0], run_name="__main__")
            finally:
                print("MKDIR " + json.dumps(made), file=sys.stderr)
            """)
        r = subprocess.run([PYTHON, "-c", code, str(LAUNCH), *map(str, args)], cwd=REPO, env=self.env,
                           capture_output=True, text=True, timeout=90)
        made = [json.loads(line[len("MKDIR "):]) for line in r.stderr.splitlines() if line.startswith("MKDIR ")]
        self.assertEqual(len(made), 1, r.stderr)
        return r, made[0]

    def test_ipc_dry_run(self):
        # ipc: every listener is a socket in one private directory, shown but not made by a dry run
        for mode, servers in (("bsp", 2), ("allreduce", 0)):
            path = self.tiny_variant(f"ipc-{mode}.toml", [('mode = "bsp"', f'mode = "{mode}"'),
                                                          ("servers = 1", "servers = 2"),
                                                          ("[cluster]", '[cluster]\ntransport = "ipc"')])
            r, made = self.launch_watching_mkdir("run", path, "--runs-dir", self.runs, "--dry-run")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual([d for d in made if "pslab-launch-" not in d], [], "a dry run created a directory")
            self.assertFalse(self.runs.exists())
            cmds = dry_run_commands(r.stdout)
            if servers:
                binds = [option(cmds[f"server{k}"][1], "--bind") for k in range(servers)]
                sockets = os.path.dirname(binds[0][len("ipc://"):])
                self.assertEqual(binds, [f"ipc://{sockets}/server{k}" for k in range(servers)])
                for name in ("worker0", "worker1", "evaluator"):
                    self.assertEqual(option(cmds[name][1], "--servers"), ",".join(binds))
            else:
                coordinator = option(cmds["worker0"][1], "--coordinator")
                sockets = os.path.dirname(coordinator[len("ipc://"):])
                self.assertEqual(coordinator, f"ipc://{sockets}/coordinator")
                for name in ("worker0", "worker1"):
                    self.assertEqual(option(cmds[name][1], "--coordinator"), coordinator)
                    self.assertEqual(option(cmds[name][1], "--snapshots"), f"ipc://{sockets}/snapshots")
                self.assertEqual(option(cmds["evaluator"][1], "--snapshots"), f"ipc://{sockets}/snapshots")
                self.assertNotIn("tcp://", r.stdout)
            self.assertTrue(sockets.startswith("/tmp/pslab-"), sockets)
            self.assertFalse(os.path.exists(sockets))

    def test_ipc_needs_one_host(self):
        path = self.ssh_config(["hostA", "hostB"])
        ssh_text = path.read_text()
        for transport in ("shm", "ipc"):  # shm's headers go over the same sockets
            path.write_text(ssh_text.replace("[cluster]", f'[cluster]\ntransport = "{transport}"'))
            for extra in ([], ["--dry-run"]):
                r = self.launch("run", path, "--runs-dir", self.runs, *extra)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(f'cluster.transport = "{transport}"', r.stderr)
                self.assertIn("hostA, hostB", r.stderr)
                self.assertFalse(self.runs.exists(), "a run directory was created")
        slurm = self.slurm_config()
        slurm.write_text(slurm.read_text().replace("[cluster]", '[cluster]\ntransport = "ipc"\nhosts = ["n1", "n2"]'))
        r = self.launch("run", slurm, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("cluster.transport", r.stderr)
        # one host is fine: ssh makes the socket directory there; srun keeps every task on one node
        path.write_text(path.read_text().replace('hosts = ["hostA", "hostB"]', 'hosts = ["hostA"]'))
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        remote = dry_run_commands(r.stdout)["server0"][1][6]
        self.assertRegex(remote, r" && mkdir -p -m 700 /tmp/pslab-\S+ && exec .* -- .* --bind ipc:///tmp/pslab-\S+/server0 ")
        slurm.write_text(slurm.read_text().replace('\nhosts = ["n1", "n2"]', ""))
        r = self.launch("run", slurm, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(" --nodes=1 ", r.stdout)

    def test_auto_transport_is_shm_on_one_host_and_per_pair_across_hosts(self):
        local = self.tiny_variant("auto.toml", [("steps = 500", "steps = 60"), ("[cluster]", '[cluster]\ntransport = "auto"')])
        r = self.launch("run", local, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(option(dry_run_commands(r.stdout)["server0"][1], "--bind"), r"^ipc:///tmp/pslab-\S+/server0$")
        self.assertNotIn("tcp://", r.stdout)
        path = self.ssh_config(["hostA", "hostB"])
        path.write_text(path.read_text().replace("[cluster]", '[cluster]\ntransport = "auto"'))
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # two hosts: a server listens on a socket and a port; each peer uses the socket of a server
        # on its host and the port of one elsewhere (hostA: server0, worker0, evaluator)
        cmds = {name: remote_argv(argv) for name, (_, argv) in dry_run_commands(r.stdout).items()}
        self.assertEqual(option(cmds["server0"], "--bind"), "ipc:///tmp/pslab-XXXXXXXX/server0+tcp://<address of hostA>:<port 0>")
        self.assertEqual(option(cmds["server1"], "--bind"), "ipc:///tmp/pslab-XXXXXXXX/server1+tcp://<address of hostB>:<port 1>")
        for who in ("worker0", "evaluator"):
            self.assertEqual(option(cmds[who], "--servers"), "ipc:///tmp/pslab-XXXXXXXX/server0,tcp://<address of hostB>:<port 1>")
        self.assertEqual(option(cmds["worker1"], "--servers"), "tcp://<address of hostA>:<port 0>,ipc:///tmp/pslab-XXXXXXXX/server1")
        self.assertIn("each server listens on a socket and a port", r.stdout)
        # Slurm over two nodes: the same, in srun's blocks (n1: server0, worker0; n2: worker1, evaluator)
        slurm = self.slurm_config()
        slurm.write_text(slurm.read_text().replace("[cluster]", '[cluster]\ntransport = "auto"\nhosts = ["n1", "n2"]'))
        r = self.launch("run", slurm, "--runs-dir", self.runs, "--dry-run", "--base-port", 29500)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        tasks = {name.split()[1]: argv for name, (_, argv) in dry_run_commands(r.stdout).items() if " " in name}
        self.assertEqual(option(tasks["server0"], "--bind"), "ipc:///tmp/pslab-XXXXXXXX/server0+tcp://n1:29500")
        self.assertEqual(option(tasks["worker0"], "--servers"), "ipc:///tmp/pslab-XXXXXXXX/server0")
        self.assertEqual(option(tasks["worker1"], "--servers"), "tcp://n1:29500")
        self.assertNotIn("--nodes=1", r.stdout)
        # all-reduce over two hosts: TCP and Gloo throughout
        path.write_text(path.read_text().replace('mode = "bsp"', 'mode = "allreduce"'))
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("ipc://", r.stdout)
        # a real run on this host: shared memory, the sockets' directory gone at the end
        r = self.launch("run", local, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_invocation("tiny") / "run"
        self.assertEqual(json.loads((run / "summary.json").read_text())["status"], "ok")
        manifest = json.loads((run / "manifest.json").read_text())
        self.assertEqual(manifest["transport"], "auto")
        self.assertFalse(os.path.exists(manifest["socket_dir"]))
        self.assertEqual(manifest["auth"], "none", "one host, Unix sockets: no key needed")
        self.assertFalse((run / "run.key").exists())

    def test_collective_on_gpus_follows_the_gpus_each_host_has(self):
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): the launcher decides
        # before anything starts, from `nvidia-smi -L` (here a stand-in with $FAKE_GPUS GPUs).
        self.fake_bin("nvidia-smi", """\
            #!/bin/bash
            [[ $FAKE_GPUS == fail ]] && { echo "NVIDIA-SMI has failed" >&2; exit 9; }
            for ((i = 0; i < ${FAKE_GPUS:-1}; i++)); do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
            """)
        path = self.tiny_variant("gpu.toml", [('mode = "bsp"', 'mode = "allreduce"'),
                                              ("[train]", '[train]\ndevice = "cuda"')])
        text = path.read_text()

        def dry(collective, gpus, cvd=None):
            path.write_text(text.replace("[cluster]", f'[cluster]\ncollective = "{collective}"'))
            env = dict(self.env, FAKE_GPUS=str(gpus))
            env.pop("CUDA_VISIBLE_DEVICES", None)
            if cvd is not None:
                env["CUDA_VISIBLE_DEVICES"] = cvd
            return self.launch("run", path, "--runs-dir", self.runs, "--dry-run", env=env)

        shared = "host local runs ranks 0, 1 on 1 GPU (GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0))"
        r = dry("auto", 1)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f'cluster.collective = "auto": {shared}, so GPU buffers are all-reduced through host memory', r.stdout)
        r = dry("auto", 2)
        self.assertIn('cluster.collective = "auto": NCCL, every rank has a GPU of its own', r.stdout)
        r = dry("auto", 2, cvd="1")  # one of the two visible: GPU 1
        self.assertIn("ranks 0, 1 on 1 GPU (GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1))", r.stdout)
        r = dry("gloo", 2)
        self.assertIn('cluster.collective = "gloo": GPU buffers are all-reduced through host memory', r.stdout)
        # an explicit "nccl" that cannot work: refused, naming the host, its ranks and its GPUs
        for extra in ([], ["--dry-run"]):
            path.write_text(text.replace("[cluster]", '[cluster]\ncollective = "nccl"'))
            r = self.launch("run", path, "--runs-dir", self.runs, *extra, env=dict(self.env, FAKE_GPUS="1"))
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn('cluster.collective = "nccl" needs a GPU of its own for every all-reduce rank', r.stderr)
            self.assertIn(shared, r.stderr)
            self.assertFalse(self.runs.exists(), "a run directory was created")
        r = dry("nccl", 2)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("NCCL, every rank has a GPU of its own", r.stdout)
        r = dry("auto", 0)
        self.assertIn("host local runs ranks 0, 1 on no visible GPU", r.stdout)
        # nvidia-smi fails: unknown here, so "auto" is left to the ranks
        r = dry("auto", "fail")
        self.assertIn("the GPUs of local are not known here (nvidia-smi -L did not answer); the ranks decide at start", r.stdout)
        # ssh: each host asked over ssh (stand-in: runs the command here); 4 ranks round-robin
        # over 2 hosts = 2 per host
        self.fake_bin("ssh", """\
            #!/bin/bash
            while [[ $1 == -o ]]; do shift 2; done
            export SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22"  # what sshd sets: the address reached
            exec bash -c "$2"
            """)
        ssh = self.ssh_config(["hostA", "hostB"], workers=4)
        ssh.write_text(ssh.read_text().replace('mode = "bsp"', 'mode = "allreduce"')
                       .replace("[train]", '[train]\ndevice = "cuda"').replace("[cluster]", '[cluster]\ncollective = "nccl"'))
        r = self.launch("run", ssh, "--runs-dir", self.runs, "--dry-run", env=dict(self.env, FAKE_GPUS="2"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = self.launch("run", ssh, "--runs-dir", self.runs, "--dry-run", env=dict(self.env, FAKE_GPUS="1"))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("host hostA runs ranks 0, 2 on 1 GPU", r.stderr)
        self.assertIn("host hostB runs ranks 1, 3 on 1 GPU", r.stderr)
        # Slurm: the nodes are the job's; the ranks decide
        slurm = self.slurm_config("allreduce")
        slurm.write_text(slurm.read_text().replace("[train]", '[train]\ndevice = "cuda"'))
        r = self.launch("run", slurm, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("the nodes are not known before the job; each rank checks at start", r.stdout)
        # CPU workers: nothing to decide, nothing said
        r = self.launch("run", self.tiny_variant("ar.toml", [('mode = "bsp"', 'mode = "allreduce"')]),
                        "--runs-dir", self.runs, "--dry-run")
        self.assertNotIn("collective", r.stdout)
        # a real start records the decision in the run's config (the ranks then fail here: no GPU)
        path.write_text(text)
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", env=dict(self.env, FAKE_GPUS="1"))
        config = tomllib.loads((self.only_invocation("tiny") / "run" / "config.toml").read_text())
        self.assertEqual(config["cluster"]["collective"], "gloo", r.stdout + r.stderr)
        self.assert_no_processes_left()

    # ---- real runs -------------------------------------------------------------------------
    def test_tiny_end_to_end(self):
        r = self.launch("run", TINY, "--runs-dir", self.runs)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        inv = self.only_invocation("tiny")
        self.assertRegex(inv.name, r"^\d{8}-\d{6}$")
        run = inv / "run"
        for f in ["config.toml", "plan.json", "manifest.json", "summary.json", "metrics/worker0.jsonl", "metrics/worker1.jsonl",
                  "metrics/server0.jsonl", "metrics/evaluator.jsonl", "logs/server0.log", "logs/worker0.log",
                  "logs/worker1.log", "logs/evaluator.log"]:
            self.assertTrue((run / f).is_file(), f)
        for png in ["convergence", "bytes", "throughput", "step_time", "staleness"]:
            for d in (run / "plots", inv / "plots"):
                data = (d / f"{png}.png").read_bytes()
                self.assertEqual(data[:8], PNG_MAGIC, d / png)
                self.assertGreater(len(data), 10000)
        # config.toml: exactly what ran, every default filled in
        with open(run / "config.toml", "rb") as f:
            cfg = tomllib.load(f)
        self.assertEqual(cfg["train"]["steps"], 500)
        self.assertEqual(cfg["cluster"]["timeout_s"], 60.0)  # a default, written out
        # manifest
        m = json.loads((run / "manifest.json").read_text())
        self.assertEqual([p["name"] for p in m["processes"]], ["server0", "worker0", "worker1", "evaluator"])
        for p in m["processes"]:
            self.assertIn(str(run / "config.toml"), p["command"])
            self.assertIsInstance(p["pid"], int)
        for key in ["git", "host", "cpu", "gpu", "libraries", "seed", "start_time", "launcher_command"]:
            self.assertIn(key, m)
        self.assertIn("run", m["launcher_command"])
        self.assertEqual(m["transport"], "tcp")
        self.assertIn("python", m["libraries"])
        # summary
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual((s["mode"], s["workers"], s["servers"], s["device"], s["seed"], s["status"]),
                         ("bsp", 2, 1, "cpu", 1, "ok"))
        self.assertGreater(s["final_test_acc"], 0.85)
        self.assertLessEqual(s["final_test_acc"], 1.0)
        self.assertGreaterEqual(s["best_test_acc"], s["final_test_acc"])
        self.assertEqual(s["target_acc"], 0.9)
        self.assertIsNotNone(s["time_to_target_s"])
        self.assertTrue(0 < s["time_to_target_s"] <= s["wall_s"])
        self.assertAlmostEqual(s["epochs"], 500 * 2 * 32 / 4096, places=6)
        self.assertEqual(s["staleness"]["max"], 0)  # bsp
        self.assertGreater(s["bytes_pushed"], 500 * 2 * 132 * 4)  # 500 steps x 2 workers x 132 floats
        self.assertEqual(s["pushed_by_codec"], {"f32": {"pushes": 500 * 2, "payload_bytes": 500 * 2 * 132 * 4}})
        self.assertGreater(s["bytes_pulled"], 0)
        self.assertAlmostEqual(s["train_samples"], 500 * 2 * 32, delta=500 * 2 * 32 * 1e-3)
        # samples/s cannot exceed the training samples over the time the workers trained
        self.assertGreater(s["samples_per_s"], 0)
        self.assertLess(s["samples_per_s"], 2 * 32 / 0.005)  # each step of a worker sleeps >= 5 ms
        self.assertGreater(s["step_time_ms"]["delay"], 4.9)
        # progress lines and the comparison
        self.assertRegex(r.stdout, r"step \d+(-\d+)?/500")
        self.assertRegex(r.stdout, r"ETA")
        self.assertIn("| run | bsp |", r.stdout)
        rows = (inv / "comparison.csv").read_text().splitlines()
        self.assertEqual(len(rows), 2)
        self.assertTrue((inv / "comparison.md").read_text().count("| run | bsp |") == 1)
        self.assert_no_processes_left()

    def test_run_follows_the_binarys_plan(self):
        # the steps, processes and sizes come from `pslab_worker config --plan`, saved as plan.json
        sets = ["--set", "train.steps=37", "--set", "cluster.servers=2"]
        dry = self.launch("run", TINY, *sets, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(dry.returncode, 0, dry.stderr)
        self.assertIn("2 servers, 37 steps per worker]", dry.stdout)
        r = self.launch("run", TINY, *sets, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(", 37 steps each ->", r.stdout)
        run = self.only_invocation("tiny") / "run"
        plan = json.loads((run / "plan.json").read_text())
        self.assertEqual((plan["total_steps"], plan["workers"], plan["servers"], plan["uses_servers"]), (37, 2, 2, True))
        self.assertEqual([p["name"] for p in plan["processes"]],
                         ["server0", "server1", "worker0", "worker1", "evaluator"])
        binary = subprocess.run([str(WORKER_BIN), "config", "-c", str(run / "config.toml"), "--plan", "-"],
                                capture_output=True, text=True, check=True)
        self.assertEqual(json.loads(binary.stdout), plan)  # what the run's own config plans
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual((s["steps_per_worker"], s["status"]), (37, "ok"))
        self.assertAlmostEqual(s["train_samples"], 37 * 2 * 32, delta=1)
        # each of the 37 x 2 pushes reached both servers, and counts once
        self.assertEqual((s["staleness"]["count"], s["staleness"]["max"]), (37 * 2, 0))  # bsp
        self.assert_no_processes_left()
        # plot.py still draws a run from before plan.json (cluster.mode from config.toml instead)
        (run / "plan.json").unlink()
        p = subprocess.run([PYTHON, str(REPO / "experiments" / "plot.py"), str(run), "--out", str(self.tmp / "plots")],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        for png in ["convergence", "throughput", "step_time", "staleness"]:
            self.assertEqual((self.tmp / "plots" / f"{png}.png").read_bytes()[:8], PNG_MAGIC, png)

    # ---- staleness statistics and plot.py's imports -----------------------------------------
    def test_staleness_counts_each_push_once(self):
        sys.path.insert(0, str(REPO / "experiments"))
        try:
            from launcher.metrics import staleness_stats
        finally:
            sys.path.remove(str(REPO / "experiments"))
        # 2 servers; worker 0 pushed 3 times, worker 1 twice: every push is in both histograms
        finals = [{"kind": "server_final", "shard": 0, "staleness": {"count": 999},
                   "staleness_hist": {"0": [2, 1], "1": [0, 1, 1]}},
                  {"kind": "server_final", "shard": 1, "staleness_hist": {"0": [1, 1, 1], "1": [2]}}]
        st = staleness_stats(finals)  # merged: 5 at 0, 3 at 1, 2 at 2
        self.assertEqual(st["count"], 5)
        self.assertAlmostEqual(st["mean"], (1 * 3 + 2 * 2) / 10)
        self.assertEqual((st["p99"], st["max"]), (2, 2))
        # p99 is the smallest staleness with at least 99% of the (push, shard) pairs at or below it
        finals = [{"staleness_hist": {"0": [99, 0, 0, 0, 0, 1]}}, {"staleness_hist": {"0": [99, 0, 0, 0, 0, 1]}},
                  {"kind": "server_final", "shard": 2}]  # a server without a histogram does not count
        st = staleness_stats(finals)
        self.assertEqual((st["count"], st["p99"], st["max"]), (100, 0, 5))
        self.assertAlmostEqual(st["mean"], 10 / 200)
        self.assertIsNone(staleness_stats([{"staleness_hist": {"0": [0, 0]}}]))
        self.assertIsNone(staleness_stats([]))

    def test_plot_imports_the_metrics_module_alone(self):
        code = ("import sys; sys.path.insert(0, 'experiments'); import plot; assert 'launch' not in sys.modules; "
                "print(sorted(m for m in sys.modules if m.split('.')[0] == 'launcher'))")
        r = subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "['launcher', 'launcher.metrics']")

    def test_plots_use_a_python_that_has_matplotlib(self):
        # plot.py ran under /usr/bin/python3 even where only python3 on PATH had matplotlib.
        bad, good = self.tmp / "no-mpl-python", self.tmp / "mpl-python"
        for path, status in ((bad, 1), (good, 0)):  # answer "import matplotlib" with this status
            path.write_text(f"#!/bin/sh\nexit {status}\n")
            path.chmod(0o755)
        code = ("import sys; sys.path.insert(0, 'experiments'); from launcher.run import plot_python; "
                f"print(plot_python([{str(bad)!r}, {str(good)!r}]), plot_python([{str(bad)!r}]))")
        r = subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), [str(good), "None"])
        # None at all: said before the first run, and the runs go on without plots.
        env = dict(self.env, PSLAB_PLOT_PYTHON=str(bad))
        r = self.launch("run", TINY, "--set", "train.steps=30", "--runs-dir", self.runs, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"no Python with matplotlib found (tried: {bad})", r.stderr)
        self.assertNotIn("plot.py failed", r.stderr)
        self.assertFalse((self.only_invocation("tiny") / "run" / "plots").exists())

    def test_diverged_run_is_reported(self):
        r = self.launch("run", TINY, "--set", "optimizer.lr=1e38", "--set", "train.steps=100",
                        "--set", "straggler.delay_ms=0", "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)  # the experiment's outcome, not a failure
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual(s["status"], "diverged")
        self.assertGreater(s["diverged"]["epoch"], 0.0)
        self.assertIn(s["diverged"]["worker"], (0, 1))
        self.assertIn("training diverged at epoch", r.stdout)
        self.assertIn("| run | bsp | 2 | 1 | diverged |", r.stdout)
        self.assert_no_processes_left()

    def test_sweep_runs_every_point(self):
        path = self.tiny_variant("sweep.toml", [('mode = "bsp"', 'mode = ["allreduce", "bsp", "asp"]'),
                                                ("steps = 500", "steps = 100"), ("delay_ms = 5.0", "delay_ms = 1.0")])
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        inv = self.only_invocation("tiny")
        modes = ["allreduce", "bsp", "asp"]
        self.assertEqual(sorted(d.name for d in inv.iterdir() if d.is_dir()), sorted(f"mode={m}" for m in modes))
        for mode in modes:
            run = inv / f"mode={mode}"
            s = json.loads((run / "summary.json").read_text())
            self.assertEqual((s["mode"], s["status"]), (mode, "ok"))
            self.assertEqual(s["servers"], 0 if mode == "allreduce" else 1)
            self.assertEqual(s["staleness"] is None, mode == "allreduce")
            self.assertGreater(s["final_test_acc"], 0.5)
            with open(run / "config.toml", "rb") as f:
                self.assertEqual(tomllib.load(f)["cluster"]["mode"], mode)
            self.assertEqual(sorted(p.name for p in (run / "logs").iterdir()),
                             sorted(["evaluator.log", "worker0.log", "worker1.log"] + ([] if mode == "allreduce" else ["server0.log"])))
        lines = (inv / "comparison.csv").read_text().splitlines()
        self.assertEqual([line.split(",")[:2] for line in lines[1:]], [[f"mode={m}", m] for m in modes])

    def test_killed_worker_fails_the_run_and_stops_everything(self):
        p = self.launch_bg("run", self.long_config(), "--runs-dir", self.runs, "--no-plots")
        procs = self.wait_for_processes(4)
        worker1 = [pid for pid, argv in procs.items() if argv[1] == "ps" and option(argv, "--rank") == "1"]
        self.assertEqual(len(worker1), 1, procs)
        end = time.monotonic() + 30  # training has started: worker 0 and the evaluator have written metrics
        while not all(any(m.stat().st_size for m in self.runs.glob(f"tiny/*/run/metrics/{n}.jsonl"))
                      for n in ("worker0", "evaluator")):
            self.assertLess(time.monotonic(), end, "worker 0 and the evaluator wrote no metrics")
            time.sleep(0.05)
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

    def wait_for_train_lines(self, names, timeout=30):
        """Until each metrics file of `names` (e.g. "worker1") holds a train line."""
        end = time.monotonic() + timeout
        while not all(any('"train"' in m.read_text() for m in self.runs.glob(f"*/*/run/metrics/{n}.jsonl"))
                      for n in names):
            self.assertLess(time.monotonic(), end, f"{names} wrote no train line")
            time.sleep(0.05)

    def test_asp_and_ssp_runs_go_on_without_a_killed_worker(self):
        # cluster.on_worker_loss = "auto" is "continue" in asp and ssp: worker 1 is killed while
        # training; the servers drop it after heartbeat_s of silence, worker 0 trains to the end.
        for mode in ("asp", "ssp:2"):
            with self.subTest(mode=mode):
                shutil.rmtree(self.runs, ignore_errors=True)
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

    def test_a_hung_bsp_worker_is_named_within_the_heartbeat(self):
        # bsp cannot go on without a worker: a stopped (SIGSTOP) worker fails the run within about
        # heartbeat_s, and the error names it, not the worker waiting for it.
        p = self.launch_bg("run", self.long_config(), "--runs-dir", self.runs, "--no-plots", "--set", "cluster.heartbeat_s=1")
        procs = self.wait_for_processes(4)
        worker1 = [pid for pid, argv in procs.items() if argv[1] == "ps" and option(argv, "--rank") == "1"]
        self.wait_for_train_lines(["worker0", "worker1"])
        os.kill(worker1[0], signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            out, err = p.communicate(timeout=30)
        finally:
            try:
                os.kill(worker1[0], signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.assertEqual(p.returncode, 1, out + err)
        self.assertLess(time.monotonic() - stopped, 6.0, err)
        self.assertRegex(err, r"server0 \(shard 0\) on local exited with code 1")
        self.assertRegex(err, r"worker 1 lost: silent for 1\.\d s at clock \d+ \(cluster\.heartbeat_s = 1\); bsp cannot train on without it")
        self.assert_no_processes_left()

    def stderr_with_times(self, p):
        """Reads p's stderr on a thread: returns [(monotonic time, line)], filled as lines come."""
        lines = []
        def read():
            for line in p.stderr:
                lines.append((time.monotonic(), line))
        t = threading.Thread(target=read, daemon=True)
        t.start()
        self.addCleanup(t.join, 5)
        return lines

    def stop_until_the_run_fails(self, p, pid, lines):
        """SIGSTOPs pid and waits for the launcher to fail the run (exit 1); returns its stderr,
        its first FAILED line and how many seconds after the SIGSTOP that line came."""
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            p.wait(timeout=30)
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)  # the reader thread takes the last lines
        err = "".join(line for _, line in lines)
        self.assertEqual(p.returncode, 1, err)
        first = next(((t, line) for t, line in lines if "FAILED" in line), None)
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
        # server is not holding it, or it would beat), and that is not a lost worker. (With
        # cluster.on_server_loss = "restart", the asp default, the workers would first
        # wait some seconds for a restart: "fail" here.)
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
        self.assertRegex(first, r"worker\d \(rank \d\) on local exited with code 1")
        self.assertLess(after, 2 * 1.0, err)
        self.assertRegex(err, r"server 0 at \S+: silent for 1\.\d s while (Push|Pull) \(clock \d+\) waited for its reply")
        self.assert_no_processes_left()

    def test_resume_after_ctrl_c_ends_like_an_uninterrupted_run(self):
        # Ctrl-C mid-run, then `launch.py resume`: ssp:1 over 2 servers (the servers write their
        # checkpoints as they stop) and allreduce (rank 0 wrote one every 0.3 s); each ends with
        # the accuracy of a run never stopped.
        for mode in ("ssp:1", "allreduce"):
            with self.subTest(mode=mode):
                shutil.rmtree(self.runs, ignore_errors=True)
                self.check_resume(mode)

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
        for transport in ("tcp", "ipc"):
            with self.subTest(transport=transport):
                shutil.rmtree(self.runs, ignore_errors=True)
                self.check_server_restart(transport)

    def check_server_restart(self, transport):
        path = self.tiny_variant("restart.toml", [("steps = 500", "steps = 1500"), ('mode = "bsp"', 'mode = "asp"'),
                                                  ("servers = 1", "servers = 2")],
                                 append="\n[checkpoint]\nevery_s = 0.3\n")
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots", "--set", "cluster.heartbeat_s=1",
                           "--set", f'cluster.transport="{transport}"')
        procs = self.wait_for_processes(5)
        server1 = [pid for pid, argv in procs.items() if "--shard" in argv and option(argv, "--shard") == "1"]
        self.assertEqual(len(server1), 1, procs)
        self.wait_for_train_lines(["worker0", "worker1"])
        run = self.only_invocation("tiny") / "run"
        end = time.monotonic() + 20
        while not (run / "checkpoints" / "server1.ckpt").exists():
            self.assertLess(time.monotonic(), end, "server 1 wrote no checkpoint")
            time.sleep(0.05)
        os.kill(server1[0], signal.SIGKILL)
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

    def test_failed_run_is_cleaned_up_before_the_next_one(self):
        # --keep-going: while the sweep's second run trains, nothing of the failed first run is left
        path = self.tiny_variant("sweep.toml", [('mode = "bsp"', 'mode = ["bsp", "asp"]'), ("steps = 500", "steps = 100000")])
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots", "--keep-going")
        procs = self.wait_for_processes(4)
        self.assertTrue(all("mode=bsp" in " ".join(argv) for argv in procs.values()), procs)
        server = [pid for pid, argv in procs.items() if "pslab_server" in argv[0]]
        time.sleep(0.3)
        os.kill(server[0], signal.SIGKILL)
        end = time.monotonic() + 20
        while not any("mode=asp" in " ".join(a) for a in pslab_processes(str(self.runs)).values()):
            self.assertLess(time.monotonic(), end, "the second run did not start")
            time.sleep(0.05)
        self.assertEqual(cmdlines_containing("mode=bsp"), {}, "processes of the failed run are still there")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130, out + err)
        self.assertRegex(err, r"FAILED mode=bsp: server0 \(shard 0\) on local was killed by signal 9")
        self.assert_no_processes_left()

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

    # ---- algorithms beyond the three modes --------------------------------------------------
    def test_dcasgd_and_staleness_aware_steps_train_over_real_servers(self):
        path = self.tiny_variant("algos.toml", [('mode = "bsp"', 'mode = ["asp", "dcasgd:0.1"]'),
                                                ("workers = 2", "workers = 4"), ("servers = 1", "servers = 2")])
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", "--set", "optimizer.staleness_lr=true")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        inv = self.only_invocation("tiny")
        for d in ("mode=asp", "mode=dcasgd_0.1"):
            s = json.loads((inv / d / "summary.json").read_text())
            self.assertEqual(s["status"], "ok", d)
            self.assertGreater(s["final_test_acc"], 0.85, d)
            self.assertGreater(s["staleness"]["mean"], 0.5, d)  # the steps it divided were stale
        plan = json.loads((inv / "mode=dcasgd_0.1" / "plan.json").read_text())
        for k in (0, 1):
            fin = [x for x in map(json.loads, (inv / "mode=dcasgd_0.1" / "metrics" / f"server{k}.jsonl").read_text().splitlines())
                   if x.get("kind") == "server_final"][0]
            shard = plan["params"] // 2 + (1 if k < plan["params"] % 2 else 0)
            self.assertEqual(fin["pulled_params_bytes"], 4 * shard * 4)  # θ as served, one copy per worker
        self.assertNotIn("pulled_params_bytes", (inv / "mode=asp" / "metrics" / "server0.jsonl").read_text())

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
                epochs = [x["epoch"] for x in evals]
                gaps = [b - a for a, b in zip(epochs, epochs[1:-1])]  # the last one is the final evaluation
                self.assertLess(max(gaps), 0.25 + 0.1, (extra, epochs))
                self.assertTrue(evals[-1].get("final"), extra)
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
        r = self.launch("run", TINY, "--set", "eval.every_epochs=0.1", "--set", 'cluster.mode="asp"',
                        "--set", "data.test_samples=400000", "--set", "eval.batch=1", "--runs-dir", self.runs,
                        "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_invocation("tiny") / "run"
        evals = [x for x in map(json.loads, (run / "metrics" / "evaluator.jsonl").read_text().splitlines())
                 if x.get("kind") == "eval"]
        epochs = [x["epoch"] for x in evals]
        self.assertLess(max(b - a for a, b in zip(epochs, epochs[1:-1])), 0.1 + 0.05, epochs)
        self.assertGreater(max(x["eval_ms"] for x in evals), 50.0, "the evaluations were not slower than the ticks")
        ts = [x["t"] for x in evals]
        self.assertEqual(ts, sorted(ts))

    def test_a_sweep_over_seeds_is_summarized_as_mean_and_sd(self):
        r = self.launch("run", TINY, "--set", "seed=[1, 2]", "--set", 'cluster.mode=["bsp", "asp"]',
                        "--set", 'cluster.launcher="virtual"', "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        md = (self.only_invocation("tiny") / "comparison.md").read_text()
        self.assertIn("Over seeds (mean ± sd):", md)
        rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| mode=")}
        self.assertEqual(sorted(rows), ["mode=asp", "mode=bsp"])
        accs = {}
        for mode in ("bsp", "asp"):
            accs[mode] = [json.loads((d / "summary.json").read_text())["final_test_acc"]
                          for d in sorted(self.only_invocation("tiny").glob(f"seed=*,mode={mode}"))]
            self.assertEqual(len(accs[mode]), 2)
            mean = sum(accs[mode]) / 2
            sd = abs(accs[mode][0] - accs[mode][1]) / 2 ** 0.5
            self.assertIn(f"| mode={mode} | 2 | {100 * mean:.2f} ± {100 * sd:.2f}% |", rows[f"mode={mode}"])
        s = json.loads(next(self.only_invocation("tiny").glob("seed=1,mode=bsp")).joinpath("summary.json").read_text())
        self.assertAlmostEqual(s["train_time_to_target_s"], s["time_to_target_s"] - s["startup_s"])
        # the curves: the mean over the seeds with a band
        runs = sorted(str(d) for d in self.only_invocation("tiny").glob("seed=*"))
        p = subprocess.run([PYTHON, str(REPO / "experiments" / "plot.py"), *runs, "--out", str(self.tmp / "plots")],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual((self.tmp / "plots" / "seeds.png").read_bytes()[:8], PNG_MAGIC)

    # ---- the virtual cluster and replay -------------------------------------------------------
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

    def test_replay_of_a_real_asp_run_ends_on_its_theta_bit_for_bit(self):
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
        s = json.loads((run / "replay" / "summary.json").read_text())
        self.assertTrue(s["replay_identical"])
        self.assertEqual(s["params_checksums"], s["recorded_params_checksums"])
        # another worker's push moved before a pull it followed: the replay is at another version than
        # the run served, and says so (the order is checked, not just read)
        lines = traces[0]
        i = next(i for i in range(len(lines) - 1) if lines[i].startswith("pull ") and lines[i + 1].startswith("push ")
                 and lines[i].split()[1] != lines[i + 1].split()[1])
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
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

    # ---- the pslab command, installed ---------------------------------------------------------
    def test_pslab_command_from_an_install_prefix_and_the_checkout(self):
        prefix = self.tmp / "prefix"
        r = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for name in ("pslab", "pslab_worker", "pslab_server"):
            self.assertTrue(os.access(prefix / "bin" / name, os.X_OK), name)
        env = dict(self.env, PATH=f"{prefix / 'bin'}:{self.env['PATH']}")
        env.pop("PSLAB_BUILD")  # the installed binaries, found beside the installed launcher
        work = self.tmp / "work"
        work.mkdir()
        def pslab(*args, cwd=work):
            return subprocess.run(["pslab", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        r = pslab("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for cmd in ("run", "resume", "replay", "calibrate", "plot", "scale", "bundle"):
            self.assertIn(f"pslab {cmd}", r.stdout)
            h = pslab(cmd, "--help")
            self.assertEqual(h.returncode, 0, f"pslab {cmd} --help: {h.stdout}{h.stderr}")
            self.assertRegex(h.stdout, r"(?i)usage|pslab|experiments", cmd)
        self.assertIn("usage: pslab run", pslab("run", "--help").stdout)
        self.assertEqual(pslab("nonsense").returncode, 2)
        config = prefix / "share" / "pslab" / "experiments" / "configs" / "tiny.toml"
        r = pslab("run", config, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = next(d for d in (work / "runs" / "tiny").glob("*/run") if not d.parent.is_symlink())  # ./runs
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok")
        manifest = json.loads((run / "manifest.json").read_text())
        self.assertTrue(manifest["build_dir"].startswith(str(prefix)), manifest["build_dir"])
        r = pslab("plot", run, "--out", work / "plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue((work / "plots" / "convergence.png").read_bytes().startswith(PNG_MAGIC))
        # from the checkout: the same command
        r = subprocess.run([str(REPO / "experiments" / "pslab"), "run", TINY, "--dry-run"], cwd=self.tmp,
                           env=self.env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("[server0@local]", r.stdout)

    # ---- ssh and Slurm through stand-ins on PATH --------------------------------------------
    def fake_bin(self, name, script):
        d = self.tmp / "bin"
        d.mkdir(exist_ok=True)
        path = d / name
        path.write_text(textwrap.dedent(script))
        path.chmod(0o755)
        self.env["PATH"] = f"{d}:{self.env['PATH']}"
        return path

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
        base = random.randrange(20000, 32000, 10)  # below the ephemeral ports
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", "--base-port", base)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # each host asked once for its address and free ports, then one ssh per process
        self.assertEqual(sorted(log.read_text().split()), ["127.0.0.1"] * 3 + ["localhost"] * 3)
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual(s["status"], "ok")
        self.assertGreater(s["final_test_acc"], 0.85)
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
        base = random.randrange(20000, 32000, 10)  # below the ephemeral ports
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots", "--base-port", base)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual((s["mode"], s["servers"], s["status"], s["staleness"]), ("allreduce", 0, "ok", None))
        self.assertGreater(s["final_test_acc"], 0.85)
        self.assert_no_processes_left()

    # ---- two hosts in network namespaces ----------------------------------------------------
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
            base = random.randrange(20000, 32000, 10)  # below the ephemeral ports
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

    def install_fake_slurm(self):
        calls = self.tmp / "srun-calls"
        self.fake_bin("srun", f"""\
            #!/bin/bash
            # stand-in: srun --ntasks=N [--opt]... CMD... -> N local copies with SLURM_* set
            echo "$@" >> {calls}
            n=0 job=$RANDOM
            while [[ $1 == --* ]]; do [[ $1 == --ntasks=* ]] && n=${{1#--ntasks=}}; shift; done
            pids=()
            for ((i = 0; i < n; i++)); do
              SLURM_PROCID=$i SLURM_NTASKS=$n SLURM_JOB_NODELIST="fake[1-1]" SLURM_STEP_TASKS_PER_NODE=$n \
                SLURM_JOB_ID=$job SLURM_STEP_ID=0 "$@" & pids+=($!)
            done
            status=0
            for i in "${{!pids[@]}}"; do
              wait "${{pids[$i]}}" || {{ rc=$?; echo "srun: error: localhost: task $i: Exited with exit code $rc" >&2;
                                        kill "${{pids[@]}}" 2>/dev/null; status=$rc; }}
            done
            exit $status
            """)
        self.fake_bin("scontrol", """\
            #!/bin/bash
            # stand-in: scontrol show hostnames LIST -> one host per line
            [[ $1 == show && $2 == hostnames ]] || exit 1
            [[ $3 == "fake[1-1]" ]] && { echo localhost; exit 0; }
            [[ $3 == "node[1-2]" ]] && { echo node1; echo node2; exit 0; }
            exit 1
            """)
        return calls

    def test_slurm_run_resumes_after_ctrl_c(self):
        # Under (stand-in) Slurm: Ctrl-C mid-run, then `launch.py resume`: srun again, and each task
        # adds its --resume (launch.json says so); the run ends ok from the servers' checkpoints.
        self.install_fake_slurm()
        text = TINY.read_text().replace("[cluster]", '[cluster]\nlauncher = "slurm"').replace("steps = 500", "steps = 1200")
        path = self.write("slurm-resume.toml", text)
        # no --base-port: each srun's tasks take their ports from the job id (the stand-in's random one)
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots")
        self.wait_for_processes(4)
        self.wait_for_train_lines(["worker0", "worker1"])
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130, out + err)
        self.assert_no_processes_left()
        run = self.only_invocation("tiny") / "run"
        self.assertTrue((run / "checkpoints" / "server0.ckpt").is_file(), (run / "logs" / "server0.log").read_text() + err)
        r = self.launch("resume", run, "--no-plots", timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(json.loads((run / "launch.json").read_text())["resume"])
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok", s.get("failure"))
        self.assertIn("server 0: resumed from", (run / "logs" / "server0.log").read_text())
        self.assertIn("[worker 1] resumed at step", (run / "logs" / "worker1.log").read_text())
        self.assertGreater(s["final_test_acc"], 0.85)
        self.assert_no_processes_left()

    def test_slurm_end_to_end_and_task_roles(self):
        calls = self.install_fake_slurm()
        base = random.randrange(20000, 32000, 10)  # below the ephemeral ports
        r = self.launch("run", self.slurm_config(), "--runs-dir", self.runs, "--no-plots", "--base-port", base)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_invocation("tiny") / "run"
        srun_argv = calls.read_text().split()
        self.assertEqual(srun_argv[-4:], ["/usr/bin/python3", "experiments/launch.py", "task", str(run)])
        self.assertIn("--ntasks=4", srun_argv)
        self.assertIn("--kill-on-bad-exit=1", srun_argv)
        s = json.loads((run / "summary.json").read_text())
        self.assertEqual(s["status"], "ok")
        self.assertGreater(s["final_test_acc"], 0.85)
        for name in ("server0", "worker0", "worker1", "evaluator"):
            self.assertTrue((run / "logs" / f"{name}.log").exists(), name)
        # the manifest records what each task really ran: its node, pid and command line
        m = {p["name"]: p for p in json.loads((run / "manifest.json").read_text())["processes"]}
        self.assertEqual([m[n]["slurm_task"] for n in ("server0", "worker0", "worker1", "evaluator")], [0, 1, 2, 3])
        for p in m.values():
            self.assertEqual(p["host"], "localhost")
            self.assertIsInstance(p["pid"], int)
            self.assertIn("--procs-on-host 4", p["command"])
            self.assertIn(f"tcp://127.0.0.1:{base}", p["command"])

        # The roles of the tasks of that run on an uneven two-node allocation (3 tasks on node1,
        # 1 on node2, as Slurm lays them out in blocks), the node list injected with --hosts ...
        def task(procid, *extra, ntasks=4, per_node="3,1"):
            env = dict(self.env, SLURM_PROCID=str(procid), SLURM_NTASKS=str(ntasks), SLURM_JOB_NODELIST="node[1-2]",
                       SLURM_STEP_TASKS_PER_NODE=per_node)
            return self.launch("task", run, "--print", *extra, env=env)

        printed = {}
        for i in range(4):
            t = task(i, "--hosts", "node1,node2")
            self.assertEqual(t.returncode, 0, t.stderr)
            printed[i] = shlex.split(t.stdout.strip())
            self.assertIn(f"on {'node2' if i == 3 else 'node1'}", t.stderr)
        ep = f"tcp://node1:{base}"
        self.assertEqual(os.path.basename(printed[0][0]), "pslab_server")
        self.assertEqual(option(printed[0], "--bind"), f"tcp://node1:{base}")
        self.assertEqual(option(printed[0], "--shard"), "0")
        for i, rank in ((1, "0"), (2, "1")):
            self.assertEqual(printed[i][1], "ps")
            self.assertEqual(option(printed[i], "--rank"), rank)
            self.assertEqual(option(printed[i], "--servers"), ep)
        self.assertEqual(printed[3][1], "eval")
        self.assertEqual(option(printed[3], "--servers"), ep)
        # node1 runs tasks 0-2 (the workers: GPU slots 0 and 1), node2 the evaluator
        self.assertEqual([option(printed[i], "--procs-on-host") for i in (1, 2, 3)], ["3", "3", "1"])
        self.assertEqual([option(printed[i], "--gpu-slot") for i in (1, 2, 3)], ["0", "1", "0"])
        # "2(x2)": two on each node
        self.assertEqual(option(shlex.split(task(2, "--hosts", "node1,node2", per_node="2(x2)").stdout), "--procs-on-host"), "2")
        bad = task(0, "--hosts", "node1,node2", per_node="3")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("names 1 node(s), the node list 2", bad.stderr)
        self.assertEqual(option(printed[0], "--run-start"), option(printed[3], "--run-start"))
        # ... and through `scontrol show hostnames` of SLURM_JOB_NODELIST
        self.assertEqual(shlex.split(task(1).stdout.strip()), printed[1])
        # a task count that does not match the run is refused
        bad = task(0, "--hosts", "node1", ntasks=5)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("SLURM_NTASKS", bad.stderr)
        self.assert_no_processes_left()

    def test_a_cancelled_slurm_job_is_reported_as_cancelled(self):
        # scancel: the step's tasks are killed and srun says so; not blamed on a task
        calls = self.install_fake_slurm()
        self.fake_bin("srun", f"""\
            #!/bin/bash
            echo "$@" >> {calls}
            echo "srun: Job step aborted: Waiting up to 32 seconds for job step to finish." >&2
            echo "slurmstepd: error: *** STEP 4242.0 ON node1 CANCELLED AT 2026-11-25T08:40:00 ***" >&2
            echo "srun: error: node1: task 1: Terminated" >&2
            exit 143
            """)
        r = self.launch("run", self.slurm_config(), "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("the Slurm step 4242.0 was cancelled (by scancel, at 2026-11-25T08:40:00, said by node1)", r.stderr)
        self.assertNotIn("task 1 = ", r.stderr)
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual(s["status"], "cancelled")

    def test_slurm_allreduce_task_roles(self):
        # allreduce: tasks are the workers, then the evaluator; rank 0 and the evaluator listen
        calls = self.install_fake_slurm()
        self.fake_bin("srun", f"#!/bin/bash\necho \"$@\" >> {calls}\nexit 0\n")  # prepare the run dir only
        r = self.launch("run", self.slurm_config("allreduce"), "--runs-dir", self.runs, "--no-plots", "--base-port", 31000)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_invocation("tiny") / "run"
        self.assertIn("--ntasks=3", calls.read_text())
        out = {}
        for i in range(3):
            env = dict(self.env, SLURM_PROCID=str(i), SLURM_NTASKS="3", SLURM_STEP_TASKS_PER_NODE="1(x3)")
            t = self.launch("task", run, "--print", "--hosts", "n1,n2,n3", env=env)
            self.assertEqual(t.returncode, 0, t.stderr)
            out[i] = shlex.split(t.stdout.strip())
        self.assertEqual([out[i][1] for i in range(3)], ["allreduce", "allreduce", "eval"])
        self.assertEqual(option(out[1], "--rank"), "1")
        self.assertEqual(option(out[0], "--coordinator"), "tcp://n1:31000")
        self.assertEqual(option(out[1], "--coordinator"), "tcp://n1:31000")
        self.assertEqual(option(out[1], "--snapshots"), "tcp://n3:31002")
        self.assertEqual(option(out[2], "--snapshots"), "tcp://n3:31002")

    def test_slurm_ipc_task_roles(self):
        # ipc: srun on one node; the tasks' endpoints are the run's sockets; the directory goes with the run
        calls = self.install_fake_slurm()
        self.fake_bin("srun", f"#!/bin/bash\necho \"$@\" >> {calls}\nexit 0\n")  # prepare the run dir only
        path = self.slurm_config()
        path.write_text(path.read_text().replace("[cluster]", '[cluster]\ntransport = "ipc"'))
        r = self.launch("run", path, "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("--nodes=1", calls.read_text().split())
        run = self.only_invocation("tiny") / "run"
        sockets = json.loads((run / "launch.json").read_text())["socket_dir"]
        self.assertEqual(json.loads((run / "manifest.json").read_text())["transport"], "ipc")
        self.assertTrue(sockets.startswith("/tmp/pslab-"), sockets)
        self.assertFalse(os.path.exists(sockets), "the socket directory outlived the run")
        out = {}
        for i in range(4):
            env = dict(self.env, SLURM_PROCID=str(i), SLURM_NTASKS="4")
            t = self.launch("task", run, "--print", "--hosts", "n1", env=env)
            self.assertEqual(t.returncode, 0, t.stderr)
            out[i] = shlex.split(t.stdout.strip())
        self.assertEqual(option(out[0], "--bind"), f"ipc://{sockets}/server0")
        for i in (1, 2, 3):
            self.assertEqual(option(out[i], "--servers"), f"ipc://{sockets}/server0")
        env = dict(self.env, SLURM_PROCID="0", SLURM_NTASKS="4", SLURM_STEP_TASKS_PER_NODE="2(x2)")
        t = self.launch("task", run, "--print", "--hosts", "n1,n2", env=env)
        self.assertEqual(t.returncode, 2, t.stdout + t.stderr)
        self.assertIn("cluster.transport", t.stderr)


if __name__ == "__main__":
    unittest.main()
