"""The evidence records as the book reads them: what an experiment's chapter shows (a complete
record's claim seeds, one of them trained again and checked against it), and chapter 13's views
(each experiment's plan and progress, both seed sets' verdicts side by side, the build's seeds
against the records).

Nothing here decides anything: :mod:`modnets.experiments.core.evidence` reads the records and
:mod:`modnets.experiments.core.claims` decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from modnets.experiments.core.discovery import get, list_experiments
from modnets.experiments.core.evidence import (
    MIN_SEEDS,
    PILOT_SEEDS,
    Record,
    configured,
    load_record,
)
from modnets.experiments.core.experiment import Experiment
from modnets.experiments.core.options import RunOptions, resolved
from modnets.experiments.core.report import (
    COLOURS,
    format_interval,
    format_value,
    own_experiments,
    papers,
)
from modnets.experiments.core.stats import seed_stats
from modnets.profiles import select

__all__ = [
    "RECORD_MISMATCH",
    "SeedCheck",
    "check_against_record",
    "BookResults",
    "book_results",
    "evidence_records",
    "evidence_status",
    "evidence_frame",
    "evidence_sentence",
    "evidence_table",
    "record_checks",
    "build_path",
    "paper_records",
]


#: What a page says where a seed the build ran lies outside its evidence record (``make audit``
#: fails on it).
RECORD_MISMATCH = "outside its evidence record"


@dataclass(frozen=True)
class SeedCheck:
    """One claim's tested quantity at a seed recomputed by the build, against the record:
    ``within`` when ``value`` lies in the record's range over the set widened by its spread
    (machines round differently, so not to the bit)."""

    id: str
    seed: int
    value: float
    low: float
    high: float

    @property
    def within(self) -> bool:
        return self.low <= self.value <= self.high


def check_against_record(record: Record, results: dict) -> list[SeedCheck]:
    """Each claim's value at each seed of ``results`` (a run of the book's build) that is a
    claim seed of ``record``, against the claim set's values in the record."""
    if record.results["claim"] is None:
        raise ValueError(f"the record of {record.plan.experiment} is not complete")
    ours = [s for s in results["seeds"] if s in record.plan.seeds["claim"]]
    if not ours:
        raise ValueError(f"none of the seeds {results['seeds']} is a claim seed of the record")
    reference = {c["id"]: c["values"] for c in record.results["claim"]["claims"]}
    out = []
    for claim in results["claims"]:
        values = [v for v in reference.get(claim["id"]) or [] if math.isfinite(v)]
        if len(claim["values"]) != len(results["seeds"]) or len(values) < 2:
            continue  # not one value per seed (not tested here), or no spread to go by
        # a non-finite value of this build lies outside any range: a mismatch
        spread = seed_stats(values)["sd"]
        lo, hi = min(values) - spread, max(values) + spread
        by_seed = dict(zip(results["seeds"], claim["values"], strict=True))
        out += [SeedCheck(claim["id"], s, by_seed[s], lo, hi) for s in ours]
    return out


# ----------------------------------------------------------------------------- what a chapter shows


@dataclass(frozen=True)
class BookResults:
    """What a chapter shows: ``results``, the claim set of the experiment's evidence record where
    it has a complete one (``recorded``), else this build's run; ``build``, this build's run
    (the record's first claim seeds recomputed, or every configured seed); ``checks``, the
    build's claim values against the record."""

    results: dict
    recorded: bool
    build: dict
    checks: list[SeedCheck] = field(default_factory=list)

    def sentence(self) -> str:
        """Where the chapter's numbers come from, and whether this build agrees with them."""
        seeds = self.results["seeds"]
        if not self.recorded:
            return (
                f"No complete evidence record at this profile yet: these are this build's "
                f"{len(seeds)} seeds ({seeds}); chapter 13 says how a record is made."
            )
        prov = self.results["provenance"]
        bad = [c for c in self.checks if not c.within]
        agree = (
            f"{len(self.checks) - len(bad)} of its {len(self.checks)} claim values lie within "
            "the record's range over the claim seeds, widened by their spread"
        )
        if bad:
            agree += f"; {len(bad)} lie {RECORD_MISMATCH} ({', '.join(c.id for c in bad)})"
        return (
            f"These are the results of the evidence record: {len(seeds)} claim seeds "
            f"({seeds[0]}..{seeds[-1]}, their number chosen by power), recorded on "
            f"{', '.join(prov['cpu'])} with torch {', '.join(prov['torch'])}; chapter 13 sets "
            f"them beside a replication on as many other seeds. This build measured seed "
            f"{', '.join(map(str, self.build['seeds']))} again (trained, or loaded from this "
            f"machine's checkpoints where it made the record): {agree}."
        )


