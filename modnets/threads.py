"""The CPU thread policy shared by the experiments, the notebooks and the benchmarks.

torch's CPU kernels run on libgomp (GNU OpenMP) threads. By default a thread that finishes its
share of a parallel region *spins* for about 300,000 iterations before it sleeps, waiting for the
others. That is fastest on a quiet machine, and ruinous when another process holds one of the
cores: the spinning thread keeps its core while the thread it waits for cannot run. On two cores,
a small model's training step then runs several times slower (chapter 12, ``thread_policy``).

The policy: use every core (two threads beat one on a quiet machine for every experiment's
step), but let waiting threads spin only :data:`GOMP_SPINCOUNT` iterations before they sleep.
libgomp reads the variable once, when torch loads it, so :func:`apply` must run before
``import torch``: ``import modnets`` first does it, and the Makefile exports it for the book.
Where torch was imported first, the policy does not apply and the default spinning stays.

The thread count does not change what is computed, only how fast; but 1 and 2 threads round
differently, so it is left at torch's default (all cores) rather than adapted while training,
which would make training irreproducible.
"""

from __future__ import annotations

import os
import sys

__all__ = ["GOMP_SPINCOUNT", "apply", "effective"]

#: Iterations a waiting libgomp thread spins before it sleeps (libgomp's default: 300,000).
#: Chosen in ``python -m bench --only thread_policy``, which times every experiment's training
#: step quiet and next to a busy process under several values.
GOMP_SPINCOUNT = "1000"

#: Whether the policy took effect in this process (``import modnets`` came before torch).
effective: bool | None = None


def apply() -> bool:
    """Set ``GOMP_SPINCOUNT`` (unless the environment already sets it) and record in
    :data:`effective` whether torch was still unloaded, so that it applies to this process (it
    always applies to child processes)."""
    global effective
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
    if effective is None:
        effective = "torch" not in sys.modules
    return effective
