"""A PyTorch module trained on pslab's parameter servers, by the run's rule (bsp, ssp:s, asp,
dcasgd, local:H, easgd), with pslab's metrics, plots and comparisons. No link to libtorch: θ and
the gradients are one flat float32 buffer each, exchanged through libpslab_client.so.

    import pslab.torch as pt
    run = pt.launched()                  # this process's part of the run (the launcher's PSLAB_*)
    model = Net()                        # float32 parameters; their order is θ's
    if run.is_evaluator:
        pt.evaluate(model, lambda m: my_test_loss_and_accuracy(m))   # until training ends
    else:
        worker = pt.Worker(model)        # the start barrier; θ0 from the servers
        for idx in worker.batches():     # this worker's share of each epoch (sample indices)
            worker.step(loss_fn(model(x[idx]), y[idx]), len(idx))   # backward, push, θ for the next step
        worker.end()

A process the launcher started is seeded when it imports this module (torch.manual_seed: the
run's seed, the same in every process, so that what θ does not hold, a frozen layer, is built
alike everywhere); Worker() then seeds its own (the seed + 1 + rank: dropout, augmentation). The
servers own θ: an optimizer's step() or another in-place change of a parameter between two
steps is an error (PslabError naming it). A config may leave the
model's sizes and θ0 to the script (model.kind = "external" without model.sizes): the launcher
first runs it with PSLAB_THETA0, where Worker() and evaluate() write the module's initial
parameters and sizes and end the process.

Worker flattens the module's parameters once: each parameter becomes a view of one θ buffer and
its .grad a view of one gradient buffer, so a step moves no parameter tensor (a CUDA module: θ
and ∇θ cross to and from pinned host buffers, one copy each way). Buffers that are not parameters
(batch norm's running statistics) stay each process's own.
"""
import json
import os
import sys
import threading
import time

import numpy as np
import torch

import pslab
from pslab import Client, Launched, PslabError, launched  # noqa: F401 (the names a script needs)

__all__ = ["Worker", "evaluate", "launched", "data", "device", "save_theta", "sizes_of", "parameters", "PslabError"]

if os.environ.get("PSLAB_SEED") and os.environ.get("PSLAB_RANK"):  # a process of a run: seeded before it builds its module
    torch.manual_seed(int(os.environ["PSLAB_SEED"]))


def _seed_this_worker(run):
    """After θ is taken: this worker's own random stream (the run's seed + 1 + rank)."""
    if run is not None:
        torch.manual_seed(run.seed + 1 + run.rank)


def parameters(model):
    """The module's parameters that θ holds, in θ's order (those that require a gradient)."""
    return [p for p in model.parameters() if p.requires_grad]


def save_theta(model, path):
    """Writes the module's parameters, flat in θ's order, as float32: a model.theta_file for the
    servers' θ0 (with model.sizes = sizes_of(model))."""
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in parameters(model)])
    flat.numpy().tofile(str(path))


def sizes_of(model):
    """model.sizes for the config: the floats of each parameter tensor, in θ's order."""
    return [p.numel() for p in parameters(model)]


def _theta0_then_exit(model, run):
    """The launcher's first start of the script (run.theta0): θ0 and the sizes, then the end."""
    save_theta(model, run.theta0)
    with open(f"{run.theta0}.json", "w") as f:
        json.dump({"sizes": sizes_of(model)}, f)
    print(f"pslab.torch: θ0 of {sum(sizes_of(model))} parameters in {len(sizes_of(model))} tensors -> {run.theta0}",
          file=sys.stderr)
    sys.exit(0)


