"""The experiment protocol: what an experiment declares, and the one run every experiment shares.

An experiment is one package of :mod:`modnets.experiments` whose ``__init__`` exports
``EXPERIMENT``, an :class:`Experiment`. It declares what is its own:

* ``configs``: its configuration per profile (``smoke``, ``cpu``, ``gpu``);
* ``measure(config, options)``: trains its models at every claim seed and measures them,
  returning a :class:`Measurement` (the models' per-seed numbers, the per-seed diagnostics, the
  configuration as run and its selection seeds);
* ``regime(results)`` and ``claims(results)``: what the claims presuppose of the trained models,
  and the claims, both read from the results as they will be written (``config``, ``models``,
  ``diagnostics`` and, for ``claims``, ``regime``);
* ``summarise(config, models, diagnostics)``: the summaries over seeds, computed from the
  per-seed entries ``measure`` returned, as a results file holds them (plain JSON): so results
  measured one seed at a time, in other processes or on other machines, combine into the
  results of their seeds (:mod:`modnets.experiments.core.evidence`). ``config`` is the run's
  configuration, or the profile's where seed records are combined (before any choice a run
  makes on its selection seeds), so the summaries read what they need from the entries;
* ``rules``: the rules that decide its claims (:mod:`modnets.experiments.core.rules` pins them);
* ``dry_run(config)``: one training step of each model on a tiny batch (the budget and the
  smoke checks use it); ``summary(results)``: the plain-text table the command line prints.

:func:`run` does the rest, the same for every experiment: the profile and its configuration,
the device, the worker processes, then measure → summarise → regime → claims → the results
file's schema.
:mod:`modnets.experiments.core.discovery` finds the packages; the command line, the budget, the
model registry and chapter 13 iterate what it finds.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modnets.experiments.core import harness
from modnets.experiments.core.fingerprints import plain
from modnets.experiments.core.options import RunOptions, resolved
from modnets.experiments.core.rule import Rule
from modnets.profiles import get_profile, select

__all__ = [
    "RunOptions",
    "RegisteredModel",
    "Measurement",
    "Experiment",
    "PARTS",
    "run",
    "decided",
]


@dataclass(frozen=True)
class RegisteredModel:
    """A model of an experiment that :func:`modnets.create_model` offers by name
    (``<name>_<profile>``): ``build(config, **overrides)`` makes it, untrained, from the
    experiment's configuration of a profile (``overrides``: fields of its model configuration);
    ``example(config, batch)`` makes a batch of the inputs it reads; ``what`` says what it is.
    ``bench``: its name in the benchmarks of training steps, which time it as ``train(config)``
    (the ``TrainConfig`` the experiment trains it with) says; ``""``: not benchmarked."""

    build: Callable[..., Any]
    example: Callable[[Any, int], Any]
    what: str
    bench: str = ""
    train: Callable[[Any], Any] | None = None


@dataclass
class Measurement:
    """What an experiment measured: ``models`` (per model, ``per_seed`` numbers and their
    summaries), ``diagnostics``, the configuration as run (after any selection) and the seeds
    any choice was made on (never claim seeds)."""

    models: dict
    diagnostics: dict
    config: Any
    selection_seeds: Sequence[int] = ()


#: The names an experiment package exports (its ``__init__``, re-exporting its files' public
#: names), and the :class:`Experiment` field each fills. The title is its docstring's first line.
PARTS = {
    "NAME": "name",
    "SOURCE_PAPER": "paper",
    "CHAPTER": "chapter",
    "CONFIGS": "configs",
    "measure": "measure",
    "regime": "regime",
    "claims": "claims",
    "summarise": "summarise",
    "format_summary": "summary",
    "dry_run": "dry_run",
    "RULES": "rules",
    "TRAIN_CODE": "code",
}
#: The names it may export.
OPTIONAL_PARTS = {
    "REGISTERED": "registered",
    "DATA_FOLDERS": "data_folders",
    "ZERO_GRAD_AT_INIT": "zero_grad_at_init",
    "GPU_COMMAND": "gpu_command",
    "train_seeds": "train_seeds",
    "SELECTED_SETTINGS": "selected_settings",
}


@dataclass(frozen=True)
class Experiment:
    """One experiment, as its package declares it (see the module docstring).

    ``paper``: the paper whose claims it tests (chapter 13 groups by it; ``""`` for an experiment
    of our own questions only); ``chapter``: the book's notebook that runs it (``""`` for none;
    the experiments are listed in the book's order). ``code``: what its trained models depend
    on (the provenance's code fingerprint). ``registered``: its models the model registry
    offers, by name (:class:`RegisteredModel`).
    ``data_folders``: the folders below the data root it reads (none: it makes its own data).
    ``zero_grad_at_init``: parameter-name substrings that get no gradient at initialisation,
    with the reason. ``gpu_command``: the command that runs it at the papers' scale, where it is
    not the plain one. ``train_seeds(config, options)``: trains the models of all of
    ``config``'s seeds into the checkpoints ``measure`` loads, side by side in
    ``options.workers`` processes (an evidence run calls it with a whole seed set, then measures
    seed by seed); for an experiment whose seeds train best beside each other's.
    ``selected_settings``: the configuration fields ``measure`` chooses on the selection seeds
    (a field, or a dotted path into one: ``"train.model.type_dim"``), so that a seed record's
    may differ from its profile's there (and nowhere else)."""

    name: str
    title: str
    paper: str
    chapter: str
    configs: Mapping[str, Any]
    measure: Callable[[Any, RunOptions], Measurement]
    regime: Callable[[dict], dict]
    claims: Callable[[dict], list]
    summarise: Callable[[Any, dict, dict], tuple[dict, dict]]
    summary: Callable[[dict], str]
    dry_run: Callable[[Any], list]
    rules: Mapping[str, Rule]
    code: Sequence = ()
    registered: Mapping[str, RegisteredModel] = field(default_factory=dict)
    data_folders: tuple[str, ...] = ()
    zero_grad_at_init: Mapping[str, str] = field(default_factory=dict)
    gpu_command: str = ""
    train_seeds: Callable[[Any, RunOptions], None] | None = None
    selected_settings: tuple[str, ...] = ()

    def __post_init__(self):
        missing = [p for p in ("smoke", "cpu", "gpu") if p not in self.configs]
        if missing:
            raise ValueError(f"experiment {self.name!r}: configs lacks the profiles {missing}")
        foreign = [r.id for r in self.rules.values() if r.experiment != self.name]
        if foreign:
            raise ValueError(f"experiment {self.name!r}: rules {foreign} name another experiment")

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]) -> Experiment:
        """The experiment a package declares by the names it exports (:data:`PARTS`, and
        :data:`OPTIONAL_PARTS` where it has them): ``Experiment.from_namespace(globals())`` at
        the end of its ``__init__``."""
        missing = [n for n in PARTS if n not in namespace]
        if missing or not namespace.get("__doc__"):
            where = namespace.get("__name__", "the package")
            missing += [] if namespace.get("__doc__") else ["a docstring (its title)"]
            raise ValueError(f"{where} must define {missing} to declare an experiment")
        parts = {f: namespace[n] for n, f in PARTS.items()}
        parts |= {f: namespace[n] for n, f in OPTIONAL_PARTS.items() if n in namespace}
        title = namespace["__doc__"].strip().split("\n\n")[0]
        return cls(title=" ".join(title.split()).rstrip("."), **parts)

    @property
    def command(self) -> str:
        """The command that runs it at the papers' scale."""
        return self.gpu_command or f"python -m modnets.experiments.{self.name} --profile gpu"

    def run(self, config=None, profile: str | None = None, options=None, **flags) -> dict:
        """:func:`run` of this experiment."""
        return run(self, config, profile, options, **flags)


