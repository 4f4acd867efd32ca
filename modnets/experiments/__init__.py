"""The papers' experiments, runnable as ``python -m modnets.experiments.<name> --profile cpu``.

Each is one package exporting ``EXPERIMENT`` (:mod:`modnets.experiments.core.experiment`);
:func:`list_experiments` and :func:`get` find them, here and in the folders that
``MODNETS_EXPERIMENTS`` names.
"""

from modnets.experiments.core.discovery import extra_folders, get, list_experiments

# a researcher's own experiment packages join this package from the folders the variable names
__path__ += [folder for folder in extra_folders() if folder not in __path__]

__all__ = ["get", "list_experiments"]
