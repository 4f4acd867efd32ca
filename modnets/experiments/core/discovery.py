"""Finding the experiments: every package of :mod:`modnets.experiments` that exports
``EXPERIMENT`` (an :class:`~modnets.experiments.core.experiment.Experiment`) is one.

A researcher's own experiment is one package too: put it in ``modnets/experiments/``, or in a
folder named by ``MODNETS_EXPERIMENTS`` (folders separated by ``os.pathsep``), whose packages
join :mod:`modnets.experiments` (``python -m modnets.experiments <name>`` runs them; the
budget, chapter 13, the model registry and the rule checks find them), as timm finds a
registered model.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil

from modnets.experiments.core.experiment import Experiment
from modnets.experiments.core.rule import Rule

__all__ = [
    "EXTRA_PATH",
    "extra_folders",
    "list_experiments",
    "get",
    "all_rules",
    "rules_of",
]

#: The environment variable naming more folders of experiment packages.
EXTRA_PATH = "MODNETS_EXPERIMENTS"
#: The packages of modnets.experiments that are not experiments.
NOT_EXPERIMENTS = frozenset({"core"})


def extra_folders() -> list[str]:
    """The folders :data:`EXTRA_PATH` names, in order."""
    return [p for p in os.environ.get(EXTRA_PATH, "").split(os.pathsep) if p.strip()]


def _package():
    package = importlib.import_module("modnets.experiments")
    for folder in extra_folders():  # set after the package was imported (a test, a notebook)
        if folder not in package.__path__:
            package.__path__.append(folder)
    return package


@functools.cache
def _found(path: tuple[str, ...]) -> dict[str, Experiment]:
    found = {}
    for info in pkgutil.iter_modules(list(path)):
        if not info.ispkg or info.name in NOT_EXPERIMENTS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"modnets.experiments.{info.name}")
        experiment = getattr(module, "EXPERIMENT", None)
        if experiment is None:
            continue
        if not isinstance(experiment, Experiment):
            raise TypeError(
                f"modnets.experiments.{info.name}.EXPERIMENT must be an Experiment, "
                f"got {type(experiment).__name__}"
            )
        if experiment.name != info.name:
            raise ValueError(
                f"modnets.experiments.{info.name}.EXPERIMENT is named {experiment.name!r}; "
                "an experiment is named after its package"
            )
        found[info.name] = experiment
    return found


def _all() -> dict[str, Experiment]:
    return _found(tuple(_package().__path__))


def list_experiments() -> list[str]:
    """The experiments' names in the book's order (by chapter; those without one last, by
    name)."""
    found = _all().values()
    return [e.name for e in sorted(found, key=lambda e: (not e.chapter, e.chapter, e.name))]


def get(name: str) -> Experiment:
    """The experiment ``name`` (a package of :mod:`modnets.experiments`)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be an experiment's name (a str), got {type(name).__name__}")
    found = _all()
    if name not in found:
        raise ValueError(f"no experiment {name!r}; there are {list_experiments()}")
    return found[name]


def all_rules() -> dict[str, Rule]:
    """Every experiment's rules, by id, in the experiments' order."""
    return {i: r for name in list_experiments() for i, r in get(name).rules.items()}


def rules_of(experiment: str) -> dict[str, Rule]:
    """The rules of ``experiment``, by id, in the order it reports them."""
    return dict(get(experiment).rules)
