"""Claims as code: every verdict in the book is computed here, from a rule declared in advance.

A rule (:class:`modnets.experiments.core.rules.Rule`) says what is tested: a quantity, measured once
per seed, against a threshold, in a direction (``>``, ``<``), or signed within a margin
(``equivalent``). Rules of kind ``"paper"`` quote a claim of a paper with its own number
(``paper_effect``, in the units of the tested quantity); rules of kind ``"ours"`` are questions of
this book and never count as reproductions. This module turns a rule and its per-seed values
into a :class:`Claim`:

* ``reproduced``       -- the 95 % t-interval over seeds lies wholly on the claim's side of the
  threshold (for an equivalence: the two one-sided tests (TOST) put the 90 % interval inside
  the margin);
* ``not reproduced``   -- the interval lies wholly on the other side (outside the margin);
* ``inconclusive``     -- neither; the ``reason`` says whether the effect is *smaller than the
  paper's* (the interval excludes the paper's effect: said first, since it holds at any power),
  or else whether the test was *underpowered* (its minimal detectable effect ``mde`` at 80 %
  power exceeds the paper's effect, with the number of seeds that would do);
* ``not testable here`` -- the setting lacks something the test needs (:func:`untestable`), or
  the models missed the regime the claim presupposes (:func:`outside_regime`).

Every tested claim carries its p-value; :func:`holm` adds ``verdict_holm``, the verdict after
Holm's correction within a family (one paper's claims). Power, TOST and Holm come from
``statsmodels``; intervals from ``scipy``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from modnets.experiments.core.mechanism import Mechanism
from modnets.experiments.core.rules import Rule, get_rule
from modnets.experiments.core.stats import seed_stats

__all__ = [
    "VERDICTS",
    "CLAIM_KINDS",
    "CLAIM_FIELDS",
    "ALPHA",
    "POWER",
    "Claim",
    "decide",
    "mde",
    "seeds_needed",
    "paper_distance",
    "decide_rule",
    "sides",
    "paired",
    "untestable",
    "outside_regime",
    "holm",
]

VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not testable here")
CLAIM_KINDS = ("paper", "ours")
CLAIM_FIELDS = ("id", "kind", "text", "source", "paper", "ours", "rule", "verdict")
ALPHA = 0.05  # two-sided: the 95 % interval decides
POWER = 0.8  # the power at which the minimal detectable effect is stated
MAX_SEEDS = 1000  # seeds_needed caps its search here


@dataclass(frozen=True)
class Claim:
    """One rule's outcome (see the module docstring). ``paper_effect``, ``threshold``, ``mde``
    and ``interval`` are in the units of the tested quantity (unscaled)."""

    id: str
    kind: str
    text: str
    source: str
    paper: str
    ours: str
    rule: str
    verdict: str
    reason: str = ""
    interval: list | None = None  # the 95 % t-interval of the tested quantity
    values: list = field(default_factory=list)  # the tested quantity, one value per seed
    test: str = ">"
    threshold: float | None = None
    paper_effect: float | None = None
    mde: float | None = None  # the smallest effect (distance from the threshold) seen at 80 %
    seeds_needed: int | None = None  # seeds that would see the paper's effect at 80 % power
    vs_paper: str = "-"
    p_value: float | None = None
    verdict_holm: str = ""
    holm_family: str = ""
    scale: float = 1.0
    unit: str = ""

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.kind not in CLAIM_KINDS:
            raise ValueError(f"kind must be one of {CLAIM_KINDS}, got {self.kind!r}")

    def as_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- the tests


def decide(
    values: Sequence[float],
    threshold: float = 0.0,
    direction: str = ">",
    confidence: float = 1 - ALPHA,
) -> tuple[str, list | None, str]:
    """``(verdict, interval, reason)`` for "the quantity is ``direction`` ``threshold``", from the
    ``confidence`` t-interval over the per-seed ``values``. ``"!="`` (a difference of either
    sign) is reproduced by an interval on either side; no interval shows there is none."""
    if direction not in (">", "<", "!="):
        raise ValueError(f"direction must be '>', '<' or '!=', got {direction!r}")
    s = seed_stats(values, confidence)
    if not all(math.isfinite(v) for v in s["values"]):
        return "inconclusive", None, "a seed gave a non-finite value: no interval"
    if s["ci"] is None:
        return "inconclusive", None, "one seed: no interval, so no verdict"
    if s["sd"] == 0.0:
        return "inconclusive", s["ci"], "the same value on every seed: no spread, so no interval"
    lo, hi = s["ci"]
    above, below = lo > threshold, hi < threshold
    if direction == "!=":
        paper_side, other_side = above or below, False
    else:
        paper_side, other_side = (above, below) if direction == ">" else (below, above)
    if paper_side:
        return "reproduced", s["ci"], ""
    if other_side:
        return "not reproduced", s["ci"], ""
    return "inconclusive", s["ci"], "the interval contains the threshold"


def _power_args(equivalence: bool) -> dict:
    # TOST passes when both one-sided tests do: each at power (1 + POWER) / 2
    if equivalence:
        return dict(alpha=ALPHA, power=(1 + POWER) / 2, alternative="larger")
    return dict(alpha=ALPHA, power=POWER, alternative="two-sided")


def mde(sd: float, n: int, equivalence: bool = False) -> float | None:
    """The minimal detectable effect of a one-sample t-test over ``n`` seeds with spread ``sd``:
    the distance from the threshold found with :data:`POWER` at the two-sided :data:`ALPHA`
    (``statsmodels`` ``TTestPower``). For an equivalence (TOST, each side at :data:`ALPHA`), the
    smallest margin shown with that power when the true difference is 0."""
    if n < 2 or not math.isfinite(sd) or sd <= 0:
        return None
    return _standard_mde(n, **_power_args(equivalence)) * sd


# The solve depends on the test and n, not on the spread, and seeds_needed bisects over n:
# each is solved once.
@functools.cache
def _standard_mde(n: int, alpha: float, power: float, alternative: str) -> float:
    """The MDE in units of the spread (Cohen's d) over ``n`` seeds."""
    from statsmodels.stats.power import TTestPower

    d = TTestPower().solve_power(nobs=n, alpha=alpha, power=power, alternative=alternative)
    return float(np.squeeze(d))


def seeds_needed(effect: float, sd: float, equivalence: bool = False) -> int | None:
    """Seeds that give :data:`POWER` to detect ``effect`` (a distance from the threshold, or the
    margin of an equivalence) at spread ``sd``; None past :data:`MAX_SEEDS`."""
    if not (math.isfinite(sd) and sd > 0 and effect > 0):
        return None

    def ok(n: int) -> bool:
        m = mde(sd, n, equivalence)
        return m is not None and m <= effect

    if not ok(MAX_SEEDS):
        return None
    lo, hi = 1, 2  # ok(hi) by the end; never ok(lo)
    while not ok(hi):
        lo, hi = hi, min(2 * hi, MAX_SEEDS)
    while hi - lo > 1:  # the mde falls with n: bisect for the first n that is ok
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def _tost(values: np.ndarray, margin: float) -> tuple[str, list | None, float, str]:
    """Equivalence within ``±margin``: TOST at :data:`ALPHA` (90 % interval inside the margin)
    reproduces; the 95 % interval wholly outside it does not."""
    from scipy import stats
    from statsmodels.stats.weightstats import DescrStatsW

    s = seed_stats(values)
    if s["ci"] is None or s["sd"] == 0.0:
        return "inconclusive", s["ci"], float("nan"), "no spread over seeds: no interval"
    p, _, _ = DescrStatsW(values).ttost_mean(-margin, margin)
    lo, hi = s["ci"]
    if p < ALPHA:
        return "reproduced", s["ci"], float(p), ""
    if lo > margin or hi < -margin:
        side = margin if lo > margin else -margin
        return "not reproduced", s["ci"], float(stats.ttest_1samp(values, side).pvalue), ""
    return "inconclusive", s["ci"], float(p), "the interval is not inside the margin"


def _fmt(x: float, rule: Rule) -> str:
    return f"{rule.scale * x:.{rule.digits}f}{rule.unit}"


def _ours(values: Sequence[float], rule: Rule) -> str:
    s = seed_stats(values)
    return f"{_fmt(s['mean'], rule)} ± {rule.scale * s['sd']:.{rule.digits}f} (n={s['n']})"


def decide_rule(
    rule_id: str, values: Sequence[float], ours: str | None = None, rules: dict | None = None
) -> Claim:
    """The claim of rule ``rule_id`` (declared by its experiment, or from ``rules``) tested on
    ``values``, one per seed. ``ours`` replaces the default "mean ± sd" summary (e.g. to show both
    sides of a comparison)."""
    from scipy import stats  # (scipy and statsmodels load in seconds: only where used)

    rule = get_rule(rule_id) if rules is None else rules[rule_id]
    v = np.asarray([float(x) for x in values], dtype=float)
    s = seed_stats(v)
    equivalence = rule.test == "equivalent"
    if equivalence:
        verdict, interval, p, reason = _tost(v, rule.threshold)
    else:
        verdict, interval, reason = decide(v, rule.threshold, rule.test)
        finite = v.size > 1 and np.isfinite(v).all() and s["sd"] > 0
        p = float(stats.ttest_1samp(v, rule.threshold).pvalue) if finite else float("nan")
    m = mde(s["sd"], s["n"], equivalence) if np.isfinite(v).all() else None
    distance = paper_distance(rule)
    needed = seeds_needed(distance, s["sd"], equivalence) if distance is not None else None
    vs = _vs_paper(rule, interval)
    if verdict == "inconclusive" and interval is not None and reason:
        power = {"mde": m, "distance": distance, "needed": needed, "vs": vs, "n": s["n"]}
        reason = _why_inconclusive(rule, reason, **power)
    return _claim(
        rule,
        ours or _ours(v, rule),
        verdict,
        reason,
        interval=interval,
        values=s["values"],
        mde=m,
        seeds_needed=needed,
        vs_paper=vs,
        p_value=None if math.isnan(p) else p,
    )


def _claim(rule: Rule, ours: str, verdict: str, reason: str, **outcome) -> Claim:
    """A :class:`Claim` of ``rule``: its fields from the rule, the rest from ``outcome``."""
    return Claim(
        id=rule.id,
        kind=rule.kind,
        text=rule.text,
        source=rule.source,
        paper=rule.paper,
        ours=ours,
        rule=rule.describe(),
        verdict=verdict,
        reason=reason,
        test=rule.test,
        threshold=rule.threshold,
        paper_effect=rule.paper_effect,
        scale=rule.scale,
        unit=rule.unit,
        **outcome,
    )


def paper_distance(rule: Rule) -> float | None:
    """How far the paper's effect lies from the threshold, on the claim's side (an equivalence:
    its margin); None where the paper gives no number."""
    if rule.test == "equivalent":
        return rule.threshold
    if rule.paper_effect is None:
        return None
    d = rule.paper_effect - rule.threshold
    return {">": d, "<": -d, "!=": abs(d)}[rule.test]


def _vs_paper(rule: Rule, interval: list | None) -> str:
    # a zero-width interval (the same value on every seed) says nothing about the paper's effect
    if rule.paper_effect is None or interval is None or interval[0] == interval[1]:
        return "-"
    lo, hi = interval
    if rule.test == "equivalent":
        return (
            "consistent with the paper's" if lo <= rule.paper_effect <= hi else "unlike the paper's"
        )
    if rule.test == "!=":  # the size of the difference, whichever its sign
        size, a, b = (
            abs(rule.paper_effect - rule.threshold),
            lo - rule.threshold,
            hi - rule.threshold,
        )
        least = 0.0 if a <= 0 <= b else min(abs(a), abs(b))
        if max(abs(a), abs(b)) < size:
            return "smaller than the paper's"
        return "larger than the paper's" if least > size else "consistent with the paper's"
    below, above = hi < rule.paper_effect, lo > rule.paper_effect
    smaller, larger = (below, above) if rule.test == ">" else (above, below)
    if smaller:
        return "smaller than the paper's"
    return "larger than the paper's" if larger else "consistent with the paper's"


def _why_inconclusive(rule: Rule, reason: str, *, mde, distance, needed, vs: str, n: int) -> str:
    m = mde
    if distance is None or m is None:
        return reason
    # an interval that already excludes the paper's effect decided that much, whatever the power
    if vs == "smaller than the paper's":
        return f"{reason}; the effect is smaller than the paper's (mde {_fmt(m, rule)})"
    if m > distance:
        more = f"{needed} seeds would" if needed else f"over {MAX_SEEDS} seeds would"
        return (
            f"underpowered: at n={n} the test detects {_fmt(m, rule)} or more, the "
            f"paper's effect is {_fmt(distance, rule)}; {more}"
        )
    return f"{reason}, though the test could see the paper's effect (mde {_fmt(m, rule)})"


def sides(
    a: Sequence[float], b: Sequence[float], names: tuple[str, str], rule_id: str | None = None
) -> str:
    """``"A mean ± sd; B mean ± sd"``: both sides of a paired comparison, formatted as rule
    ``rule_id`` formats its quantity."""
    rule = get_rule(rule_id) if rule_id is not None else None
    out = []
    for name, v in zip(names, (a, b), strict=True):
        st = seed_stats(v)
        if rule is None:
            out.append(f"{name} {st['mean']:.3f} ± {st['sd']:.3f}")
        else:
            out.append(f"{name} {_fmt(st['mean'], rule)} ± {rule.scale * st['sd']:.{rule.digits}f}")
    return "; ".join(out)


def paired(rule_id: str, a: Sequence[float], b: Sequence[float], names: tuple[str, str]) -> Claim:
    """Rule ``rule_id`` tested on ``a - b``, paired by seed, both sides shown in ``ours``."""
    if len(a) != len(b):
        raise ValueError(f"a and b must have one value per seed each, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    s = seed_stats(diffs)
    rule = get_rule(rule_id)
    diff = f"difference {_fmt(s['mean'], rule)} ± {rule.scale * s['sd']:.{rule.digits}f}"
    return decide_rule(rule_id, diffs, f"{sides(a, b, names, rule_id)}; {diff} (n={s['n']})")


def untestable(rule_id: str, reason: str, rules: dict | None = None) -> Claim:
    """Rule ``rule_id`` where this setting cannot test it (missing data, ...), with the reason."""
    rule = get_rule(rule_id) if rules is None else rules[rule_id]
    return _claim(rule, "-", "not testable here", reason)


def outside_regime(claim: Claim, regime: dict) -> Claim:
    """``claim`` unchanged where the experiment's models reached the regime its claims presuppose
    (``regime["reached"]``) and use the part it is about (``regime["mechanisms"]``,
    :mod:`modnets.experiments.core.mechanism`); otherwise ``not testable here`` with the measured
    shortfall, its numbers kept."""
    checks = [Mechanism.from_dict(m) for m in regime.get("mechanisms", ())]
    unused = [m for m in checks if claim.id in m.claims and m.unused]
    if regime["reached"] and not unused:
        return claim
    if unused:
        reason = f"{unused[0].name} unused: {unused[0].describe()}"
    else:
        reason = f"outside the paper's regime: {regime['shortfall']}"
    return replace(
        claim, verdict="not testable here", verdict_holm="not testable here", reason=reason
    )


def holm(claims: Sequence[Claim], family: str) -> list[Claim]:
    """``claims`` with ``verdict_holm``: the claims of kind ``"paper"`` that were tested (a
    p-value) get Holm's step-down correction at :data:`ALPHA` (``statsmodels``
    ``multipletests``) over ``family``; a decisive verdict whose adjusted p-value is not below
    :data:`ALPHA` becomes ``inconclusive``. Every other claim keeps its verdict."""
    tested = [
        i
        for i, c in enumerate(claims)
        if c.kind == "paper" and c.p_value is not None and c.verdict != "not testable here"
    ]
    out = [replace(c, verdict_holm=c.verdict, holm_family="") for c in claims]
    if tested:
        from statsmodels.stats.multitest import multipletests

        reject = multipletests([claims[i].p_value for i in tested], ALPHA, "holm")[0]
        for i, r in zip(tested, reject, strict=True):
            verdict = claims[i].verdict if r else "inconclusive"
            out[i] = replace(out[i], verdict_holm=verdict, holm_family=family)
    return out
