"""What every part of the launcher shares: the checkout's path, output, and the two errors
that end an invocation (UsageError: exit 2) or a run (RunFailed: exit 1)."""
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def default_runs_dir():
    """Where runs go without --runs-dir: ./runs, in the directory the launcher was started in
    (from a checkout or installed); the launcher prints the run directory before anything starts."""
    return pathlib.Path.cwd() / "runs"


def is_loopback(addr):
    return addr in ("localhost", "::1") or addr.startswith("127.")


def say(*parts):
    print(*parts, flush=True)


def warn(msg):
    print(f"launch.py: {msg}", file=sys.stderr, flush=True)


class UsageError(Exception):
    """Bad config, options or missing binaries: exit 2, nothing started."""


class RunFailed(Exception):
    """A run failed; the message says which process and why. status: summary.json's ("failed", or
    "cancelled": the Slurm job was)."""

    def __init__(self, message, status="failed"):
        super().__init__(message)
        self.status = status


def cmd_out(argv, cwd=None):
    """A command's stripped standard output, or None when it cannot run or fails."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=cwd)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None
