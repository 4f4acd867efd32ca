"""The routing sweep: candidates pretrained on a selection seed, the choice among them, and the
record that pins a profile's settings."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

from modnets import diagnostics
from modnets.experiments.core import fingerprints
from modnets.experiments.core.options import RunOptions, resolved
from modnets.experiments.fuzzy_boolean.config import (
    CONFIGS,
    FINETUNINGS,
    NAME,
    RECORDED_SWEEPS,
    FuzzyBooleanConfig,
    FuzzyBooleanTrain,
    unswept,
)
from modnets.experiments.fuzzy_boolean.data import fit_points, for_seed, load_data, selection_split
from modnets.experiments.fuzzy_boolean.models import evaluate, finetuned, pretrained


def sweep_record_path(profile: str) -> Path:
    """Where the sweep behind ``profile``'s pinned settings is recorded (``experiments/records``)."""
    return Path(__file__).parents[1] / "records" / f"{NAME}_sweep_{profile}.json"


def record_sweep(
    profile: str = "cpu", show_progress: bool = True, cache: bool = True, resume: bool = False
) -> dict:
    """Run :data:`RECORDED_SWEEPS` ``[profile]`` from ``profile``'s training configuration
    without its pinned settings (:func:`unswept`) and write its record: the sweep, the
    configuration it started from and its report (:func:`sweep`). Pin the report's choice in
    ``CONFIGS[profile]``; a test checks that the two agree."""
    if profile not in RECORDED_SWEEPS:
        raise ValueError(f"profile must be one of {sorted(RECORDED_SWEEPS)}, got {profile!r}")
    config = CONFIGS[profile]
    base = unswept(config.train)
    sw = RECORDED_SWEEPS[profile]
    started = replace(config, train=base, sweep=sw)
    options = RunOptions(show_progress=show_progress, cache=cache, resume=resume)
    _, report = sweep(started, options=options)
    # the configuration as far as it determines the weights (not its speed switches)
    train = fingerprints.plain(base, for_key=True)
    record = {"sweep": fingerprints.plain(sw), "train": train, "report": report}
    path = sweep_record_path(profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)  # never a half-written record
    return record


def load_sweep_record(profile: str) -> dict:
    """The record :func:`record_sweep` wrote for ``profile``."""
    path = sweep_record_path(profile)
    if not path.exists():
        rerun = f"modnets.experiments.fuzzy_boolean.record_sweep({profile!r})"
        raise FileNotFoundError(f"no sweep recorded for profile {profile!r} at {path}; run {rerun}")
    return json.loads(path.read_text())


