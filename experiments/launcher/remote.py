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
import select
import selectors
import signal
import socket
import subprocess
import time

from .processes import die_with_parent, killpg

MARK = "[pslab-launch] "  # a line of the launcher's own, in a process's log
STOP_GRACE_S = 2.0  # SIGTERM to the group, SIGKILL after this long (the launcher waits longer)
DRAIN_S = 1.0  # the child exited but its output is still open: read what comes this long, then end
SSH_DRAIN_S = 5.0  # at the end: wait this long at most for ssh to take what waits (the exit record last)


class SshCopy:
    """The child's output as ssh carries it to the launcher (fd 1, non-blocking). What the pipe
    cannot take now waits here, up to LIMIT bytes; past that (a stalled connection: a partition)
    whole chunks are left out of ssh's copy, said in a line: the log on the host has everything,
    and the remote end goes on hearing stdin and the clock. gone: ssh's end is closed."""
    LIMIT = 1 << 20

    def __init__(self, fd):
        self.fd, self.pending, self.left_out, self.gone, self.ends_line = fd, bytearray(), 0, False, True

    def add(self, data, own=False):
        """Output to send (own: a line of the remote end's, never left out)."""
        if self.gone or not data:
            return
        if not own and len(self.pending) + len(data) > self.LIMIT:
            self.left_out += len(data)
            return
        if self.left_out:
            self.pending += (b"" if self.ends_line else b"\n") + (
                f"launch.py remote: {self.left_out} bytes of output left out here (the connection did not take "
                f"them); the log on {socket.gethostname()} has them\n").encode()
            self.left_out = 0
        self.pending += data
        self.ends_line = data.endswith(b"\n")
        self.flush()

    def line(self, text):
        """text as a line of its own (after a line cut short, on the next)."""
        self.add((b"" if self.ends_line else b"\n") + (text + "\n").encode(), own=True)

    def flush(self):
        """Writes what the pipe takes now."""
        while self.pending and not self.gone:
            try:
                n = os.write(self.fd, self.pending)
            except BlockingIOError:
                return
            except OSError:  # (ssh is gone)
                self.gone = True
                self.pending.clear()
                return
            del self.pending[:n]

    def drain(self, seconds):
        """Waits up to `seconds` for ssh to take what waits (the last lines: the exit record)."""
        end = time.monotonic() + seconds
        self.flush()
        while self.pending and not self.gone and time.monotonic() < end:
            time.sleep(0.02)
            self.flush()


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
        for text in (f"cannot start {argv[0]}: {e}",
                     MARK + json.dumps({"event": "exit", "host": socket.gethostname(), "pid": None, "code": 127})):
            log.write((text + "\n").encode())
            os.write(1, (text + "\n").encode())
        log.close()
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
        end.watch_ssh(sel)
        if exited_at is None and child.poll() is not None:
            exited_at = time.monotonic()
        if exited_at is not None and time.monotonic() > exited_at + DRAIN_S:
            return end.finish(sel)  # (what it left is ended with its group)
        for key, _ in sel.select(timeout=0.2):
            if key.data == "stdin":
                end.read_stdin(sel)
                continue
            if key.data == "ssh":
                end.ssh.flush()
                continue
            data = os.read(child.stdout.fileno(), 65536)
            if not data:  # the child's output ended: it exited (or closed it)
                sel.unregister(child.stdout)
                return end.finish(sel)
            end.forward(data)


