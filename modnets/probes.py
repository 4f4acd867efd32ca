"""Probes: one way to look inside any model of the library.

A model's forward pass names the quantities a reader may want to inspect with one call,
``probe(name, value)``, and otherwise stays the paper's algorithm. Outside a :func:`trace` block
the call is a single truthiness check and records nothing; inside, every value is kept (detached)
in call order::

    with trace() as t:
        model(x)
    t["ni.compatibility"]  # one tensor per function iteration, (B, U, T) each
    t.stack("ni.compatibility")  # (calls, B, U, T)

The names the library emits (one mechanism for the three architectures):

===========================  =========================================================
``ni.types``                 NI: inferred types ``(B, T, d_type)`` per function iteration
``ni.compatibility``         NI: ``C`` ``(B, U, T)`` per function iteration (NI eq. 3)
``skmdpa.log_kernel``        NAC: the log of the sampled kernel each SKMDPA uses (NAC eq. 3)
``nac.confidences``          NAC: the read-out confidences ``(B, U_o)``
``nfm.read_weights``         NFM: the top-k weights of each read ``(B, H, T, 1 + S)``
``nfm.state``                NFM: each module's output ``h(i)``, every pass (Algorithm 1)
===========================  =========================================================

:mod:`modnets.diagnostics` turns traces into the numbers the chapters print (routing spread,
link sparsity, what NFM reads); experiments keep them under ``"diagnostics"`` in their results.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

__all__ = ["probe", "trace", "Trace", "tracing"]

_ACTIVE: list[Trace] = []


class Trace(dict):
    """``name -> [value, ...]`` in call order. ``names`` limits what is kept (None: all)."""

    def __init__(self, names: tuple[str, ...] | None = None):
        super().__init__()
        self.names = names

    def add(self, name: str, value: Tensor) -> None:
        if self.names is None or name in self.names:
            self.setdefault(name, []).append(value.detach())

    def stack(self, name: str, dim: int = 0) -> Tensor:
        """The values recorded under ``name``, stacked along a new ``dim``."""
        if name not in self:
            raise KeyError(f"nothing was recorded under {name!r}; recorded: {sorted(self)}")
        return torch.stack(self[name], dim)


def tracing() -> bool:
    """Whether a :func:`trace` block is open (a model may skip work only a probe needs)."""
    return bool(_ACTIVE)


def probe(name: str, value: Tensor) -> None:
    """Record ``value`` under ``name`` in every open trace; nothing outside :func:`trace`."""
    if _ACTIVE:
        for t in _ACTIVE:
            t.add(name, value)


@contextmanager
def trace(*names: str) -> Iterator[Trace]:
    """Collect what the models' probes emit while the block runs (only ``names``, if given)."""
    t = Trace(names or None)
    _ACTIVE.append(t)
    try:
        yield t
    finally:
        _ACTIVE.remove(t)
