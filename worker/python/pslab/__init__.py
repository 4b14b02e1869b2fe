"""pslab's worker side in Python: a client of a run's parameter servers, through libpslab_client.so
(worker/pslab_client.h) with ctypes. No compiler on the user's side and no link to any framework:
θ and gradients are plain float32 buffers of P values (a NumPy array, a CPU tensor's .numpy(),
array.array("f"), ...), read and written in place.

    import pslab
    with pslab.Client("runs/.../config.toml", rank=0, servers="tcp://10.0.0.1:5000") as c:
        theta = numpy.empty(c.num_params, numpy.float32)
        c.connect()
        c.pull(0, theta)
        for clock in range(steps):
            grad = ...                                   # computed on theta, over `batch` samples
            c.push(clock, batch, grad, theta)            # θ for clock + 1 comes back into theta
        c.bye(steps)

Started by the launcher (worker.kind = "python"), a script finds its part of the run with
pslab.launched(), and Client.from_launcher() opens it; pslab.torch trains a PyTorch module so.

The library is looked for at $PSLAB_CLIENT_LIB, else beside this package's checkout
(build/worker/libpslab_client.so; the bundle's has the same layout).
"""
import array
import ctypes
import dataclasses
import json
import os
import pathlib
import threading

__all__ = ["Client", "PullInfo", "StepInfo", "PslabError", "Launched", "launched", "library_path", "EVALUATOR"]

EVALUATOR = -1  # the evaluator's rank (pslab_client.h: PSLAB_CLIENT_EVALUATOR)


class PslabError(RuntimeError):
    """A call the servers or the client refused or could not complete; the message says why."""


class PullInfo(ctypes.Structure):
    """What a round of replies said, over all shards (pslab_client.h: pslab_pull_info)."""
    _fields_ = [("min_version", ctypes.c_long), ("max_version", ctypes.c_long), ("samples_applied", ctypes.c_long),
                ("held_us", ctypes.c_long), ("min_clock", ctypes.c_long), ("training_done", ctypes.c_int)]

    def __repr__(self):
        return "PullInfo(" + ", ".join(f"{name}={getattr(self, name)}" for name, _ in self._fields_) + ")"


class StepInfo(ctypes.Structure):
    """What a step by the run's rule did (pslab_client.h: pslab_step_info)."""
    _fields_ = [("pull", PullInfo), ("exchanged", ctypes.c_int), ("comm_s", ctypes.c_double), ("wait_s", ctypes.c_double),
                ("delay_s", ctypes.c_double), ("lr", ctypes.c_double)]

    def __repr__(self):
        return "StepInfo(" + ", ".join(f"{name}={getattr(self, name)}" for name, _ in self._fields_) + ")"


