"""Benchmarks: ``python -m bench`` runs the suite of :mod:`modnets.benchmarks`."""
