"""Turning inputs into a set of tokens, and CLS tokens into predictions.

Shared by the Neural Interpreter and its ViT baseline so that an experiment swaps one model for the
other with one argument.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["PatchEmbedding", "ElementEmbedding", "ClassTokens", "Heads"]


class PatchEmbedding(nn.Module):
    """Non-overlapping ``p x p`` patches, linearly embedded, plus learned positions (ViT-style).

    Shapes: images ``(B, C, H, W)`` with ``H = W = image_size`` -> tokens ``(B, (H/p)^2, dim)``.
    """

    def __init__(self, image_size: int, patch_size: int, in_channels: int, dim: int):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size={patch_size} must divide image_size={image_size} exactly")
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        self.num_tokens = (image_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        self.pos = nn.Parameter(torch.randn(self.num_tokens, dim) * 0.02)

    def forward(self, images: Tensor) -> Tensor:
        expected = (self.in_channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images must have shape (batch, {', '.join(map(str, expected))}), "
                f"got {tuple(images.shape)}"
            )
        return self.proj(images).flatten(2).transpose(1, 2) + self.pos


class ElementEmbedding(nn.Module):
    """Each element of a vector (or of a set of feature vectors) becomes one token.

    Every element has its own learned embedding (its position) added to a shared linear map of its
    value, so the model knows *which* input a token carries (NI §4.1 uses "learnable positional
    embeddings" for the five inputs of the fuzzy-Boolean task).

    Shapes: ``(B, n)`` or ``(B, n, features)`` -> ``(B, n, dim)``.
    """

    def __init__(self, num_elements: int, features: int, dim: int):
        super().__init__()
        self.num_elements, self.features = num_elements, features
        self.num_tokens = num_elements
        self.proj = nn.Linear(features, dim)
        self.pos = nn.Parameter(torch.randn(num_elements, dim) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2 and self.features == 1:
            x = x[..., None]
        if x.dim() != 3 or tuple(x.shape[1:]) != (self.num_elements, self.features):
            raise ValueError(
                f"x must have shape (batch, {self.num_elements}) or "
                f"(batch, {self.num_elements}, {self.features}), got {tuple(x.shape)}"
            )
        return self.proj(x) + self.pos


class ClassTokens(nn.Module):
    """``n`` learned CLS tokens prepended to the set: ``(B, T, d) -> (B, n + T, d)``."""

    def __init__(self, num_tokens: int, dim: int):
        super().__init__()
        self.num_tokens = num_tokens
        self.tokens = nn.Parameter(torch.randn(num_tokens, dim) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.tokens.expand(x.shape[0], -1, -1), x], dim=1)


class Heads(nn.Module):
    """LayerNorm + linear read-out of each CLS token: one head per token, or one shared head.

    Shapes: cls ``(B, n, d)`` -> ``(B, n, num_outputs)``. The per-token heads run as one batched
    matrix product, not a loop.
    """

    def __init__(self, num_tokens: int, dim: int, num_outputs: int, shared: bool = False):
        super().__init__()
        self.num_tokens, self.shared = num_tokens, shared
        self.norm = nn.LayerNorm(dim)
        n = 1 if shared else num_tokens
        bound = dim**-0.5
        self.weight = nn.Parameter(torch.empty(n, num_outputs, dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(n, num_outputs))

    def forward(self, cls: Tensor) -> Tensor:
        return torch.einsum("bnd,nod->bno", self.norm(cls), self.weight) + self.bias