def run(
    experiment: Experiment,
    config=None,
    profile: str | None = None,
    options: RunOptions | None = None,
    **flags,
) -> dict:
    """The whole experiment at every claim seed; the results in the harness schema (plain JSON).

    ``config`` defaults to the experiment's configuration for ``profile`` (default:
    ``MODNETS_PROFILE``). ``options`` (:class:`RunOptions`), or its fields by keyword
    (``show_progress=False``, ``workers=2``). ``measure`` gets them resolved: the device and the
    number of worker processes set."""
    options = resolved(options, flags)
    start = time.perf_counter()
    profile = get_profile(profile)
    config = select(experiment.configs, profile) if config is None else config
    workers = harness.workers_for(options.workers, profile, options.device)
    options = dataclasses.replace(options, workers=workers)
    measured = experiment.measure(config, options)
    return decided(experiment, profile, measured, harness.provenance(start, experiment.code))


def as_written(obj):
    """``obj`` as a results file holds it: plain JSON (string keys, lists)."""
    return json.loads(json.dumps(plain(obj), allow_nan=True))


def decided(
    experiment: Experiment,
    profile: str,
    measured: Measurement,
    provenance: dict,
    *,
    written_config: dict | None = None,
) -> dict:
    """The results of ``measured`` (its per-seed entries): their summaries over seeds, the
    regime and the claims, in the harness schema (plain JSON). Each reads the results as the
    file will hold them (string keys), so a results file, or per-seed records combined, decide
    as the run did. ``written_config``: the configuration as the file holds it, where it is not
    ``measured.config``'s (records combined: the configuration as their seeds ran)."""
    models, diagnostics = experiment.summarise(
        measured.config, as_written(measured.models), as_written(measured.diagnostics)
    )
    config = as_written(measured.config) if written_config is None else written_config
    parts = {"config": config, "models": models, "diagnostics": diagnostics}
    results = as_written(parts)
    results["regime"] = experiment.regime(results)
    return harness.results_dict(
        experiment.name,
        profile,
        config=config,
        seeds=config["seeds"],
        models=models,
        diagnostics=diagnostics,
        claims=experiment.claims(results),
        provenance=provenance,
        selection_seeds=measured.selection_seeds,
        regime=results["regime"],
    )
