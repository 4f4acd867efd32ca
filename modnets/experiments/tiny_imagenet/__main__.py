"""``python -m modnets.experiments.tiny_imagenet``: see :mod:`modnets.experiments.tiny_imagenet.run`."""

from modnets.experiments.tiny_imagenet.run import main

main()
