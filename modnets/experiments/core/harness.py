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

import ast
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import platform
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from scipy import stats
from torch import nn

from modnets import distributed, parallel
from modnets.training import CheckpointError, checkpoint_dir, save_checkpoint
from modnets.utils import seed_everything

__all__ = [
    "SCHEMA",
    "code_fingerprint",
    "data_fingerprint",
    "checkpoint_key",
    "load_or_train",
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

#: The keys of every experiment's results, in this order.
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


# ----------------------------------------------------------------------------- fingerprints


@functools.cache
def _module_closure(name: str) -> tuple[str, ...]:
    """``name`` and every ``modnets`` module it imports, transitively (read from the source, so
    nothing is executed), sorted."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        try:
            spec = importlib.util.find_spec(mod)
        except (ModuleNotFoundError, ValueError):  # "from modnets.x import SomeClass"
            continue
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        seen.add(mod)
        tree = ast.parse(Path(spec.origin).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("modnets")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith("modnets"):
                    # "from modnets import distributed" imports a submodule, not the package's
                    # __init__ (which imports every architecture); "from modnets.ni import X"
                    # imports the module itself
                    subs = [f"{node.module}.{a.name}" for a in node.names]
                    found = [m for m in subs if _is_module(m)]
                    todo += found
                    if len(found) < len(subs):
                        todo.append(node.module)
    return tuple(sorted(seen))


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def _referenced(fn: Callable) -> list[Callable]:
    """The functions and classes of ``fn``'s own module that ``fn`` names (transitively), so
    that a helper a training step calls is hashed with it."""
    module = inspect.getmodule(fn)
    out, todo, seen = [], [fn], set()
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        out.append(f)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                obj = getattr(module, node.id, None)
                if (inspect.isfunction(obj) or inspect.isclass(obj)) and inspect.getmodule(
                    obj
                ) is module:
                    todo.append(obj)
    return out


def _import_name(obj: Callable) -> str:
    """The name ``obj``'s module is imported by, also where it runs as ``python -m`` (there its
    ``__module__`` is ``"__main__"``): the CLI and the library then share checkpoints."""
    name = obj.__module__
    if name == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        name = name if spec is None else spec.name
    return name


def code_fingerprint(*parts: ModuleType | str | Callable) -> str:
    """A hash of the library code a trained model depends on.

    Each part is a module (or its dotted name), hashed with every ``modnets`` module it imports,
    or a function or class, hashed by its own source and that of every function or class of its
    module it names, transitively (an experiment's model builder and training step with their
    helpers, without the rest of the module, so that a change to an analysis retrains nothing).
    """
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, str | ModuleType):
            name = part if isinstance(part, str) else part.__name__
            for mod in _module_closure(name):
                origin = importlib.util.find_spec(mod).origin
                h.update(mod.encode() + b"\0" + Path(origin).read_bytes() + b"\0")
        elif callable(part):
            for f in _referenced(part):
                h.update(f"{_import_name(f)}.{f.__qualname__}".encode() + b"\0")
                h.update(inspect.getsource(f).encode() + b"\0")
        else:
            raise TypeError(
                f"code parts must be modules, module names or functions, got {type(part).__name__}"
            )
    return h.hexdigest()[:16]


def data_fingerprint(*paths: str | os.PathLike) -> str:
    """A hash of the data files read: each file's path (relative to what was given) and size;
    a folder stands for every file below it. A missing path hashes as missing, so a checkpoint
    trained on a subset is not reused once more files (a full download) are there."""
    h = hashlib.sha256()
    for p in paths:
        p = Path(p)
        h.update(str(p.name).encode() + b"\0")
        if p.is_file():
            h.update(str(p.stat().st_size).encode())
        elif p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for f in sorted(files):
                    full = Path(root) / f
                    h.update(f"{full.relative_to(p)}:{full.stat().st_size}\n".encode())
        else:
            h.update(b"<missing>")
    return h.hexdigest()[:16]


def _plain(obj, for_key: bool = False):
    """A configuration as plain JSON types (dataclasses, tuples, paths). ``for_key`` leaves out
    the dataclass fields marked ``metadata={"key": False}`` (they do not change the weights)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: _plain(getattr(obj, f.name), for_key)
            for f in dataclasses.fields(obj)
            if not (for_key and f.metadata.get("key", True) is False)
        }
    if isinstance(obj, dict):
        return {str(k): _plain(v, for_key) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v, for_key) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _config_classes(obj) -> list[type]:
    """The dataclass types inside a configuration (their methods, e.g. ``model_config``, decide
    the model as much as their fields do)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = [type(obj)]
        for f in dataclasses.fields(obj):
            out += _config_classes(getattr(obj, f.name))
        return out
    if isinstance(obj, dict | list | tuple):
        return [
            c for v in (obj.values() if isinstance(obj, dict) else obj) for c in _config_classes(v)
        ]
    return []


def checkpoint_key(name: str, train_config, seed: int, data: str, code: str) -> str:
    """The checkpoint key: a hash of ``name``, the whole training configuration (its values and
    the source of its dataclasses), the seed and the data and code fingerprints."""
    classes = sorted({c for c in _config_classes(train_config)}, key=lambda c: c.__qualname__)
    sources = [inspect.getsource(c) for c in classes]
    blob = json.dumps(
        {
            "name": name,
            "train": _plain(train_config, for_key=True),
            "seed": seed,
            "data": data,
            "code": code,
            "config_code": sources,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- load or train


def load_or_train(
    name: str,
    train_config,
    seed: int,
    build: Callable[[], nn.Module],
    train: Callable[..., dict],
    *,
    code: Sequence,
    data: str,
    device=None,
    cache: bool = True,
    resume: bool = False,
    extra: bool = False,
) -> tuple:
    """The trained model ``name`` at ``seed``: loaded from its checkpoint, or trained and saved.

    ``build()`` makes the untrained model (called after seeding with ``seed``);
    ``train(model, state_path, resume)`` trains it in place and returns its history
    (``state_path`` is where :func:`modnets.training.fit` keeps its resumable state). ``code``
    lists what the model's training depends on (see :func:`code_fingerprint`), ``data`` is the
    data fingerprint (:func:`data_fingerprint`). ``cache=False`` trains without reading or
    writing checkpoints. Under ``torchrun`` every rank trains; only rank 0 writes.

    ``extra=True``: ``train`` returns ``(history, extra)``, where ``extra`` is whatever else is
    worth keeping with the model (e.g. the digits experiment's pretraining snapshots); it is
    stored in the checkpoint and returned third, ``(model, history, extra)``. A checkpoint
    without one is retrained.
    """
    key = checkpoint_key(name, train_config, seed, data, code_fingerprint(*code))
    path = checkpoint_dir() / f"{name}_{key}.pt"

    def fresh() -> nn.Module:
        seed_everything(seed)
        model = build()
        return model if device is None else model.to(device)

    model = fresh()
    if cache and path.exists():
        try:
            state = torch.load(path, map_location=device or "cpu", weights_only=False)
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
    history = train(model, state_path, resume)
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
    workers: int,
    cache: bool,
    desc: str,
    show_progress: bool = True,
    whole_rounds: bool = False,
) -> None:
    """``train(task)`` for every task, side by side in ``workers`` processes, into the
    checkpoints that the experiment's own loop then loads (the loop analyses in this process,
    where its timings are not shared with a neighbour). Nothing with one worker or without
    checkpoints (``cache=False``): the loop then trains.

    ``whole_rounds``: for tasks of equal cost, only as many as fill every worker in each round;
    the rest (fewer than ``workers``) are left to the loop, which trains them with every thread
    instead of leaving cores idle."""
    if whole_rounds:
        tasks = tasks[: len(tasks) - len(tasks) % workers]
    if cache and workers > 1 and len(tasks) > 1:
        parallel.map_tasks(train, tasks, workers, desc, show_progress)


# ----------------------------------------------------------------------------- seeds


def seed_stats(values: Iterable[float], confidence: float = 0.95) -> dict:
    """``{"mean", "sd", "n", "ci", "values"}`` over seeds: ``sd`` with one degree of freedom
    removed, ``ci`` the ``confidence`` t-interval of the mean (``scipy.stats.t``; ``None`` with
    fewer than two values)."""
    v = np.asarray([float(x) for x in values], dtype=float)
    if v.size == 0:
        raise ValueError("seed_stats needs at least one value")
    mean = float(v.mean())
    sd = float(v.std(ddof=1)) if v.size > 1 else 0.0
    ci = None
    if v.size > 1:
        if sd == 0.0:
            ci = [mean, mean]
        else:
            lo, hi = stats.t.interval(
                confidence, v.size - 1, loc=mean, scale=sd / math.sqrt(v.size)
            )
            ci = [float(lo), float(hi)]
    return {"mean": mean, "sd": sd, "n": int(v.size), "ci": ci, "values": v.tolist()}


def per_seed(runs: Sequence[dict], *path) -> list:
    """``[run[path[0]][path[1]]... for run in runs]``: one value per seed."""
    out = []
    for r in runs:
        for p in path:
            r = r[p]
        out.append(r)
    return out


def fmt(s: dict, scale: float = 1.0, digits: int = 3, n: bool = True) -> str:
    """``"mean ± sd (n=seeds)"`` of a :func:`seed_stats` dict (``n=False``: without the count)."""
    out = f"{scale * s['mean']:.{digits}f} ± {scale * s['sd']:.{digits}f}"
    return f"{out} (n={s['n']})" if n else out


# ----------------------------------------------------------------------------- results


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
        "config": _plain(config),
        "seeds": list(seeds),
        "selection_seeds": list(selection_seeds),
        "regime": _plain(regime if regime is not None else {}),
        "models": _plain(models),
        "diagnostics": _plain(diagnostics),
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
    from modnets.experiments.claims import CLAIM_FIELDS, VERDICTS

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


def regime(required: str, checks: dict[str, tuple[float, float, str]]) -> dict:
    """A results file's ``regime``: ``checks`` maps a name to ``(measured, bar, direction)``
    (``">="`` or ``"<="``), each measured value the worst over seeds; ``reached`` when every
    check holds, ``shortfall`` naming those that do not."""
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
    }


def import_experiment(name: str) -> ModuleType:
    """``modnets.experiments.<name>``."""
    return importlib.import_module(f"modnets.experiments.{name}")


# ----------------------------------------------------------------------------- the gpu dry run


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


def dry_run(module: ModuleType | str, profile: str = "gpu") -> dict[str, dict]:
    """Build every model of an experiment's ``profile`` configuration (on the CPU) and take one
    training step each: the loss must be finite and every trainable parameter must get a
    gradient, except those the module lists in ``ZERO_GRAD_AT_INIT`` (name substring -> reason).

    Returns ``{name: {"loss", "parameters", "zero_grad": [names], "seconds"}}``; raises
    ``AssertionError`` naming what failed. The module provides ``dry_run(config) -> [DryRun]``.
    """
    module = import_experiment(module) if isinstance(module, str) else module
    config = module.CONFIGS[profile]
    allowed = getattr(module, "ZERO_GRAD_AT_INIT", {})
    report = {}
    for part in module.dry_run(config):
        t0 = time.perf_counter()
        model = part.model.train()
        loss = part.loss(model)
        if not torch.isfinite(loss).all():
            raise AssertionError(f"{module.__name__} {part.name}: loss {loss} is not finite")
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
                f"{module.__name__} {part.name}: no gradient reaches "
                f"{unexplained[:8]} ({len(unexplained)} parameters)"
            )
        bad = [
            n
            for n, p in model.named_parameters()
            if p.grad is not None and not torch.isfinite(p.grad).all()
        ]
        if bad:
            raise AssertionError(
                f"{module.__name__} {part.name}: non-finite gradients in {bad[:8]}"
            )
        report[part.name] = {
            "loss": loss.item(),
            "zero_grad": missing + zero,
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": time.perf_counter() - t0,
        }
    return report
