"""Processes of a run: the signal flag every wait checks, starting a process with its log,
stopping them all (nothing left behind), and words for how one ended."""
import ctypes
import os
import pathlib
import signal
import subprocess
import threading
import time

from .common import warn

KILL_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the launcher: exit 128 + signum once everything is stopped."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# ---- signals: a flag, checked wherever the launcher waits ----------------------------------
_signal_received = None


def _on_signal(signum, _frame):
    global _signal_received
    if _signal_received is None:
        _signal_received = signum


def catch_signals():
    """SIGINT and SIGTERM set the flag instead of ending the launcher at once."""
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def check_signal():
    if _signal_received is not None:
        raise Interrupted(_signal_received)


def communicate_checked(popen, timeout_s):
    """popen.communicate(), a signal heard every 0.2 s (Interrupted); TimeoutExpired past timeout_s."""
    end = time.monotonic() + timeout_s
    while True:
        check_signal()
        try:
            return popen.communicate(timeout=max(0.01, min(0.2, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= end:
                raise


def sleep_checked(seconds):
    end = time.monotonic() + seconds
    while True:
        check_signal()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.1))


# ---- starting and stopping -----------------------------------------------------------------
def die_with_parent():
    """Child side, before exec: SIGKILL this process if the launcher dies (even by SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def start(proc, cwd, append_log=False, env=None):
    """Starts proc.command in its own session, output to proc.log (appended to: a resumed run), or
    for ssh to proc.ssh_log with stdin a pipe (the remote end's stop line); sets proc.popen.
    env: variables added to the launcher's environment for it (the run's MPS daemon)."""
    out = proc.ssh_log if proc.control else proc.log
    out.parent.mkdir(parents=True, exist_ok=True)
    proc.log_from = {str(path): path.stat().st_size if append_log and path.exists() else 0
                     for path in (proc.log, proc.ssh_log) if path is not None}
    with open(out, "ab" if append_log else "wb") as log:
        proc.popen = subprocess.Popen(proc.command, stdin=subprocess.PIPE if proc.control else subprocess.DEVNULL,
                                      stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                                      preexec_fn=die_with_parent, env={**os.environ, **env} if env else None)
    if proc.control:  # (a heartbeat to an ssh that stalled must not stall the launcher)
        os.set_blocking(proc.popen.stdin.fileno(), False)


class Heartbeat:
    """ssh: a line "alive" to every remote end still running, 4 times per alive_s (at most every
    second), from a thread of its own, so that whatever the launcher waits for meanwhile (a stop's
    grace, a manifest written) the remote ends hear it; a remote end stops its process when it
    hears nothing for alive_s (remote.py). A launcher stopped (Ctrl-Z) for longer ends its ssh
    processes so. `with Heartbeat(procs, alive_s):` beats while the block runs; procs may grow."""

    def __init__(self, procs, alive_s):
        self.procs, self.every = procs, min(1.0, alive_s / 4)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="ssh heartbeat", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc):
        self.done.set()
        self.thread.join()

    def _beat(self):
        while not self.done.wait(self.every):
            for p in list(self.procs):
                if p.control and p.popen is not None:
                    write_stdin(p, b"alive\n")


# The launcher's writes to ssh's stdins (the heartbeat's thread, the main thread's stop and close):
# one at a time, so that none goes to a descriptor closed, or closed and reused, meanwhile.
_stdin_lock = threading.Lock()


def write_stdin(proc, data):
    """data to proc's stdin (an ssh client's: non-blocking); what a full pipe does not take is left
    out (ssh is giving up on the host), as is a closed one."""
    with _stdin_lock:
        if proc.popen.stdin is None or proc.popen.stdin.closed:
            return
        try:
            os.write(proc.popen.stdin.fileno(), data)
        except OSError:
            pass


def close_stdin(proc):
    with _stdin_lock:
        if proc.popen.stdin is not None:
            try:
                proc.popen.stdin.close()
            except OSError:
                pass


def run_in_group(argv, timeout_s, **popen_args):
    """Runs argv to its end in a process group of its own (a Ctrl-C of the launcher stops it; what
    it leaves in its group is killed when it ends); returns its exit status. Raises
    subprocess.TimeoutExpired past timeout_s, Interrupted on SIGINT or SIGTERM, the group ended."""
    popen_args.setdefault("stdin", subprocess.DEVNULL)  # (the launcher's own stdin is not theirs to read)
    p = subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent, **popen_args)
    end = time.monotonic() + timeout_s
    try:
        while p.poll() is None:
            check_signal()
            if time.monotonic() > end:
                raise subprocess.TimeoutExpired(argv, timeout_s)
            time.sleep(0.05)
    finally:
        if p.poll() is None:  # (interrupted or past its time: asked first)
            killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        killpg(p.pid, signal.SIGKILL)  # what is left of its group
        reap(p, " ".join(argv[:2]))
    return p.returncode


REAP_S = 10.0  # after SIGKILL: a process that is still there is stuck in the kernel (a hung NFS write)


def reap(popen, name):
    """Waits for a process sent SIGKILL, at most REAP_S; one that does not end is named, with its
    state, and left (the launcher does not hang on it)."""
    try:
        popen.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:
        try:
            state = pathlib.Path(f"/proc/{popen.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = "?"
        warn(f"{name} (pid {popen.pid}) did not end {REAP_S:g} s after SIGKILL (state {state}: "
             f"D is a wait in the kernel, e.g. on a file system that does not answer); left running")


def killpg(pgid, sig):
    """Signals a process group; one that is gone (or not ours to signal) is left be."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def ask_to_stop(proc):
    """ssh: the line "stop" to the remote end, then the end of its stdin; False if it is gone."""
    with _stdin_lock:
        try:
            proc.popen.stdin.write(b"stop\n")
            proc.popen.stdin.close()
            return True
        except (OSError, ValueError):
            return False


