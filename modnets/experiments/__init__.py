"""The papers' experiments, runnable as ``python -m modnets.experiments.<name> --profile cpu``.

Each is one package exporting ``EXPERIMENT`` (:mod:`modnets.experiments.core.experiment`);
:func:`list_experiments` and :func:`get` find them, here and in the folders that
``MODNETS_EXPERIMENTS`` names.
"""

import os as _os

# a researcher's own experiment packages join this package from the folders the variable names
__path__ += [p for p in _os.environ.get("MODNETS_EXPERIMENTS", "").split(_os.pathsep) if p.strip()]

from modnets.experiments.core.discovery import get, list_experiments  # noqa: E402

__all__ = ["get", "list_experiments"]
