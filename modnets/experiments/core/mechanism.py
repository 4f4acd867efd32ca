"""Mechanism checks: is the part of the model a claim is about used at all?

A claim about dropping modules is empty when the modules carry nothing: dropping them then
costs nothing whatever order they are dropped in, and "little cost" is reproduced for the wrong
reason. Before a claim is decided, its experiment checks, on the same seeds, that removing the
part (every edge, all modules but one, all functions but one) costs more accuracy than the
intact model varies from seed to seed. Where it does not, the claims that rely on it are ``not
testable here: <part> unused`` (:func:`modnets.experiments.core.claims.outside_regime`), never
reproduced. The checks are part of the regime (:func:`modnets.experiments.core.harness.regime`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from modnets.experiments.core.stats import seed_stats

__all__ = ["Mechanism", "mechanism"]


@dataclass(frozen=True)
class Mechanism:
    """One mechanism check: ``cost`` is the mean over seeds of the intact model's score minus the
    score with the part removed (``how``), ``spread`` the intact score's standard deviation over
    seeds. The part is ``used`` when the cost exceeds the spread, ``unused`` when it does not,
    and neither where there is nothing to compare (one seed, a non-finite score): then the
    claims keep their verdicts. ``claims``: the rule ids that rely on it."""

    name: str
    how: str
    claims: tuple[str, ...]
    cost: float
    spread: float

    @property
    def checked(self) -> bool:
        return math.isfinite(self.cost) and math.isfinite(self.spread)

    @property
    def used(self) -> bool:
        return self.checked and self.cost > self.spread

    @property
    def unused(self) -> bool:
        return self.checked and self.cost <= self.spread

    def describe(self, scale: float = 100.0, unit: str = " points") -> str:
        cost = f"{self.how} costs {scale * self.cost:.1f}{unit}"
        if not self.checked:
            return f"{cost}, with no seed spread to compare it with"
        than = "more than" if self.used else "not more than"
        sd = f"sd {scale * self.spread:.1f}{unit}"
        return f"{cost}, {than} the seed spread of the intact model ({sd})"

    def as_dict(self) -> dict:
        return {**asdict(self), "claims": list(self.claims), "used": self.used}

    @classmethod
    def from_dict(cls, d: dict) -> Mechanism:
        """The check as a results file holds it (:meth:`as_dict`)."""
        return cls(d["name"], d["how"], tuple(d["claims"]), d["cost"], d["spread"])


def mechanism(
    name: str, how: str, claims: Sequence[str], intact: Sequence[float], ablated: Sequence[float]
) -> Mechanism:
    """The check of ``name`` from per-seed scores of the intact model and of the model with the
    part removed (paired by seed)."""
    if len(intact) != len(ablated) or not intact:
        raise ValueError(
            f"intact and ablated need one score per seed each, got {len(intact)} and {len(ablated)}"
        )
    cost = seed_stats([a - b for a, b in zip(intact, ablated, strict=True)])["mean"]
    spread = seed_stats(intact)["sd"] if len(intact) > 1 else float("nan")
    return Mechanism(name, how, tuple(claims), cost, spread)
