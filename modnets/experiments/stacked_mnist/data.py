"""Stacked-MNIST canvases: the training stream of a seed, the fixed test canvases per digit count,
and their batches."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from modnets.data.digits import load_mnist
from modnets.data.stacked_mnist import make_canvases
from modnets.experiments.stacked_mnist.config import StackedMNISTConfig, StackedMNISTTrain


def training_data(train: StackedMNISTTrain, root=None, verify: bool = True) -> dict:
    """``{"train" | "val": {count: StackedMNIST}}``: training and validation canvases from
    disjoint parts of MNIST's train split (``val_images`` held out), fixed by ``data_seed``."""
    x_tr, y_tr = load_mnist("train", root=root, verify=verify)
    perm = np.random.default_rng(train.data_seed).permutation(len(x_tr))
    val_idx, tr_idx = perm[: train.val_images], perm[train.val_images :]
    out = {"train": {}, "val": {}}
    for split, idx, n, offset in (
        ("train", tr_idx, train.train_per_count, 0),
        ("val", val_idx, train.val_per_count, 100),
    ):
        for c in train.train_counts:
            seed = 1000 * train.data_seed + offset + c
            out[split][c] = make_canvases(x_tr[idx], y_tr[idx], n, c, seed=seed)
    return out


def load_test_canvases(
    config: StackedMNISTConfig, root=None, verify: bool = True, seed: int = 0
) -> dict:
    """``{count: StackedMNIST}``: test canvases from MNIST's test split, drawn from
    ``data_seed`` and the claim ``seed`` (each seed is evaluated on its own draw)."""
    x_te, y_te = load_mnist("test", root=root, verify=verify)
    s = 1000 * config.train.data_seed + 100_000 * seed
    return {
        c: make_canvases(x_te, y_te, config.test_per_count, c, seed=s + 200 + c)
        for c in config.test_counts
    }


def load_data(config: StackedMNISTConfig, root=None, verify: bool = True) -> dict:
    """``{"train" | "val" | "test": {count: StackedMNIST}}`` (see :func:`training_data` and
    :func:`load_test_canvases`). Seeded: the same config gives the same canvases."""
    return {
        **training_data(config.train, root, verify),
        "test": load_test_canvases(config, root, verify),
    }


def inputs(images: Tensor, device, mean: float = 0.017, std: float = 0.12) -> Tensor:
    """uint8 canvases -> standardised floats, with the pixel mean and std of the training
    canvases (half 1-digit, half 3-digit) on a 0..1 scale (a plain ReLU CNN without batch norm
    starts to learn much sooner on standardised inputs than on the mostly-zero 0..1 canvases)."""
    return (images.to(device).float() / 255.0 - mean) / std
