"""Small helpers shared by the library and the notebooks."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["seed_everything", "default_device", "count_parameters"]


def seed_everything(seed: int = 0, deterministic: bool = False) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (CPU and CUDA); return a seeded ``torch.Generator``.

    ``deterministic=True`` also asks PyTorch for deterministic kernels (slower on GPU).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 -- seeds the legacy global generator users call
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    return torch.Generator().manual_seed(seed)


def default_device() -> torch.device:
    """CUDA when available, then Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def count_parameters(module: torch.nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
