"""Evidence runs: each paper claim decided on seeds chosen by power, twice, from one committed
record per seed.

The book's build trains a few seeds in minutes; a verdict needs as many seeds as the claim's
spread asks for, and it counts only if another set of seeds, run on any machine, gives the same
one. An evidence run (``python -m modnets.reproduce``) goes, per experiment and profile:

1. **pilot**: the experiment at :data:`PILOT_SEEDS` (never claim seeds) gives the spread over
   seeds of each claim's tested quantity;
2. **plan**: from that spread, the seeds each paper claim needs to see the paper's effect at 80 %
   power (:func:`~modnets.experiments.core.claims.seeds_needed`); ``n`` is their largest, within
   [:data:`MIN_SEEDS`, :data:`CAP`]; two disjoint sets of ``n`` seeds, the claim seeds and the
   replication seeds, are written to ``plan.json`` before either runs;
3. **seeds**: each seed measured alone, written to ``seed-<k>.json`` with its provenance (code
   fingerprint, torch, CPU, threads, compile path, wall time); a seed with a record is not
   run again, so a run stopped anywhere resumes, in another session or on another machine;
4. **record**: each set's seed records combined (the experiment's ``summarise``), its regime and
   claims decided as the book decides them; a claim is decided where both sets agree.

A seed record is sealed (a hash of its content), so an edited number is caught; a record whose
code fingerprint is not the code's any more is stale (:func:`problems` names both, with the
command that renews them: :mod:`modnets.experiments.core.renewal`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from modnets.experiments.core import harness
from modnets.experiments.core.claims import paper_distance, seeds_needed
from modnets.experiments.core.experiment import Experiment, Measurement, decided
from modnets.experiments.core.fingerprints import logic_fingerprint, plain
from modnets.experiments.core.options import RunOptions, resolved
from modnets.experiments.core.rules import get_rule
from modnets.experiments.core.stats import seed_stats
from modnets.profiles import select
from modnets.utils import atomic_file, progress

__all__ = [
    "RECORDS",
    "CLOCK_KEYS",
    "PILOT_SEEDS",
    "MIN_SEEDS",
    "CAP",
    "REPLICATION_START",
    "SETS",
    "GATED_PROFILES",
    "PilotOutsideRegime",
    "Plan",
    "Agreement",
    "Record",
    "agreements",
    "record_folder",
    "configured",
    "measurement_fingerprint",
    "measure_seed",
    "combine",
    "plan_from_pilot",
    "evidence",
    "load_record",
    "read_plan",
    "read_seed",
    "seal",
    "seed_path",
    "write_seed",
]

#: Where the records are committed: ``<RECORDS>/<profile>/<experiment>/``.
RECORDS = Path(__file__).resolve().parents[1] / "records"
#: The pilot's seeds: they choose how many claim seeds there are, so they are never claim seeds.
PILOT_SEEDS = (900, 901, 902)
#: The fewest claim seeds a plan takes: below it a t-interval is too wide to decide anything.
MIN_SEEDS = 4
#: The most: a claim that needs more says so ("needs N > CAP seeds") instead of deciding.
CAP = 12
#: The replication seeds are ``REPLICATION_START, +1, ...``; the claim seeds ``0, 1, ...``.
REPLICATION_START = 1000
#: The two seed sets of a plan.
SETS = ("claim", "replication")
#: The profiles whose pilot must reach the regime before a plan is declared (``smoke`` proves
#: code paths and decides nothing).
GATED_PROFILES = ("cpu", "gpu")


@dataclass(frozen=True)
class Plan:
    """What an evidence run fixes before any claim seed runs: ``needed``, per paper claim with a
    number, the seeds that see the paper's effect at 80 % power at the pilot's spread (``None``:
    more than any affordable number, or no spread to go by); ``n`` the seeds per set; ``seeds``
    both sets by name; ``code`` the code fingerprint the pilot ran with; ``declared`` the date."""

    experiment: str
    profile: str
    pilot_seeds: list[int]
    needed: dict[str, int | None]
    n: int
    cap: int
    seeds: dict[str, list[int]]
    code: str
    declared: str

    def __post_init__(self):
        if not 2 <= self.n <= self.cap:
            raise ValueError(f"plan: n must be in [2, cap={self.cap}], got {self.n}")
        for name in SETS:
            seeds = self.seeds[name]
            if len(seeds) != self.n or len(set(seeds)) != self.n:
                raise ValueError(f"plan: the {name} seeds must be {self.n} distinct, got {seeds}")
        claim, replication = (set(self.seeds[s]) for s in SETS)
        overlap = (claim & replication) | ((claim | replication) & set(self.pilot_seeds))
        if overlap:
            raise ValueError(
                f"plan: the pilot, claim and replication seeds share {sorted(overlap)}"
            )


@dataclass(frozen=True)
class Agreement:
    """One claim under both seed sets: ``decided`` is the verdict both gave (after Holm), or
    ``"undecided"``, with ``note`` saying why (the sets disagree, or the claim needs more seeds
    than the plan's cap); ``smaller``: both sets put the effect below the paper's; ``claims``:
    each set's :class:`~modnets.experiments.core.claims.Claim` (its values and interval)."""

    id: str
    kind: str
    verdicts: dict[str, str]
    decided: str
    note: str = ""
    smaller: bool = False
    claims: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Record:
    """An experiment's evidence: its :class:`Plan` and each set's results (the harness schema, as
    a run of those seeds would give them); ``missing``: the seeds of each set with no record yet
    (then that set's results are ``None``). :func:`agreements` reads the claims of both sets."""

    plan: Plan
    results: dict[str, dict | None]
    missing: dict[str, list[int]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not any(self.missing.values())


def record_folder(experiment: str, profile: str, root: str | Path | None = None) -> Path:
    """Where an experiment's records at ``profile`` lie."""
    return Path(RECORDS if root is None else root) / profile / experiment


def seed_path(folder: Path, seed: int) -> Path:
    return folder / f"seed-{seed}.json"


# ----------------------------------------------------------------------------- one seed


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def seal(content: dict) -> str:
    """The hash of a record's content (everything but the seal)."""
    text = json.dumps({k: v for k, v in content.items() if k != "seal"}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def configured(experiment: Experiment, profile: str, seeds: Sequence[int]):
    """``experiment``'s configuration at ``profile``, at ``seeds``."""
    return dataclasses.replace(select(experiment.configs, profile), seeds=tuple(seeds))


def measurement_fingerprint(experiment: Experiment) -> str:
    """A hash of the code that measures the trained models: ``measure`` and ``summarise`` with
    the helpers of their package they name, without their docstrings (the provenance's
    ``code_fingerprint`` covers the code the models train with)."""
    return logic_fingerprint(experiment.measure, experiment.summarise)


@contextlib.contextmanager
def _own_checkpoints():
    """Checkpoints of evidence runs kept apart (``<checkpoint_dir>/evidence``): a seed record is
    measured from models its own run trained (and a resumed run reloads), never from a model a
    book build trained in another process layout, which rounds otherwise."""
    from modnets.training import checkpoint_dir

    before = os.environ.get("MODNETS_CHECKPOINTS")
    os.environ["MODNETS_CHECKPOINTS"] = str(checkpoint_dir() / "evidence")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MODNETS_CHECKPOINTS", None)
        else:
            os.environ["MODNETS_CHECKPOINTS"] = before


def measure_seed(
    experiment: Experiment, profile: str, seed: int, options: RunOptions | None = None
) -> dict:
    """``experiment`` at ``profile`` measured at ``seed`` alone: its results without claims (a
    set decides those), with the provenance of this process, sealed; its models trained in this
    process layout or loaded from an evidence run's own checkpoints (:func:`_own_checkpoints`)."""
    from modnets.training import compiler_available

    options = resolved(options, {})
    start = time.perf_counter()
    config = configured(experiment, profile, [seed])
    workers = harness.workers_for(options.workers, profile, options.device)
    with _own_checkpoints():
        measured = experiment.measure(config, dataclasses.replace(options, workers=workers))
    provenance = harness.provenance(start, experiment.code)
    provenance["measurement_fingerprint"] = measurement_fingerprint(experiment)
    provenance["cpu"] = _cpu_model()
    provenance["compiler"] = compiler_available(options.device)
    provenance["date"] = datetime.date.today().isoformat()
    out = {
        "experiment": experiment.name,
        "profile": profile,
        "seed": seed,
        "config": plain(measured.config),
        "selection_seeds": list(measured.selection_seeds),
        "models": plain(measured.models),
        "diagnostics": plain(measured.diagnostics),
        "provenance": provenance,
    }
    out = json.loads(json.dumps(out, allow_nan=True))
    return {**out, "seal": seal(out)}


def read_plan(path: Path) -> Plan:
    """The plan at ``path``, its seal checked: a plan is fixed before its seeds run."""
    content = json.loads(path.read_text())
    if content.get("seal") != seal(content):
        raise ValueError(f"{path}: its content does not match its seal (edited after it was made)")
    return Plan(**{k: v for k, v in content.items() if k != "seal"})


def read_seed(path: Path) -> dict:
    record = json.loads(path.read_text())
    if record.get("seal") != seal(record):
        raise ValueError(f"{path}: its content does not match its seal (edited after it was made)")
    return record


# ----------------------------------------------------------------------------- combining


#: The endings of the keys of readings taken with a clock (they differ from one process to
#: the next): where seed records differ there, the first record's reading is kept.
CLOCK_KEYS = ("seconds", "_per_s", "_ms", "_vs_cnn", "speedup_at80")


def _merge(parts: list, key: str = ""):
    """Seed records' ``models`` / ``diagnostics`` (per-seed entries, before any summary) as one:
    per-seed lists (entries with a ``"seed"``) joined in order, dicts merged key by key; anything
    else (a setting, a choice made on the selection seeds) must be the same in every record,
    but for readings taken with a clock (:data:`CLOCK_KEYS`: the first record's)."""
    first = parts[0]
    if all(isinstance(p, dict) for p in parts):
        keys = list(dict.fromkeys(k for p in parts for k in p))
        return {k: _merge([p[k] for p in parts if k in p], k) for k in keys}
    if all(isinstance(p, list) for p in parts) and all(
        isinstance(x, dict) and "seed" in x for p in parts for x in p
    ):
        return [x for p in parts for x in p]
    same = all(json.dumps(p, sort_keys=True) == json.dumps(first, sort_keys=True) for p in parts)
    if not same and not key.endswith(CLOCK_KEYS):
        raise ValueError(f"the seed records differ in {key!r}, which is not per seed: {parts[:3]}")
    return first


def combine(experiment: Experiment, records: Sequence[dict]) -> dict:
    """The results (harness schema, claims decided) of the seeds of ``records``, as one run of
    those seeds gives them."""
    if not records:
        raise ValueError("combine needs at least one seed record")
    profile = records[0]["profile"]
    seeds = [r["seed"] for r in records]
    as_run = [{k: v for k, v in r["config"].items() if k != "seeds"} for r in records]
    if any(c != as_run[0] for c in as_run):
        raise ValueError(f"{experiment.name}: the seed records were made with other configurations")
    models = _merge([r["models"] for r in records])
    diagnostics = _merge([r["diagnostics"] for r in records])
    prov = [r["provenance"] for r in records]
    provenance = {
        "code_fingerprint": sorted({p["code_fingerprint"] for p in prov}),
        "torch": sorted({p["torch"] for p in prov}),
        "cpu": sorted({p.get("cpu", p["device"]) for p in prov}),
        "device": sorted({p["device"] for p in prov}),
        "compiler": sorted({bool(p.get("compiler")) for p in prov}),
        "threads": sorted({p["threads"] for p in prov}),
        "wall_seconds": sum(p["wall_seconds"] for p in prov),
        # the time the seeds' models trained side by side before they were measured
        "trained_ahead_seconds": sum(p.get("trained_ahead_seconds", 0.0) for p in prov),
        "dates": sorted({p.get("date", "") for p in prov}),
    }
    selection = records[0]["selection_seeds"]
    config = configured(experiment, profile, seeds)
    measured = Measurement(models, diagnostics, config, selection)
    # the configuration as the seeds ran it (after any selection), as the results file holds it
    written = {**as_run[0], "seeds": seeds}
    return decided(experiment, profile, measured, provenance, written_config=written)


# ----------------------------------------------------------------------------- the plan


def plan_from_pilot(pilot: dict, *, cap: int = CAP, min_seeds: int = MIN_SEEDS) -> Plan:
    """The :class:`Plan` the pilot's results (:func:`combine` of the pilot seeds) ask for."""
    needed = {}
    for claim in pilot["claims"]:
        distance = paper_distance(get_rule(claim["id"]))
        if claim["kind"] != "paper" or distance is None or len(claim["values"]) < 2:
            continue
        sd = seed_stats(claim["values"])["sd"]
        needed[claim["id"]] = seeds_needed(distance, sd, claim["test"] == "equivalent")
    affordable = [k for k in needed.values() if k is not None and k <= cap]
    n = min(max([min_seeds, *affordable]), cap)
    return Plan(
        experiment=pilot["experiment"],
        profile=pilot["profile"],
        pilot_seeds=list(pilot["seeds"]),
        needed=needed,
        n=n,
        cap=cap,
        seeds={
            "claim": list(range(n)),
            "replication": list(range(REPLICATION_START, REPLICATION_START + n)),
        },
        code=pilot["provenance"]["code_fingerprint"][0],
        declared=datetime.date.today().isoformat(),
    )


# ----------------------------------------------------------------------------- the run


def write_seed(path: Path, record: dict) -> None:
    """Write a seed record to ``path`` at once (never half-written), sealed as it is now."""
    record = {k: v for k, v in record.items() if k != "seal"}
    with atomic_file(path) as tmp:
        tmp.write_text(
            json.dumps({**record, "seal": seal(record)}, indent=1, allow_nan=True) + "\n"
        )


def _ensure(experiment, profile, seeds, *, folder, options, desc) -> list[dict]:
    """The seed records of ``seeds``, measuring (and writing) those not yet recorded."""
    todo = [s for s in seeds if not seed_path(folder, s).exists()]
    workers = harness.workers_for(options.workers, profile, options.device)
    side_by_side = experiment.train_seeds is not None and workers > 1
    # as many seeds at a time as there are workers, each group recorded before the next trains:
    # a run longer than a session keeps every group it finished
    size = workers if side_by_side else 1
    groups = [todo[i : i + size] for i in range(0, len(todo), size)]
    bar = progress(total=len(todo), desc=f"{experiment.name}: {desc}", mininterval=1)
    for group in groups:
        ahead = 0.0  # each seed's share of the time its group trained side by side
        if side_by_side and len(group) > 1:
            # the group's models side by side first, each seed then measured from them alone
            start = time.perf_counter()
            with _own_checkpoints():
                config = configured(experiment, profile, group)
                experiment.train_seeds(config, dataclasses.replace(options, workers=workers))
            ahead = (time.perf_counter() - start) / len(group)
        for seed in group:
            record = measure_seed(experiment, profile, seed, options.quiet())
            record["provenance"]["trained_ahead_seconds"] = ahead
            write_seed(seed_path(folder, seed), record)
            bar.update(1)
    bar.close()
    return [read_seed(seed_path(folder, s)) for s in seeds]


class PilotOutsideRegime(RuntimeError):
    """The pilot seeds miss the regime the claims presuppose: a plan made from them would spend
    its claim seeds on claims that are not testable here."""


def evidence(
    experiment: Experiment,
    profile: str,
    options: RunOptions | None = None,
    *,
    root: str | Path | None = None,
    **flags,
) -> Record:
    """Run (or go on with) ``experiment``'s evidence at ``profile``: the pilot, the plan (kept
    once written), both seed sets; the :class:`Record`. At a profile that decides
    (:data:`GATED_PROFILES`), a pilot that misses the regime stops the run before the plan
    (:class:`PilotOutsideRegime`)."""
    options = resolved(options, flags)
    folder = record_folder(experiment.name, profile, root)
    plan_path = folder / "plan.json"
    if not plan_path.exists():
        pilots = _ensure(
            experiment, profile, PILOT_SEEDS, folder=folder, options=options, desc="pilot"
        )
        pilot = combine(experiment, pilots)
        regime = pilot["regime"]
        if profile in GATED_PROFILES and not regime["reached"]:
            raise PilotOutsideRegime(
                f"{experiment.name} at {profile}: the pilot seeds {PILOT_SEEDS} miss the regime "
                f"the claims presuppose ({regime['shortfall']}); no plan is declared and no "
                "claim seed runs. Change the profile (and log why in chapter 13's rule log), "
                f"then run again: the pilot's records in {folder} are then stale."
            )
        plan = dataclasses.asdict(plan_from_pilot(pilot))
        with atomic_file(plan_path) as tmp:
            tmp.write_text(json.dumps({**plan, "seal": seal(plan)}, indent=1) + "\n")
    plan = read_plan(plan_path)
    for name in SETS:
        seeds = plan.seeds[name]
        _ensure(experiment, profile, seeds, folder=folder, options=options, desc=f"{name} seeds")
    return load_record(experiment, profile, root)


def agreements(records: Sequence[Record], family: str) -> list[Agreement]:
    """Each claim of ``records`` (complete ones; one paper's experiments, or one experiment of
    our own) under both seed sets, Holm's correction taken over the paper claims of each set
    together (one ``family``, as chapter 13 takes it)."""
    from modnets.experiments.core.claims import Claim, holm

    records = [r for r in records if r.complete]
    by_set = {}
    for name in SETS:
        claims = [Claim(**c) for r in records for c in r.results[name]["claims"]]
        by_set[name] = {c.id: c for c in holm(claims, family)}
    needed = {k: v for r in records for k, v in r.plan.needed.items()}
    caps = {c["id"]: r.plan.cap for r in records for c in r.results["claim"]["claims"]}
    out = []
    for cid, claim in by_set["claim"].items():
        verdicts = {s: by_set[s][cid].verdict_holm for s in SETS}
        same = len(set(verdicts.values())) == 1
        note = ""
        if same and verdicts["claim"] == "not testable here":
            pass  # untestable on both sets: more seeds would not make it testable
        elif cid in needed and needed[cid] is None:
            note = "the pilot gave no number of seeds (no spread, or its effect on the other side)"
        elif cid in needed and needed[cid] > caps[cid]:
            note = f"needs {needed[cid]} seeds at the pilot's spread, more than {caps[cid]}"
        elif not same:
            note = "the two seed sets disagree"
        decided = verdicts["claim"] if same and not note else "undecided"
        smaller = all(by_set[s][cid].vs_paper == "smaller than the paper's" for s in SETS)
        sets = {s: by_set[s][cid] for s in SETS}
        out.append(
            Agreement(
                cid, claim.kind, verdicts, decided=decided, note=note, smaller=smaller, claims=sets
            )
        )
    return out


def load_record(experiment: Experiment, profile: str, root: str | Path | None = None) -> Record:
    """The :class:`Record` of ``experiment`` at ``profile`` from its committed files."""
    folder = record_folder(experiment.name, profile, root)
    plan_path = folder / "plan.json"
    if not plan_path.exists():
        raise FileNotFoundError(
            f"no evidence record for {experiment.name} at {profile} in {folder}: "
            f"python -m modnets.reproduce --profile {profile} --experiments {experiment.name}"
        )
    plan = read_plan(plan_path)
    results, missing = {}, {}
    for name in SETS:
        seeds = plan.seeds[name]
        missing[name] = [s for s in seeds if not seed_path(folder, s).exists()]
        records = [read_seed(seed_path(folder, s)) for s in seeds if s not in missing[name]]
        results[name] = None if missing[name] else combine(experiment, records)
    return Record(plan, results, missing)