def sweep(
    config: FuzzyBooleanConfig,
    data=None,
    options: RunOptions | None = None,
    **flags,
) -> tuple[FuzzyBooleanTrain, dict]:
    """Run ``config.sweep`` (see :class:`FuzzyBooleanSweep`): ``(train, report)``, where
    ``train`` is ``config.train`` with the chosen ``truncation``, ``type_dim``,
    ``straight_through`` and per-finetuning learning rates, and ``report`` holds every
    candidate's selection R^2 and routing, and every rate's selection R^2. Candidates and their
    finetunes are checkpointed like the experiment's own models (``fuzzy_boolean-pretrain``,
    ``fuzzy_boolean-<finetuning>``, seed ``config.sweep.seed``) on that seed's own task
    (:func:`for_seed`): the chosen ones *are* that seed's models, which :func:`trained_models`
    loads given ``for_seed(train, config.sweep.seed)``; ``options.resume`` continues an
    interrupted one (``options``: :class:`RunOptions`, or its fields by keyword). The sweep's
    seed is a selection seed, never a claim seed."""
    options = resolved(options, flags)
    sw, base = config.sweep, config.train
    if sw is None:
        return base, {}
    t = for_seed(base, sw.seed)  # the selection seed's own task
    data = load_data(t) if data is None else data
    pre_sel, new_sel = (selection_split(d, sw.selection_fraction) for d in data[:2])
    pre_fit, new_fit, fingerprint = fit_points(config, data)
    rows, models = [], []
    epochs = t.pretrain.epochs if sw.epochs is None else sw.epochs
    for cand in sw.candidates():
        tc = replace(
            t,
            model={**t.model, **cand},
            pretrain=replace(t.pretrain, epochs=epochs),
            finetune_lrs=(),
        )
        desc = f"sweep: {_label(cand)}"
        model, _ = pretrained(
            tc, sw.seed, pre_fit, fingerprint=fingerprint, desc=desc, options=options
        )
        r2 = evaluate(model, pre_sel).mean().item()
        routing = diagnostics.ni_routing(model, pre_sel.x_val[: config.routing_points])
        rows.append(
            {
                **cand,
                "r2": r2,
                "regime": routing["regime"],
                "modular_every_iteration": _modular_every_iteration(routing),
                "functions_used": routing["functions_used"],
                "routing_entropy": routing["routing_entropy"],
                "functions_per_token": routing["functions_per_token"],
            }
        )
        models.append((tc, model))
    best = choose_candidate(rows)
    tc, chosen_model = models[best]
    weights = copy.deepcopy(chosen_model.state_dict())
    lr_scores: dict = {}
    for finetuning in FINETUNINGS:
        lr_scores[finetuning] = {}
        for lr in sorted(sw.finetune_lrs):
            model, _ = finetuned(
                replace(tc, finetune_lrs=((finetuning, lr),)),
                finetuning,
                sw.seed,
                weights,
                new_fit,
                fingerprint=fingerprint,
                desc=f"sweep: finetune [{finetuning}] lr {lr:g}",
                options=options,
            )
            lr_scores[finetuning][lr] = evaluate(model, new_sel).mean().item()
    # the best rate per finetuning (ties: the smaller)
    lrs = tuple((r, max(v, key=lambda lr, v=v: (v[lr], -lr))) for r, v in lr_scores.items())
    chosen = {k: rows[best][k] for k in ("truncation", "type_dim", "straight_through")}
    report = {
        "candidates": rows,
        "chosen": chosen,
        "chosen_regime": rows[best]["regime"],
        "any_modular": any(r["regime"] == "modular" for r in rows),
        "finetune_lr_selection": {
            r: {str(lr): v for lr, v in d.items()} for r, d in lr_scores.items()
        },
        "finetune_lrs": dict(lrs),
        "epochs": epochs,
        "selection_points": len(pre_sel.x_val),
    }
    return replace(base, model={**base.model, **chosen}, finetune_lrs=lrs), report


def _modular_every_iteration(routing: dict) -> bool:
    """Modular routing at *every* function iteration: more than
    :data:`~modnets.diagnostics.COLLAPSED_FUNCTIONS` functions used and an entropy below
    :data:`~modnets.diagnostics.UNIFORM_ENTROPY` at each (``routing_regime`` calls routing
    modular unless *all* iterations are collapsed, or all uniform)."""
    return all(
        n > diagnostics.COLLAPSED_FUNCTIONS and h < diagnostics.UNIFORM_ENTROPY
        for n, h in zip(routing["functions_used"], routing["routing_entropy"], strict=True)
    )


def choose_candidate(rows: list[dict]) -> int:
    """The index of the sweep's choice among ``rows`` (``{"r2", "regime",
    "modular_every_iteration", ...}``): the highest selection R^2 among candidates whose routing
    is modular at every iteration; failing that, among those whose regime is modular; failing
    that, among all (ties: the first). Routing first: a candidate that fits better with
    collapsed or uniform routing gives re-routing nothing to act on."""
    if not rows:
        raise ValueError("rows is empty: the sweep has no candidates")
    strict = [i for i, r in enumerate(rows) if r.get("modular_every_iteration")]
    modular = [i for i, r in enumerate(rows) if r["regime"] == "modular"]
    return max(strict or modular or range(len(rows)), key=lambda i: (rows[i]["r2"], -i))


def _label(overrides: dict) -> str:
    return f"tau {overrides['truncation']:g}, type dim {overrides['type_dim']}" + (
        ", straight-through" if overrides["straight_through"] else ""
    )
