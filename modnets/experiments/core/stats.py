"""Summaries over seeds: mean, standard deviation and 95 % interval of one value per seed."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np


def seed_stats(values: Iterable[float], confidence: float = 0.95) -> dict:
    """``{"mean", "sd", "n", "ci", "values"}`` over seeds: ``sd`` with one degree of freedom
    removed, ``ci`` the ``confidence`` t-interval of the mean (``scipy.stats.t``; ``None`` with
    fewer than two values)."""
    v = np.asarray([float(x) for x in values], dtype=float)
    if v.size == 0:
        raise ValueError("seed_stats needs at least one value")
    mean = float(v.mean())
    sd = float(v.std(ddof=1)) if v.size > 1 else 0.0
    ci = None
    if v.size > 1:
        if sd == 0.0:
            ci = [mean, mean]
        else:
            from scipy import stats  # (a second to load: only where a summary is made)

            lo, hi = stats.t.interval(
                confidence, v.size - 1, loc=mean, scale=sd / math.sqrt(v.size)
            )
            ci = [float(lo), float(hi)]
    return {"mean": mean, "sd": sd, "n": int(v.size), "ci": ci, "values": v.tolist()}


def per_seed(runs: Sequence[dict], *path) -> list:
    """``[run[path[0]][path[1]]... for run in runs]``: one value per seed."""
    out = []
    for r in runs:
        for p in path:
            r = r[p]
        out.append(r)
    return out


def fmt(s: dict, scale: float = 1.0, digits: int = 3, n: bool = True) -> str:
    """``"mean ± sd (n=seeds)"`` of a :func:`seed_stats` dict (``n=False``: without the count)."""
    out = f"{scale * s['mean']:.{digits}f} ± {scale * s['sd']:.{digits}f}"
    return f"{out} (n={s['n']})" if n else out
