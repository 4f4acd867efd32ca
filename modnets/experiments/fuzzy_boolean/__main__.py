"""``python -m modnets.experiments.fuzzy_boolean``: see :mod:`modnets.experiments.fuzzy_boolean.run`."""

from modnets.experiments.fuzzy_boolean.run import main

main()
