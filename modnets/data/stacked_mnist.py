"""Stacked MNIST (NFM §4.2, App. C): several MNIST digits on one 64x64 canvas, multi-label targets.

Each digit is reduced from 28x28 to 16x16 by nearest-neighbour downsampling and pasted at a
random position of a 64x64 black canvas; the target says which of the ten digit classes appear
(a multi-label binary classification). Training on canvases with 1 and 3 digits and testing on 1
to 5 asks whether a model generalises to numbers of objects it never saw.

Choices where App. C is silent (each stated in chapter 11):

* the digits of one canvas are of *distinct* classes, so a canvas with ``n`` digits has exactly
  ``n`` positive labels (with repeats allowed, a "3-digit" canvas could carry 2 labels and the
  held-out counts would leak into training);
* the 16x16 boxes do not overlap (positions are drawn uniformly and re-drawn for canvases whose
  boxes collide), so every digit is fully visible; pixels are combined by maximum anyway;
* each digit image is drawn at random (with replacement) from its class in the given images.

``layout="grid"`` (:data:`LAYOUTS`) instead puts each digit exactly in its own cell of the canvas
cut into ``digit_size`` squares (the side-by-side chapter's easier task).

:func:`make_canvases` works on any uint8 ``(N, 28, 28)`` images; :func:`load_stacked_mnist`
builds canvases from the MNIST train or test split (:func:`modnets.data.digits.load_mnist`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from modnets.data.digits import load_mnist

__all__ = [
    "CANVAS_SIZE",
    "DIGIT_SIZE",
    "StackedMNIST",
    "downsample",
    "sample_positions",
    "grid_positions",
    "LAYOUTS",
    "make_canvases",
    "noise_canvases",
    "load_stacked_mnist",
]

CANVAS_SIZE = 64
DIGIT_SIZE = 16
NUM_CLASSES = 10


@dataclass
class StackedMNIST:
    """Canvases ``(N, 1, S, S)`` uint8, targets ``(N, 10)`` float (1 = class present), and for
    each canvas its digits' classes ``(N, n)`` and top-left corners ``(N, n, 2)`` (row, col)."""

    images: torch.Tensor
    targets: torch.Tensor
    digits: torch.Tensor
    positions: torch.Tensor

    def __len__(self) -> int:
        return len(self.images)

    @property
    def num_digits(self) -> int:
        return self.digits.shape[1]


def downsample(images: np.ndarray, size: int = DIGIT_SIZE) -> np.ndarray:
    """uint8 ``(N, H, W)`` -> ``(N, size, size)`` by nearest-neighbour (``F.interpolate``)."""
    if images.ndim != 3:
        raise ValueError(f"images must be (N, H, W), got shape {images.shape}")
    x = torch.from_numpy(np.array(images, dtype=np.uint8))[:, None]  # a writable copy
    return F.interpolate(x, size=(size, size), mode="nearest")[:, 0].numpy()


def sample_positions(
    n: int,
    num_digits: int,
    rng: np.random.Generator,
    canvas_size: int = CANVAS_SIZE,
    digit_size: int = DIGIT_SIZE,
    max_rounds: int = 10_000,
) -> np.ndarray:
    """Top-left corners ``(n, num_digits, 2)`` of non-overlapping ``digit_size`` boxes.

    All positions are drawn uniformly; the canvases with a colliding pair are drawn again (the
    whole canvas, so the accepted layouts stay uniform over the non-overlapping ones).
    """
    span = canvas_size - digit_size + 1
    if span <= 0:
        raise ValueError(f"digit_size={digit_size} does not fit canvas_size={canvas_size}")
    pos = rng.integers(0, span, size=(n, num_digits, 2))
    todo = np.arange(n)
    for _ in range(max_rounds):
        if num_digits < 2:
            return pos
        p = pos[todo]
        gap = np.abs(p[:, :, None, :] - p[:, None, :, :])  # (m, d, d, 2)
        overlap = (gap < digit_size).all(-1)
        overlap[:, np.arange(num_digits), np.arange(num_digits)] = False
        bad = overlap.any((1, 2))
        if not bad.any():
            return pos
        todo = todo[bad]
        pos[todo] = rng.integers(0, span, size=(len(todo), num_digits, 2))
    raise RuntimeError(
        f"could not place {num_digits} non-overlapping {digit_size}px digits on a "
        f"{canvas_size}px canvas"
    )


