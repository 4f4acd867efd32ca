"""``python -m modnets.experiments.stacked_mnist``: see :mod:`modnets.experiments.stacked_mnist.run`."""

from modnets.experiments.stacked_mnist.run import main

main()
