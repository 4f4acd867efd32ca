"""``python -m modnets.experiments.side_by_side``: see :mod:`modnets.experiments.side_by_side.run`."""

from modnets.experiments.core.cli import experiment_main
from modnets.experiments.side_by_side import EXPERIMENT

experiment_main(EXPERIMENT)
