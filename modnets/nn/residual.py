"""What a residual branch passes through: LayerScale, DropPath (stochastic depth) and the
multiplicative noise NAC puts on module codes in training."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LayerScale(nn.Module):
    """``gamma * x`` with a learnable per-channel ``gamma`` (CaiT; the public NAC code's ModFFN
    blocks, initial value 0.1); ``init=None`` is the identity."""

    def __init__(self, dim: int, init: float | None):
        super().__init__()
        self.gamma = None if init is None else nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: Tensor) -> Tensor:
        return x if self.gamma is None else x * self.gamma


def drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    """DropPath / stochastic depth: zero a residual branch for a random ``p`` of the examples
    and rescale the rest by ``1 / (1 - p)``, in training only (``x``: ``(B, ...)``)."""
    if p == 0 or not training:
        return x
    keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) >= p
    return x * keep.to(x.dtype) / (1 - p)


def code_noise(codes: Tensor, scale: float, training: bool) -> Tensor:
    """``c * (1 + U(-scale, scale))`` feature-wise in training (public code's VectorScaleNoise:
    ``c + U(-scale |c|, scale |c|)``), ``c`` otherwise."""
    if scale == 0 or not training:
        return codes
    return codes + codes.detach().abs() * scale * (2 * torch.rand_like(codes) - 1)
