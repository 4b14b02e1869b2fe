"""What every part of the launcher shares: the checkout's path, output, writing its files, and
the errors that end an invocation (UsageError: exit 2; CannotWrite: exit 1) or a run (RunFailed:
exit 1)."""
import json
import os
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


# What the launchers of one run on different hosts must agree on (the probe's answer, remote.py's
# markers, the binaries' command lines): a host whose checkout says another is refused, named.
LAUNCHER_PROTOCOL = 3  # 3: remote.py hears the launcher (--alive-s)


def bundle_facts():
    """A bundle's BUNDLE.json (experiments/bundle.sh: revision, dirty, made, libraries), or None
    (a checkout)."""
    try:
        return json.loads((REPO / "BUNDLE.json").read_text())
    except (OSError, ValueError):
        return None


def checkout_revision():
    """This checkout's git revision (short), a bundle's (the one it was made from), or None."""
    bundle = bundle_facts()
    if bundle and bundle.get("revision") not in (None, "unknown"):
        return bundle["revision"][:7]
    return cmd_out(["git", "rev-parse", "--short", "HEAD"], cwd=REPO)


# The environment that decides a process's numerics (which BLAS kernels, how many threads, TF32):
# recorded in manifest.json, handed to processes on other hosts, compared by a replay.
NUMERICS_PREFIXES = ("OPENBLAS_", "GOTO", "OMP_", "MKL_", "BLIS_", "CUBLAS_", "NVIDIA_TF32_OVERRIDE")


def numerics_env(environ=None):
    """{name: value} of the variables in NUMERICS_PREFIXES set in `environ` (default: this process's)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(NUMERICS_PREFIXES)}


def say(*parts):
    print(*parts, flush=True)


def warn(msg):
    print(f"launch.py: {msg}", file=sys.stderr, flush=True)


class UsageError(Exception):
    """Bad config, options or missing binaries: exit 2, nothing started."""


class CannotWrite(Exception):
    """A file of the run could not be written (a full disk, a read-only directory): exit 1, one line
    naming the path and the system's reason."""


def write_file(path, text):
    """Writes `text` to `path` whole or not at all: to a temporary file beside it, flushed to disk,
    then renamed over it (a reader finds the old file or the new one, never a cut one). Raises
    CannotWrite naming the path."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise CannotWrite(f"cannot write {path}: {e.strerror or e}") from None


def disk_trouble(path):
    """' (the file system of PATH is full)' or ' (PATH is read-only)' when that is why a process of
    the run may have failed, else ''."""
    try:
        st = os.statvfs(path)
    except OSError:
        return ""
    if st.f_flag & os.ST_RDONLY or not os.access(path, os.W_OK):
        return f" ({path} is read-only)"
    if st.f_bavail == 0 or (st.f_favail == 0 and st.f_files):
        return f" (the file system of {path} is full)"
    return ""


class RunFailed(Exception):
    """A run failed; the message says which process and why. status: summary.json's ("failed", or
    "cancelled": the Slurm job was)."""

    def __init__(self, message, status="failed"):
        super().__init__(message)
        self.status = status


def cmd_out(argv, cwd=None):
    """A command's stripped standard output, or None when it cannot run or fails."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=cwd, stdin=subprocess.DEVNULL)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None
