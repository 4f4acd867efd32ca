"""The evidence run: ``python -m modnets.reproduce --profile cpu [--experiments NAME ...]``.

For each experiment: a pilot on its pilot seeds, the number of claim seeds from the pilot's
spread by power, then the claim seeds and a disjoint replication set, one committed record per
seed (:mod:`modnets.experiments.core.evidence`). It resumes where it stopped: a seed with a
record is not run again, and a training that was stopped (Ctrl-C, or ``kill -TERM`` for a run
started in the background, whose shell has it ignore Ctrl-C's SIGINT) goes on from its last
saved step, bit for bit. Hours at ``cpu``; apart from ``make book``, which reads the records.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from modnets.experiments.core import evidence, evidence_report, renewal
from modnets.experiments.core.discovery import get, list_experiments
from modnets.experiments.core.options import RunOptions

__all__ = ["main", "format_record", "format_renewal"]


def format_record(record: evidence.Record, others: list[evidence.Record] = ()) -> str:
    """A record as plain text: the plan, then each of its claims under both seed sets, Holm's
    correction taken over its paper's claims in ``record`` and the complete ``others`` (the
    records of the paper's other experiments)."""
    plan = record.plan
    needed = ", ".join(
        f"{k} {v if v is not None else f'> {plan.cap}'}" for k, v in plan.needed.items()
    )
    lines = [
        f"{plan.experiment} at {plan.profile}: n = {plan.n} seeds a set (pilot seeds "
        f"{plan.pilot_seeds}; seeds needed at the pilot's spread: {needed or 'no paper number'})"
    ]
    if not record.complete:
        left = {k: len(v) for k, v in record.missing.items() if v}
        return "\n".join([*lines, f"  not complete: seeds left {left}"])
    ids = {c["id"] for c in record.results["claim"]["claims"]}
    family = get(plan.experiment).paper or plan.experiment
    for a in evidence.agreements([record, *others], family):
        if a.id in ids:
            both = " / ".join(a.verdicts[s] for s in evidence.SETS)
            note = f" ({a.note})" if a.note else ""
            lines.append(f"  [{a.decided}] {a.id} ({a.kind}): {both}{note}")
    return "\n".join(lines)


def format_renewal(done: renewal.Renewal) -> str:
    """What a renewal did, in a line."""
    if done.witness is None:
        return f"{done.experiment}: every record stands"
    if done.equal:
        kept = f"; {len(done.removed)} made elsewhere left to measure again" if done.removed else ""
        return (
            f"{done.experiment}: seed {done.witness}, measured again, equals its record: "
            f"{len(done.stamped)} stale records stamped with the code as it is{kept}"
        )
    return (
        f"{done.experiment}: seed {done.witness}, measured again, differs from its record: "
        f"its new record stands, {len(done.removed)} stale records left to measure again"
    )


def main(argv: list[str] | None = None) -> None:
    names = list_experiments()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=("smoke", "cpu", "gpu"), default="cpu")
    parser.add_argument("--experiments", nargs="+", choices=names, default=names)
    parser.add_argument("--records", type=Path, default=None, help="the records' folder")
    parser.add_argument("--workers", type=int, default=None, help="processes within a seed")
    parser.add_argument(
        "--renew",
        action="store_true",
        help="make stale records stand: stamped if a witness seed measures as before, else measured again",
    )
    args = parser.parse_args(argv)
    # an evidence run's trainings are hours long: a stopped one goes on where it was saved
    options = RunOptions(workers=args.workers, resume=True)
    for name in args.experiments:
        experiment = get(name)
        try:
            if args.renew:
                print(
                    format_renewal(
                        renewal.renew(experiment, args.profile, options, root=args.records)
                    )
                )
            record = evidence.evidence(experiment, args.profile, options, root=args.records)
        except evidence.PilotOutsideRegime as e:
            sys.exit(str(e))
        except KeyboardInterrupt:
            sys.exit(
                "\nstopped: the seeds recorded so far and the trainings' saved steps are kept; run "
                f"the same command to go on ({evidence.record_folder(name, args.profile, args.records)})"
            )
        others = evidence_report.paper_records(experiment, args.profile, args.records)
        print(format_record(record, others), flush=True)


if __name__ == "__main__":
    main()
