"""``python -m modnets.experiments.digits``: see :mod:`modnets.experiments.digits.run`."""

from modnets.experiments.digits.run import main

main()
