"""Records that no longer stand, and how they are made to stand again.

A seed record (:mod:`modnets.experiments.core.evidence`) is sealed, so an edited number is
caught, and it names the code and holds the settings it was made with, so a record made by
other code, or with other settings than its profile's now, is stale.
:func:`problems` names both, with the command that renews them. :func:`renew` measures one stale
seed again, the witness: where the code as it is now measures it exactly as its record says, on
a machine like the record's, the change did not move what such a machine measures, and the
stale records made on one are stamped with the new fingerprints (the witness named in their
provenance); otherwise they are measured again.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modnets.experiments.core.evidence import (
    CLOCK_KEYS,
    RECORDS,
    configured,
    measure_seed,
    measurement_fingerprint,
    read_plan,
    read_seed,
    write_seed,
)
from modnets.experiments.core.experiment import Experiment
from modnets.experiments.core.fingerprints import code_fingerprint, plain
from modnets.experiments.core.options import RunOptions, resolved

__all__ = ["Problem", "problems", "same_measurement", "Renewal", "renew"]


@dataclass(frozen=True)
class Problem:
    """A seed record that does not stand: ``path``, ``reason`` and the ``command`` that renews
    it; ``stale``: made by other code (else edited after it was made)."""

    path: Path
    reason: str
    command: str
    stale: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}; renew it: {self.command}"


def problems(
    experiments: Sequence[Experiment], root: str | Path | None = None, profile: str = "*"
) -> list[Problem]:
    """What is wrong with the committed records of ``experiments`` (at ``profile``; ``"*"``:
    every profile): a plan or a seed record edited after it was made, or a seed record made by
    code that is not the code any more, the training code or the measurement code (stale).
    Empty: every record stands."""
    edited = "its content does not match its seal (edited after it was made)"
    out = []
    for experiment in experiments:
        train = code_fingerprint(*experiment.code) if experiment.code else None
        measurement = measurement_fingerprint(experiment)
        folders = Path(RECORDS if root is None else root).glob(f"{profile}/{experiment.name}/")
        for path in sorted(folders):
            renew = (
                f"python -m modnets.reproduce --profile {path.parent.name} "
                f"--experiments {experiment.name} --renew"
            )
            if (path / "plan.json").exists():
                try:
                    read_plan(path / "plan.json")
                except ValueError:
                    out.append(Problem(path / "plan.json", edited, renew))
            for seed_file in sorted(path.glob("seed-*.json")):
                try:
                    record = read_seed(seed_file)
                except ValueError:
                    out.append(Problem(seed_file, edited, renew))
                    continue
                made = record["provenance"]
                for what, now, then in (
                    ("training code", train, made["code_fingerprint"]),
                    ("measurement code", measurement, made.get("measurement_fingerprint")),
                ):
                    if now is not None and then != now:
                        reason = f"made with {what} {then}, the code is now {now} (stale)"
                        out.append(Problem(seed_file, reason, renew, stale=True))
                # a profile's settings are code too: a record of other settings is stale
                changed = _changed_settings(experiment, path.parent.name, record)
                if changed:
                    reason = f"made with other settings than the profile's now ({changed}; stale)"
                    out.append(Problem(seed_file, reason, renew, stale=True))
    return out


def _changed_settings(experiment: Experiment, profile: str, record: dict) -> str:
    """The settings (top-level configuration fields, but the seeds) in which ``record`` differs
    from ``experiment``'s configuration at ``profile`` now, leaving out what ``measure`` chooses
    on the selection seeds (its ``selected_settings``: a field, or a dotted path into one);
    empty where none differs."""
    now = plain(configured(experiment, profile, [record["seed"]]))
    then = copy.deepcopy(record["config"])
    for path in ("seeds", *experiment.selected_settings):
        *parents, leaf = path.split(".")
        for config in (now, then):
            for key in parents:
                config = config.get(key) if isinstance(config, dict) else None
            if isinstance(config, dict):
                config.pop(leaf, None)
    fields = dict.fromkeys([*then, *now])
    return ", ".join(k for k in fields if then.get(k) != now.get(k))


#: What a seed record measured (its provenance aside), compared when a witness is measured again.
MEASURED = ("config", "selection_seeds", "models", "diagnostics")
#: What makes two processes round alike: a witness vouches only for records made on its like.
MACHINE = ("torch", "cpu", "threads", "compiler", "world_size")


def _without_clock(x):
    if isinstance(x, dict):
        return {k: _without_clock(v) for k, v in x.items() if not k.endswith(CLOCK_KEYS)}
    if isinstance(x, list):
        return [_without_clock(v) for v in x]
    return x


def same_measurement(a: dict, b: dict) -> bool:
    """Whether two seed records measured the same, bit for bit, but for the clock's readings."""
    return all(
        json.dumps(_without_clock(a[k]), sort_keys=True)
        == json.dumps(_without_clock(b[k]), sort_keys=True)
        for k in MEASURED
    )


def _machine(record: dict) -> tuple:
    return tuple(record["provenance"].get(k) for k in MACHINE)


@dataclass(frozen=True)
class Renewal:
    """What :func:`renew` did: the ``witness`` seed measured again (None: none could be) and
    whether it measured as its record said (``equal``); the seeds whose records were stamped
    with the new fingerprints (``stamped``) and those left to be measured again (``removed``)."""

    experiment: str
    witness: int | None
    equal: bool
    stamped: list[int]
    removed: list[int]


def renew(
    experiment: Experiment,
    profile: str,
    options: RunOptions | None = None,
    *,
    root: str | Path | None = None,
) -> Renewal:
    """Make ``experiment``'s records at ``profile`` stand again. An edited record is removed (the
    evidence run measures its seed again). Of the stale ones, the lowest seed is measured again
    with the code as it is now, the witness: if it measures as its record says
    (:func:`same_measurement`) on a machine like the record's, every stale record made on such a
    machine gets the new fingerprints, the old ones and the witness kept in its provenance
    (``"renewed"``). Otherwise the witness's new record replaces its old one and the other
    stale records are removed, to be measured again."""
    options = resolved(options, {})
    found = problems([experiment], root, profile)
    for p in found:
        if not p.stale and p.path.exists():
            p.path.unlink()
    stale = {p.path: read_seed(p.path) for p in found if p.stale and p.path.exists()}
    if not stale:
        return Renewal(experiment.name, None, False, [], [])
    path = min(stale, key=lambda p: stale[p]["seed"])
    old = stale.pop(path)
    new = measure_seed(experiment, profile, old["seed"], options.quiet())
    equal = _machine(new) == _machine(old) and same_measurement(old, new)
    stamped, removed = [], []
    if equal:
        stale[path] = old
        for p, record in stale.items():
            if _machine(record) != _machine(new):
                p.unlink()
                removed.append(record["seed"])
                continue
            prov = record["provenance"]
            history = {
                "date": new["provenance"]["date"],
                "witness": old["seed"],
                "code_fingerprint": prov["code_fingerprint"],
                "measurement_fingerprint": prov.get("measurement_fingerprint"),
            }
            now = {k: new["provenance"][k] for k in ("code_fingerprint", "measurement_fingerprint")}
            renewed = [*prov.get("renewed", []), history]
            write_seed(p, {**record, "provenance": {**prov, **now, "renewed": renewed}})
            stamped.append(record["seed"])
    else:
        write_seed(path, new)
        for p, record in stale.items():
            p.unlink()
            removed.append(record["seed"])
    return Renewal(experiment.name, old["seed"], equal, sorted(stamped), sorted(removed))
