"""The `pslab` command, from `cmake --install` into a prefix and from the checkout.
"""
import json
import os
import subprocess
import unittest

from tests.launcher.helpers import LauncherTestCase, REPO, TINY, BUILD, PNG_MAGIC


class Install(LauncherTestCase):
    """The pslab command, installed and in the checkout."""

    # Defect: `experiments/quickstart.sh --help` and `tests/run.sh --help` ran the setup (apt-get
    # install on a fresh machine, then the build) before their arguments were looked at.
    def test_the_readme_commands_say_what_they_do_before_installing_or_building_anything(self):
        tools = self.tmp / "bin"  # bash and sed alone: a setup that ran would fail for want of dpkg-query
        tools.mkdir()
        for tool in ("bash", "sed"):
            (tools / tool).symlink_to(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                                                     text=True, check=True).stdout.strip())
        env = dict(self.env, PATH=str(tools))
        for script, usage in (("experiments/quickstart.sh", "experiments/quickstart.sh [LAUNCHER ARGUMENTS]"),
                              ("tests/run.sh", "tests/run.sh [CTEST ARGUMENTS]"),
                              ("experiments/setup.sh", "Installs what is missing"),
                              ("experiments/bench.sh", "experiments/bench.sh [train|ps|allreduce")):
            for flag in ("-h", "--help"):
                r = subprocess.run([str(tools / "bash"), str(REPO / script), flag], env=env, capture_output=True,
                                   text=True, timeout=30)
                self.assertEqual(r.returncode, 0, f"{script} {flag}: {r.stdout}{r.stderr}")
                self.assertIn(usage, r.stdout, script)
                self.assertNotIn("[setup]", r.stdout + r.stderr, f"{script} {flag} ran the setup")
                self.assertNotIn("set -euo", r.stdout, script)

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
        for cmd in ("run", "resume", "replay", "calibrate", "plot", "scale", "bundle", "quickstart"):
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
        # from the checkout, started in another directory: the runs go to ./runs there, and the
        # first line says where
        elsewhere = self.tmp / "elsewhere"
        elsewhere.mkdir()
        r = subprocess.run([str(REPO / "experiments" / "pslab"), "run", TINY, "--dry-run"], cwd=elsewhere,
                           env=self.env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("[server0@local]", r.stdout)
        r = subprocess.run([str(REPO / "experiments" / "pslab"), "run", TINY, "--no-plots"], cwd=elsewhere,
                           env=self.env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(str(elsewhere / "runs" / "tiny"), r.stdout.splitlines()[0])
        self.assertTrue(any((elsewhere / "runs" / "tiny").glob("*/run/summary.json")))


if __name__ == "__main__":
    unittest.main()
