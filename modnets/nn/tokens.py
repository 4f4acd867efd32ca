"""Turning inputs into a set of tokens, and CLS tokens into predictions.

Shared by the Neural Interpreter and its ViT baseline so that an experiment swaps one model for the
other with one argument. Both are built from one configuration (an :class:`~modnets.models.ni.NIConfig`);
the pieces here read only the fields they name, so this module depends on no model.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from modnets.pretrained import Pretrained

__all__ = [
    "PatchEmbedding",
    "ConvTokenizer",
    "ElementEmbedding",
    "ClassTokens",
    "Heads",
    "make_tokenizer",
    "ClassTokenModel",
]


class PatchEmbedding(nn.Module):
    """Non-overlapping ``p x p`` patches, linearly embedded, plus learned positions (ViT-style;
    ``positions=False`` leaves them out, for models that encode positions in attention).

    Shapes: images ``(B, C, H, W)`` with ``H = W = image_size`` -> tokens ``(B, (H/p)^2, dim)``.
    """

    def __init__(
        self, image_size: int, patch_size: int, in_channels: int, dim: int, positions: bool = True
    ):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size={patch_size} must divide image_size={image_size} exactly")
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        self.num_tokens = (image_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        self.pos = nn.Parameter(torch.randn(self.num_tokens, dim) * 0.02) if positions else None

    def arguments(self) -> dict:
        return dict(self._arguments)

    def forward(self, images: Tensor) -> Tensor:
        expected = (self.in_channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images must have shape (batch, {', '.join(map(str, expected))}), "
                f"got {tuple(images.shape)}"
            )
        tokens = self.proj(images).flatten(2).transpose(1, 2)
        return tokens if self.pos is None else tokens + self.pos


class _ChannelsLastNorm(nn.LayerNorm):
    """LayerNorm over the channels of a ``(B, C, H, W)`` map."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvTokenizer(nn.Module, Pretrained):
    """The convolutional preprocessor of NAC App. C (Tiny-ImageNet): a 64x64 image -> 8x8 tokens.

    ``conv k4 s4 + LN`` -> a ConvNeXt block {Liu et al., 2022} (7x7 depthwise conv, LN, linear
    ``C -> 4C``, GELU, LN, linear ``4C -> C``, residual) -> ``conv k2 s2 + LN``, then a learned
    ``pos_dim``-d positional encoding per position *concatenated* to each token. App. C puts a
    LayerNorm before each pointwise linear and says nothing of the residual or the hidden width;
    we keep ConvNeXt's (residual, ``4C``).

    Shapes: images ``(B, in_channels, S, S)`` -> tokens ``(B, (S/8)^2, out_channels + pos_dim)``.
    """

    def __init__(
        self,
        image_size: int = 64,
        in_channels: int = 3,
        hidden_channels: int = 96,
        out_channels: int = 192,
        pos_dim: int = 64,
    ):
        super().__init__()
        if image_size % 8:
            raise ValueError(f"image_size must be a multiple of 8, got {image_size}")
        self.image_size, self.in_channels = image_size, in_channels
        self._arguments = dict(
            image_size=image_size,
            in_channels=in_channels,
            hidden_channels=hidden_channels,
            out_channels=out_channels,
            pos_dim=pos_dim,
        )
        c, self.num_tokens = hidden_channels, (image_size // 8) ** 2
        self.out_dim = out_channels + pos_dim
        self.stem = nn.Conv2d(in_channels, c, kernel_size=4, stride=4)
        self.stem_norm = _ChannelsLastNorm(c)
        self.dwconv = nn.Conv2d(c, c, kernel_size=7, padding=3, groups=c)
        self.norm1, self.fc1 = nn.LayerNorm(c), nn.Linear(c, 4 * c)
        self.norm2, self.fc2 = nn.LayerNorm(4 * c), nn.Linear(4 * c, c)
        self.down = nn.Conv2d(c, out_channels, kernel_size=2, stride=2)
        self.down_norm = _ChannelsLastNorm(out_channels)
        self.pos = nn.Parameter(0.02 * torch.randn(self.num_tokens, pos_dim))

    def arguments(self) -> dict:
        return dict(self._arguments)

    def forward(self, images: Tensor) -> Tensor:
        expected = (self.in_channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images must have shape (batch, {', '.join(map(str, expected))}), "
                f"got {tuple(images.shape)}"
            )
        x = self.stem_norm(self.stem(images))
        h = self.dwconv(x).permute(0, 2, 3, 1)  # (B, H, W, C)
        h = self.fc2(self.norm2(nn.functional.gelu(self.fc1(self.norm1(h)))))
        x = x + h.permute(0, 3, 1, 2)
        x = self.down_norm(self.down(x)).flatten(2).transpose(1, 2)  # (B, 64, out_channels)
        return torch.cat([x, self.pos.expand(x.shape[0], -1, -1)], dim=-1)


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
    """``n`` learned CLS tokens prepended to the set: ``(B, T, d) -> (B, n + T, d)``, drawn from
    ``N(0, std^2)`` (ViT's 0.02; the public NI code's 1)."""

    def __init__(self, num_tokens: int, dim: int, std: float = 0.02):
        super().__init__()
        self.num_tokens = num_tokens
        self.tokens = nn.Parameter(torch.randn(num_tokens, dim) * std)

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


def make_tokenizer(config) -> nn.Module:
    """Patch embedding for images, per-element embedding for vectors, from a configuration's
    ``input_kind``, ``dim`` and input fields (an :class:`~modnets.models.ni.NIConfig`)."""
    if config.input_kind == "image":
        return PatchEmbedding(
            config.image_size,
            config.patch_size,
            config.in_channels,
            config.dim,
            positions=config.positional == "absolute",
        )
    return ElementEmbedding(config.num_elements, config.element_features, config.dim)


class ClassTokenModel(nn.Module):
    """CLS-token surgery shared by :class:`~modnets.models.ni.NeuralInterpreter` and
    :class:`~modnets.models.baselines.ViT`: a model with ``config`` (``num_cls``, ``num_outputs``,
    ``dim``, ``shared_head`` and a ``replace`` method), ``cls`` and ``heads``."""

    cls: ClassTokens
    heads: Heads

    def reset_cls_tokens(self, num_cls: int, num_outputs: int | None = None) -> None:
        """Replace the CLS tokens by ``num_cls`` fresh ones, for new tasks (NI §4.1-4.2).

        A shared head is kept (unless ``num_outputs`` changes it); per-token heads are replaced by
        fresh ones. ``config.num_cls`` (and ``num_outputs``) are updated.
        """
        num_outputs = self.config.num_outputs if num_outputs is None else num_outputs
        new_config = self.config.replace(num_cls=num_cls, num_outputs=num_outputs)
        device = self.cls.tokens.device
        self.cls = ClassTokens(num_cls, new_config.dim).to(device)
        if not (new_config.shared_head and num_outputs == self.config.num_outputs):
            self.heads = Heads(num_cls, new_config.dim, num_outputs, new_config.shared_head).to(
                device
            )
        self.config = new_config

    def keep_cls_token(self, index: int) -> None:
        """Keep only CLS token ``index`` and its head (e.g. to adapt with a pretrained task's
        token instead of a fresh one); ``config.num_cls`` becomes 1."""
        n = self.config.num_cls
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise ValueError(f"index must be an int in [0, {n}), got {index!r}")
        with torch.no_grad():
            tokens = self.cls.tokens[index : index + 1].clone()
            self.cls = ClassTokens(1, self.config.dim).to(tokens.device)
            self.cls.tokens.copy_(tokens)
            if not self.config.shared_head:
                self.heads.weight = nn.Parameter(self.heads.weight[index : index + 1].clone())
                self.heads.bias = nn.Parameter(self.heads.bias[index : index + 1].clone())
                self.heads.num_tokens = 1
        self.config = self.config.replace(num_cls=1)
