"""The built-in MLP (model.kind = "mlp": Linear + ReLU per hidden width, then a Linear head,
He-uniform / Xavier-uniform weights, zero biases) written in PyTorch and trained on pslab's
servers. experiments/configs/torch-mlp.toml compares bsp, ssp:2, asp and local:4 on it:

    /usr/bin/python3 experiments/launch.py run experiments/configs/torch-mlp.toml

The launcher runs this file for every worker and for the evaluator (worker.kind = "python");
pslab.launched() says which. Its θ0 and its tensors' sizes come from here too (the config gives
none): the launcher's first start of it writes them (PSLAB_THETA0) and ends at pt.Worker().
"""
import torch
import torch.nn.functional as F

import pslab.torch as pt

HIDDEN = (256, 128)


class MLP(torch.nn.Module):
    def __init__(self, features, classes, hidden=HIDDEN):
        super().__init__()
        widths = [features, *hidden]
        self.hidden = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.head = torch.nn.Linear(widths[-1], classes)
        for layer in self.hidden:
            torch.nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")  # U(±sqrt(6 / fan_in))
            torch.nn.init.zeros_(layer.bias)
        torch.nn.init.xavier_uniform_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, x):
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.head(x)


def test_loss_and_accuracy(model, x, y, batch=2000):
    """Mean cross-entropy and accuracy over the test set."""
    loss, correct = 0.0, 0
    for i in range(0, len(y), batch):
        out = model(x[i:i + batch])
        loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
        correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    return loss / len(y), correct / len(y)


def main():
    run = pt.launched()                        # this process's part of the run
    x, y, x_test, y_test = pt.data(run=run)    # data.* as pslab reads it (Fashion-MNIST, normalised)
    model = MLP(x.shape[1], int(y.max()) + 1)
    if run.is_evaluator:
        pt.evaluate(model, lambda m: test_loss_and_accuracy(m, x_test, y_test), run=run)
        return
    worker = pt.Worker(model, run=run)         # the start barrier; θ0 from the servers
    for idx in worker.batches():               # this worker's share of each epoch
        loss = F.cross_entropy(model(x[idx]), y[idx])
        worker.step(loss, len(idx))            # backward; the run's rule moves θ
    worker.end()


if __name__ == "__main__":
    main()
