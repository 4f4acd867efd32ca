"""One argument picks the model an experiment trains: an NI or its ViT baseline from one
:class:`~modnets.models.ni.NIConfig` (NI §4.2 compares the two at similar size)."""

from __future__ import annotations

from torch import nn

from modnets.models.baselines import ViT
from modnets.models.ni import NeuralInterpreter, NIConfig

__all__ = ["MODELS", "build_model"]

MODELS = ("ni", "vit")


def build_model(kind: str, config: NIConfig, **kwargs) -> nn.Module:
    """``build_model("ni", cfg)`` or ``build_model("vit", cfg, depth=...)``."""
    if kind == "ni":
        return NeuralInterpreter(config, **kwargs)
    if kind == "vit":
        return ViT(config, **kwargs)
    raise ValueError(f"kind must be one of {MODELS}, got {kind!r}")
