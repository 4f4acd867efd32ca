"""Parameter groups of a model for its optimiser: which parameters take weight decay."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

__all__ = ["weight_decay_groups"]


def weight_decay_groups(
    module: nn.Module, weight_decay: float, exempt: Iterable[str] = ()
) -> list[dict]:
    """AdamW parameter groups: weight decay except on parameters with ``dim <= 1`` and those whose
    own name (the last part of the dotted name) is in ``exempt`` (codes, signatures, latents)."""
    exempt = set(exempt)
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if p.requires_grad:
            free = name.rsplit(".", 1)[-1] in exempt
            (no_decay if p.dim() <= 1 or free else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
