"""The papers' experiments, runnable as ``python -m modnets.experiments.<name> --profile cpu``."""
