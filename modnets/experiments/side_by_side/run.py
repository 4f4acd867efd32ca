"""NI, NAC and NFM beside their plain counterparts on one stacked-MNIST task and one budget:
what the experiment measures at every claim seed (``measure``; ``core.experiment.run`` makes
the results of it).

Run ``python -m modnets.experiments.side_by_side --profile cpu --out results.json``.
"""

from __future__ import annotations

import functools

from modnets import parallel
from modnets.data.stacked_mnist import noise_canvases
from modnets.experiments.core import harness
from modnets.experiments.core.experiment import Measurement
from modnets.experiments.core.options import RunOptions
from modnets.experiments.side_by_side.analysis import costs, drop_scores
from modnets.experiments.side_by_side.config import MODEL_NAMES, SideBySideConfig
from modnets.experiments.side_by_side.data import inputs, test_data, training_data
from modnets.experiments.side_by_side.models import (
    adapt,
    build_model,
    droppable,
    loss,
    mean_exact,
    trained_model,
)
from modnets.experiments.side_by_side.rates import HEAVIEST_FIRST, select_rates, train_task


def measure(config: SideBySideConfig, options: RunOptions) -> Measurement:
    """Choose each model's learning rate on the selection seeds (unless ``config`` holds the
    rates a selection run recorded), train (or load) every model at every claim seed and measure
    it.

    ``models[name]["per_seed"]`` holds per seed ``iid`` (mean exact-match on the trained digit
    counts), ``ood`` (on the held-out counts), ``few_shot`` (K-MNIST after adapting from a few
    canvases) and, where the model allows it, ``kept_at_50`` / ``kept_at_80`` (exact-match with
    half / 80 % of its modules or functions dropped, minus the full model's);
    ``models[name]["costs"]`` the parameters, FLOPs and step and inference times beside the
    CNN's, measured in this process one model after another."""
    data = training_data(config.train, options.root, options.verify)
    train = functools.partial(train_task, config, options)
    with parallel.keep_workers():  # started once for the selection and the claim seeds
        if config.learning_rates is None:
            rates = select_rates(config, data, options)
        else:  # chosen by the same selection, run apart and recorded
            rates = {k: {"lr": config.learning_rates[k], "scores": None} for k in MODEL_NAMES}
        # the slowest models first, so that the two workers finish together
        claim_tasks = [(s, k, rates[k]["lr"]) for k in HEAVIEST_FIRST for s in config.seeds]
        harness.train_ahead(train, claim_tasks, options, "models")
    models = {name: {"per_seed": [], "lr": rates[k]["lr"]} for k, name in MODEL_NAMES.items()}
    last = {}
    for seed in config.seeds:
        tests = test_data(config, seed, options.root, options.verify)
        for kind, name in MODEL_NAMES.items():
            lr = rates[kind]["lr"]
            model, history = trained_model(kind, config, seed, data, options, lr=lr)
            row = {"seed": seed, "history": history}
            row["iid"] = mean_exact(model, tests["iid"], config.eval_batch)
            row["ood"] = mean_exact(model, tests["ood"], config.eval_batch)
            row["few_shot"] = adapt(model, tests, config, lr, seed)
            if droppable(kind):
                for f, acc in drop_scores(model, tests["iid"], config, seed).items():
                    row[f"kept_at_{round(100 * f)}"] = acc - row["iid"]
            models[name]["per_seed"].append(row)
            last[name] = model
    for name, c in costs(last, config).items():
        models[name]["costs"] = c
    diagnostics = {"learning_rates": {MODEL_NAMES[k]: v for k, v in rates.items()}}
    return Measurement(models, diagnostics, config, config.selection_seeds)


def summarise(config: SideBySideConfig, models: dict, diagnostics: dict) -> tuple[dict, dict]:
    """Nothing to summarise over seeds: the claims read the per-seed entries, and the costs are
    measured once, in one process."""
    return models, diagnostics


def dry_run(config: SideBySideConfig) -> list[harness.DryRun]:
    """Every model of ``config`` and its training loss on two random canvases of the real
    shape (see :func:`modnets.experiments.core.harness.dry_run`)."""
    t = config.train
    images, y = noise_canvases(2, t.canvas)
    x = inputs(images, "cpu")
    steps = t.epochs * len(t.train_counts) * (t.per_count // t.batch_size)
    models = {name: build_model(kind, t, seed=0) for kind, name in MODEL_NAMES.items()}
    size = {"samples": 2, "batch_size": t.batch_size, "steps": steps}
    return [
        harness.DryRun(name, net, lambda m: loss(m, x, y), **size) for name, net in models.items()
    ]
