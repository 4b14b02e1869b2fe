"""Watching a run: new metrics lines as they are written, the progress line, the wait for every
process, and what the launcher says when one fails."""
import json
import math
import re
import time

import shlex

from .common import RunFailed, cmd_out, say
from .placement import ssh_base
from .processes import check_signal, describe_exit, end_group, log_tail
from .remote import describe_remote_exit, remote_exit


class Tail:
    """New complete JSON lines of a file that another process is appending to."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
        return rows


def fmt_duration(s):
    if s is None or s != s or s == math.inf:
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """One line about the state of a run, from the newest metrics lines."""

    def __init__(self, plan, run_dir, prefix):
        self.plan, self.prefix = plan, prefix
        self.tails = {r: Tail(run_dir / "metrics" / f"worker{r}.jsonl") for r in range(plan.workers)}
        self.eval_tail = Tail(run_dir / "metrics" / "evaluator.jsonl")
        self.first = {}   # rank -> first train line of this life (a "start" line begins a life)
        self.latest = {}  # rank -> newest train line
        self.gap = {}     # rank -> seconds between its two newest train lines
        self.last_eval = None
        self.lost = set()  # ranks of lost workers (the run goes on without them)
        # The servers' verdict: rank -> the first "worker_lost" line that dropped it (PS modes; "seen":
        # when, time.monotonic()), until a "worker_back" line says a server took it back
        copies = ("server", "backup") if plan.replicas > 1 else ("server",)  # (a backup that took over says it too)
        self.server_tails = [Tail(run_dir / "metrics" / f"{c}{k}.jsonl") for c in copies for k in range(plan.servers)] \
            if plan.uses_servers else []
        self.dropped = {}

    def training_over(self):
        """Whether every worker not lost has written its last step's train line."""
        alive = [r for r in range(self.plan.workers) if r not in self.lost]
        return all(self.latest.get(r, {}).get("step", 0) >= self.plan.total_steps for r in alive)

    def forget(self, rank):
        """A lost worker: no longer in the step range, the rate or the ETA."""
        self.lost.add(rank)
        self.tails.pop(rank, None)
        self.first.pop(rank, None)
        self.latest.pop(rank, None)

    def poll(self):
        for r, tail in self.tails.items():
            for row in tail.read():
                if row.get("kind") == "start":  # (a resumed run's pause is no pace)
                    self.first.pop(r, None)
                elif row.get("kind") == "train":
                    self.first.setdefault(r, row)
                    if r in self.latest:
                        self.gap[r] = row["t"] - self.latest[r]["t"]
                    self.latest[r] = row
        for row in self.eval_tail.read():
            if row.get("kind") == "eval":
                self.last_eval = row
        for tail in self.server_tails:
            for row in tail.read():
                if row.get("kind") == "worker_lost":
                    row["seen"] = time.monotonic()
                    self.dropped.setdefault(row["worker"], row)
                elif row.get("kind") == "worker_back":  # its link came back in time (cluster.reconnect_s)
                    self.dropped.pop(row["worker"], None)

    def line(self, elapsed):
        plan = self.plan
        parts = [f"[{self.prefix}]"]
        acc = self.last_eval.get("test_acc") if self.last_eval else None
        if not self.latest:
            parts.append("starting: waiting for the first training metrics")
        else:
            total = plan.total_steps
            epochs = [self.latest[r]["epoch"] for r in self.latest]
            mean_epoch = sum(epochs) / len(epochs)  # over the workers that have reported
            alive = [r for r in range(plan.workers) if r not in self.lost]
            steps = {r: self.latest.get(r, {}).get("step", 0) for r in alive}
            slow = min(alive, key=lambda r: steps[r])
            # Metric times: seconds from the run's start; the virtual cluster's are simulated, and
            # its newest line stands for now. A worker's rate counts while its next line is not late.
            now_t = max(row["t"] for row in self.latest.values()) if plan.virtual else elapsed
            rate = sum(row.get("samples_per_s", 0.0) for r, row in self.latest.items()
                       if row["step"] < total and now_t - row["t"] < max(5.0, 2 * self.gap.get(r, 0.0)))
            parts.append(f"epoch {mean_epoch:.2f}/{plan.epochs:.3g}")
            lo, hi = min(steps.values()), max(steps.values())
            parts.append(f"step {lo}/{total}" if lo == hi else f"step {lo}-{hi}/{total}")
            losses = [row.get("loss") for row in self.latest.values()]
            losses = [x if isinstance(x, (int, float)) else math.nan for x in losses]  # NaN is written as null
            parts.append(f"loss {sum(losses) / len(losses):.4f}")
            parts.append(f"test acc {100 * acc:.2f}%" if acc is not None else "test acc -")
            parts.append(f"{rate:,.0f} samples/s" + (f" (simulated, at {fmt_duration(now_t)})" if plan.virtual else ""))
            parts.append(f"elapsed {fmt_duration(elapsed)}")
            if self.lost:
                parts.append(f"lost: worker {', '.join(map(str, sorted(self.lost)))}")
            # ETA from the slowest worker's own pace between its first and newest lines.
            eta = None
            s_last = steps[slow]
            if s_last >= total:
                eta = 0.0
            elif not plan.virtual and slow in self.first and self.latest[slow]["t"] > self.first[slow]["t"]:
                f, l = self.first[slow], self.latest[slow]
                pace = (l["step"] - f["step"]) / (l["t"] - f["t"])
                if pace > 0:
                    eta = max(0.0, (total - s_last) / pace - (now_t - l["t"]))
            elif s_last > 0:
                eta = elapsed * (total - s_last) / s_last
            parts.append(f"ETA {fmt_duration(eta)}")
            return "  ".join(parts)
        if acc is not None:
            parts.append(f"test acc {100 * acc:.2f}%")
        parts.append(f"elapsed {fmt_duration(elapsed)}")
        return "  ".join(parts)