def book_results(
    experiment: Experiment,
    profile: str,
    options: RunOptions | None = None,
    *,
    root: str | Path | None = None,
    check_seeds: int = 1,
    **flags,
) -> BookResults:
    """What ``experiment``'s chapter shows at ``profile``: its record's claim set, with its first
    ``check_seeds`` claim seeds trained again here and checked against it, where the record is
    complete; else a run of the configured seeds."""
    options = resolved(options, flags)
    try:
        record = load_record(experiment, profile, root)
    except FileNotFoundError:
        record = None
    if record is None or not record.complete:
        results = experiment.run(profile=profile, options=options)
        return BookResults(results, False, results)
    config = configured(experiment, profile, record.plan.seeds["claim"][:check_seeds])
    build = experiment.run(config, profile, options)
    recorded = _holm_over_paper(experiment, record, profile, root)
    return BookResults(recorded, True, build, check_against_record(record, build))


def paper_records(experiment: Experiment, profile: str, root=None) -> list[Record]:
    """The complete records of the other experiments that test ``experiment``'s paper."""
    out = []
    for name in papers().get(experiment.paper, ()) if experiment.paper else ():
        if name == experiment.name:
            continue
        try:
            record = load_record(get(name), profile, root)
        except FileNotFoundError:
            continue
        if record.complete:
            out.append(record)
    return out


def _holm_over_paper(experiment: Experiment, record: Record, profile: str, root) -> dict:
    """The record's claim set with Holm's correction over its paper's claims in every complete
    record of that paper (the family chapter 13 takes), so a verdict reads the same in every
    chapter."""
    from modnets.experiments.core.claims import Claim, holm

    results = record.results["claim"]
    if not experiment.paper:
        return results
    records = [record, *paper_records(experiment, profile, root)]
    claims = [Claim(**c) for r in records for c in r.results["claim"]["claims"]]
    ours = {c["id"] for c in results["claims"]}
    family = {c.id: c.as_dict() for c in holm(claims, experiment.paper) if c.id in ours}
    return {**results, "claims": [family[c["id"]] for c in results["claims"]]}


# ----------------------------------------------------------------------------- chapter 13


def evidence_records(profile: str, root=None) -> dict:
    """Every experiment's evidence record at ``profile`` (:mod:`~.evidence`), ``None`` where it
    has none yet, in the book's order."""
    from modnets.experiments.core import evidence

    out = {}
    for name in list_experiments():
        try:
            out[name] = evidence.load_record(get(name), profile, root)
        except FileNotFoundError:
            out[name] = None
    return out


def evidence_status(records: dict, profile: str) -> str:
    """A Markdown list: per experiment, its plan and how far its evidence run at ``profile`` has
    come."""
    lines = []
    for name, record in records.items():
        run = f"`python -m modnets.reproduce --profile {profile} --experiments {name}`"
        if record is None:
            lines.append(f"* `{name}`: no evidence record yet ({run}).")
            continue
        plan = record.plan
        done = {k: len(plan.seeds[k]) - len(v) for k, v in record.missing.items()}
        where = ""
        if record.complete:
            prov = record.results["claim"]["provenance"]
            where = f"; recorded on {', '.join(prov['cpu'])} with torch {', '.join(prov['torch'])}"
            sets = [r["provenance"] for r in record.results.values()]
            if all("wall_seconds" in p for p in sets):
                seconds = sum(p["wall_seconds"] + p.get("trained_ahead_seconds", 0.0) for p in sets)
                where += f", the two sets in {seconds / 3600:.1f} h of machine time"
        lines.append(
            f"* `{name}`: {plan.n} seeds a set (the most a paper claim needs at the spread of "
            f"the pilot seeds {plan.pilot_seeds}, within {MIN_SEEDS}..{plan.cap}; plan of "
            f"{plan.declared}); claim seeds {done['claim']} of {plan.n}, replication seeds "
            f"{done['replication']} of {plan.n} recorded{where}."
            + ("" if record.complete else f" It goes on with {run}.")
        )
    return "\n".join(lines)


