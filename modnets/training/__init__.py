"""Small training utilities shared by the experiments (device-agnostic).

One file per job: ``optim`` (the optimiser, its schedule and TrainConfig), ``runtime`` (precision,
compilation, minibatches, counts and scores), ``checkpoints`` (saved weights and resumable state)
and ``loop`` (:func:`fit`).
"""

from modnets.nn.params import weight_decay_groups
from modnets.training.checkpoints import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    ResumableLoop,
    checkpoint_dir,
    load_train_state,
    save_checkpoint,
)
from modnets.training.loop import fit
from modnets.training.optim import OPTIMIZERS, SCHEDULES, TrainConfig, optimizer_for, warmup_cosine
from modnets.training.runtime import (
    AnyBatch,
    amp_dtype,
    autocast,
    compiler_available,
    group_batches,
    maybe_compile,
    minibatches,
    r2_score,
    trainable_parameters,
)

__all__ = [
    "warmup_cosine",
    "weight_decay_groups",
    "OPTIMIZERS",
    "SCHEDULES",
    "TrainConfig",
    "optimizer_for",
    "group_batches",
    "minibatches",
    "amp_dtype",
    "autocast",
    "trainable_parameters",
    "r2_score",
    "compiler_available",
    "maybe_compile",
    "AnyBatch",
    "save_checkpoint",
    "checkpoint_dir",
    "CheckpointError",
    "CHECKPOINT_FORMAT",
    "load_train_state",
    "ResumableLoop",
    "fit",
]
