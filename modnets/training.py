"""Small training utilities shared by the experiments (device-agnostic)."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = [
    "warmup_cosine",
    "minibatches",
    "autocast",
    "trainable_parameters",
    "r2_score",
    "save_checkpoint",
    "checkpoint_dir",
    "maybe_compile",
]


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, floor: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the base learning rate, then cosine decay to ``floor`` times it."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    warmup_steps = min(max(0, warmup_steps), total_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def minibatches(
    n: int, batch_size: int, generator: torch.Generator, drop_last: bool = True
) -> Iterator[Tensor]:
    """Indices of one shuffled epoch over ``n`` samples, ``batch_size`` at a time."""
    perm = torch.randperm(n, generator=generator)
    end = n - n % batch_size if drop_last else n
    for start in range(0, end, batch_size):
        yield perm[start : start + batch_size]


def autocast(device: torch.device | str):
    """bfloat16 autocast on CUDA; a no-op context elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def trainable_parameters(module: nn.Module) -> int:
    """Number of scalar parameters with ``requires_grad``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def r2_score(pred: Tensor, target: Tensor) -> Tensor:
    """Coefficient of determination per output column: ``1 - SS_res / SS_tot``.

    Shapes: ``(n, k)`` -> ``(k,)`` (or ``(n,)`` -> scalar). Matches
    ``sklearn.metrics.r2_score(target, pred, multioutput="raw_values")``.
    """
    if pred.shape != target.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} differ")
    pred, target = pred.double(), target.double()
    ss_res = ((target - pred) ** 2).sum(0)
    ss_tot = ((target - target.mean(0)) ** 2).sum(0)
    return 1 - ss_res / ss_tot


def save_checkpoint(obj: object, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file in the same folder, then rename: never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def checkpoint_dir() -> Path:
    """``$MODNETS_CHECKPOINTS``, else ``~/.cache/modnets/checkpoints`` (the data root may be read-only)."""
    env = os.environ.get("MODNETS_CHECKPOINTS", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "modnets" / "checkpoints"


def maybe_compile(module: nn.Module) -> nn.Module:
    """``torch.compile(module)`` when ``MODNETS_COMPILE=1`` (off by default: compiling costs
    minutes and pays off only on long GPU runs); the module itself otherwise."""
    if os.environ.get("MODNETS_COMPILE", "").strip() in ("1", "true", "yes"):
        return torch.compile(module)
    return module
