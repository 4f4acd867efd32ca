"""What NFM §4 reads from trained models: how much faster the NFM converges, which earlier layers
its attention reads, and accuracy on digit counts held out of training."""

from __future__ import annotations

import math

import torch

from modnets import diagnostics, probes
from modnets.data.stacked_mnist import StackedMNIST
from modnets.experiments.stacked_mnist.config import StackedMNISTConfig
from modnets.experiments.stacked_mnist.data import inputs
from modnets.models.nfm import ConvNet


def convergence_gain(val: list[float], tail: float = 0.2) -> float:
    """How much the best validation accuracy rose over the last ``tail`` of the epochs:
    ``max(val) - max(val[:-n])`` with ``n = max(1, round(tail * len(val)))`` (a run counts as
    converged when this is below 1 point). 0 for fewer than two epochs."""
    if not 0 < tail < 1:
        raise ValueError(f"tail must be in (0, 1), got {tail}")
    val = [float(v) for v in val]
    if len(val) < 2:
        return 0.0
    n = max(1, round(tail * len(val)))
    return max(val) - max(val[:-n])


@torch.no_grad()
def read_matrix(model: ConvNet, data: StackedMNIST, n: int = 512, batch_size: int = 128) -> list:
    """Which earlier states each NFM read attends to: ``(K N, 1 + K N)`` mean weights (column 0:
    the default slot), averaged over the first ``n`` canvases (see :class:`modnets.models.nfm.NFMOutput`)."""
    model.eval()
    device = next(model.parameters()).device
    total, count = None, 0
    for i in range(0, min(n, len(data)), batch_size):
        x = inputs(data.images[i : min(i + batch_size, n)], device)
        reads = model(x, return_details=True)[1].reads.cpu() * len(x)
        total = reads if total is None else total + reads
        count += len(x)
    return (total / max(count, 1)).tolist()


@torch.no_grad()
def traced_reads(model: ConvNet, data: StackedMNIST, n: int) -> dict:
    """:func:`modnets.diagnostics.nfm_reads` of the first ``n`` canvases, through the probes
    (one entry per read with a non-empty memory, in call order)."""
    model.eval()
    device = next(model.parameters()).device
    with probes.trace("nfm.read_weights") as t:
        model(inputs(data.images[:n], device))
    return diagnostics.nfm_reads(t["nfm.read_weights"])


def held_out(config: StackedMNISTConfig | dict) -> list[int]:
    """The tested digit counts never trained on (from a config or its plain JSON form)."""
    if isinstance(config, dict):
        tests, trained = config["test_counts"], config["train"]["train_counts"]
    else:
        tests, trained = config.test_counts, config.train.train_counts
    return [int(c) for c in tests if int(c) not in {int(t) for t in trained}]


def ood_dips(accuracy: dict, held: list[int]) -> dict:
    """Per held-out count ``c`` whose neighbours ``c - 1`` and ``c + 1`` are both tested:
    ``acc(c) - sqrt(acc(c - 1) acc(c + 1))``, how far ``c`` falls below the geometric mean of its
    neighbours (``accuracy``: count -> exact-match accuracy; keys may be strings)."""
    acc = {int(c): float(a) for c, a in accuracy.items()}
    return {
        c: acc[c] - math.sqrt(acc[c - 1] * acc[c + 1])
        for c in held
        if c - 1 in acc and c + 1 in acc
    }
