"""The Slurm launcher through stand-in `srun` and `scontrol` on PATH that start the tasks here: a
run end to end and resumed after Ctrl-C, a cancelled job, and the role each task takes (ps,
allreduce, ipc) on uneven allocations.
"""
import json
import os
import pathlib
import shlex
import signal
import sys
import time
import unittest
import unittest.mock

from tests.launcher.helpers import LauncherTestCase, TINY, option, free_base_port


class Slurm(LauncherTestCase):
    """Runs under a stand-in Slurm, and the tasks' roles."""

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
              SLURM_PROCID=$i SLURM_NTASKS=$n SLURM_JOB_NODELIST="fake[1-1]" SLURM_STEP_TASKS_PER_NODE=$n SLURMD_NODENAME=localhost \
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
        base = free_base_port()
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

    def test_ports_come_from_a_probe_step_of_one_task_per_node(self):
        # inside an allocation (SLURM_JOB_NUM_NODES), a first step asks each node for free ports:
        # concurrent jobs on a node cannot share one, as a window derived from the job id could
        calls = self.install_fake_slurm()
        self.env["SLURM_JOB_NUM_NODES"] = "1"
        r = self.launch("run", self.slurm_config(mode="asp"), "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        steps = calls.read_text().splitlines()
        self.assertEqual(len(steps), 2, steps)
        self.assertIn("--ntasks=1 --ntasks-per-node=1 --kill-on-bad-exit=1 /usr/bin/python3 experiments/launch.py probe --slurm "
                      "--ports 4", steps[0])
        run = self.only_invocation("tiny") / "run"
        ports = json.loads((run / "launch.json").read_text())["ports"]
        self.assertEqual(list(ports), ["localhost"])
        self.assertEqual(len(set(ports["localhost"])), 4)
        m = {p["name"]: p for p in json.loads((run / "manifest.json").read_text())["processes"]}
        self.assertIn(f"--bind tcp://127.0.0.1:{ports['localhost'][0]}", m["server0"]["command"])
        self.assertIn(f"--servers tcp://127.0.0.1:{ports['localhost'][0]}", m["worker1"]["command"])
        self.assert_no_processes_left()

    def test_ports_derived_from_the_job_id_stay_in_the_job_s_window(self):
        # Without a probe (outside an allocation): the window is the job's, each process at its place
        # on its node. 64 ports were kept per job whatever its size, and process i took start + i:
        # the 65th process of a job sat in the next job's window.
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "experiments"))
        from launcher.task import slurm_ports
        from launcher.common import UsageError
        env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
        with unittest.mock.patch.dict(os.environ, env):
            for where, most in ((["n1", "n2"] * 50, 50), (["n1"] * 130, 130)):
                port_of = slurm_ports(None, None, where)
                ports = [port_of(i) for i in range(len(where))]
                window = -(-most // 64) * 64
                start = min(ports)
                self.assertEqual((start - 20000) % window, 0, (start, window))
                self.assertLessEqual(max(ports) + 1, 32000)
                for node in set(where):
                    mine = [p for p, w in zip(ports, where) if w == node]
                    self.assertEqual(sorted(mine), list(range(start, start + len(mine))), node)
                # another job's window of the same size shares none of these ports
                with unittest.mock.patch.dict(os.environ, {"SLURM_JOB_ID": "4243"}):
                    other = slurm_ports(None, None, where)
                    self.assertFalse(set(ports) & {other(i) for i in range(len(where))})
            with self.assertRaisesRegex(UsageError, "12001 processes on one node"):
                slurm_ports(None, None, ["n1"] * 12001)(0)

    def test_a_job_ended_by_its_time_limit_under_sbatch_is_reported_as_cancelled(self):
        # under sbatch, the time limit (or scancel) reaches the launcher as SIGTERM: Slurm's own
        # record of the job says which, not "interrupted", once it no longer says COMPLETING (as
        # a real slurmctld does for a moment, longer when loaded)
        self.install_fake_slurm()
        asked = self.tmp / "scontrol-asked"
        self.fake_bin("scontrol", f"""\
            #!/bin/bash
            [[ $1 == show && $2 == hostnames ]] && {{ echo localhost; exit 0; }}
            if [[ $1 == show && $2 == job ]]; then
              echo x >> {asked}
              state=TIMEOUT; (( $(wc -l < {asked}) < 3 )) && state=COMPLETING
              echo "JobId=$4 JobName=x JobState=$state Reason=None"; exit 0
            fi
            exit 1
            """)
        self.env["SLURM_JOB_ID"] = "77"
        path = self.slurm_config()
        path.write_text(path.read_text().replace("steps = 500", "steps = 100000"))
        p = self.launch_bg("run", path, "--runs-dir", self.runs, "--no-plots", "--base-port", free_base_port())
        self.wait_for_processes(4)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 143, out + err)
        self.assertIn("the Slurm job 77 was cancelled (its time limit)", err)
        self.assertEqual(len(asked.read_text().split()), 3, "asked Slurm until the job no longer said COMPLETING")
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual(s["status"], "cancelled")
        self.assertIn("its time limit", s["failure"])
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

    def fake_srun_saying(self, calls, lines, code):
        self.fake_bin("srun", "#!/bin/bash\n" + f'echo "$@" >> {calls}\n'
                      + "".join(f"echo {json.dumps(line)} >&2\n" for line in lines) + f"exit {code}\n")

    def test_a_killed_task_is_blamed_not_the_cancellation_it_caused(self):
        # kill -9 of task 2: srun's --kill-on-bad-exit then cancels the step; the task is the cause
        calls = self.install_fake_slurm()
        self.fake_srun_saying(calls, ["srun: error: node1: task 2: Killed", "srun: Terminating StepId=12.0",
                                      "slurmstepd: error: *** STEP 12.0 ON node1 CANCELLED AT 2026-11-25T08:40:00 ***",
                                      "srun: error: node1: tasks 0-1,3: Terminated"], 137)
        r = self.launch("run", self.slurm_config(), "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("task 2 = worker1 (rank 1) on node1 failed first (Killed)", r.stderr)
        self.assertNotIn("was cancelled", r.stderr)
        s = json.loads((self.only_invocation("tiny") / "run" / "summary.json").read_text())
        self.assertEqual(s["status"], "failed")

    def test_a_time_limit_is_reported_as_such(self):
        calls = self.install_fake_slurm()
        self.fake_srun_saying(calls, ["slurmstepd: error: *** JOB 77 ON node2 CANCELLED AT 2026-11-25T09:00:00 DUE TO TIME LIMIT ***",
                                      "srun: error: node2: tasks 0-3: Terminated"], 143)
        r = self.launch("run", self.slurm_config(), "--runs-dir", self.runs, "--no-plots")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("the Slurm job 77 was cancelled (its time limit, at 2026-11-25T09:00:00, said by node2)", r.stderr)
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
