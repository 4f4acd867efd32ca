"""Where datasets live.

The data root is ``$MODNETS_DATA`` when set, else ``~/.cache/modnets``. Datasets keep their standard
on-disk layouts below it (``MNIST/raw/*.gz``, ``KMNIST/raw/*.npz``, ``MNIST-M/mnist_m/``,
``TinyImageNet/tiny-imagenet-200/``). Loaders download into it when the internet is reachable and
otherwise raise :class:`DatasetNotFoundError` naming the missing path and how to provide it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "data_root", "DatasetNotFoundError", "DatasetCorruptedError"]

ENV_VAR = "MODNETS_DATA"


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is missing from the data root and could not be downloaded."""


class DatasetCorruptedError(ValueError):
    """A dataset file exists but is truncated, corrupted or of an unknown release."""


def data_root() -> Path:
    """The directory that holds the datasets (not created here)."""
    env = os.environ.get(ENV_VAR, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "modnets"
