"""The side-by-side task: small stacked-MNIST canvases (which digits appear?), the held-out
digit count, and K-MNIST canvases for few-shot adaptation."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from modnets.data.digits import load_kmnist, load_mnist
from modnets.data.stacked_mnist import make_canvases
from modnets.experiments.side_by_side.config import SideBySideConfig, SideBySideTrain


def _canvases(digits: tuple, train: SideBySideTrain, n: int, counts, seed: int) -> dict:
    """``{count: StackedMNIST}``: ``n`` canvases of each digit count from ``digits = (images,
    labels)``, drawn from ``seed``."""
    size = {"canvas_size": train.canvas, "digit_size": train.digit, "layout": "grid"}
    return {c: make_canvases(*digits, n, c, seed=seed + c, **size) for c in counts}


def training_data(train: SideBySideTrain, root=None, verify: bool = True) -> dict:
    """``{"train" | "val": {count: StackedMNIST}}`` from disjoint parts of MNIST's train split
    (``val_images`` held out for validation), fixed by ``data_seed``."""
    x, y = load_mnist("train", root=root, verify=verify)
    perm = np.random.default_rng(train.data_seed).permutation(len(x))
    val, tr = perm[: train.val_images], perm[train.val_images :]
    s = 1000 * train.data_seed
    return {
        "train": _canvases((x[tr], y[tr]), train, train.per_count, train.train_counts, s),
        "val": _canvases((x[val], y[val]), train, train.val_per_count, train.train_counts, s + 100),
    }


def test_data(config: SideBySideConfig, seed: int, root=None, verify: bool = True) -> dict:
    """Each claim ``seed``'s own draw of test canvases: ``"iid"`` (the trained digit counts) and
    ``"ood"`` (held-out counts) from MNIST's test split; ``"kmnist_train"`` (``few_shot``
    canvases, half of them per trained count) and ``"kmnist_test"`` from disjoint halves of
    K-MNIST's test split (the only K-MNIST split here)."""
    t = config.train
    s = 1000 * t.data_seed + 100_000 * seed
    x, y = load_mnist("test", root=root, verify=verify)
    kx, ky = load_kmnist("test", root=root, verify=verify)
    half = np.random.default_rng(t.data_seed).permutation(len(kx))
    a, b = half[: len(kx) // 2], half[len(kx) // 2 :]
    few = max(1, config.few_shot // len(t.train_counts))
    return {
        "iid": _canvases((x, y), t, config.test_per_count, t.train_counts, s + 200),
        "ood": _canvases((x, y), t, config.test_per_count, config.ood_counts, s + 300),
        "kmnist_train": _canvases((kx[a], ky[a]), t, few, t.train_counts, s + 400),
        "kmnist_test": _canvases((kx[b], ky[b]), t, config.test_per_count, t.train_counts, s + 500),
    }


#: Pixel mean and standard deviation of the training canvases (one and two 16-pixel digits on
#: 32x32) on a 0..1 scale: standardised inputs let the plain ReLU CNN learn from the first steps.
MEAN, STD = 0.050, 0.202


def inputs(images: Tensor, device) -> Tensor:
    """uint8 canvases ``(B, 1, S, S)`` -> standardised floats."""
    return (images.to(device).float() / 255.0 - MEAN) / STD