def evidence_frame(records: dict):
    """One row per claim of the complete records: its verdict after Holm (one family per paper,
    or per experiment of our own) under the claim seeds and under the replication seeds, and
    what is decided."""
    import pandas as pd

    from modnets.experiments.core import evidence

    groups = {paper: names for paper, names in papers().items()}
    groups |= {name: (name,) for name in own_experiments()}
    rows = []
    for family, names in groups.items():
        complete = [records[n] for n in names if records.get(n) and records[n].complete]
        for a in evidence.agreements(complete, family):
            row = {"paper": family, "claim": a.id, "kind": a.kind}
            row |= {f"{k} seeds": v for k, v in a.verdicts.items()}
            rows.append(row | {"decided": a.decided, "why undecided": a.note or "-"})
    columns = ["paper", "claim", "kind", "claim seeds", "replication seeds", "decided"]
    return pd.DataFrame(rows, columns=[*columns, "why undecided"])


def _estimate(claim) -> str:
    """A set's mean tested quantity with its 95 % interval, in the claim's units."""
    c = claim.as_dict()
    finite = [v for v in claim.values if v is not None and math.isfinite(v)]
    if not finite:
        return "no value"
    mean = format_value(c, seed_stats(finite)["mean"])
    return f"{mean}{claim.unit} {format_interval(c)}" if claim.interval else f"{mean}{claim.unit}"


def _quoted(a, paper_effect: bool = True) -> str:
    """A claim id with both sets' estimates (and the paper's effect, where it states one)."""
    sets = "; ".join(f"{k} seeds {_estimate(c)}" for k, c in a.claims.items())
    first = a.claims.get("claim")
    effect = first.paper_effect if first is not None else None
    paper = ""
    if paper_effect and effect is not None:
        paper = f"; the paper's {format_value(first.as_dict(), effect)}{first.unit}"
    return f"`{a.id}` ({sets}{paper})"


def _paper_paragraph(paper: str, rows: list, tested: str) -> str:
    """What both seed sets say of one paper's claims, in sentences with their numbers."""
    by: dict[str, list] = {}
    for a in rows:
        by.setdefault(a.decided, []).append(a)
    said = []
    yes = by.get("reproduced", [])
    full = [a for a in yes if not a.smaller]
    if full:
        said.append("Both seed sets reproduce " + ", ".join(_quoted(a) for a in full) + ".")
    small = [a for a in yes if a.smaller]
    if small:
        said.append(
            "Both reproduce the direction of "
            + ", ".join(_quoted(a) for a in small)
            + ", with an effect smaller than the paper's (both intervals stop short of it)."
        )
    if by.get("not reproduced"):
        said.append(
            "Both find " + ", ".join(_quoted(a) for a in by["not reproduced"]) + " not reproduced."
        )
    inconclusive = by.get("inconclusive", [])
    less = [a for a in inconclusive if a.smaller]
    weak = [a for a in inconclusive if not a.smaller]
    why = {
        " with an effect smaller than the paper's: their intervals hold the threshold and "
        "exclude the paper's effect": less,
        ", underpowered: their intervals hold both the threshold and the paper's effect": weak,
    }
    for reason, group in why.items():
        if group:
            said.append(f"Both leave {', '.join(map(_quoted, group))} inconclusive{reason}.")
    for a in by.get("not testable here", []):
        reason = a.claims["claim"].reason if "claim" in a.claims else ""
        said.append(f"`{a.id}` is not testable here: {reason.rstrip('.')}.")
    for a in by.get("undecided", []):
        gave = " and ".join(f"{v} on the {k} seeds" for k, v in a.verdicts.items())
        said.append(f"{_quoted(a)} is open, {gave}: {a.note}.")
    return f"**{paper}** ({tested}). " + " ".join(said)


def evidence_sentence(records: dict) -> str:
    """Per paper, a paragraph generated from both seed sets (:func:`evidence.agreements`): what
    both reproduce (and where the effect is smaller than the paper's), what neither does, and why
    the rest is open (power, disagreement, not testable here and why), each claim with its
    numbers."""
    from modnets.experiments.core import evidence

    lines = []
    for paper, names in papers().items():
        complete = [records[n] for n in names if records.get(n) and records[n].complete]
        if not complete:
            runs = ", ".join(f"`{n}`" for n in names)
            lines.append(f"**{paper}**: no evidence record of {runs} is complete yet.")
            continue
        rows = [a for a in evidence.agreements(complete, paper) if a.kind == "paper"]
        tested = "; ".join(f"`{r.plan.experiment}`: {r.plan.n} seeds a set" for r in complete)
        lines.append(_paper_paragraph(paper, rows, tested))
    return "\n\n".join(lines)