def grid_positions(
    n: int,
    num_digits: int,
    rng: np.random.Generator,
    canvas_size: int = CANVAS_SIZE,
    digit_size: int = DIGIT_SIZE,
) -> np.ndarray:
    """Top-left corners ``(n, num_digits, 2)`` of distinct cells of the canvas cut into a grid
    of ``digit_size`` squares, drawn uniformly: every digit sits exactly in one cell."""
    if canvas_size % digit_size:
        raise ValueError(
            f"canvas_size={canvas_size} must be a multiple of digit_size={digit_size} "
            "for the grid layout"
        )
    k = canvas_size // digit_size
    if num_digits > k * k:
        raise ValueError(f"num_digits={num_digits} exceeds the grid's {k * k} cells")
    cells = np.argsort(rng.random((n, k * k)), axis=1)[:, :num_digits]
    return np.stack([cells // k, cells % k], axis=-1) * digit_size


#: How digits are placed: anywhere without overlap, or in the cells of a grid.
LAYOUTS = {"free": sample_positions, "grid": grid_positions}


def make_canvases(
    images: np.ndarray,
    labels: np.ndarray,
    num_canvases: int,
    num_digits: int,
    *,
    seed: int = 0,
    canvas_size: int = CANVAS_SIZE,
    digit_size: int = DIGIT_SIZE,
    layout: str = "free",
) -> StackedMNIST:
    """``num_canvases`` canvases of ``num_digits`` digits of distinct classes each.

    Args:
        images: uint8 ``(N, H, W)`` digit images (any size; downsampled to ``digit_size``).
        labels: ``(N,)`` classes in ``0..9``; every class must occur.
        seed: the canvases are a function of the images, labels and seed alone.
        layout: a key of :data:`LAYOUTS`.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {tuple(LAYOUTS)}, got {layout!r}")
    if not 1 <= num_digits <= NUM_CLASSES:
        raise ValueError(f"num_digits must be in 1..{NUM_CLASSES}, got {num_digits}")
    if num_canvases < 0:
        raise ValueError(f"num_canvases must be >= 0, got {num_canvases}")
    labels = np.asarray(labels).astype(np.int64)
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    counts = np.bincount(labels, minlength=NUM_CLASSES)
    if len(counts) > NUM_CLASSES or (counts == 0).any():
        raise ValueError(f"labels must cover every class 0..9, got counts {counts.tolist()}")
    rng = np.random.default_rng(seed)
    small = downsample(images, digit_size)
    # distinct classes per canvas: the first n of a random permutation of 0..9
    classes = np.argsort(rng.random((num_canvases, NUM_CLASSES)), axis=1)[:, :num_digits]
    # an image of each chosen class, uniformly: index into the images sorted by class
    order = np.argsort(labels, kind="stable")
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pick = start[classes] + (rng.random(classes.shape) * counts[classes]).astype(np.int64)
    chosen = small[order[pick]]  # (n, d, s, s)
    pos = LAYOUTS[layout](num_canvases, num_digits, rng, canvas_size, digit_size)
    canvas = np.zeros((num_canvases, canvas_size, canvas_size), dtype=np.uint8)
    rows = np.arange(num_canvases)[:, None, None]
    offs = np.arange(digit_size)
    for d in range(num_digits):
        r = (pos[:, d, 0, None] + offs)[:, :, None]  # (n, s, 1)
        c = (pos[:, d, 1, None] + offs)[:, None, :]  # (n, 1, s)
        canvas[rows, r, c] = np.maximum(canvas[rows, r, c], chosen[:, d])
    targets = np.zeros((num_canvases, NUM_CLASSES), dtype=np.float32)
    np.put_along_axis(targets, classes, 1.0, axis=1)
    return StackedMNIST(
        torch.from_numpy(canvas)[:, None],
        torch.from_numpy(targets),
        torch.from_numpy(classes),
        torch.from_numpy(pos),
    )


def noise_canvases(
    n: int, canvas_size: int = CANVAS_SIZE, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, targets)``: ``n`` canvases of uint8 noise (drawn from ``seed``) with made-up
    targets, two classes each: inputs of the real shape for a dry run, no data read."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, canvas_size, canvas_size), generator=g, dtype=torch.uint8)
    targets = torch.zeros(n, 10)
    for i in range(n):
        targets[i, torch.randperm(10, generator=g)[:2]] = 1.0
    return images, targets


def load_stacked_mnist(
    split: str,
    num_canvases: int,
    num_digits: int,
    seed: int = 0,
    indices: np.ndarray | None = None,
    root=None,
    verify: bool = True,
) -> StackedMNIST:
    """Canvases from MNIST's ``split`` ("train" or "test"); ``indices`` restricts the digit
    images to a subset (e.g. train images held out for validation)."""
    images, labels = load_mnist(split, root=root, verify=verify)
    if indices is not None:
        images, labels = images[indices], labels[indices]
    return make_canvases(images, labels, num_canvases, num_digits, seed=seed)
