"""``python -m modnets.experiments.tiny_imagenet``: see :mod:`modnets.experiments.tiny_imagenet.run`."""

from modnets.experiments.core.cli import experiment_main
from modnets.experiments.tiny_imagenet import EXPERIMENT

experiment_main(EXPERIMENT)
