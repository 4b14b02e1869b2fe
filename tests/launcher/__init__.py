"""The launcher's tests: experiments/launch.py through its command line, real runs of the binaries.

One module per concern (test_config, test_runs, test_evaluations, test_failures, test_resume,
test_virtual, test_install, test_ssh, test_slurm), one CTest entry per class (launcher.Config,
...; tests/CMakeLists.txt); what they share is helpers.py. Run from the repository root with
PSLAB_BUILD naming a build directory, e.g.
    PSLAB_BUILD=build /usr/bin/python3 -m unittest -v tests/launcher/test_config.py
    PSLAB_BUILD=build /usr/bin/python3 -m unittest -v tests.launcher.test_failures.Heartbeats
    PSLAB_BUILD=build /usr/bin/python3 -m unittest discover -v -s tests/launcher -t .
Real runs use experiments/configs/tiny.toml (synthetic logistic regression, seconds). ssh and
Slurm cannot run here: their dry runs are checked line by line, and each is also run end to end
through a stand-in `ssh` / `srun` / `scontrol` on PATH that starts the command locally. Every
test cleans up its temporary directory and any process it started.
"""