def evidence_table(records: dict):
    """:func:`evidence_frame` as an HTML table, verdicts coloured; None where no record is
    complete yet."""
    frame = evidence_frame(records)
    if frame.empty:
        return None

    def colour(v: str) -> str:
        return f"background-color: {COLOURS[v]}" if v in COLOURS else ""

    subset = ["claim seeds", "replication seeds", "decided"]
    return frame.style.hide(axis="index").map(colour, subset=subset)


def build_path(experiment: str, profile: str, folder="_build/results"):
    """Where a chapter that shows its evidence record keeps the seeds it trained again."""
    from modnets.experiments.core.results import results_path

    return results_path(f"{experiment}_build", profile, folder)


def record_checks(records: dict, profile: str, folder="_build/results") -> tuple:
    """``(frame, sentence)``: each claim's value at each claim seed this build ran (the chapters'
    results files) against its experiment's record: inside the record's range over its claim
    seeds widened by their spread, or :data:`RECORD_MISMATCH` (``frame``: None where no seed was
    checked)."""
    import pandas as pd

    from modnets.experiments.core.results import load_results

    rows = []
    for name, record in records.items():
        path = build_path(name, profile, folder)  # the seeds its chapter trained again
        if record is None or not record.complete or not path.exists():
            continue
        results = load_results(path)
        if not set(results["seeds"]) & set(record.plan.seeds["claim"]):
            continue
        for c in check_against_record(record, results):
            rows.append(
                {
                    "experiment": name,
                    "claim": c.id,
                    "seed": c.seed,
                    "this build": f"{c.value:.4g}",
                    "record's range": f"[{c.low:.4g}, {c.high:.4g}]",
                    "check": "within" if c.within else RECORD_MISMATCH,
                }
            )
    if not rows:
        return None, "No seed of this build has an evidence record to be checked against."
    frame = pd.DataFrame(rows)
    bad = int((frame["check"] != "within").sum())
    sentence = (
        f"{len(rows) - bad} of the {len(rows)} per-seed values this build recomputed lie within "
        "their evidence record's range (widened by its spread)"
    )
    return frame, sentence + (f"; {bad} lie {RECORD_MISMATCH}." if bad else ".")


# ----------------------------------------------------------------------------- the protocol


def _seeds(seeds) -> str:
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds)) or "none"


def protocol_boxes(experiment: Experiment, profile: str) -> tuple[str, ...]:
    """The five steps of :func:`modnets.diagrams.evidence_protocol` for ``experiment`` at
    ``profile``: its selection seeds and number of claims, and the n and seeds its evidence
    record's plan fixed (the generic steps where it has none yet)."""
    from modnets.diagrams import PROTOCOL_STEPS

    config = select(experiment.configs, profile)
    paper = sum(r.kind == "paper" for r in experiment.rules.values())
    ours = len(experiment.rules) - paper
    declared = f"{paper} paper claims" if paper else f"{ours} questions of ours"
    if paper and ours:
        declared += f",\n{ours} of ours"
    selection = config.selection_seeds
    boxes = [
        f"{declared};\nsettings chosen on\nselection seed{'s' * (len(selection) != 1)}\n"
        f"{_seeds(selection)}",
        f"pilot seeds\n({_seeds(PILOT_SEEDS)}):\nthe spread",
        *PROTOCOL_STEPS[2:],
    ]
    try:
        plan = load_record(experiment, profile).plan
    except FileNotFoundError:  # no plan yet: the generic steps
        return tuple(boxes)
    boxes[2] = f"plan: $n$ = {plan.n}\nseeds a set\nby power (mde)"
    boxes[3] = (
        f"claim seeds {_seeds(plan.seeds['claim'])},\nreplication seeds\n"
        f"{_seeds(plan.seeds['replication'])}:\nregime, mechanism,\nHolm"
    )
    return tuple(boxes)


def protocol_figure(experiment: str, profile: str):
    """The evidence protocol as ``experiment`` follows it at ``profile`` (an experiment
    chapter's first figure): :func:`modnets.diagrams.evidence_protocol` with
    :func:`protocol_boxes`."""
    from modnets.diagrams import evidence_protocol

    exp = get(experiment)
    title = f"How the {exp.name.replace('_', ' ')} experiment decides its claims ({profile})"
    return evidence_protocol(title, protocol_boxes(exp, profile))
