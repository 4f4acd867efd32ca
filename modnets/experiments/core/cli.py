"""The command line shared by every experiment: ``python -m modnets.experiments.<name>``, or
``python -m modnets.experiments <name>`` for any experiment :func:`list_experiments` finds.

``--profile``, ``--out`` (JSON results in the schema of :mod:`modnets.experiments.core.harness`),
``--no-cache`` (retrain even if a checkpoint exists), ``--quiet`` and ``--resume`` (continue
interrupted training). Under ``torchrun`` each process joins the process group and trains
data-parallel; only rank 0 prints and writes. Ctrl-C saves the training state and exits with a
hint to ``--resume``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from modnets import distributed
from modnets.experiments.core.discovery import all_rules, get, list_experiments
from modnets.experiments.core.experiment import Experiment, RunOptions
from modnets.experiments.core.results import save_results
from modnets.experiments.core.rules import unlogged
from modnets.profiles import PROFILES
from modnets.training import checkpoint_dir
from modnets.utils import atomic_file

__all__ = ["experiment_main", "main", "format_claims", "record_arguments", "save_record"]


def format_claims(results: dict) -> str:
    """The claims of a results dict as plain text, one per line."""
    lines = ["claims:"]
    for c in results["claims"]:
        reason = f" ({c['reason']})" if c.get("reason") else ""
        lines.append(
            f"  [{c['verdict']}] {c['id']}: {c['text']} -- ours {c['ours']}; "
            f"paper {c['paper']}{reason}"
        )
    return "\n".join(lines)


def record_arguments(
    doc: str,
    argv: list[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """``--profile``, ``--workers`` and ``--out``: the command line of a measurement made once and
    recorded (a selection of learning rates, a fidelity comparison), described by ``doc``'s first
    paragraph; ``extra`` adds the measurement's own arguments."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the record here")
    if extra is not None:
        extra(parser)
    return parser.parse_args(argv)


def save_record(record: dict, path: str | Path) -> Path:
    """Write what a :func:`record_arguments` command measured (a selection of learning rates, a
    fidelity comparison: not an experiment's results, so not held to their schema) as JSON,
    atomically."""
    path = Path(path)
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(record, indent=1))
    return path


def _unwritable(folder: Path) -> str | None:
    """Why a file cannot be written in ``folder`` (created if missing), or None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def _parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--no-cache", action="store_true", help="train even if a checkpoint exists")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--resume", action="store_true", help="continue interrupted training from its checkpoints"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    """``python -m modnets.experiments <name> [options]``: any experiment by name;
    ``python -m modnets.experiments rules``: the fingerprints of the rules that differ from the
    rule-change log (what a new log entry must record)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    names = list_experiments()
    if argv[:1] == ["rules"]:
        print(json.dumps(unlogged(all_rules()), indent=1))
        return
    if not argv or argv[0] not in names:
        sys.exit(
            "usage: python -m modnets.experiments NAME [--profile P] [--out F] ...\n"
            f"       python -m modnets.experiments rules\nNAME: one of {', '.join(names)}"
        )
    experiment_main(get(argv[0]), argv[1:])


def experiment_main(experiment: Experiment, argv: list[str] | None = None) -> None:
    """Parse the command line, run ``experiment``, print its summary and the claims, write the
    JSON."""
    parser = _parser(experiment.title)
    args = parser.parse_args(argv)
    # where the run will write, checked before it trains for hours
    folders = {"--out": args.out.parent if args.out is not None else None}
    folders["the checkpoint folder (MODNETS_CHECKPOINTS)"] = (
        None if args.no_cache else checkpoint_dir()
    )
    for what, folder in folders.items():
        problem = folder and _unwritable(folder)
        if problem:
            parser.error(f"{what}: cannot write to {folder} ({problem})")
    distributed.setup()  # under torchrun: one process per device, data-parallel training
    try:
        options = RunOptions(
            show_progress=not args.quiet, resume=args.resume, cache=not args.no_cache
        )
        results = experiment.run(profile=args.profile, options=options)
        if distributed.is_main():
            print(experiment.summary(results))
            print(format_claims(results))
            if args.out is not None:
                save_results(results, args.out)
                print(f"results written to {args.out}", file=sys.stderr)
    except KeyboardInterrupt as err:
        what = str(err) or "interrupted outside a training step (nothing to save)"
        sys.exit(f"\n{what}; rerun with --resume to continue")
    finally:
        distributed.cleanup()