class _Flat:
    """The module's parameters as views of one θ buffer (and, for training, their .grad as views of
    one gradient buffer), on the module's device; host buffers of P float32 for the client."""

    def __init__(self, model, client, grads):
        params = parameters(model)
        P = client.num_params
        if not params:
            raise PslabError("the module has no parameters that require a gradient")
        bad = [f"{name} ({p.dtype})" for name, p in model.named_parameters() if p.requires_grad and p.dtype != torch.float32]
        if bad:
            raise PslabError(f"θ is float32: these parameters are not ({', '.join(bad)}); model.float() first")
        devices = {p.device for p in params}
        if len(devices) > 1:
            raise PslabError(f"the module's parameters are on several devices ({', '.join(map(str, devices))}); pslab.torch "
                             f"takes a module on one")
        n = sum(p.numel() for p in params)
        if n != P:
            raise PslabError(f"the module has {n} parameters (tensors {[p.numel() for p in params]}), this run's θ has {P}: "
                             f"model.sizes = {[p.numel() for p in params]} in the config")
        sizes = client.config.get("model", {}).get("sizes") or []  # (model.kind = "external": lars/lamb go by them)
        if sizes and list(sizes) != [p.numel() for p in params]:
            numels = [p.numel() for p in params]
            at = next((i for i, (a, b) in enumerate(zip(sizes, numels)) if a != b), min(len(sizes), len(numels)))
            raise PslabError(f"the module's parameter tensors are {[p.numel() for p in params]} floats, model.sizes says "
                             f"{list(sizes)} (first difference: tensor {at}); they must agree in order: model.sizes = "
                             f"pslab.torch.sizes_of(model)")
        self.device = params[0].device
        self.cuda = self.device.type == "cuda"
        pinned = dict(pin_memory=True) if self.cuda else {}
        self.host_theta = torch.empty(P, dtype=torch.float32, **pinned)
        self.theta = torch.empty(P, dtype=torch.float32, device=self.device) if self.cuda else self.host_theta
        self.host_grad = self.grad = None
        if grads:
            self.host_grad = torch.zeros(P, dtype=torch.float32, **pinned)
            self.grad = torch.zeros(P, dtype=torch.float32, device=self.device) if self.cuda else self.host_grad
        offset = 0
        self.params, self.grad_views = params, []
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        with torch.no_grad():
            for p in params:
                k = p.numel()
                self.theta[offset:offset + k].copy_(p.reshape(-1))
                p.data = self.theta[offset:offset + k].view_as(p)
                if grads:
                    self.grad_views.append(self.grad[offset:offset + k].view_as(p))
                    p.grad = self.grad_views[-1]
                offset += k
        self.theta_ptrs = [p.data_ptr() for p in params]
        # The client writes and reads these (NumPy views of the host buffers; nothing is copied).
        self.theta_np, self.grad_np = self.host_theta.numpy(), (self.host_grad.numpy() if grads else None)

    def check_theta(self):
        """Every parameter still lies in θ's buffer: else θ from the servers would not reach it."""
        for name, p, ptr in zip(self.names, self.params, self.theta_ptrs):
            if p.data_ptr() != ptr:
                raise PslabError(f"parameter {name} no longer lies in θ's buffer (the module moved with .to() or .cpu(), "
                                 f"or its .data was replaced, after pslab.torch took it): θ from the servers would not "
                                 f"reach it; move the module before Worker(model) / evaluate(model, fn)")

    def attach_grads(self):
        """Each parameter's .grad is its view of the gradient buffer (zero_grad(set_to_none=True),
        PyTorch's default, drops them: backward would make new ones, and the push would be zeros)."""
        for p, view in zip(self.params, self.grad_views):
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view

    def gather_grads(self):
        """A .grad that something replaced after backward (a hook, a clip that reassigns): copied in."""
        for p, view in zip(self.params, self.grad_views):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
                p.grad = view

    def theta_arrived(self, wait=False):
        """The host θ is new: to the device (a CUDA module; wait: before the host buffer is written
        again by whatever follows without a GPU step between). Then each parameter's version, to
        tell an in-place change (an optimizer's step) at the next step."""
        if self.cuda:
            self.theta.copy_(self.host_theta, non_blocking=not wait)
        self.versions = [p._version for p in self.params]

    def check_untouched(self):
        """No parameter changed in place since θ arrived: the servers own θ (an optimizer's step()
        here would move it where no server has it, and push a gradient taken there)."""
        for name, p, v in zip(self.names, self.params, self.versions):
            if p._version != v:
                raise PslabError(f"parameter {name} was changed in place since θ came from the servers (an optimizer's "
                                 f"step(), or an in-place edit): the run's rule updates θ; leave the step to "
                                 f"worker.step(loss, samples)")

    def grad_to_host(self):
        if self.cuda:
            self.host_grad.copy_(self.grad)  # (waits for backward)


