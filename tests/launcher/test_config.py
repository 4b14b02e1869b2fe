"""The launcher's config errors and dry runs: an invalid config stops everything before anything
starts, naming the key; a dry run prints every process's command line (on this host, over ssh,
under Slurm; tcp, ipc, shm and auto transports; GPU collectives) and writes nothing.
"""
import json
import os
import re
import shlex
import subprocess
import textwrap
import tomllib
import unittest

from tests.launcher.helpers import LauncherTestCase, REPO, LAUNCH, TINY, PYTHON, dry_run_commands, remote_argv, option


class Config(LauncherTestCase):
    """Config errors and dry runs (the last two tests also start a run, for what a real start records)."""

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

    def test_placement_is_linear_in_processes(self):
        # 100000 workers placed and printed in seconds (it was quadratic: ~15 min)
        r = self.launch("run", TINY, "--runs-dir", self.runs, "--dry-run", "--set", "cluster.workers=100000",
                        "--set", "train.batch=1", timeout=60)  # (a batch no larger than a worker's share)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(sum(line.startswith("[worker") for line in r.stdout.splitlines()), 100000)

    def test_files_a_variant_or_a_sweep_names_are_beside_the_config(self):
        # Defect: the config's top-level worker.script went to the binary as a --set, which won over
        # what a variant set (variant b ran a.py); a variant's or a sweep's relative path was taken
        # from the launcher's directory.
        (self.tmp / "sub").mkdir()
        for name in ("a.py", "b.py", "c.py"):
            (self.tmp / "sub" / name).write_text("pass\n")
        path = self.write("sub/v.toml", """\
            name = "v"
            [model]
            kind = "linear"
            [data]
            kind = "least-squares"
            [worker]
            kind = "python"
            script = ["a.py", "c.py"]
            [[variant]]
            name = "a"
            [[variant]]
            name = "b"
            worker.script = "b.py"
            """)
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        runs = r.stdout.split("# run ")[1:]
        scripts = [sorted(set(re.findall(r"\S*/[abc]\.py", run))) for run in runs]
        sub = str(self.tmp / "sub")
        self.assertEqual(scripts, [[f"{sub}/a.py"], [f"{sub}/c.py"], [f"{sub}/b.py"]])
        # a --set names a file from where the launcher runs
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run", "--set", f"worker.script={sub}/c.py")
        self.assertEqual(sorted(set(re.findall(r"\S*/[abc]\.py", r.stdout))), [f"{sub}/c.py"])

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
            self.assertEqual(option(cmds[f"server{k}"][1], "--procs-on-host"), "6")
            self.assertEqual(option(cmds[f"server{k}"][1], "--servers-on-host"), "2")  # (a GPU run's share the rest)
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

    def test_ssh_dry_run(self):
        path = self.ssh_config(["hostA", "hostB"])
        for k in [k for k in self.env if k.startswith(("OPENBLAS_", "GOTO", "OMP_", "MKL_", "BLIS_", "CUBLAS_", "NVIDIA_TF32"))]:
            del self.env[k]
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        cmds = dry_run_commands(r.stdout)
        placement = {name: host for name, (host, _) in cmds.items()}
        self.assertEqual(placement, {"server0": "hostA", "server1": "hostB", "worker0": "hostA",
                                     "worker1": "hostB", "evaluator": "hostA"})
        for name, (host, argv) in cmds.items():
            # ssh gives up on a host it has not heard for cluster.ssh_alive_s (60 s here), as the
            # remote end does on the launcher
            self.assertEqual(argv[:10], ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o",
                                         "ServerAliveInterval=10", "-o", "ServerAliveCountMax=6", host])
            self.assertEqual(len(argv), 11, argv)
            remote = argv[10]
            self.assertTrue(remote.startswith(f"cd {shlex.quote(str(REPO))} && exec "), remote)
            self.assertIn(" remote --log ", remote)
            self.assertIn(" --alive-s 60 -- ", remote)
        inner = {name: remote_argv(argv) for name, (_, argv) in cmds.items()}
        self.assertIn(" exec python3 experiments/launch.py remote --log ", cmds["server0"][1][-1])
        # each host's address and ports are asked of it at launch: placeholders here
        self.assertEqual(option(inner["server0"], "--bind"), "tcp://<address of hostA>:<port 0>")
        self.assertEqual(option(inner["worker0"], "--servers"),
                         "tcp://<address of hostA>:<port 0>,tcp://<address of hostB>:<port 1>")
        # the launcher's numerics environment goes to every remote process (ssh gives it its own)
        env = dict(self.env, OPENBLAS_CORETYPE="Haswell", OMP_NUM_THREADS="1")
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run", env=env)
        self.assertIn(" exec env OMP_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell python3 experiments/launch.py remote --log ",
                      dry_run_commands(r.stdout)["worker1"][1][-1])
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
        remote = dry_run_commands(r.stdout)["server0"][1][-1]
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

    def fake_gpus(self):
        """A stand-in `nvidia-smi -L` with $FAKE_GPUS GPUs ("fail": it fails, saying so)."""
        self.fake_bin("nvidia-smi", """\
            #!/bin/bash
            [[ $FAKE_GPUS == fail ]] && { echo "NVIDIA-SMI has failed" >&2; exit 9; }
            for ((i = 0; i < ${FAKE_GPUS:-1}; i++)); do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
            """)

    def test_collective_on_gpus_over_ssh_asks_each_host(self):
        self.fake_gpus()
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
        # the hosts are asked with $PSLAB_SSH, as the run's processes are started, and what ssh
        # said is named when it fails
        self.fake_bin("badssh", """\
            #!/bin/bash
            while [[ $1 == -o ]]; do shift 2; done
            echo "ssh: Could not resolve hostname $1: Name or service not known" >&2
            exit 255
            """)
        ssh.write_text(ssh.read_text().replace('collective = "nccl"', 'collective = "auto"'))
        r = self.launch("run", ssh, "--runs-dir", self.runs, "--dry-run", env=dict(self.env, FAKE_GPUS="2", PSLAB_SSH="badssh"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("the GPUs of hostA, hostB are not known here (ssh hostA nvidia-smi -L exited 255: ssh: Could not "
                      "resolve hostname hostA: Name or service not known; ssh hostB", r.stdout)

    def test_collective_on_gpus_follows_the_gpus_each_host_has(self):
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): the launcher decides
        # before anything starts, from `nvidia-smi -L` (here a stand-in with $FAKE_GPUS GPUs).
        self.fake_gpus()
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
        # overlap asked for: NCCL's does not overlap, so "auto" goes through host memory (NCCL was
        # picked, and the binary refused it, naming a temporary file)
        path.write_text(text.replace("[cluster]", '[cluster]\ncollective = "auto"\noverlap = true'))
        r = self.launch("run", path, "--runs-dir", self.runs, "--dry-run", env=dict(self.env, FAKE_GPUS="2"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn('cluster.collective = "auto" with cluster.overlap = true: through host memory', r.stdout)
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
        self.assertIn("the GPUs of local are not known here (nvidia-smi -L exited 9: NVIDIA-SMI has failed); the ranks "
                      "decide at start", r.stdout)
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

    def test_a_config_the_binary_does_not_answer_for_is_an_error_naming_it(self):
        # pslab_worker config reads the data sets' headers; on a file system that hangs it would
        # hold the launcher for ever: past CONFIG_TIMEOUT_S it is a usage error naming the command.
        import sys
        sys.path.insert(0, str(REPO / "experiments"))
        from launcher import plan as launcher_plan
        from launcher.common import UsageError
        hangs = self.fake_bin("pslab_worker", "#!/bin/sh\nexec sleep 30\n")
        bins = launcher_plan.Binaries(hangs.parent, hangs, hangs)
        saved, launcher_plan.CONFIG_TIMEOUT_S = launcher_plan.CONFIG_TIMEOUT_S, 0.5
        try:
            with self.assertRaises(UsageError) as e:
                launcher_plan.binary_config(bins, ["--print", "some.toml"])
        finally:
            launcher_plan.CONFIG_TIMEOUT_S = saved
        self.assertIn(f"{hangs} config --print some.toml did not answer within 0.5 s", str(e.exception))


if __name__ == "__main__":
    unittest.main()
