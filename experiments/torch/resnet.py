"""A small ResNet (He et al. 2016: 3x3 convolutions, batch norm, identity shortcuts; stages of
16, 32 and 64 channels, BLOCKS basic blocks each, global average pooling, a linear head) in
PyTorch, trained on pslab's servers. experiments/configs/torch-resnet.toml compares bsp and asp:

    /usr/bin/python3 experiments/launch.py run experiments/configs/torch-resnet.toml
    ... --set train.device=cuda     (each worker on a GPU of its host: GPU slot mod the GPUs)

θ is the parameters (convolutions, batch norm's scales and shifts, the head); batch norm's
running statistics are no parameters and stay each process's own. The evaluator therefore
measures them afresh for each θ it evaluates (over RECALIBRATE training batches, in train mode,
as their plain average) before it evaluates in eval mode.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import pslab.torch as pt

BLOCKS = 1          # per stage: 1 is ResNet-8, 3 ResNet-20
CHANNELS = (16, 32, 64)
RECALIBRATE = 20    # training batches of 256 behind the evaluator's batch-norm statistics


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, channels_in, classes, blocks=BLOCKS, widths=CHANNELS):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels_in, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            for b in range(blocks):
                layers.append(Block(cin, w, 2 if i > 0 and b == 0 else 1))
                cin = w
        self.stages = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def recalibrate_batch_norm(model, x, batches=RECALIBRATE, batch=256):
    """Batch norm's running statistics measured afresh on training batches (their plain average)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # (a cumulative average)
    model.train()
    g = torch.Generator().manual_seed(0)
    for _ in range(batches):
        model(x[torch.randint(len(x), (batch,), generator=g).to(x.device)])
    model.eval()


def test_loss_and_accuracy(model, x_train, x, y, batch=1000):
    recalibrate_batch_norm(model, x_train)
    loss, correct = 0.0, 0
    for i in range(0, len(y), batch):
        out = model(x[i:i + batch])
        loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
        correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    return loss / len(y), correct / len(y)


def image_shape(features):
    """(channels, side) of square images of `features` floats each, channel-first as pslab's data
    holds them: Fashion-MNIST 784 = 1 x 28 x 28, CIFAR-10 3072 = 3 x 32 x 32."""
    for channels in (1, 3):
        side = int(round((features / channels) ** 0.5))
        if channels * side * side == features:
            return channels, side
    raise SystemExit(f"resnet.py: samples of {features} floats are not square images of 1 or 3 channels")


def main():
    run = pt.launched()
    device = pt.device(run)                      # train.device: cpu, or this process's GPU
    x, y, x_test, y_test = (t.to(device) for t in pt.data(run=run))
    channels, side = image_shape(x.shape[1])
    x, x_test = x.view(-1, channels, side, side), x_test.view(-1, channels, side, side)
    model = ResNet(channels, int(y.max()) + 1).to(device)
    if run.is_evaluator:
        pt.evaluate(model, lambda m: test_loss_and_accuracy(m, x, x_test, y_test), run=run)
        return
    worker = pt.Worker(model, run=run)
    model.train()
    for idx in worker.batches():
        idx = idx.to(device)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        worker.step(loss, len(idx))
    worker.end()


if __name__ == "__main__":
    main()
