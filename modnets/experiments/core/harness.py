"""What every experiment shares: load-or-train, fingerprints, seeds, the results schema.

An experiment module keeps only what is its own (building its models, one training step,
evaluation, analyses, its ``PAPER`` table and ``claims``); this module does the rest:

* :func:`load_or_train` -- one path from a configuration to a trained model, for the chapters and
  the command line alike. The checkpoint key hashes the *training* part of the configuration
  whole, the seed, a fingerprint of the data files read and a fingerprint of the library code the
  model depends on; the analysis part is never hashed. A checkpoint that does not fit the model
  is retrained with a warning.
* :func:`seed_stats` -- mean, sd and the 95 % t-interval over seeds (``scipy.stats``).
* :func:`results_dict` / :data:`SCHEMA` -- one results schema for every experiment.
* :func:`dry_run` -- one training step of a configuration on tiny inputs of the real shapes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from modnets import distributed, parallel
from modnets.experiments.core.fingerprints import (
    checkpoint_key,
    code_fingerprint,
    data_fingerprint,
    plain,
)
from modnets.experiments.core.options import RunOptions
from modnets.experiments.core.stats import per_seed, seed_stats
from modnets.training import CheckpointError, checkpoint_dir, fit, save_checkpoint
from modnets.utils import seed_everything

#: The keys of every experiment's results, in this order.
__all__ = [
    "SCHEMA",
    "code_fingerprint",
    "data_fingerprint",
    "checkpoint_key",
    "load_or_train",
    "Stage",
    "workers_for",
    "train_ahead",
    "seed_stats",
    "per_seed",
    "provenance",
    "results_dict",
    "check_results",
    "regime",
    "DryRun",
    "dry_run",
]

SCHEMA = (
    "experiment",
    "profile",
    "config",
    "seeds",
    "selection_seeds",
    "regime",
    "models",
    "diagnostics",
    "claims",
    "provenance",
)

CHECKPOINT_FORMAT = "modnets-model-v2"


def load_or_train(
    name: str,
    train_config,
    seed: int,
    build: Callable[[], nn.Module],
    train: Callable[..., dict],
    *,
    code: Sequence,
    data: str,
    options: RunOptions | None = None,
    desc: str = "training",
    extra: bool = False,
) -> tuple:
    """The trained model ``name`` at ``seed``: loaded from its checkpoint, or trained and saved.

    ``build()`` makes the untrained model (called after seeding with ``seed``);
    ``train(model, stage)`` trains it in place and returns its history: ``stage`` (a
    :class:`Stage` named ``desc``) says where :func:`modnets.training.fit` keeps its resumable
    state, and calls it. ``code``
    lists what the model's training depends on (see :func:`code_fingerprint`), ``data`` is the
    data fingerprint (:func:`data_fingerprint`). ``options`` (:class:`RunOptions`): the device
    (``None``: where ``build`` puts it), ``cache=False`` trains without reading or writing
    checkpoints, ``resume`` goes on from an interrupted training's state. Under ``torchrun``
    every rank trains; only rank 0 writes.

    ``extra=True``: ``train`` returns ``(history, extra)``, where ``extra`` is whatever else is
    worth keeping with the model (e.g. the digits experiment's pretraining snapshots); it is
    stored in the checkpoint and returned third, ``(model, history, extra)``. A checkpoint
    without one is retrained.
    """
    options = RunOptions() if options is None else options
    device, cache, resume = options.device, options.cache, options.resume
    key = checkpoint_key(name, train_config, seed, data, code_fingerprint(*code))
    path = checkpoint_dir() / f"{name}_{key}.pt"

    def fresh() -> nn.Module:
        seed_everything(seed)
        model = build()
        return model if device is None else model.to(device)

    model = fresh()
    if cache and path.exists():
        try:
            state = torch.load(path, map_location=device or "cpu", weights_only=True)
            if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
                raise CheckpointError(f"{path} is not a {CHECKPOINT_FORMAT} checkpoint")
            if extra and "extra" not in state:
                raise CheckpointError(f"{path} holds no extra (saved without extra=True)")
            model.load_state_dict(state["model"])
            return (model, state["history"], state["extra"]) if extra else (model, state["history"])
        except Exception as err:  # truncated, foreign, or another shape: train afresh
            warnings.warn(
                f"checkpoint {path} does not fit this model ({str(err)[:200]}); retraining",
                stacklevel=2,
            )
            model = fresh()
    state_path = path.with_suffix(".train.pt") if cache else None
    seed_everything(seed)
    stage = Stage(desc, seed, options.show_progress, state_path, resume)
    history = train(model, stage)
    history, kept = history if extra else (history, None)
    if cache and distributed.is_main():
        state = {
            "format": CHECKPOINT_FORMAT,
            "name": name,
            "key": key,
            "model": model.state_dict(),
            "history": history,
        }
        save_checkpoint({**state, "extra": kept} if extra else state, path)
        state_path.unlink(missing_ok=True)  # the finished model replaces its training state
    distributed.barrier()
    return (model, history, kept) if extra else (model, history)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One model's training, as :func:`load_or_train` hands it to an experiment's ``train``:
    its name in the progress bar and the saved state, its seed, and where its resumable state
    lives (``state_path``; ``None``: nowhere) and whether it goes on from there."""

    desc: str = "training"
    seed: int = 0
    show_progress: bool = True
    state_path: Path | None = None
    resume: bool = False

    def fit(self, model: nn.Module, step: Callable, config, **how) -> dict:
        """:func:`modnets.training.fit` of ``model`` with ``step`` and ``config`` (a
        ``TrainConfig``) as this stage says; ``how``: fit's other arguments (``n`` or
        ``batches``, ``evaluate``, ...). The saved state names the stage unless ``how`` gives a
        ``state_config``."""
        how.setdefault("state_config", {"stage": self.desc})
        return fit(
            model,
            step,
            config,
            desc=self.desc,
            show_progress=self.show_progress,
            seed=self.seed,
            state_path=self.state_path,
            resume=self.resume,
            **how,
        )


def workers_for(workers: int | None, profile: str, device) -> int:
    """The processes an experiment trains its independent models in
    (:func:`modnets.parallel.map_tasks`): ``workers`` where given; else one under ``torchrun``
    and at ``smoke`` (a process's start-up would cost more than its seconds of training), and
    :func:`modnets.parallel.default_workers` otherwise."""
    if workers is not None:
        return workers
    if distributed.is_distributed() or profile == "smoke":
        return 1
    return parallel.default_workers(device)


def train_ahead(
    train: Callable,
    tasks: Sequence,
    options: RunOptions,
    desc: str,
    *,
    whole_rounds: bool = False,
) -> list | None:
    """``train(task)`` for every task, side by side in ``options.workers`` processes, into the
    checkpoints that the experiment's own loop then loads (the loop times in this process,
    where its timings are not shared with a neighbour); the tasks' results, in order. Nothing
    (``None``) with one worker or without checkpoints (``cache=False``): the loop then trains.

    ``whole_rounds``: for tasks of equal cost, only as many as fill every worker in each round;
    the rest (fewer than ``workers``) are left to the loop, which trains them with every thread
    instead of leaving cores idle."""
    workers = options.workers or 1
    if whole_rounds and workers > 1:
        tasks = tasks[: len(tasks) - len(tasks) % workers]
    if options.cache and workers > 1 and len(tasks) > 1:
        return parallel.map_tasks(train, tasks, workers, desc, options.show_progress)
    return None


def provenance(start: float, code: Sequence = ()) -> dict:
    """Where and how the results were made: code fingerprint, versions, device, wall time."""
    device = distributed.local_device() if distributed.is_distributed() else None
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "code_fingerprint": code_fingerprint(*code) if code else code_fingerprint("modnets"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": f"{device.type}: {name or platform.machine()}",
        "threads": torch.get_num_threads(),
        "world_size": distributed.world_size(),
        "wall_seconds": time.perf_counter() - start,
    }


def results_dict(
    experiment: str,
    profile: str,
    config,
    seeds: Sequence[int],
    models: dict,
    diagnostics: dict,
    claims: list,
    provenance: dict,
    *,
    selection_seeds: Sequence[int] = (),
    regime: dict | None = None,
) -> dict:
    """The results of one experiment in :data:`SCHEMA` (plain JSON throughout).

    ``selection_seeds``: the seeds any choice of the configuration was made on (sweeps, learning
    rates); never claim seeds. ``regime``: what the claims presuppose of the trained models
    (``{"required", "reached", "shortfall", "measured"}``). At ``smoke`` every claim is ``not
    testable here`` (:data:`SMOKE_REASON`), its numbers kept."""
    claims = [c if isinstance(c, dict) else c.as_dict() for c in claims]
    if profile == "smoke":
        claims = [_at_smoke(c) for c in claims]
    out = {
        "experiment": experiment,
        "profile": profile,
        "config": plain(config),
        "seeds": list(seeds),
        "selection_seeds": list(selection_seeds),
        "regime": plain(regime if regime is not None else {}),
        "models": plain(models),
        "diagnostics": plain(diagnostics),
        "claims": claims,
        "provenance": provenance,
    }
    check_results(out)
    return out


#: Why no claim is decided at the ``smoke`` profile.
SMOKE_REASON = "not testable at smoke: the smoke profile proves the code paths and decides nothing"


def _at_smoke(claim: dict) -> dict:
    """``claim`` (a dict) as the smoke profile reports it: not testable, its numbers kept."""
    verdicts = dict.fromkeys(("verdict", "verdict_holm"), "not testable here")
    return {**claim, **verdicts, "reason": SMOKE_REASON}


#: What every results file's ``regime`` holds.
REGIME_FIELDS = ("required", "reached", "shortfall", "measured")


def check_results(results: dict) -> None:
    """Raise ``ValueError`` unless ``results`` has exactly the keys of :data:`SCHEMA`, plain JSON
    values (no models or tensors), claims with every field, disjoint claim and selection seeds
    and a ``regime``."""
    from modnets.experiments.core.claims import CLAIM_FIELDS, VERDICTS

    if not isinstance(results, dict) or tuple(results) != SCHEMA:
        got = tuple(results) if isinstance(results, dict) else type(results).__name__
        raise ValueError(f"results must have the keys {SCHEMA} in order, got {got}")
    try:
        json.dumps(results, allow_nan=True)
    except TypeError as err:
        raise ValueError(f"results must be plain JSON (no live objects): {err}") from None
    shared = set(results["seeds"]) & set(results["selection_seeds"])
    if shared:
        raise ValueError(f"seeds {sorted(shared)} are both claim and selection seeds")
    missing = [f for f in REGIME_FIELDS if f not in results["regime"]]
    if missing:
        raise ValueError(f"regime lacks {missing}")
    for c in results["claims"]:
        missing = [f for f in CLAIM_FIELDS if f not in c]
        if missing:
            raise ValueError(f"claim {c.get('id', '?')!r} lacks {missing}")
        if c["verdict"] not in VERDICTS:
            raise ValueError(f"claim {c['id']!r} has verdict {c['verdict']!r}; allowed {VERDICTS}")


def regime(
    required: str, checks: dict[str, tuple[float, float, str]], mechanisms: Sequence = ()
) -> dict:
    """A results file's ``regime``: ``checks`` maps a name to ``(measured, bar, direction)``
    (``">="`` or ``"<="``), each measured value the worst over seeds; ``reached`` when every
    check holds, ``shortfall`` naming those that do not. ``mechanisms``: the
    :class:`~modnets.experiments.core.mechanism.Mechanism` checks of the parts the claims are
    about (a claim whose part is unused is not testable, whatever ``reached`` says)."""
    failed = []
    for name, (value, bar, direction) in checks.items():
        ok = value >= bar if direction == ">=" else value <= bar
        if not (ok and math.isfinite(value)):
            failed.append(f"{name} {value:.4g} (needs {direction} {bar:.4g})")
    measured = {k: {"value": v, "bar": b, "direction": d} for k, (v, b, d) in checks.items()}
    return {
        "required": required,
        "reached": not failed,
        "shortfall": "; ".join(failed),
        "measured": measured,
        "mechanisms": [m.as_dict() for m in mechanisms],
    }


@dataclasses.dataclass
class DryRun:
    """One model of an experiment, ready for one training step: ``loss(model)`` computes the
    experiment's own training loss on a tiny batch of the real input shapes."""

    name: str
    model: nn.Module
    loss: Callable[[nn.Module], torch.Tensor]
    samples: int = 2  # examples in the batch ``loss`` uses
    batch_size: int = 0  # the configured training batch (0: not given)
    steps: int = 0  # optimiser steps of one full training of this model at one seed (0: not given)
    # the loss on the first n examples (n <= samples), given where part of a step's cost does not
    # grow with the batch (a NAC's circuit): the budget then measures two batch sizes
    loss_on: Callable[[nn.Module, int], torch.Tensor] | None = None

    def seeded_loss(self, model: nn.Module, n: int | None = None) -> torch.Tensor:
        """``loss(model)`` (``loss_on(model, n)`` with ``n``), its random draws (dropout,
        DropPath, augmentation) from seed 0: the same on every dry run, the caller's random state
        untouched."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return self.loss(model) if n is None else self.loss_on(model, n)


def dry_run(experiment, profile: str = "gpu") -> dict[str, dict]:
    """Build every model of ``experiment``'s ``profile`` configuration (on the CPU) and take one
    training step each: the loss must be finite and every trainable parameter must get a
    gradient, except those the experiment lists in ``zero_grad_at_init`` (name substring ->
    reason).

    Returns ``{name: {"loss", "parameters", "zero_grad": [names], "seconds"}}``; raises
    ``AssertionError`` naming what failed. ``experiment`` (an
    :class:`~modnets.experiments.core.experiment.Experiment`) provides
    ``dry_run(config) -> [DryRun]``.
    """
    config = experiment.configs[profile]
    allowed = experiment.zero_grad_at_init
    name = f"modnets.experiments.{experiment.name}"
    report = {}
    for part in experiment.dry_run(config):
        t0 = time.perf_counter()
        model = part.model.train()
        loss = part.seeded_loss(model)
        if not torch.isfinite(loss).all():
            raise AssertionError(f"{name} {part.name}: loss {loss} is not finite")
        loss.backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        zero = [
            n
            for n, p in model.named_parameters()
            if p.requires_grad and p.grad is not None and not p.grad.any()
        ]
        unexplained = [n for n in missing + zero if not any(k in n for k in allowed)]
        if unexplained:
            raise AssertionError(
                f"{name} {part.name}: no gradient reaches "
                f"{unexplained[:8]} ({len(unexplained)} parameters)"
            )
        bad = [
            n
            for n, p in model.named_parameters()
            if p.grad is not None and not torch.isfinite(p.grad).all()
        ]
        if bad:
            raise AssertionError(f"{name} {part.name}: non-finite gradients in {bad[:8]}")
        report[part.name] = {
            "loss": loss.item(),
            "zero_grad": missing + zero,
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": time.perf_counter() - t0,
        }
    return report
