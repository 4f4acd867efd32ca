"""``python -m modnets.experiments NAME --profile cpu``: any experiment by name."""

from modnets.experiments.core.cli import main

main()
