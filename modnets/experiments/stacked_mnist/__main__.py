"""``python -m modnets.experiments.stacked_mnist``: see :mod:`modnets.experiments.stacked_mnist.run`."""

from modnets.experiments.core.cli import experiment_main
from modnets.experiments.stacked_mnist import EXPERIMENT

experiment_main(EXPERIMENT)