def monitor(procs, progress, run_start, deadline_s, failure_of, tolerate=lambda p: False, verdict=lambda: None):
    """Waits for every process; returns when all exited 0 or failed with tolerate(p) true (a lost
    worker the run goes on without), raises RunFailed otherwise. An exit seen: what the process
    left in its group is killed (end_group). verdict(): called after each look at the metrics
    (every second), to act on what the servers decided. run_start: the metrics' zero (a resumed
    run's first start); the --max-minutes guard counts from now."""
    last_line, started = 0.0, time.time()
    while True:
        check_signal()
        for p in procs:
            if p.returncode is None:
                rc = p.popen.poll()
                if rc is not None:
                    p.returncode = rc
                    end_group(p)
                    if rc != 0 and not tolerate(p):
                        raise failure_of(p)
        if all(p.returncode is not None for p in procs):
            return
        now = time.time()
        if now - started > deadline_s:
            running = ", ".join(p.name for p in procs if p.returncode is None)
            raise RunFailed(f"the run exceeded --max-minutes {deadline_s / 60:g} (wall-clock guard); "
                            f"still running: {running}")
        if now - last_line >= 1.0:
            progress.poll()
            verdict()
            say(progress.line(now - run_start))
            last_line = now
        time.sleep(0.1)


def how_it_ended(p):
    """How process p ended, in words: over ssh from the remote end's own record (its signal or
    code, its host and pid), since ssh itself reports any death as 255."""
    if not p.control:
        return describe_exit(p.returncode)
    record = remote_exit(p.log, p.ssh_log, since=p.since)
    if record:
        return describe_remote_exit(record)
    if p.returncode == 255:
        return (f"lost its ssh connection (ssh exit 255) before the remote end said how the process ended; "
                f"ssh said:\n{log_tail(p.ssh_log, 5)}\n   ")
    # The remote end never said how it ended (it could not start there, or write its log): what
    # ssh carried back says why.
    return (f"{describe_exit(p.returncode)} without the remote end's record; ssh said ({p.ssh_log}):\n"
            f"{log_tail(p.ssh_log, 5)}\n   ")


def process_log_tail(p, n=20):
    """The last lines of p's log; over ssh, fetched from its host when it is not on a shared file system here."""
    if p.control and not p.log.exists():
        out = cmd_out([*ssh_base(), p.host, f"tail -n {n} {shlex.quote(str(p.log))}"])
        if out is not None:
            return "\n".join("    " + line for line in out.splitlines()) or "    (the log is empty)"
    return log_tail(p.log, n)


def process_failure(p):
    return RunFailed(f"{p.describe()} on {p.host} {how_it_ended(p)}; the last lines of {p.log}:\n"
                     f"{process_log_tail(p)}")


CANCELLED = re.compile(r"\*\*\* (JOB|STEP) (\S+) ON (\S+) CANCELLED AT (\S+)(.*?)\*\*\*")
# A task's own end in srun's log: "srun: error: NODE: task 3: Exited with exit code 1", "...: task 2:
# Killed", "...: tasks 0-1: Segmentation fault". "Terminated" is how srun reports the tasks it (or
# scancel) stopped, a consequence, not a cause.
TASK_FAILED = re.compile(r"srun: error: (\S+): tasks? (\d+)[-,\d]*: (?!Terminated)(.+)")


def srun_failure(procs, srun_proc, run_dir):
    """What ended a Slurm run, from srun's own log: a task that failed (its exit, or the signal
    that killed it; srun's --kill-on-bad-exit then cancels the step, which is a consequence), or
    the job or step cancelled (scancel, or its time limit: "CANCELLED AT ... DUE TO TIME LIMIT"),
    whichever srun said first."""
    def make(p):
        text = ""
        if p.log.exists():  # (this life's lines: a resumed run appends to srun.log)
            with open(p.log, "rb") as f:
                f.seek(p.since(p.log))
                text = f.read().decode(errors="replace")
        c, t = CANCELLED.search(text), TASK_FAILED.search(text)
        if c and not (t and t.start() < c.start()):
            why = c.group(5).strip() or "by scancel"
            why = "its time limit" if "TIME LIMIT" in why else why.lower() if why.startswith("DUE TO") else why
            return RunFailed(f"the Slurm {c.group(1).lower()} {c.group(2)} was cancelled ({why}, at {c.group(4)}, "
                             f"said by {c.group(3)}); srun {describe_exit(p.returncode)}; the last lines of {p.log}:\n"
                             f"{log_tail(p.log)}", status="cancelled")
        msg = f"srun {describe_exit(p.returncode)}"
        if t and int(t.group(2)) < len(procs):
            task = procs[int(t.group(2))]
            tlog = run_dir / "logs" / f"{task.name}.log"
            msg += (f"; task {task.index} = {task.describe()} on {t.group(1)} failed first ({t.group(3).strip()}); "
                    f"the last lines of {tlog}:\n{log_tail(tlog)}")
        return RunFailed(msg + f"\nthe last lines of {p.log}:\n{log_tail(p.log)}")
    return make