@dataclasses.dataclass(frozen=True)
class Launched:
    """This process's part of a run, as the launcher hands it over (environment variables
    PSLAB_*, worker.kind = "python"): the run's config file, rank (EVALUATOR for the evaluator),
    the servers' and backups' addresses, the key file, the run directory (metrics go there), when
    the run started (Unix s), the processes on this host, this process's GPU slot, the run's seed;
    theta0: where to write θ0 instead of training (the launcher's first start of the script, for a
    model whose sizes and θ0 the config leaves to it)."""
    config: str
    rank: int
    servers: str = ""
    backups: str = ""
    auth_key: str = ""
    run_dir: str = ""
    run_start: float = 0.0
    procs_on_host: int = 1
    gpu_slot: int = 0
    seed: int = 1
    theta0: str = ""

    @property
    def is_evaluator(self):
        return self.rank == EVALUATOR

    def threads(self, config=None):
        """Compute threads for this process: train.threads, else this host's cores over its processes."""
        wanted = int(((config or {}).get("train") or {}).get("threads") or 0)
        return wanted if wanted > 0 else max(1, (os.cpu_count() or 1) // max(1, self.procs_on_host))


def launched(environ=None):
    """What the launcher handed this process (Launched), or PslabError saying what is missing:
    a script of worker.kind = "python" is started by experiments/launch.py, which sets PSLAB_*."""
    env = os.environ if environ is None else environ
    needed = ("PSLAB_CONFIG", "PSLAB_RANK") + (() if env.get("PSLAB_THETA0") else ("PSLAB_SERVERS",))
    missing = [k for k in needed if not env.get(k)]
    if missing:
        raise PslabError(f"{', '.join(missing)} not set: this script is one of a run's processes, started by "
                         f"experiments/launch.py (worker.kind = \"python\", worker.script), which sets them")
    def number(name, kind, default):
        try:
            return kind(env.get(name) or default)
        except ValueError:
            raise PslabError(f"{name}={env.get(name)!r} is not {'an integer' if kind is int else 'a number'} (set by "
                             f"experiments/launch.py)") from None

    return Launched(config=env["PSLAB_CONFIG"], rank=number("PSLAB_RANK", int, 0), servers=env.get("PSLAB_SERVERS", ""),
                    backups=env.get("PSLAB_BACKUPS", ""), auth_key=env.get("PSLAB_AUTH_KEY", ""),
                    run_dir=env.get("PSLAB_RUN_DIR", ""), run_start=number("PSLAB_RUN_START", float, 0.0),
                    procs_on_host=number("PSLAB_PROCS_ON_HOST", int, 1), gpu_slot=number("PSLAB_GPU_SLOT", int, 0),
                    seed=number("PSLAB_SEED", int, 1), theta0=env.get("PSLAB_THETA0", ""))


def library_path():
    """Where libpslab_client.so is: $PSLAB_CLIENT_LIB, or the build beside this checkout."""
    if os.environ.get("PSLAB_CLIENT_LIB"):
        return pathlib.Path(os.environ["PSLAB_CLIENT_LIB"])
    return pathlib.Path(__file__).resolve().parents[3] / "build" / "worker" / "libpslab_client.so"


_lib = None


def _library():
    global _lib
    if _lib is None:
        path = library_path()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise PslabError(f"cannot load {path} ({e}): build pslab (experiments/setup.sh) or set $PSLAB_CLIENT_LIB") from None
        vp, cp, lp, fp = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_long, ctypes.POINTER(ctypes.c_float)
        info = ctypes.POINTER(PullInfo)
        lib.pslab_client_open.restype = vp
        lib.pslab_client_open.argtypes = [cp, ctypes.POINTER(cp), ctypes.c_int, ctypes.c_int, cp, cp, cp]
        lib.pslab_client_error.restype = cp
        lib.pslab_client_error.argtypes = [vp]
        lib.pslab_client_num_params.restype = lp
        lib.pslab_client_num_params.argtypes = [vp]
        lib.pslab_client_total_steps.restype = lp
        lib.pslab_client_total_steps.argtypes = [vp]
        lib.pslab_client_steps_per_epoch.restype = lp
        lib.pslab_client_steps_per_epoch.argtypes = [vp]
        lib.pslab_client_batch.argtypes = [vp, lp, ctypes.POINTER(ctypes.c_uint), ctypes.c_int]
        for name in ("train_samples", "features", "classes"):
            getattr(lib, f"pslab_client_{name}").restype = lp if name == "train_samples" else ctypes.c_int
            getattr(lib, f"pslab_client_{name}").argtypes = [vp]
        lib.pslab_client_train_set.argtypes = [vp, fp, ctypes.POINTER(ctypes.c_int)]
        lib.pslab_client_test_samples.restype = lp
        lib.pslab_client_test_samples.argtypes = [vp]
        lib.pslab_client_test_set.argtypes = [vp, fp, ctypes.POINTER(ctypes.c_int)]
        lib.pslab_client_target_dim.argtypes = [vp]
        lib.pslab_client_targets.argtypes = [vp, ctypes.c_int, fp]
        lib.pslab_client_config.restype = cp
        lib.pslab_client_config.argtypes = [vp]
        step = ctypes.POINTER(StepInfo)
        lib.pslab_client_begin.argtypes = [vp, fp, step]
        lib.pslab_client_train_step.argtypes = [vp, lp, ctypes.c_double, ctypes.c_int, ctypes.c_double, fp, fp, step]
        lib.pslab_client_end.argtypes = [vp]
        lib.pslab_client_next_theta.argtypes = [vp, fp, info]
        lib.pslab_client_eval.argtypes = [vp, ctypes.c_double, ctypes.c_double]
        lib.pslab_client_shutdown.argtypes = [vp]
        lib.pslab_client_metrics.argtypes = [vp, cp, ctypes.c_double]
        lib.pslab_client_step.argtypes = [vp, lp, ctypes.c_double, ctypes.c_int, ctypes.c_double, ctypes.c_double,
                                          ctypes.c_double, lp]
        lib.pslab_client_connect.argtypes = [vp]
        lib.pslab_client_pull.argtypes = [vp, lp, fp, info]
        lib.pslab_client_push.argtypes = [vp, lp, ctypes.c_int, fp, fp, info]
        lib.pslab_client_bye.argtypes = [vp, lp]
        lib.pslab_client_close.restype = None
        lib.pslab_client_close.argtypes = [vp]
        lib.pslab_client_catch_interrupts.restype = None
        lib.pslab_client_catch_interrupts.argtypes = []
        if threading.current_thread() is threading.main_thread():  # (Ctrl-C ends a call's wait: KeyboardInterrupt)
            lib.pslab_client_catch_interrupts()
        _lib = lib
    return _lib


class Client:
    """One worker of a run, talking to its servers (all of pslab_client.h; each call blocks until
    the servers answered, and raises PslabError naming the server and what was waited for)."""

    def __init__(self, config, rank, servers, backups=None, auth_key=None, overrides=()):
        """config: the run's config.toml; overrides: "section.key=value" as --set; servers and
        backups: addresses in shard order (a list, or comma-separated); auth_key: the run's key
        file, where the run authenticates."""
        self._lib = _library()
        join = (lambda v: ",".join(v) if isinstance(v, (list, tuple)) else (v or ""))
        sets = [str(o).encode() for o in overrides]
        argv = (ctypes.c_char_p * max(1, len(sets)))(*sets)
        self._c = self._lib.pslab_client_open(str(config).encode(), argv, len(sets), int(rank), join(servers).encode(),
                                              join(backups).encode(), str(auth_key or "").encode())
        why = self._lib.pslab_client_error(self._c).decode()
        if why:
            self._lib.pslab_client_close(self._c)
            self._c = None
            raise PslabError(why)
        self.rank = int(rank)
        self._pointers = {}  # name -> (the buffer last given, its float*): _floats
        self.config = json.loads(self._lib.pslab_client_config(self._c).decode())  # resolved: every key
        self.num_params = int(self._lib.pslab_client_num_params(self._c))  # P
        self.total_steps = int(self._lib.pslab_client_total_steps(self._c))  # this worker trains
        self.steps_per_epoch = int(self._lib.pslab_client_steps_per_epoch(self._c))

    @classmethod
    def from_launcher(cls, run=None):
        """This process's client in a run the launcher started (run: launched()), its metrics going to
        the run directory as pslab_worker's do."""
        run = run or launched()
        c = cls(run.config, run.rank, run.servers, run.backups or None, run.auth_key or None)
        if run.run_dir:
            c.metrics(run.run_dir, run.run_start)
        return c

    @property
    def is_evaluator(self):
        return self.rank == EVALUATOR

    def batch(self, step):
        """The sample indices (into the run's training set) of this worker's batch at `step`
        (0-based over the run), as pslab_worker draws them: an array.array("I")."""
        n = self._lib.pslab_client_batch(self._live(), int(step), None, 0)
        self._check(0 if n >= 0 else -1)
        out = array.array("I", bytes(4 * n))
        if n:
            ptr = (ctypes.c_uint * n).from_buffer(out)
            self._check(0 if self._lib.pslab_client_batch(self._c, int(step), ptr, n) == n else -1)
        return out

    def train_set(self):
        """The run's training set as pslab_worker reads it (data.*): (x, labels, features), x an
        array.array("f") of n x features floats (row-major), labels an array.array("i") of n
        (empty for regression: targets()). Indices from batch() are into it."""
        return self._data_set("train")

    def targets(self, test=False):
        """Regression data: (targets, k), an array.array("f") of n x k floats (row-major)."""
        k = self._lib.pslab_client_target_dim(self._live())
        self._check(0 if k >= 0 else -1)
        n = (self._lib.pslab_client_test_samples if test else self._lib.pslab_client_train_samples)(self._c)
        out = array.array("f", bytes(4 * n * k))
        ptr = (ctypes.c_float * len(out)).from_buffer(out) if len(out) else None
        self._check(self._lib.pslab_client_targets(self._c, int(bool(test)), ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))))
        return out, k

    def test_set(self):
        """The run's test set (data.test_samples of it, normalised as the training set), as train_set()."""
        return self._data_set("test")

    def _data_set(self, which):
        n = getattr(self._lib, f"pslab_client_{which}_samples")(self._live())
        self._check(0 if n >= 0 else -1)
        features, classes = self._lib.pslab_client_features(self._c), self._lib.pslab_client_classes(self._c)
        x = array.array("f", bytes(4 * n * features))
        labels = array.array("i", bytes(4 * n if classes > 0 else 0))
        xp = (ctypes.c_float * len(x)).from_buffer(x) if len(x) else None
        lp = (ctypes.c_int * len(labels)).from_buffer(labels) if len(labels) else None
        self._check(getattr(self._lib, f"pslab_client_{which}_set")(self._c, ctypes.cast(xp, ctypes.POINTER(ctypes.c_float)),
                                                                    ctypes.cast(lp, ctypes.POINTER(ctypes.c_int))))
        return x, labels, features

    # ---- training by the run's rule (pslab_client.h: begin, train_step, end) ----
    def begin(self, theta):
        """The start barrier, then θ for step 0 into theta (P float32, in place). Returns a StepInfo."""
        info = StepInfo()
        self._check(self._lib.pslab_client_begin(self._live(), self._floats(theta, "theta", True), ctypes.byref(info)))
        return info

    def train_step(self, step, loss, samples, compute_s, grad, theta):
        """Step `step` computed grad (the mean over `samples`) on theta in compute_s seconds; the run's
        rule moves theta in place to θ for the next step (a push and its answer, or the worker's own
        optimizer and now and then an exchange). Logged as pslab_worker logs a step. Returns a StepInfo."""
        info = StepInfo()
        self._check(self._lib.pslab_client_train_step(self._live(), int(step), float(loss), int(samples), float(compute_s),
                                                      self._floats(grad, "grad", False), self._floats(theta, "theta", True),
                                                      ctypes.byref(info)))
        return info

    def end(self):
        """After the last step: Bye to every server."""
        self._check(self._lib.pslab_client_end(self._live()))

    # ---- the evaluator (rank EVALUATOR) ----
    def next_theta(self, theta):
        """Waits until θ is due (eval.interval_s or eval.every_epochs, and the end of training) and
        writes it into theta; returns a PullInfo (training_done: the last one)."""
        info = PullInfo()
        self._check(self._lib.pslab_client_next_theta(self._live(), self._floats(theta, "theta", True), ctypes.byref(info)))
        return info

    def eval(self, test_loss, test_acc=None):
        """The evaluation of the θ next_theta() took: its metrics line (test_acc None: regression)."""
        self._check(self._lib.pslab_client_eval(self._live(), float(test_loss), -1.0 if test_acc is None else float(test_acc)))

    def shutdown(self):
        """Asks every server to exit (the evaluator, after the last evaluation)."""
        self._check(self._lib.pslab_client_shutdown(self._live()))

    def metrics(self, run_dir, run_start=0.0):
        """Write metrics as pslab_worker does, to run_dir/metrics/worker<rank>.jsonl (the
        launcher's summary and plots read them); times since run_start (Unix s; 0: now)."""
        self._check(self._lib.pslab_client_metrics(self._live(), str(run_dir).encode(), float(run_start)))

    def step(self, step, loss, samples, compute_s=0.0, comm_s=0.0, wait_s=0.0, version=-1):
        """Step `step` is done (after metrics()): its loss, samples, seconds computing and
        communicating, of those held by the servers (PullInfo.held_us), the θ version it used."""
        self._check(self._lib.pslab_client_step(self._live(), int(step), float(loss), int(samples), float(compute_s),
                                                float(comm_s), float(wait_s), int(version)))

    def connect(self):
        """Hello to every server; returns once every worker said Hello (the start barrier)."""
        self._check(self._lib.pslab_client_connect(self._live()))

    def pull(self, clock, theta):
        """θ for step `clock` into theta (P float32, written in place); returns a PullInfo."""
        info = PullInfo()
        self._check(self._lib.pslab_client_pull(self._live(), int(clock), self._floats(theta, "theta", True), ctypes.byref(info)))
        return info

    def push(self, clock, batch, grad, theta=None):
        """The gradient (P float32) computed at `clock` over `batch` samples; with theta, θ for
        clock + 1 comes back into it (one round trip). Returns a PullInfo."""
        info = PullInfo()
        out = self._floats(theta, "theta", True) if theta is not None else None
        self._check(self._lib.pslab_client_push(self._live(), int(clock), int(batch), self._floats(grad, "grad", False),
                                                out, ctypes.byref(info)))
        return info

    def bye(self, clock):
        """This worker is done, at the clock after its last push."""
        self._check(self._lib.pslab_client_bye(self._live(), int(clock)))

    def close(self):
        if self._c is not None:
            self._lib.pslab_client_close(self._c)
            self._c = None
            self._pointers = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_c", None) is not None:
            self.close()

    # ---- helpers ----
    def _live(self):
        if self._c is None:
            who = "the evaluator" if self.rank == EVALUATOR else f"worker {self.rank}"
            raise PslabError(f"{who}: the client is closed")
        return self._c

    def _check(self, rc):
        if rc != 0:
            why = self._lib.pslab_client_error(self._c).decode()
            if why.endswith("interrupted by SIGINT"):  # (a Ctrl-C ended the call's wait)
                raise KeyboardInterrupt(why)
            raise PslabError(why)

    def _floats(self, buf, name, writable):
        """A float* to buf's memory: P contiguous float32 values (nothing is copied). The buffer a
        name was last given is remembered with its pointer (and kept alive by it), so that a
        worker handing the same θ and ∇θ every step pays for the checks once."""
        cached = self._pointers.get(name)
        if cached is not None and cached[0] is buf:
            return cached[1]
        try:
            view = memoryview(buf)
        except TypeError:
            raise TypeError(f"{name}: a buffer of float32 values is needed (a NumPy array, a CPU tensor's .numpy()), "
                            f"not {type(buf).__name__}") from None
        if view.format not in ("f", "<f", "=f") or view.itemsize != 4:
            raise TypeError(f"{name}: float32 values are needed, this buffer holds {view.format!r} of {view.itemsize} bytes")
        if not view.c_contiguous:
            raise ValueError(f"{name}: the buffer must be contiguous")
        if view.nbytes != 4 * self.num_params:
            raise ValueError(f"{name} holds {view.nbytes // 4} floats; this run's θ has {self.num_params}")
        if view.readonly:
            if writable:
                raise ValueError(f"{name}: the buffer is read-only, and {name} is written")
            # A read-only gradient: copied, to hand C a pointer; kept until the next push, for the
            # transport may still send from it after a push that failed.
            self._copied = bytearray(view)
            return self._pointer(memoryview(self._copied))
        ptr = self._pointer(view)
        self._pointers[name] = (buf, ptr)
        return ptr

    def _pointer(self, view):
        return ctypes.cast((ctypes.c_float * self.num_params).from_buffer(view), ctypes.POINTER(ctypes.c_float))
