"""How the side-by-side experiment chooses each model's learning rate: every candidate rate
trained on the selection seeds (never claim seeds), the best validation accuracy kept."""

from __future__ import annotations

import functools

import numpy as np

from modnets.experiments.core import harness
from modnets.experiments.core.options import RunOptions
from modnets.experiments.side_by_side.config import MODEL_NAMES, SideBySideConfig
from modnets.experiments.side_by_side.models import mean_exact, trained_model

#: The models by their training time per step on this task, slowest first.
HEAVIEST_FIRST = ("ni", "nfm", "nac", "pio", "cnn", "vit")


def train_task(config: SideBySideConfig, options: RunOptions, task: tuple) -> None:
    """Train (into checkpoints) model ``kind`` at ``seed`` and learning rate ``lr``."""
    seed, kind, lr = task
    trained_model(kind, config, seed, options=options.quiet(), lr=lr)


def choose_rates(config: SideBySideConfig, data: dict, options: RunOptions) -> dict:
    """Per model, the learning rate of ``config.train.lrs`` with the best validation accuracy
    averaged over the selection seeds (ties: the smaller rate): ``{kind: {"lr", "scores"}}``."""
    out = {}
    for kind in MODEL_NAMES:
        scores = {}
        for lr in config.train.lrs:
            accs = []
            for seed in config.selection_seeds:
                model, _ = trained_model(kind, config, seed, data, options, lr=lr)
                accs.append(mean_exact(model, data["val"], config.eval_batch))
            scores[lr] = float(np.mean(accs))
        out[kind] = {"lr": max(scores, key=lambda r: (scores[r], -r)), "scores": scores}
    return out


def select_rates(config: SideBySideConfig, data: dict, options: RunOptions) -> dict:
    """Train every model at every rate of ``config.train.lrs`` on the selection seeds (side by
    side in ``options.workers`` processes) and :func:`choose_rates` from them."""
    train = functools.partial(train_task, config, options)
    lrs = config.train.lrs
    selection = [(s, k, lr) for k in HEAVIEST_FIRST for lr in lrs for s in config.selection_seeds]
    harness.train_ahead(train, selection, options, "selection")
    return choose_rates(config, data, options)
