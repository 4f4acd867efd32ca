"""``python -m modnets.experiments.side_by_side``: see :mod:`modnets.experiments.side_by_side.run`."""

from modnets.experiments.side_by_side.run import main

main()
