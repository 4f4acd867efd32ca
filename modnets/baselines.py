"""Baselines that share the Neural Interpreter's input and output plumbing.

:class:`ViT` uses the same tokeniser, CLS tokens and heads as :class:`~modnets.ni.NeuralInterpreter`
and is built from the same :class:`~modnets.ni.NIConfig`, so an experiment swaps one model for the
other with one argument (:func:`build_model`). This mirrors NI §4.2, which compares against a
vision transformer {Dosovitskiy et al., 2021} of similar size.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from modnets.ni import ClassTokenModel, NeuralInterpreter, NIConfig, make_tokenizer
from modnets.nn.tokens import ClassTokens, Heads

__all__ = ["TransformerBlock", "ViT", "build_model", "MODELS"]


class TransformerBlock(nn.Module):
    """Pre-LayerNorm transformer block: ``x + Attn(LN(x))``, then ``+ MLP(LN(.))``.

    Shapes: ``(B, T, d) -> (B, T, d)``. Attention uses ``F.scaled_dot_product_attention`` (fused
    kernels on GPU).
    """

    def __init__(self, dim: int, num_heads: int, mlp_hidden: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide dim={dim}")
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_hidden), nn.GELU(), nn.Linear(mlp_hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        B, T, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(B, T, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, d_head)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(B, T, d))
        return x + self.mlp(self.norm2(x))


class ViT(ClassTokenModel):
    """Vision-transformer baseline with the NI's tokeniser, CLS tokens and heads.

    Args:
        config: the :class:`~modnets.ni.NIConfig` whose input/output fields, ``dim``,
            ``num_heads`` and ``mlp_hidden`` are used.
        depth: transformer blocks (default ``num_scripts * num_iterations * num_locs``, the NI's
            number of LOC applications, i.e. the same sequential depth).

    Shapes: as :class:`~modnets.ni.NeuralInterpreter`: ``-> (B, num_cls, num_outputs)``.
    """

    def __init__(self, config: NIConfig, depth: int | None = None):
        super().__init__()
        if not isinstance(config, NIConfig):
            raise TypeError(f"config must be an NIConfig, got {type(config).__name__}")
        if depth is None:
            depth = config.num_scripts * config.num_iterations * config.num_locs
        if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
            raise ValueError(f"depth must be a positive int, got {depth!r}")
        self.config, self.depth = config, depth
        self.tokenizer = make_tokenizer(config)
        self.cls = ClassTokens(config.num_cls, config.dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.dim, config.num_heads, config.mlp_hidden) for _ in range(depth)
        )
        self.heads = Heads(config.num_cls, config.dim, config.num_outputs, config.shared_head)

    def forward(self, x: Tensor) -> Tensor:
        h = self.cls(self.tokenizer(x))
        for block in self.blocks:
            h = block(h)
        return self.heads(h[:, : self.config.num_cls])


MODELS = ("ni", "vit")


def build_model(kind: str, config: NIConfig, **kwargs) -> nn.Module:
    """``build_model("ni", cfg)`` or ``build_model("vit", cfg, depth=...)``."""
    if kind == "ni":
        return NeuralInterpreter(config, **kwargs)
    if kind == "vit":
        return ViT(config, **kwargs)
    raise ValueError(f"kind must be one of {MODELS}, got {kind!r}")
