"""``python -m modnets.experiments.digits``: see :mod:`modnets.experiments.digits.run`."""

from modnets.experiments.core.cli import experiment_main
from modnets.experiments.digits import EXPERIMENT

experiment_main(EXPERIMENT)