def _set_threads(run, client):
    if run is not None:
        torch.set_num_threads(run.threads(client.config))


class Worker:
    """One worker of the run, training `model` (a torch.nn.Module on one device): the launcher's
    (client None: from pslab.launched(), metrics into the run directory), or `client` (a
    pslab.Client of one's own). Construction is the start barrier: it returns once every worker is
    there, with θ0 from the servers in the module's parameters."""

    def __init__(self, model, client=None, run=None):
        if client is None:
            run = run or launched()
            if run.theta0:
                _theta0_then_exit(model, run)
            client = Client.from_launcher(run)
        if client.is_evaluator:
            raise PslabError("this process is the run's evaluator, which trains nothing: pslab.torch.evaluate(model, fn)")
        self.client, self.model = client, model
        _set_threads(run, client)
        self.flat = _Flat(model, client, grads=True)
        _seed_this_worker(run)
        self.step_index = 0   # the next step
        self.last = client.begin(self.flat.theta_np)  # StepInfo of the last exchange
        self.flat.theta_arrived()
        self._mark = time.perf_counter()

    @property
    def total_steps(self):
        return self.client.total_steps

    def batches(self):
        """This worker's batches, one per step to go: sample indices (a torch int64 tensor) into
        the run's training set (data.*; pslab.torch.data()), drawn as pslab_worker draws them."""
        while self.step_index < self.client.total_steps:
            step = self.step_index
            yield torch.from_numpy(np.frombuffer(self.client.batch(step), np.uint32).astype(np.int64))
            if self.step_index == step:
                raise PslabError(f"worker {self.client.rank}: step {step} ended without worker.step(loss, samples)")

    def step(self, loss, samples):
        """Backward of `loss` (the mean over `samples` samples, computed on the module as it is), then
        the run's rule: the gradient pushed and θ for the next step loaded into the module (bsp, ssp,
        asp, dcasgd), or the worker's own optimizer steps it and every H steps the model is
        exchanged (local:H, easgd). Returns the pslab.StepInfo (comm_s, wait_s, ...)."""
        if self.step_index >= self.client.total_steps:
            raise PslabError(f"worker {self.client.rank}: all {self.client.total_steps} steps are done")
        self.flat.check_theta()
        self.flat.check_untouched()
        self.flat.attach_grads()
        self.flat.grad.zero_()
        if samples > 0:
            loss.backward()
            self.flat.gather_grads()
            value = float(loss.detach())
        else:  # (an epoch's last batch may be empty: it moves nothing, as pslab_worker's, and its loss is no NaN)
            value = 0.0
        self.flat.grad_to_host()
        compute_s = time.perf_counter() - self._mark  # (since the last step: the batch, forward and backward)
        self.last = self.client.train_step(self.step_index, value, samples, compute_s, self.flat.grad_np, self.flat.theta_np)
        self.flat.theta_arrived()
        self.step_index += 1
        self._mark = time.perf_counter()
        return self.last

    def end(self):
        """After the last step: Bye to the servers (the run ends when every worker said it)."""
        self.client.end()
        self.client.close()


EVALUATE_NICE = 10  # the evaluating thread's, as pslab_worker's evaluator: the workers' cores come first