def stop_all(procs, meanwhile=None):
    """Every live process: SIGTERM (and SIGCONT) to its group, or over ssh the remote end asked to
    stop its process group (remote.py: SIGTERM, SIGKILL after its own grace); SIGKILL after
    KILL_GRACE_S (an ssh client: the connection drops, and the remote end stops its group).
    Reaps them all. meanwhile(): called once every process was asked to stop, while they stop.
    Returns the processes that were still running."""
    live = [p for p in procs if p.popen is not None and p.popen.poll() is None]
    for p in live:
        if p.control and ask_to_stop(p):
            continue
        try:
            os.killpg(p.popen.pid, signal.SIGTERM)
            os.killpg(p.popen.pid, signal.SIGCONT)  # a stopped (SIGSTOP) process takes its SIGTERM now
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + KILL_GRACE_S
    if meanwhile:
        meanwhile()
    # The whole group gets the grace, not just its leader: srun's tasks (servers writing their
    # checkpoints as they stop) may outlive the srun that started them.
    while time.monotonic() < deadline and any(p.popen.poll() is None or group_alive(p.popen.pid) for p in live):
        time.sleep(0.05)
    for p in live:
        if p.popen.poll() is None:
            try:
                os.killpg(p.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in live:
        reap(p.popen, f"{p.describe()} on {p.host}")
    end_groups(procs)
    return live


def end_group(proc):
    """Once proc was started and has exited: SIGKILL what is left in its process group, once (the
    binaries do not fork, but a worker.script may: a data loader's workers). Right when its exit is
    seen: a group lives while any member does, so its number is not reused meanwhile; once it
    emptied, the number may go to another group, never signalled here."""
    if proc.popen is None or proc.group_ended or proc.popen.poll() is None:
        return
    proc.group_ended = True
    if group_alive(proc.popen.pid):
        killpg(proc.popen.pid, signal.SIGKILL)


def end_groups(procs):
    for p in procs:
        end_group(p)


def describe_exit(rc):
    if rc is not None and rc < 0:
        try:
            return f"was killed by signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def log_tail(path, n=20):
    try:
        lines = pathlib.Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"    (no log: {e})"
    if not lines:
        return "    (the log is empty)"
    return "\n".join("    " + line for line in lines[-n:])
