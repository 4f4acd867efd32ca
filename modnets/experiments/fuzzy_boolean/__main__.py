"""``python -m modnets.experiments.fuzzy_boolean``: see :mod:`modnets.experiments.fuzzy_boolean.run`."""

from modnets.experiments.core.cli import experiment_main
from modnets.experiments.fuzzy_boolean import EXPERIMENT

experiment_main(EXPERIMENT)
