"""NAC §4, Tiny-ImageNet with modules dropped (NAC Table 1, Figs. 10 and 15): what the
experiment measures at every claim seed (``measure``; ``core.experiment.run`` makes the results
of it).

Run ``python -m modnets.experiments.tiny_imagenet --profile cpu --out results.json``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace

import torch

from modnets.experiments.core import harness
from modnets.experiments.core.experiment import Measurement
from modnets.experiments.core.options import RunOptions
from modnets.experiments.core.stats import per_seed, seed_stats
from modnets.experiments.tiny_imagenet.analysis import (
    drop_curve,
    edge_curve,
    nac_diagnostics,
    point_at,
    relative_loss,
    scorer,
    speed_curve,
)
from modnets.experiments.tiny_imagenet.claims import (
    dropping_matters,
)
from modnets.experiments.tiny_imagenet.config import (
    ALL_BUT_ONE,
    ALL_EDGES,
    DROP_AT,
    EDGES_AT,
    NAME,
    TinyImageNetConfig,
)
from modnets.experiments.tiny_imagenet.data import Data, load_data
from modnets.experiments.tiny_imagenet.models import (
    build_model,
    make_step,
    model_name,
    trained_model,
)
from modnets.utils import seed_everything


def dry_run(config: TinyImageNetConfig) -> list[harness.DryRun]:
    """Every model of ``config`` and its training loss on four random 64x64 images (see
    :func:`modnets.experiments.core.harness.dry_run`; four, so that DropPath (0.1 per example)
    drops a residual branch for the whole batch with probability 1e-4, not 1e-2)."""
    t = config.train
    x = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8)
    y = torch.arange(4) % t.num_classes
    names = [str(c) for c in range(t.num_classes)]
    data = Data(x_train=x, y_train=y, x_val=x, y_val=y, class_names=names, fingerprint="random")
    parts = []
    for kind, prior in [("pio", None)] + [("nac", p) for p in config.priors]:
        model = build_model(kind, t, prior=prior)
        step = make_step(model, data, t)
        tc = t.nac_train if kind == "nac" else t.pio_train
        n = t.num_classes * min(500, t.max_train_per_class or 500)  # 500 per class in the release
        parts.append(
            harness.DryRun(
                model_name(kind, prior),
                model,
                lambda m, step=step: step(m, torch.arange(4))["loss"],
                samples=4,
                batch_size=tc.batch_size,
                steps=tc.epochs * (n // tc.batch_size),
                loss_on=lambda m, k, step=step: step(m, torch.arange(k))["loss"],
            )
        )
    return parts


def fit_to_gpu(config: TinyImageNetConfig, device, memory_bytes: float | None = None):
    """``config`` with the gradient accumulation its models need on ``device``'s GPU (or one of
    ``memory_bytes``), decided before training by :func:`modnets.experiments.core.budget.plan`
    (which warns); unchanged on a CPU. Accumulation is not in the checkpoint key."""
    from modnets.experiments.core import budget

    memory = budget.gpu_memory(device) if memory_bytes is None else memory_bytes
    if memory is None:
        return config
    need = budget.plan(NAME, config, memory)
    t = config.train
    pio = max(need.get(model_name("pio", None), 1), t.pio_train.accumulate)
    nac = max([need.get(model_name("nac", p), 1) for p in config.priors] + [t.nac_train.accumulate])
    t = replace(
        t,
        pio_train=replace(t.pio_train, accumulate=pio),
        nac_train=replace(t.nac_train, accumulate=nac),
    )
    return replace(config, train=t)


def train_task(config: TinyImageNetConfig, options: RunOptions, task: tuple) -> None:
    """Train (into its checkpoint) the model of ``task = (seed, kind, prior)``: :func:`measure`'s
    loop, ahead of it in a worker process."""
    seed, kind, prior = task
    trained_model(kind, config, seed, prior=prior, options=options.quiet())


def model_task(config: TinyImageNetConfig, options: RunOptions, task: tuple) -> tuple:
    """Train (into its checkpoint) and read the model of ``task = (seed, kind, prior)``: its
    :func:`readings`, ahead of :func:`measure`'s loop in a worker process."""
    seed, kind, prior = task
    data = load_data(config.train, options.root)
    model, _ = trained_model(kind, config, seed, data, prior=prior, options=options.quiet())
    return readings(model, data, config, kind=kind, prior=prior, seed=seed, device=options.device)


