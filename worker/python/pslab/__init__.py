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

The library is looked for at $PSLAB_CLIENT_LIB, else beside this package's checkout
(build/worker/libpslab_client.so; the bundle's has the same layout).
"""
import array
import ctypes
import os
import pathlib

__all__ = ["Client", "PullInfo", "PslabError", "library_path"]


class PslabError(RuntimeError):
    """A call the servers or the client refused or could not complete; the message says why."""


class PullInfo(ctypes.Structure):
    """What a round of replies said, over all shards (pslab_client.h: pslab_pull_info)."""
    _fields_ = [("min_version", ctypes.c_long), ("max_version", ctypes.c_long), ("samples_applied", ctypes.c_long),
                ("held_us", ctypes.c_long), ("min_clock", ctypes.c_long), ("training_done", ctypes.c_int)]

    def __repr__(self):
        return "PullInfo(" + ", ".join(f"{name}={getattr(self, name)}" for name, _ in self._fields_) + ")"


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
        lib.pslab_client_metrics.argtypes = [vp, cp, ctypes.c_double]
        lib.pslab_client_step.argtypes = [vp, lp, ctypes.c_double, ctypes.c_int, ctypes.c_double, ctypes.c_double,
                                          ctypes.c_double, lp]
        lib.pslab_client_connect.argtypes = [vp]
        lib.pslab_client_pull.argtypes = [vp, lp, fp, info]
        lib.pslab_client_push.argtypes = [vp, lp, ctypes.c_int, fp, fp, info]
        lib.pslab_client_bye.argtypes = [vp, lp]
        lib.pslab_client_close.restype = None
        lib.pslab_client_close.argtypes = [vp]
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
        self.num_params = int(self._lib.pslab_client_num_params(self._c))  # P
        self.total_steps = int(self._lib.pslab_client_total_steps(self._c))  # this worker trains
        self.steps_per_epoch = int(self._lib.pslab_client_steps_per_epoch(self._c))

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
        (empty for regression). Indices from batch() are into it."""
        n = self._lib.pslab_client_train_samples(self._live())
        self._check(0 if n >= 0 else -1)
        features, classes = self._lib.pslab_client_features(self._c), self._lib.pslab_client_classes(self._c)
        x = array.array("f", bytes(4 * n * features))
        labels = array.array("i", bytes(4 * n if classes > 0 else 0))
        xp = (ctypes.c_float * len(x)).from_buffer(x) if len(x) else None
        lp = (ctypes.c_int * len(labels)).from_buffer(labels) if len(labels) else None
        self._check(self._lib.pslab_client_train_set(self._c, ctypes.cast(xp, ctypes.POINTER(ctypes.c_float)),
                                                     ctypes.cast(lp, ctypes.POINTER(ctypes.c_int))))
        return x, labels, features

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
            raise PslabError(f"worker {self.rank}: the client is closed")
        return self._c

    def _check(self, rc):
        if rc != 0:
            raise PslabError(self._lib.pslab_client_error(self._c).decode())

    def _floats(self, buf, name, writable):
        """A float* to buf's memory: P contiguous float32 values (nothing is copied)."""
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
            view = memoryview(bytearray(view))  # (a read-only gradient: copied once, to hand C a pointer)
        return ctypes.cast((ctypes.c_float * self.num_params).from_buffer(view), ctypes.POINTER(ctypes.c_float))
