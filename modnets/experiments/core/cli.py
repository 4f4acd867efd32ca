"""The command line shared by every experiment: ``python -m modnets.experiments.<name>``.

``--profile``, ``--out`` (JSON results in the schema of :mod:`modnets.experiments.core.harness`),
``--no-cache`` (retrain even if a checkpoint exists), ``--quiet`` and ``--resume`` (continue
interrupted training). Under ``torchrun`` each process joins the process group and trains
data-parallel; only rank 0 prints and writes. Ctrl-C saves the training state and exits with a
hint to ``--resume``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from modnets import distributed
from modnets.experiments.core.results import save_results
from modnets.profiles import PROFILES
from modnets.training import checkpoint_dir

__all__ = ["experiment_main", "format_claims"]


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


def _unwritable(folder: Path) -> str | None:
    """Why a file cannot be written in ``folder`` (created if missing), or None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def experiment_main(
    run: Callable[..., dict],
    summary: Callable[[dict], str],
    doc: str,
    argv: list[str] | None = None,
) -> None:
    """Parse the command line, run the experiment, print ``summary(results)`` and the claims,
    write the JSON."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--no-cache", action="store_true", help="train even if a checkpoint exists")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--resume", action="store_true", help="continue interrupted training from its checkpoints"
    )
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
        results = run(
            profile=args.profile,
            show_progress=not args.quiet,
            resume=args.resume,
            cache=not args.no_cache,
        )
        if distributed.is_main():
            print(summary(results))
            print(format_claims(results))
            if args.out is not None:
                save_results(results, args.out)
                print(f"results written to {args.out}", file=sys.stderr)
    except KeyboardInterrupt as err:
        what = str(err) or "interrupted outside a training step (nothing to save)"
        sys.exit(f"\n{what}; rerun with --resume to continue")
    finally:
        distributed.cleanup()
