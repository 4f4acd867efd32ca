"""Experiment results as JSON files the book reads (the schema: :data:`harness.SCHEMA`)."""

from __future__ import annotations

import json
from pathlib import Path

from modnets.experiments.core.harness import check_results
from modnets.utils import atomic_file

__all__ = ["save_results", "load_results", "results_path"]


def results_path(experiment: str, profile: str, folder: str | Path = "_build/results") -> Path:
    """Where the chapters keep an experiment's results: ``<folder>/<experiment>_<profile>.json``."""
    return Path(folder) / f"{experiment}_{profile}.json"


def save_results(results: dict, path: str | Path) -> Path:
    """Check ``results`` against the schema, then write it as JSON atomically (a temporary file
    in the same folder, then a rename: never half-written)."""
    check_results(results)
    path = Path(path)
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(results, indent=1))
    return path


def load_results(path: str | Path) -> dict:
    """Read results written by :func:`save_results` (checked against the schema)."""
    results = json.loads(Path(path).read_text())
    check_results(results)
    return results
