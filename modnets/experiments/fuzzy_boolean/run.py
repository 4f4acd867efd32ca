"""NI §4.1, fuzzy Boolean expressions (NI Table 1): what the experiment measures at every
claim seed (``measure``; ``core.experiment.run`` makes the results of it).

Run ``python -m modnets.experiments.fuzzy_boolean --profile cpu --out results.json``.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from modnets import diagnostics
from modnets.experiments.core import harness
from modnets.experiments.core.experiment import Measurement
from modnets.experiments.core.options import RunOptions
from modnets.experiments.core.stats import per_seed, seed_stats
from modnets.experiments.fuzzy_boolean.config import (
    FINETUNINGS,
    FuzzyBooleanConfig,
    FuzzyBooleanTrain,
)
from modnets.experiments.fuzzy_boolean.data import (
    describe_functions,
    fit_points,
    for_seed,
    load_data,
    reported_split,
)
from modnets.experiments.fuzzy_boolean.models import (
    build_model,
    evaluate,
    loss,
    trained_models,
)
from modnets.experiments.fuzzy_boolean.sweep import sweep
from modnets.training import trainable_parameters


def dry_run(config: FuzzyBooleanConfig) -> list[harness.DryRun]:
    """The pretraining model of ``config`` and one loss on two random points (see
    :func:`modnets.experiments.core.harness.dry_run`)."""
    t = config.train
    x, y = torch.rand(2, t.num_variables), torch.randn(2, t.num_pretrain_functions)
    n = round(0.8 * t.points_per_function)  # make_dataset's 80/20 split (NI §4.1)
    return [
        harness.DryRun(
            "NI (pretraining)",
            build_model("ni", t),
            lambda m: loss(m, x, y),
            samples=2,
            batch_size=t.pretrain.batch_size,
            steps=t.pretrain.epochs * (n // t.pretrain.batch_size),
        )
    ]


def _train_seed(
    config: FuzzyBooleanConfig, chosen: FuzzyBooleanTrain, options: RunOptions, seed: int
) -> None:
    """Train (into checkpoints) every model of claim ``seed`` on its own task: :func:`measure`'s
    loop, ahead of it in a worker process."""
    seeded = replace(config, train=for_seed(chosen, seed))
    trained_models(seeded, seed, options=options.quiet())


def measure(config: FuzzyBooleanConfig, options: RunOptions) -> Measurement:
    """Every model at every claim seed (after the routing sweep on its selection seed).

    ``models[key]["per_seed"]`` holds each seed's R^2 per function, its mean over functions,
    history and trainable count (:func:`summarise` adds the mean over seeds).
    """
    selection = [config.sweep.seed] if config.sweep is not None else list(config.selection_seeds)
    if set(selection) & set(config.seeds):
        raise ValueError(f"the selection seeds {selection} overlap the claim seeds {config.seeds}")
    chosen, sweep_report = sweep(config, options=options)
    train = functools.partial(_train_seed, config, chosen, options)
    harness.train_ahead(train, config.seeds, options, "claim seeds", whole_rounds=True)
    models = {k: {"per_seed": []} for k in ("pretrain", *FINETUNINGS)}
    routing, shifts, functions = [], [], {}
    for seed in config.seeds:
        seeded = replace(config, train=for_seed(chosen, seed))
        data = load_data(seeded.train)
        pre_data, new_data, drawn = data
        functions[seed] = describe_functions(drawn)
        pre_fit, new_fit, _ = fit_points(seeded, data)
        reported = {
            "pretrain": reported_split(pre_fit, pre_data),
            "new": reported_split(new_fit, new_data),
        }
        trained = trained_models(seeded, seed, data, options)
        for key, (model, history) in trained.items():
            r2 = evaluate(model, reported["pretrain" if key == "pretrain" else "new"])
            models[key]["per_seed"].append(
                {
                    "seed": seed,
                    "r2": r2.tolist(),
                    "mean_r2": r2.mean().item(),
                    "history": history,
                    "trainable_parameters": trainable_parameters(model),
                }
            )
        x = pre_data.x_val[: config.routing_points]
        routing.append({"seed": seed, **diagnostics.ni_routing(trained["pretrain"][0], x)})
        # how far each finetuning regime moved the variable tokens' routing (new functions' inputs)
        x_new = new_data.x_val[: config.routing_points]
        shifts.append(
            {
                "seed": seed,
                **{
                    r: diagnostics.ni_routing_shift(trained["pretrain"][0], trained[r][0], x_new)
                    for r in FINETUNINGS
                },
            }
        )
    diag = {
        "routing_after_pretraining": routing,
        "routing_shift": shifts,
        "sweep": sweep_report,
        "functions": functions,
    }
    return Measurement(models, diag, replace(config, train=chosen), selection)


def summarise(config: FuzzyBooleanConfig, models: dict, diagnostics: dict) -> tuple[dict, dict]:
    """The summaries over seeds, from the per-seed entries: each model's mean R^2."""
    for entry in models.values():
        entry["mean_r2"] = seed_stats(per_seed(entry["per_seed"], "mean_r2"))
    return models, diagnostics