def readings(
    model, data: Data, config: TinyImageNetConfig, *, kind: str, prior, seed: int, device
) -> tuple[dict, dict | None]:
    """``(readings, diagnostics)`` of a trained model: top-1 and top-5, the drop curves (a NAC in
    three orders, Perceiver IO in a random one), a NAC's edge curve and circuit diagnostics
    (``None`` for Perceiver IO). Everything but the throughput, which is timed alone."""
    score = scorer(model, data, config.eval_batch)  # the validation tokens, computed once
    r = score(model)  # what evaluate gives on the images, bit for bit
    drop_fr = sorted({0.0, DROP_AT, *config.drop_fractions})
    # a NAC least connected first (App. F), random, most; Perceiver IO's latents have no order
    # but a random one
    orders = ("least", "random", "most") if kind == "nac" else ("random",)
    for order in orders:
        key = "drop" if order == orders[0] else f"drop_{order}"
        # a NAC's random order also to all modules but one: whether it uses its modules at all
        fr = sorted({*drop_fr, ALL_BUT_ONE}) if key == "drop_random" else drop_fr
        r[key] = drop_curve(
            model, data, fr, order=order, draws=config.random_draws, seed=seed, score=score
        )
    if kind == "pio":
        return r, None
    edge_fr = sorted({0.0, EDGES_AT, ALL_EDGES, *config.edge_fractions})
    r["edges"] = edge_curve(model, data, edge_fr, score=score)
    full, e = point_at(r["drop"], 0.0)["top1"], point_at(r["edges"], EDGES_AT)["top1"]
    r["lost_edges90"], r["relative_lost_edges90"] = full - e, relative_loss(full, e)
    seed_everything(seed)  # the same initialisation as the trained model's
    initial = build_model(kind, config.train, prior=prior).to(device)
    return r, {"seed": seed, **nac_diagnostics(model, initial, data, config.eval_batch)}


def measure(config: TinyImageNetConfig, options: RunOptions) -> Measurement:
    """Train (or load) every model at every seed and run every analysis.

    ``models[name]["per_seed"]`` holds each seed's accuracy, history, drop / speed (/ edge)
    curves and the accuracy lost at 80 % dropped (``lost_at80``: full − dropped, as a fraction;
    ``relative_lost_at80``: that over full); :func:`summarise` adds ``models[name][key]``, the
    summary of ``key`` over seeds.
    The drop curves always include 0 and 0.8, the edge curves 0, 0.9 and 1 (the claims and their
    mechanism checks need them), a NAC's random drop curve 1 (all modules but one).
    The models train in ``options.workers`` processes, each model's :func:`readings` taken where
    it trained; the throughput is timed in this process alone.
    """
    config = fit_to_gpu(config, options.device)
    data = load_data(config.train, options.root)
    runs = [("pio", None)] + [("nac", p) for p in config.priors]
    models = {model_name(k, p): {"kind": k, "prior": p, "per_seed": []} for k, p in runs}
    diag = {model_name("nac", p): [] for p in config.priors}
    # the NACs (the longest) first, so that the workers finish together
    tasks = [(seed, kind, prior) for kind, prior in runs[::-1] for seed in config.seeds]
    task = functools.partial(model_task, config, options)
    ahead = harness.train_ahead(task, tasks, options, "models")
    ahead = {} if ahead is None else dict(zip(tasks, ahead, strict=True))
    for seed in config.seeds:
        for kind, prior in runs:
            name = model_name(kind, prior)
            t0 = time.perf_counter()
            model, history = trained_model(kind, config, seed, data, prior=prior, options=options)
            r = {
                "seed": seed,
                "parameters": sum(p.numel() for p in model.parameters()),
                "history": history,
                "train_or_load_seconds": time.perf_counter() - t0,
            }
            read = ahead.get((seed, kind, prior))
            if read is None:
                where = {"kind": kind, "prior": prior, "seed": seed, "device": options.device}
                read = readings(model, data, config, **where)
            r.update(read[0])
            if read[1] is not None:
                diag[name].append(read[1])
            _speed_readings(r, model, config, seed)
            models[name]["per_seed"].append(r)
    return Measurement(models, diag, config, config.selection_seeds)


def _speed_readings(r: dict, model, config: TinyImageNetConfig, seed: int) -> None:
    """Into ``r`` (which holds the drop curves): the speed curve at the drop curves' fractions,
    and top-1, the loss and the speed-up at 80 % dropped."""
    r["speed"] = speed_curve(
        model,
        [d["fraction"] for d in r["drop"]],
        config.throughput_batch,
        config.throughput_repeats,
        seed=seed,
        seconds=config.throughput_seconds,
    )
    full = point_at(r["drop"], 0.0)["top1"]
    for key, suffix in (("drop", ""), ("drop_random", "_random"), ("drop_most", "_most")):
        if key in r:
            at = point_at(r[key], DROP_AT)["top1"]
            r[f"top1_at80{suffix}"], r[f"lost_at80{suffix}"] = at, full - at
            r[f"relative_lost_at80{suffix}"] = relative_loss(full, at)
    r["speedup_at80"] = (
        point_at(r["speed"], DROP_AT)["samples_per_s"] / point_at(r["speed"], 0.0)["samples_per_s"]
    )


def summarise(config: TinyImageNetConfig, models: dict, diagnostics: dict) -> tuple[dict, dict]:
    """The summaries over seeds, from the per-seed entries: each reading, and whether dropping
    matters for each NAC."""
    for entry in models.values():
        keys = ["top1", "top5", "top1_at80", "lost_at80", "relative_lost_at80", "speedup_at80"]
        if entry["kind"] == "nac":
            keys += [
                "lost_edges90",
                "relative_lost_edges90",
                "top1_at80_random",
                "lost_at80_random",
                "top1_at80_most",
                "lost_at80_most",
            ]
        for k in keys:
            entry[k] = seed_stats(per_seed(entry["per_seed"], k))
    for name in diagnostics:  # the mechanism the dropping claims rely on: a diagnostic, not a gate
        holds, reason = dropping_matters(models[name]["per_seed"])
        models[name]["dropping_matters"] = {"holds": holds, "reason": reason}
    return models, diagnostics
