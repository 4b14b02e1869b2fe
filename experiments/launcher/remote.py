"""The far end of a process started over ssh (`launch.py remote`, which ssh runs on the host).

It starts the binary in a process group of its own, with its output in the run's log on that
host (written there whatever happens to the connection), and ends the whole group when the
launcher asks (a line "stop" on stdin), when stdin ends (the launcher died or the connection
dropped: sshd closes it) or on SIGHUP, SIGINT or SIGTERM: SIGTERM, then SIGKILL after the
grace. Then it says how the process ended, as the last line of the log and of its own output,

    [pslab-launch] {"event": "exit", "host": ..., "pid": ..., "code": 1}    (or "signal": 9, "name": "SIGKILL")

and exits with the code, or 128 + the signal. The launcher reads that line to report a remote
death truthfully (ssh alone says 255)."""
import json
import os
import selectors
import signal
import socket
import subprocess
import time

from .processes import die_with_parent

MARK = "[pslab-launch] "  # a line of the launcher's own, in a process's log
STOP_GRACE_S = 2.0  # SIGTERM to the group, SIGKILL after this long (the launcher waits longer)
DRAIN_S = 1.0  # the child exited but its output is still open: read what comes this long, then end


def forward(out, log, data):
    """Output to the log and to ssh (fd `out`, None once gone); returns `out`, or None if it is gone."""
    log.write(data)
    log.flush()
    if out is not None:
        try:
            os.write(out, data)
        except OSError:
            return None
    return out


def say(out, log, text):
    return forward(out, log, (text + "\n").encode())


def run_remote(argv, log_path, append=False):
    stopping = []
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: stopping.append(s))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    log = open(log_path, "ab" if append else "wb")
    out = 1
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=die_with_parent)
    except OSError as e:
        say(out, log, f"cannot start {argv[0]}: {e}")
        say(out, log, MARK + json.dumps({"event": "exit", "host": socket.gethostname(), "pid": None, "code": 127}))
        return 127
    out = say(out, log, MARK + json.dumps({"event": "started", "host": socket.gethostname(), "pid": child.pid}))
    sel = selectors.DefaultSelector()
    sel.register(child.stdout, selectors.EVENT_READ, "child")
    sel.register(0, selectors.EVENT_READ, "stdin")
    kill_at = None
    exited_at = None  # when the child was seen to exit with its output still open (a process it left holds it)
    while True:
        if stopping and kill_at is None:
            kill_at = stop_group(child.pid)
        if kill_at is not None and time.monotonic() > kill_at:
            killpg(child.pid, signal.SIGKILL)
        if exited_at is None and child.poll() is not None:
            exited_at = time.monotonic()
        if exited_at is not None and time.monotonic() > exited_at + DRAIN_S:
            return finish(child, out, log, kill_at, sel, stopping)  # (what it left is ended with its group)
        for key, _ in sel.select(timeout=0.2):
            if key.data == "stdin":
                kill_at = read_stdin(sel, child, kill_at)
                continue
            data = os.read(child.stdout.fileno(), 65536)
            if not data:  # the child's output ended: it exited (or closed it)
                sel.unregister(child.stdout)
                return finish(child, out, log, kill_at, sel, stopping)
            out = forward(out, log, data)


def read_stdin(sel, child, kill_at):
    """The launcher's line "stop", or the end of stdin (the launcher or the connection is gone):
    the child's group is asked to stop. Returns when it is to be killed."""
    data = os.read(0, 4096)
    if not data or b"stop" in data:
        sel.unregister(0)
        if kill_at is None:
            kill_at = stop_group(child.pid)
    return kill_at


def stop_group(pgid):
    killpg(pgid, signal.SIGTERM)
    killpg(pgid, signal.SIGCONT)  # a stopped process takes its SIGTERM now
    return time.monotonic() + STOP_GRACE_S


def killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def finish(child, out, log, kill_at, sel, stopping):
    """Waits for the child, still heard asking it to stop (a child that closed its output goes on:
    a stop line, the end of stdin or a signal stops it; SIGKILL once past the grace), ends what is
    left of its group, says how it ended."""
    if child.stdout in (k.fileobj for k in sel.get_map().values()):
        sel.unregister(child.stdout)  # (what a process it left writes there is not the child's)
    while (rc := child.poll()) is None:
        if stopping and kill_at is None:
            kill_at = stop_group(child.pid)
        if kill_at is not None and time.monotonic() > kill_at:
            killpg(child.pid, signal.SIGKILL)
        if not sel.get_map():  # (nothing left to hear but signals)
            time.sleep(0.2)
        for key, _ in sel.select(timeout=0.2):
            if key.data == "stdin":
                kill_at = read_stdin(sel, child, kill_at)
    killpg(child.pid, signal.SIGKILL)  # anything left in its group (the binaries do not fork)
    record = {"event": "exit", "host": socket.gethostname(), "pid": child.pid}
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        record.update(signal=-rc, name=name)
    else:
        record["code"] = rc
    say(out, log, MARK + json.dumps(record))
    log.close()
    return 128 - rc if rc < 0 else rc


def markers(path, tail_bytes=65536):
    """The [pslab-launch] records of a log, oldest first (the last tail_bytes of it)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        if line.startswith(MARK):
            try:
                found.append(json.loads(line[len(MARK):]))
            except ValueError:
                pass
    return found


def remote_exit(*paths):
    """How the remote process ended, from the newest exit record in any of `paths`, or None."""
    for path in paths:
        exits = [m for m in markers(path) if m.get("event") == "exit"]
        if exits:
            return exits[-1]
    return None


def describe_remote_exit(record):
    if "signal" in record:
        return f"was killed by signal {record['signal']} ({record['name']}) on {record['host']} (pid {record['pid']})"
    return f"exited with code {record['code']} on {record['host']} (pid {record['pid']})"
