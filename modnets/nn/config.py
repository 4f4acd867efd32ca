"""One switch for the path every :class:`~modnets.nn.modattn.ModAttn` takes, as timm's
``layers/config.py`` has for fused attention.

``None`` (the default) lets each ModAttn take the path a measurement at its shape found faster
(:meth:`~modnets.nn.modattn.ModAttn.takes_fused`); ``True`` runs
NI eq. 7 through ``F.scaled_dot_product_attention``; ``False`` runs it as written, with its
``(B, U, H, T, T)`` weights. A ModAttn built with its own ``fused`` argument ignores the switch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["fused_attn", "set_fused_attn", "use_fused_attn"]

_FUSED_ATTN: bool | None = None


def _check(fused) -> None:
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"fused must be True, False or None, got {fused!r}")


def fused_attn() -> bool | None:
    """The current setting: ``True``, ``False`` or ``None`` (each ModAttn chooses)."""
    return _FUSED_ATTN


def set_fused_attn(fused: bool | None) -> None:
    """Set the path of every ModAttn built without its own ``fused`` argument."""
    global _FUSED_ATTN
    _check(fused)
    _FUSED_ATTN = fused


@contextmanager
def use_fused_attn(fused: bool | None) -> Iterator[None]:
    """:func:`set_fused_attn` inside a ``with`` block; the previous setting afterwards."""
    _check(fused)
    before = fused_attn()
    set_fused_attn(fused)
    try:
        yield
    finally:
        set_fused_attn(before)
