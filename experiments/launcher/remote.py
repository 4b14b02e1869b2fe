"""The far end of a process started over ssh (`launch.py remote`, which ssh runs on the host).

It starts the binary in a process group of its own, with its output in the run's log on that
host (written there whatever happens to the connection), and ends the whole group when the
launcher asks (a line "stop" on stdin), when stdin ends (the launcher died or the connection
dropped: sshd closes it), when stdin is silent for --alive-s (a partition: the launcher's line
"alive" comes more often) or on SIGHUP, SIGINT or SIGTERM: SIGTERM, then SIGKILL after the
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

from .processes import die_with_parent, killpg

MARK = "[pslab-launch] "  # a line of the launcher's own, in a process's log
STOP_GRACE_S = 2.0  # SIGTERM to the group, SIGKILL after this long (the launcher waits longer)
DRAIN_S = 1.0  # the child exited but its output is still open: read what comes this long, then end


def forward(out, log, data):
    """Output to the log and to ssh (fd `out`, non-blocking; None once gone); returns `out`, or None
    if it is gone. What a stalled connection (a partition) cannot take now is left out of ssh's
    copy: the log on the host has it all, and the loop goes on hearing stdin and the clock."""
    log.write(data)
    log.flush()
    if out is not None:
        try:
            os.write(out, data)
        except BlockingIOError:
            pass
        except OSError:
            return None
    return out


def say(out, log, text):
    return forward(out, log, (text + "\n").encode())


def run_remote(argv, log_path, append=False, alive_s=None):
    stopping = []
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: stopping.append(s))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    log = open(log_path, "ab" if append else "wb")
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=die_with_parent)
    except OSError as e:
        say(1, log, f"cannot start {argv[0]}: {e}")
        say(1, log, MARK + json.dumps({"event": "exit", "host": socket.gethostname(), "pid": None, "code": 127}))
        return 127
    os.set_blocking(1, False)
    end = RemoteEnd(child, log, stopping, alive_s)
    end.say(MARK + json.dumps({"event": "started", "host": socket.gethostname(), "pid": child.pid}))
    sel = selectors.DefaultSelector()
    sel.register(child.stdout, selectors.EVENT_READ, "child")
    sel.register(0, selectors.EVENT_READ, "stdin")
    exited_at = None  # when the child was seen to exit with its output still open (a process it left holds it)
    while True:
        end.tick()
        if exited_at is None and child.poll() is not None:
            exited_at = time.monotonic()
        if exited_at is not None and time.monotonic() > exited_at + DRAIN_S:
            return end.finish(sel)  # (what it left is ended with its group)
        for key, _ in sel.select(timeout=0.2):
            if key.data == "stdin":
                end.read_stdin(sel)
                continue
            data = os.read(child.stdout.fileno(), 65536)
            if not data:  # the child's output ended: it exited (or closed it)
                sel.unregister(child.stdout)
                return end.finish(sel)
            end.out = forward(end.out, log, data)


class RemoteEnd:
    """The child's process group and what stops it: the launcher's line "stop", the end of stdin
    (the launcher or the connection is gone), stdin silent for alive_s (a network partition: the
    connection stays open, nothing comes; the launcher's heartbeat is a line "alive" more often), or
    a signal to this process. Stopping: SIGTERM to the group, SIGKILL after STOP_GRACE_S."""

    def __init__(self, child, log, stopping, alive_s):
        self.child, self.log, self.stopping, self.alive_s = child, log, stopping, alive_s
        self.out = 1  # ssh's end (None once gone)
        self.kill_at = None  # when the group is to be killed, once asked to stop
        self.heard_at = time.monotonic()  # the launcher's last word on stdin

    def say(self, text):
        self.out = say(self.out, self.log, text)

    def stop(self):
        if self.kill_at is None:
            killpg(self.child.pid, signal.SIGTERM)
            killpg(self.child.pid, signal.SIGCONT)  # a stopped process takes its SIGTERM now
            self.kill_at = time.monotonic() + STOP_GRACE_S

    def tick(self):
        if self.stopping:
            self.stop()
        if self.alive_s and self.kill_at is None and time.monotonic() - self.heard_at > self.alive_s:
            self.say(f"launch.py remote: heard nothing from the launcher for {self.alive_s:g} s (cluster.ssh_alive_s): "
                     f"stopping pid {self.child.pid} on {socket.gethostname()}")
            self.stop()
        if self.kill_at is not None and time.monotonic() > self.kill_at:
            killpg(self.child.pid, signal.SIGKILL)

    def read_stdin(self, sel):
        data = os.read(0, 4096)
        self.heard_at = time.monotonic()
        if not data or b"stop" in data:
            sel.unregister(0)
            self.stop()

    def finish(self, sel):
        """Waits for the child, still heard asking it to stop (a child that closed its output goes
        on: a stop line, the end or silence of stdin or a signal stops it; SIGKILL once past the
        grace), ends what is left of its group, says how it ended."""
        child = self.child
        if child.stdout in (k.fileobj for k in sel.get_map().values()):
            sel.unregister(child.stdout)  # (what a process it left writes there is not the child's)
        while (rc := child.poll()) is None:
            self.tick()
            if not sel.get_map():  # (nothing left to hear but signals)
                time.sleep(0.2)
            for key, _ in sel.select(timeout=0.2):
                if key.data == "stdin":
                    self.read_stdin(sel)
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
        self.say(MARK + json.dumps(record))
        self.log.close()
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
