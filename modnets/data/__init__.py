"""Where datasets live.

The data root is ``$MODNETS_DATA`` when set, else ``~/.cache/modnets``. Datasets keep their standard
on-disk layouts below it (``MNIST/raw/*.gz``, ``KMNIST/raw/*.npz``, ``MNIST-M/mnist_m/``,
``TinyImageNet/tiny-imagenet-200/``). Loaders download into it when the internet is reachable and
otherwise raise :class:`DatasetNotFoundError` naming the missing path and how to provide it. A data
root that cannot be written, or that holds part of a release, is never written into: the missing
release goes to :func:`download_root` instead, with the same layout.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "ENV_VAR",
    "data_root",
    "download_root",
    "writable",
    "DatasetNotFoundError",
    "DatasetCorruptedError",
]

ENV_VAR = "MODNETS_DATA"


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is missing from the data root and could not be downloaded."""


class DatasetCorruptedError(ValueError):
    """A dataset file exists but is truncated, corrupted or of an unknown release."""


def data_root() -> Path:
    """The directory that holds the datasets (not created here)."""
    env = os.environ.get(ENV_VAR, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "modnets"


def download_root() -> Path:
    """Where a release goes when the data root cannot take it (read-only, or holding a partial
    copy): ``~/.cache/modnets``."""
    return Path.home() / ".cache" / "modnets"


def writable(path: Path) -> bool:
    """Whether ``path``, or the nearest of its parents that exists, can be written."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return os.access(path, os.W_OK)
