"""NI §4.2, multi-task digits and few-shot adaptation to K-MNIST: what the experiment
measures at every claim seed (``measure``; ``core.experiment.run`` makes the results of it).

Run ``python -m modnets.experiments.digits --profile cpu --out results.json``.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import torch
from torch import nn

from modnets import diagnostics, distributed, parallel
from modnets.experiments.core import harness
from modnets.experiments.core.experiment import Measurement
from modnets.experiments.core.options import RunOptions
from modnets.experiments.core.stats import seed_stats
from modnets.experiments.digits.analysis import (
    adapt,
    adaptation_seed,
    anytime,
    drop_functions,
    select_finetune_lr,
)
from modnets.experiments.digits.claims import drop_mean, mean_over
from modnets.experiments.digits.config import (
    FULL_TRAIN_SIZES,
    KINDS,
    MODEL_NAMES,
    DigitsConfig,
)
from modnets.experiments.digits.data import (
    DigitsData,
    for_seed,
    load_kmnist_data,
    load_pretraining_data,
)
from modnets.experiments.digits.models import (
    BUILDERS,
    Preprocess,
    evaluate,
    matched_snapshot,
    pretrain_loss,
    trained_model,
)
from modnets.utils import progress


def _analyse(
    trained: dict[str, nn.Module],
    matched: tuple[str, nn.Module],
    data: DigitsData,
    kmnist: dict,
    *,
    config: DigitsConfig,
    seed: int,
    bar,
) -> dict[str, dict]:
    """Every analysis of the models pretrained from ``seed`` (``trained``: one per kind of
    :data:`KINDS`; ``matched``: the kind ahead on validation and its validation-matched
    snapshot): ``{kind: entry}`` of per-seed results (plain JSON; dict keys as strings)."""
    seeds = [adaptation_seed(seed, s) for s in range(config.adaptation_seeds)]
    ni = trained["ni"]
    out: dict = {kind: {"adaptation": {}} for kind in KINDS}
    out["ni"].update(adaptation_resampled={}, capacity={})
    out[matched[0]]["adaptation_matched"] = {}
    runs = [
        ("ni", "adaptation", ni, False),
        ("vit", "adaptation", trained["vit"], False),
        ("ni", "adaptation_resampled", ni, True),
        ("vit_small", "adaptation", trained["vit_small"], False),
        (matched[0], "adaptation_matched", matched[1], False),
    ]
    lrs = {}
    for kind, key, model, resample in runs:  # each model's rate, on the pool's selection split
        lrs[kind, key], scores = select_finetune_lr(model, kmnist, config, seeds[0], resample)
        out[kind].setdefault("finetune_lr", {})[key] = lrs[kind, key]
        out[kind].setdefault("lr_selection", {})[key] = {str(k): v for k, v in scores.items()}
    for n in config.sample_counts:
        for kind, key, model, resample in runs:
            out[kind][key][str(n)] = []
            for a in seeds:
                out[kind][key][str(n)].append(
                    adapt(model, kmnist, n, config, a, resample=resample, lr=lrs[kind, key])
                )
                bar.update(1)
    n_cap = max(config.sample_counts)
    for u in config.capacity_functions:
        out["ni"]["capacity"][str(u)] = []
        for a in seeds:
            out["ni"]["capacity"][str(u)].append(
                adapt(ni, kmnist, n_cap, config, a, mode="functions", num_functions=u)
            )
            bar.update(1)
    U = ni.scripts[0].num_functions
    drop = drop_functions(ni, data, range(0, U), config.drop_trials, seed)
    out["ni"]["drop"] = {str(k): v for k, v in drop.items()}
    n_i = ni.config.num_iterations
    out["ni"]["anytime"] = {str(k): v for k, v in anytime(ni, data, range(0, 2 * n_i + 1)).items()}
    # the comparison at matched validation accuracy: the model ahead from its matched snapshot,
    # the other as trained
    for kind in ("ni", "vit"):
        key = "adaptation_matched" if kind == matched[0] else "adaptation"
        out[kind]["adaptation_valmatched"] = out[kind][key]
    return out


def _summaries(entries: list[dict], key: str, reduce) -> dict:
    """``{k: seed_stats([reduce(entry[key][k]) for entry in entries])}``."""
    return {k: seed_stats([reduce(e[key][k]) for e in entries]) for k in entries[0][key]}


def _validation_match(trained: dict, snapshots: dict, models: dict) -> tuple[str, nn.Module]:
    """The NI or the ViT, whichever is ahead on mean validation accuracy, at its pretraining
    snapshot closest to the other's final accuracy (:func:`matched_snapshot`); recorded in its
    latest per-seed entry as ``matched``."""
    final = {k: models[k]["per_seed"][-1]["mean_val_acc"] for k in ("ni", "vit")}
    ahead, behind = ("vit", "ni") if final["vit"] > final["ni"] else ("ni", "vit")
    snap = matched_snapshot(snapshots[ahead], final[behind])
    model = copy.deepcopy(trained[ahead])
    model.load_state_dict(snap["state"])
    epochs = len(models[ahead]["per_seed"][-1]["history"]["val_mean"])
    models[ahead]["per_seed"][-1]["matched"] = {
        "epoch": snap["epoch"],
        "of_epochs": epochs,
        "val_mean": snap["val_mean"],
        "target": final[behind],
        "target_model": behind,
    }
    return ahead, model


def _seed_results(config: DigitsConfig, options: RunOptions, seed: int) -> dict:
    """Everything :func:`measure` records of pretraining ``seed`` (plain JSON, so that a worker
    process can compute it): ``{"rows": {kind: per-seed entry}, "routing": {...}}``."""
    seeded = for_seed(config, seed)
    data = load_pretraining_data(seeded.train, options.root, options.verify)
    kmnist = load_kmnist_data(seeded, options.root, options.verify)
    models: dict = {kind: {"per_seed": []} for kind in KINDS}
    trained, snapshots = {}, {}
    for kind in KINDS:
        model, history, snapshots[kind] = trained_model(
            kind, seeded, seed, data, options, snapshots=True
        )
        acc = evaluate(model, data)
        trained[kind] = model
        models[kind]["per_seed"].append(
            {
                "seed": seed,
                "parameters": sum(p.numel() for p in model.parameters()),
                "history": history,
                "val_acc": acc,
                "mean_val_acc": mean_over(acc),
            }
        )
    matched = _validation_match(trained, snapshots, models)
    ni = trained["ni"]
    models["ni"]["per_seed"][-1]["num_iterations"] = ni.config.num_iterations
    A = config.adaptation_seeds
    runs = A * (5 * len(config.sample_counts) + len(config.capacity_functions))
    bar = progress(
        total=runs,
        desc=f"K-MNIST adaptation (seed {seed})",
        disable=not (options.show_progress and distributed.is_main()),
    )
    analysed = _analyse(trained, matched, data, kmnist, config=seeded, seed=seed, bar=bar)
    bar.close()
    for kind in KINDS:
        models[kind]["per_seed"][-1].update(analysed[kind])
    idx = torch.linspace(0, len(data.x_val) - 1, min(config.routing_images, len(data.x_val)))
    images = Preprocess()(data.x_val[idx.long()])  # spread over the datasets
    routing = {"seed": seed, **diagnostics.ni_routing(ni, images)}
    # NI Figs. 3 and 4 on the same images: routing paths by digit, and type clusters
    figs = diagnostics.ni_paths_and_types(ni, images, data.y_val[idx.long()])
    models["ni"]["per_seed"][-1].update(figs)
    return {"rows": {kind: models[kind]["per_seed"][0] for kind in KINDS}, "routing": routing}


def measure(config: DigitsConfig, options: RunOptions) -> Measurement:
    """Every model at every pretraining seed.

    ``models["ni" | "vit"]["per_seed"]`` holds each seed's history, validation accuracy and
    K-MNIST accuracies (one per adaptation seed); the NI's also its capacity, dropped-function
    and anytime accuracies (:func:`summarise` adds, beside ``per_seed``, each seed's mean over
    adaptation seeds, trials or datasets summarised over pretraining seeds). Each seed runs
    whole in one of ``options.workers`` processes.
    """
    workers, show = options.workers or 1, options.show_progress
    # whole rounds side by side; the seeds left over (fewer than the workers) here, every thread
    side = config.seeds[: len(config.seeds) - len(config.seeds) % workers]
    inline = workers == 1 or len(side) < 2
    each = functools.partial(_seed_results, config, options if inline else options.quiet())
    per_seed_results = parallel.map_tasks(
        each, side, workers, "pretraining seeds", show and not inline
    )
    rest = config.seeds[len(side) :]
    per_seed_results += [_seed_results(config, options, s) for s in rest]
    models: dict = {
        kind: {"per_seed": [r["rows"][kind] for r in per_seed_results]} for kind in KINDS
    }
    diag = {
        "datasets": list(config.train.datasets),
        "routing_after_pretraining": [r["routing"] for r in per_seed_results],
    }
    return Measurement(models, diag, config, config.selection_seeds)


def summarise(config: DigitsConfig, models: dict, diagnostics: dict) -> tuple[dict, dict]:
    """The summaries over pretraining seeds, from the per-seed entries: each seed's mean (over
    adaptation seeds, trials or datasets) summarised; the validation accuracies per model."""
    for kind, entry in models.items():
        runs = entry["per_seed"]
        entry["mean_val_acc"] = seed_stats([r["mean_val_acc"] for r in runs])
        keys = {
            "ni": ("adaptation", "adaptation_resampled", "capacity", "adaptation_valmatched"),
            "vit": ("adaptation", "adaptation_valmatched"),
        }.get(kind, ("adaptation",))
        for key in keys:
            entry[key] = _summaries(runs, key, np.mean)
    models["ni"]["drop"] = _summaries(models["ni"]["per_seed"], "drop", drop_mean)
    models["ni"]["anytime"] = _summaries(models["ni"]["per_seed"], "anytime", mean_over)
    val_acc = {kind: [r["val_acc"] for r in models[kind]["per_seed"]] for kind in KINDS}
    return models, {**diagnostics, "val_acc": val_acc}


def dry_run(config: DigitsConfig) -> list[harness.DryRun]:
    """Both pretrained models of ``config`` and the pretraining loss on two random images of the
    real shape (see :func:`modnets.experiments.core.harness.dry_run`)."""
    t = config.train
    cfg = t.ni_config()
    g = torch.Generator().manual_seed(0)
    shape = (2, cfg.in_channels, cfg.image_size, cfg.image_size)
    x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    y = torch.randint(0, cfg.num_outputs, (2,), generator=g)
    d = torch.tensor([0, len(t.datasets) - 1])
    prep = Preprocess(t.randaugment)
    # the full training splits (SVHN, MNIST-M, MNIST) less the validation images, capped
    n = sum(
        min(FULL_TRAIN_SIZES[name] - t.val_per_dataset, t.train_per_dataset or 10**9)
        for name in t.datasets
    )
    return [
        harness.DryRun(
            f"{MODEL_NAMES[kind]} (pretraining)",
            BUILDERS[kind](t),
            lambda m: pretrain_loss(m, prep, x, y, d),
            samples=2,
            batch_size=t.train_config(kind).batch_size,
            steps=t.train_config(kind).epochs * (n // t.train_config(kind).batch_size),
        )
        for kind in KINDS
    ]
