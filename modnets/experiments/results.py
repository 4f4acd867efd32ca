"""Experiment results as JSON files the book reads."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

__all__ = ["save_results", "load_results", "NOT_SAVED"]

#: Keys of a results dict that hold live objects (models, tensors), never written to JSON.
NOT_SAVED = ("models", "data", "kmnist")


def save_results(results: dict, path: str | Path, exclude: Iterable[str] = NOT_SAVED) -> Path:
    """Write ``results`` without the ``exclude`` keys as JSON, atomically (temporary file, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    skip = set(exclude)
    tmp.write_text(
        json.dumps({k: v for k, v in results.items() if k not in skip}, indent=1, default=str)
    )
    tmp.replace(path)
    return path


def load_results(path: str | Path) -> dict:
    """Read results written by :func:`save_results`."""
    return json.loads(Path(path).read_text())
