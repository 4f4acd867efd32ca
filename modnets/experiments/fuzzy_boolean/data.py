"""The fuzzy-Boolean task of a seed: its functions, their points, and the splits that train, select
and report."""

from __future__ import annotations

from dataclasses import replace

import torch

from modnets.data.fuzzy_boolean import (
    FuzzyFormulas,
    MultiTaskData,
    make_dataset,
    sample_formulas,
    sample_functions,
)
from modnets.experiments.fuzzy_boolean.config import FuzzyBooleanConfig, FuzzyBooleanTrain


def for_seed(train: FuzzyBooleanTrain, seed: int) -> FuzzyBooleanTrain:
    """``train`` with the task of ``seed``: its functions and points drawn from
    ``task_seed + 10 seed`` (:func:`load_data` uses three consecutive seeds from there)."""
    return replace(train, task_seed=train.task_seed + 10 * seed)


def load_data(train: FuzzyBooleanTrain) -> tuple[MultiTaskData, MultiTaskData, object]:
    """Pretraining data (``num_pretrain_functions``), adaptation data (the new functions) and
    the functions, all fixed by ``task_seed``."""
    k_pre, k_new = train.num_pretrain_functions, train.num_finetune_functions
    s = train.task_seed
    sample = sample_functions if train.family == "truth_tables" else sample_formulas
    functions = sample(k_pre + k_new, train.num_variables, seed=s)
    pre = make_dataset(functions[:k_pre], train.points_per_function, seed=s + 1)
    new = make_dataset(functions[k_pre:], train.points_per_function, seed=s + 2)
    return pre, new, functions


def describe_functions(functions) -> list:
    """The functions, for the results file: truth tables (0/1 lists) or formula strings."""
    if isinstance(functions, FuzzyFormulas):
        return [functions.expression(i) for i in range(len(functions))]
    return functions.tables.int().tolist()


def target_scaler(data: MultiTaskData) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-function mean and std of the training targets.

    Fuzzy DNF targets have a small variance under uniform inputs (about 0.01), and a model trained
    on them raw tends to stall at predicting the mean; it learns on standardised targets.
    """
    return data.y_train.mean(0), data.y_train.std(0)


def fit_points(config: FuzzyBooleanConfig, data) -> tuple[MultiTaskData, MultiTaskData, str]:
    """The points models train on, and their fingerprint: with a sweep, the training points but
    the sweep's selection cut (:func:`selection_split`; the cut is then the held-out split of
    every epoch's evaluation), so that the sweep's chosen candidate is the first seed's
    pretrained model itself; without one, all training points."""
    pre_data, new_data, _ = data
    if config.sweep is None:
        return pre_data, new_data, "synthetic"  # generated data: its code is in TRAIN_CODE
    frac = config.sweep.selection_fraction
    pre_fit, new_fit = (selection_split(d, frac) for d in (pre_data, new_data))
    return pre_fit, new_fit, f"synthetic, selection cut {frac}"


def reported_split(fit: MultiTaskData, data: MultiTaskData) -> MultiTaskData:
    """The split the experiment reports (``data``'s validation points), paired with the points the
    model trained on, whose target scaling :func:`evaluate` must undo."""
    return MultiTaskData(fit.x_train, fit.y_train, data.x_val, data.y_val)


def selection_split(data: MultiTaskData, fraction: float) -> MultiTaskData:
    """The split that chooses hyper-parameters: the training points but the last ``fraction``
    train, those score. Built from the training points alone: the validation split, which the
    experiment reports, is not read."""
    n = len(data.x_train)
    k = int(round(fraction * n))
    if not 0 < k < n:
        raise ValueError(f"fraction must leave points on both sides of {n}, got {fraction}")
    x, y = data.x_train, data.y_train
    return MultiTaskData(x[: n - k], y[: n - k], x[n - k :], y[n - k :])
