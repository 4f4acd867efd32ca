"""The side-by-side models' learning rates, chosen on the selection seeds alone and recorded, so
that the chapter trains only its claim seeds.

Run ``python -m modnets.experiments.side_by_side.selection --profile cpu``: it writes
``bench/recorded/side_by_side_rates_cpu.json``; the profile's configuration then names the
chosen rates (a test keeps the two equal).
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace

from modnets.experiments.core import harness
from modnets.experiments.core.cli import record_arguments, save_record
from modnets.experiments.core.options import RunOptions
from modnets.experiments.side_by_side.config import CONFIGS, MODEL_NAMES, recorded_path
from modnets.experiments.side_by_side.data import training_data
from modnets.experiments.side_by_side.models import TRAIN_CODE
from modnets.experiments.side_by_side.rates import select_rates
from modnets.profiles import get_profile, select
from modnets.utils import default_device


def selection(profile: str | None = None, workers: int | None = None, show_progress=True) -> dict:
    """Every model trained at every candidate rate on the selection seeds of ``profile``'s
    configuration; ``learning_rates`` (``{kind: lr}``) and each rate's validation accuracy."""
    start = time.perf_counter()
    profile = get_profile(profile)
    config = replace(select(CONFIGS, profile), learning_rates=None)
    device = default_device()
    workers = harness.workers_for(workers, profile, device)
    data = training_data(config.train)
    options = RunOptions(device=device, workers=workers, show_progress=show_progress)
    rates = select_rates(config, data, options)
    return {
        "profile": profile,
        "selection_seeds": list(config.selection_seeds),
        "candidates": list(config.train.lrs),
        "train": asdict(config.train),
        "learning_rates": {k: r["lr"] for k, r in rates.items()},
        "val_exact": {
            MODEL_NAMES[k]: {str(lr): a for lr, a in r["scores"].items()} for k, r in rates.items()
        },
        "provenance": harness.provenance(start, TRAIN_CODE),
    }


def main(argv: list[str] | None = None) -> None:
    args = record_arguments(__doc__, argv)
    result = selection(args.profile, args.workers)
    path = save_record(result, args.out or recorded_path(result["profile"]))
    for kind, lr in result["learning_rates"].items():
        print(
            f"{MODEL_NAMES[kind]}: lr {lr:g}  (validation exact-match {result['val_exact'][MODEL_NAMES[kind]]})"
        )
    print(f"recorded: {path}")


if __name__ == "__main__":
    main()
