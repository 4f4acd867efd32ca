"""The digits of a seed: the pretraining datasets (MNIST, MNIST-M, SVHN where present), the
K-MNIST pool and evaluation set, and the draws that make seeds exchangeable."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from modnets.data import data_root
from modnets.data.digits import load_digits
from modnets.experiments.digits.config import DigitsConfig, DigitsTrain


@dataclass
class DigitsData:
    """Images ``(N, 3, 32, 32)`` uint8, labels ``(N,)`` and dataset ids ``(N,)`` for train and val."""

    names: tuple[str, ...]
    x_train: Tensor
    y_train: Tensor
    d_train: Tensor
    x_val: Tensor
    y_val: Tensor
    d_val: Tensor


def to_rgb32(images: np.ndarray) -> Tensor:
    """uint8 ``(N, H, W)`` or ``(N, H, W, 3)`` -> uint8 ``(N, 3, 32, 32)``: grey to three channels,
    28x28 upsampled bilinearly (NI §4.2: "upsampled to shape 32x32 (if required)")."""
    x = torch.from_numpy(np.array(images, order="C"))  # a writable copy (loaders map read-only)
    x = x[:, None].expand(-1, 3, -1, -1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
    if x.shape[-1] != 32:
        chunks = [
            F.interpolate(c.float(), size=(32, 32), mode="bilinear", align_corners=False)
            for c in x.split(4096)
        ]
        x = torch.cat(chunks).round().clamp(0, 255).to(torch.uint8)
    return x.contiguous()


def subset(n: int, k: int | None, g: torch.Generator) -> Tensor:
    perm = torch.randperm(n, generator=g)
    return perm if k is None else perm[: min(k, n)]


def _mnist_m_folder(root=None) -> Path:
    base = Path(root).expanduser() if root is not None else data_root()
    return base / "MNIST-M" / "mnist_m"


def load_pretraining_data(train: DigitsTrain, root=None, verify: bool = True) -> DigitsData:
    """Train and validation images of each pretraining dataset.

    Where only a test split exists offline (MNIST-M in ``shared/data``), it is split again into
    train and validation with a fixed seed. MNIST validates on its test split.
    """
    g = torch.Generator().manual_seed(train.data_seed)
    parts = {"train": ([], [], []), "val": ([], [], [])}
    mnist_m = _mnist_m_folder(root)
    for d, name in enumerate(train.datasets):
        resplit = (
            name == "mnist_m"
            and not (mnist_m / "mnist_m_train_labels.txt").exists()
            and (mnist_m / "mnist_m_test_labels.txt").exists()
        )
        if resplit:  # offline copies hold only the test split
            x, y = load_digits(name, "test", root=root, verify=verify)
            perm = torch.randperm(len(x), generator=g).numpy()
            n_val = int(round(train.mnist_m_val_fraction * len(x)))
            xva, yva, xtr, ytr = x[perm[:n_val]], y[perm[:n_val]], x[perm[n_val:]], y[perm[n_val:]]
        else:
            xtr, ytr = load_digits(name, "train", root=root, verify=verify)
            xva, yva = load_digits(name, "test", root=root, verify=verify)
        for split, x, y, cap in (
            ("train", xtr, ytr, train.train_per_dataset),
            ("val", xva, yva, train.val_per_dataset),
        ):
            idx = subset(len(x), cap, g).numpy()
            xs, ys, ds = parts[split]
            xs.append(to_rgb32(x[idx]))
            ys.append(torch.from_numpy(y[idx]))
            ds.append(torch.full((len(idx),), d, dtype=torch.long))
    cat = {s: [torch.cat(v) for v in parts[s]] for s in parts}
    return DigitsData(tuple(train.datasets), *cat["train"], *cat["val"])


def pretraining_files(train: DigitsTrain, root=None) -> list[Path]:
    """The files and folders :func:`load_pretraining_data` reads (for the data fingerprint)."""
    base = Path(root).expanduser() if root is not None else data_root()
    files = {
        "mnist": [
            base / "MNIST" / "raw" / f"{p}-{k}-ubyte.gz"
            for p in ("train", "t10k")
            for k in ("images-idx3", "labels-idx1")
        ],
        "mnist_m": [_mnist_m_folder(root)],  # both splits, or the test split alone
        "svhn": [base / "SVHN" / f"{s}_32x32.mat" for s in ("train", "test")],
    }
    return [p for name in train.datasets for p in files[name]]


def load_kmnist_data(config: DigitsConfig, root=None, verify: bool = True) -> dict[str, Tensor]:
    """K-MNIST for adaptation: a pool to draw training samples from and a disjoint evaluation set.

    Offline only the 10 000-image test split exists; its first ``kmnist_pool`` images (after a
    seeded shuffle) form the pool and the next ``kmnist_eval`` the evaluation set. Image 9677 of
    the first release is blank and dropped.
    """
    x, y = load_digits("kmnist", "test", root=root, verify=verify)
    keep = np.flatnonzero(x.reshape(len(x), -1).max(1) > 0)
    g = torch.Generator().manual_seed(config.train.data_seed + 1)
    perm = keep[torch.randperm(len(keep), generator=g).numpy()]
    pool, ev = (
        perm[: config.kmnist_pool],
        perm[config.kmnist_pool : config.kmnist_pool + config.kmnist_eval],
    )
    return {
        "x_pool": to_rgb32(x[pool]),
        "y_pool": torch.from_numpy(y[pool]),
        "x_eval": to_rgb32(x[ev]),
        "y_eval": torch.from_numpy(y[ev]),
    }


def balanced_sample(labels: Tensor, n: int, seed: int) -> Tensor:
    """``n`` indices with (as nearly as possible) equal counts per class, seeded."""
    g = torch.Generator().manual_seed(seed)
    classes = labels.unique()
    per = [torch.nonzero(labels == c).flatten() for c in classes]
    per = [p[torch.randperm(len(p), generator=g)] for p in per]
    take = [n // len(classes) + (1 if i < n % len(classes) else 0) for i in range(len(classes))]
    return torch.cat([p[:k] for p, k in zip(per, take, strict=True)])


def for_seed(config: DigitsConfig, seed: int) -> DigitsConfig:
    """``config`` with the data draws of ``seed``: the pretraining subsets, the MNIST-M re-split
    and the K-MNIST pool and evaluation set all come from ``data_seed + seed``, so that the seeds
    are exchangeable draws of the whole experiment."""
    return replace(config, train=replace(config.train, data_seed=config.train.data_seed + seed))
