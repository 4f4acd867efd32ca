"""The evidence records as chapter 13 shows them: each experiment's plan and progress, both seed
sets' verdicts side by side, and the build's own seeds checked against the records.

Nothing here decides anything: :mod:`modnets.experiments.core.evidence` reads the records and
:mod:`modnets.experiments.core.claims` decides.
"""

from __future__ import annotations

from modnets.experiments.core.discovery import get, list_experiments
from modnets.experiments.core.evidence import RECORD_MISMATCH
from modnets.experiments.core.report import COLOURS, own_experiments, papers

__all__ = [
    "RECORD_MISMATCH",
    "evidence_records",
    "evidence_status",
    "evidence_frame",
    "evidence_sentence",
    "evidence_table",
    "record_checks",
    "build_path",
]


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
        lines.append(
            f"* `{name}`: {plan.n} seeds a set (the most a paper claim needs at the spread of "
            f"the pilot seeds {plan.pilot_seeds}, within 4..{plan.cap}; plan of "
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


def evidence_sentence(records: dict) -> str:
    """What the complete records decide, in one sentence generated from :func:`evidence_frame`."""
    frame = evidence_frame(records)
    if frame.empty:
        return "No experiment's evidence record is complete at this profile yet."
    paper = frame[frame["kind"] == "paper"]
    decided = paper[paper["decided"] != "undecided"]["decided"].value_counts()
    counts = ", ".join(f"{n} {v}" for v, n in decided.items()) or "none"
    undecided = int((paper["decided"] == "undecided").sum())
    return (
        f"Of the {len(paper)} paper claims with a complete record, both seed sets decide "
        f"{int(decided.sum())} alike ({counts}); {undecided} stay undecided."
    )


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

    from modnets.experiments.core import evidence
    from modnets.experiments.core.results import load_results, results_path

    rows = []
    for name, record in records.items():
        path = build_path(name, profile, folder)  # the seeds its chapter trained again
        if not path.exists():
            path = results_path(name, profile, folder)
        if record is None or not record.complete or not path.exists():
            continue
        results = load_results(path)
        if not set(results["seeds"]) & set(record.plan.seeds["claim"]):
            continue
        for c in evidence.check_against_record(record, results):
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
