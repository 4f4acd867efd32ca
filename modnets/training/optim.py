"""The optimiser of a training run: :class:`TrainConfig`, weight decay by parameter kind, and the
learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


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


OPTIMIZERS = ("adamw", "adam")

SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class TrainConfig:
    """How a model is optimised; everything :func:`fit` needs besides the model and the step.

    ``clip_grad_norm`` (None: no clipping) and ``amp`` (autocast on CUDA to :func:`amp_dtype`:
    bf16, or fp16 with loss scaling on a GPU without bf16) are explicit per
    experiment. ``best`` names a validation metric (a key of what ``evaluate`` returns); when set,
    the weights of the epoch where it was highest are restored at the end (NFM App. C).
    """

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    warmup_fraction: float = 0.0
    schedule: str = "cosine"
    min_lr: float = 0.0  # the cosine schedule's floor (absolute)
    clip_grad_norm: float | None = None
    amp: bool = True
    best: str | None = None
    log_points: int = 100  # points of the logged loss curve (each the mean since the last)
    # steps between training-state checkpoints (not in the checkpoint key: no effect on weights)
    save_every: int = field(default=500, metadata={"key": False})
    # gradient accumulation: each batch in this many micro-batches, one optimiser step (for a
    # GPU too small for the batch; not in the checkpoint key: the same step up to rounding)
    accumulate: int = field(default=1, metadata={"key": False})
    # the speed switches (not in the checkpoint key: the same step up to rounding):
    # torch.compile the model the step runs (its warm-up pays off over thousands of steps) ...
    compile: bool = field(default=False, metadata={"key": False})
    # ... the optimiser's fused kernel (one pass over every parameter instead of one per tensor) ...
    fused: bool = field(default=False, metadata={"key": False})
    # ... and 4-D weights stored channels-last while training (NHWC, oneDNN's own layout for
    # convolutions: no reorder of every activation around each one; a model without them is as is)
    channels_last: bool = field(default=False, metadata={"key": False})

    def __post_init__(self):
        for name in ("epochs", "batch_size", "log_points", "accumulate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {v!r}")
        if isinstance(self.save_every, bool) or not isinstance(self.save_every, int):
            raise TypeError(f"TrainConfig.save_every must be an int, got {self.save_every!r}")
        if self.save_every < 0:
            raise ValueError(
                f"TrainConfig.save_every must be >= 0 (0: only at the end), got {self.save_every}"
            )
        for name in ("lr", "min_lr", "weight_decay", "warmup_fraction", "clip_grad_norm"):
            v = getattr(self, name)
            # a YAML file gives "1e-3" as a string, and True is an int to Python
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise TypeError(
                    f"TrainConfig.{name} must be a number, got {v!r} ({type(v).__name__})"
                    + (f": pass float({v!r})" if isinstance(v, str) else "")
                )
        if not 0 < self.lr < math.inf:
            raise ValueError(f"TrainConfig.lr must be positive and finite, got {self.lr!r}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(
                f"TrainConfig.min_lr (the schedule's floor) must be in [0, lr={self.lr}], "
                f"got {self.min_lr!r}"
            )
        if not 0 <= self.weight_decay < math.inf:
            raise ValueError(
                f"TrainConfig.weight_decay must be non-negative and finite, got {self.weight_decay!r}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"TrainConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"TrainConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}"
            )
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(
                f"TrainConfig.warmup_fraction must be in [0, 1), got {self.warmup_fraction!r}"
            )
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ValueError(
                f"TrainConfig.clip_grad_norm must be positive or None, got {self.clip_grad_norm!r}"
            )
        for name in ("amp", "compile", "fused", "channels_last"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"TrainConfig.{name} must be True or False, got {getattr(self, name)!r}"
                )
        if self.batch_size % self.accumulate:
            raise ValueError(
                f"TrainConfig.accumulate={self.accumulate} must divide batch_size={self.batch_size}"
            )


def optimizer_for(param_groups: list[dict], config: TrainConfig) -> torch.optim.Optimizer:
    """``config``'s optimiser over ``param_groups``, each at ``config.weight_decay`` unless it
    sets its own, with the fused kernel when ``config.fused``."""
    groups = [{"weight_decay": config.weight_decay, **g} for g in param_groups]
    opt_class = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return opt_class(groups, lr=config.lr, fused=config.fused or None)