class RemoteEnd:
    """The child's process group and what stops it: the launcher's line "stop", the end of stdin
    (the launcher or the connection is gone), stdin silent for alive_s (a network partition: the
    connection stays open, nothing comes; the launcher's heartbeat is a line "alive" more often), or
    a signal to this process. Stopping: SIGTERM to the group, SIGKILL after STOP_GRACE_S."""

    def __init__(self, child, log, stopping, alive_s, stdin=0):
        self.child, self.log, self.stopping, self.alive_s, self.stdin = child, log, stopping, alive_s, stdin
        self.ssh = SshCopy(1)
        self.log_ends_line = True
        self.kill_at = None  # when the group is to be killed, once asked to stop
        self.heard_at = time.monotonic()  # the launcher's last word on stdin

    def forward(self, data):
        """The child's output: to the log on this host, and to ssh."""
        self.log.write(data)
        self.log.flush()
        self.log_ends_line = data.endswith(b"\n")
        self.ssh.add(data)

    def say(self, text):
        """A line of this end's own (after a line of the child's cut short, on the next)."""
        self.log.write((b"" if self.log_ends_line else b"\n") + (text + "\n").encode())
        self.log.flush()
        self.log_ends_line = True
        self.ssh.line(text)

    def watch_ssh(self, sel):
        """Hears ssh's pipe become writable while output waits for it."""
        registered = any(k.data == "ssh" for k in sel.get_map().values())
        if self.ssh.pending and not self.ssh.gone and not registered:
            try:
                sel.register(self.ssh.fd, selectors.EVENT_WRITE, "ssh")
            except OSError:  # (not a pipe or socket: flushed every tick instead)
                self.ssh.flush()
        elif registered and (not self.ssh.pending or self.ssh.gone):
            sel.unregister(self.ssh.fd)

    def stop(self):
        if self.kill_at is None:
            killpg(self.child.pid, signal.SIGTERM)
            killpg(self.child.pid, signal.SIGCONT)  # a stopped process takes its SIGTERM now
            self.kill_at = time.monotonic() + STOP_GRACE_S

    def tick(self):
        if self.stopping:
            self.stop()
        if self.kill_at is None and self.silent():
            self.say(f"launch.py remote: heard nothing from the launcher for {self.alive_s:g} s (cluster.ssh_alive_s): "
                     f"stopping pid {self.child.pid} on {socket.gethostname()}")
            self.stop()
        if self.kill_at is not None and time.monotonic() > self.kill_at:
            killpg(self.child.pid, signal.SIGKILL)

    def silent(self):
        """Whether the launcher has said nothing for alive_s. A word waiting on stdin counts: this
        end may itself have had no CPU for a while (a busy host), and then it is read next."""
        if not self.alive_s or time.monotonic() - self.heard_at <= self.alive_s:
            return False
        try:
            return not select.select([self.stdin], [], [], 0)[0]
        except (OSError, ValueError):  # (closed)
            return True

    def read_stdin(self, sel):
        data = os.read(self.stdin, 4096)
        self.heard_at = time.monotonic()
        if not data or b"stop" in data:
            sel.unregister(self.stdin)
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
            self.watch_ssh(sel)
            if not sel.get_map():  # (nothing left to hear but signals)
                time.sleep(0.2)
            for key, _ in sel.select(timeout=0.2):
                if key.data == "stdin":
                    self.read_stdin(sel)
                elif key.data == "ssh":
                    self.ssh.flush()
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
        self.ssh.drain(SSH_DRAIN_S)  # (the launcher reads how it ended from the last line)
        return 128 - rc if rc < 0 else rc


def markers(path, tail_bytes=65536, since=0):
    """The [pslab-launch] records of a log, oldest first (the last tail_bytes of it, from byte
    `since` on: an appended log's earlier lives apart)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(since, f.tell() - tail_bytes))
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


def remote_exit(*paths, since=lambda path: 0):
    """How the remote process ended, from the newest exit record in any of `paths` (each from byte
    since(path) on: this life's), or None."""
    for path in paths:
        exits = [m for m in markers(path, since=since(path)) if m.get("event") == "exit"]
        if exits:
            return exits[-1]
    return None


def describe_remote_exit(record):
    if "signal" in record:
        return f"was killed by signal {record['signal']} ({record['name']}) on {record['host']} (pid {record['pid']})"
    return f"exited with code {record['code']} on {record['host']} (pid {record['pid']})"