def _lower_this_threads_priority(nice):
    """Linux: nice is per thread; the client's taker keeps the priority it was made with."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (OSError, AttributeError) as e:
        print(f"[evaluator] could not lower the evaluating thread's priority (nice {nice}: {e}); evaluating at the "
              f"workers' priority", file=sys.stderr)


def _warn_untrained_batch_norm(model):
    """Once: a batch norm whose running statistics were never updated evaluates with mean 0 and
    variance 1 (the evaluator's own copy: fn must recompute them from θ, as the examples' do)."""
    stale = [name for name, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
             and m.track_running_stats and m.num_batches_tracked is not None and int(m.num_batches_tracked) == 0]
    if stale:
        print(f"[evaluator] batch norm {', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''}: running statistics never "
              f"updated in this process (they are not in θ): evaluating with mean 0, variance 1; recompute them in fn "
              f"(a few training batches in train mode) as experiments/torch/resnet.py does", file=sys.stderr)
    return True


def evaluate(model, fn, client=None, run=None):
    """The run's evaluator: each θ taken when due (eval.interval_s or eval.every_epochs, and at the
    end; the client's thread takes them into a queue meanwhile) is loaded into `model` and
    fn(model) -> (test_loss, test_accuracy or None) called, in no-grad eval mode, on this thread at
    a lower priority (nice 10, as pslab_worker's evaluator); writes pslab's eval lines (the
    summary, plots and comparison read them); after the last, shuts the servers down. Returns
    the last (test_loss, test_accuracy)."""
    if client is None:
        run = run or launched()
        if run.theta0:
            _theta0_then_exit(model, run)
        client = Client.from_launcher(run)
    if not client.is_evaluator:
        raise PslabError(f"worker {client.rank} is not the evaluator (rank {pslab.EVALUATOR}): pslab.torch.Worker(model)")
    _set_threads(run, client)
    flat = _Flat(model, client, grads=False)
    client.connect()
    result = None
    lowered = warned_bn = False
    while True:
        info = client.next_theta(flat.theta_np)  # (the first starts the client's taker, at this thread's priority)
        if not lowered:
            _lower_this_threads_priority(EVALUATE_NICE)
            lowered = True
        flat.check_theta()
        flat.theta_arrived(wait=True)  # (fn need not wait for the GPU before the next θ is written)
        model.eval()
        with torch.no_grad():
            result = fn(model)
        if not warned_bn:
            warned_bn = _warn_untrained_batch_norm(model)
        loss, acc = tuple(result) if isinstance(result, (tuple, list)) else (result, None)
        client.eval(float(loss), None if acc is None else float(acc))
        if info.training_done:
            break
    client.shutdown()
    client.close()
    return result


def device(run=None):
    """Where this process's module goes: train.device = "cpu", or with "cuda" its GPU (the
    launcher's GPU slot, mod the GPUs this process sees)."""
    run = run or launched()
    if run.theta0:  # (the launcher's first start, on its own host, which may have no GPU: θ0 is the same)
        return torch.device("cpu")
    with Client(run.config, run.rank, None) as c:  # (the config alone)
        wanted = c.config["train"]["device"]
    if wanted != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise PslabError(f'train.device = "cuda", but this PyTorch ({torch.__version__}) sees no GPU: worker.python '
                         f'must be an interpreter whose PyTorch has CUDA')
    gpu = torch.device("cuda", run.gpu_slot % torch.cuda.device_count())
    torch.cuda.set_device(gpu)  # (pinned buffers and streams made later go there, not to GPU 0)
    return gpu


def data(client=None, run=None):
    """The run's data as pslab_worker reads it (data.*: Fashion-MNIST, CIFAR-10, your arrays,
    the synthetic sets; normalised as configured): (x_train, y_train, x_test, y_test), torch
    tensors: inputs float32 (n, features); labels int64 (n), or for regression float32 targets (n, k)."""
    close = client is None
    if client is None:
        run = run or launched()
        client = Client(run.config, run.rank, None)  # (no servers: the data alone)
    out = []
    for test, (x, labels, features) in enumerate((client.train_set(), client.test_set())):
        out.append(torch.from_numpy(np.frombuffer(x, np.float32).reshape(-1, features)))
        if len(labels) or not len(x):
            out.append(torch.from_numpy(np.frombuffer(labels, np.int32).astype(np.int64)))
        else:
            targets, k = client.targets(test=bool(test))
            out.append(torch.from_numpy(np.frombuffer(targets, np.float32).reshape(-1, k).copy()))
    if close:
        client.close()
    return tuple(out)
