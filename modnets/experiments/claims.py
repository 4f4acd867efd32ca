"""Claims as code: every verdict in the book is computed here, by one rule.

A claim names what a paper says (``paper``, with its ``source``: "Table 1", "Fig. 5a"), what we
measured (``ours``, mean ± sd over seeds), the pre-declared test (``rule``) and the ``verdict``.
The verdict comes from the 95 % t-interval (``scipy.stats``) over seeds of one quantity: ours
minus a threshold (:func:`threshold_claim`), or A minus B, paired by seed
(:func:`comparison_claim`):

* ``reproduced``      -- the interval lies wholly on the paper's side;
* ``not reproduced``  -- it lies wholly on the other side;
* ``inconclusive``    -- it straddles the threshold (or there is one seed only, or every seed
  gave the same value, so that there is no spread to build an interval from);
* ``not testable here`` -- the test needs something this setting lacks (:func:`untestable`), or a
  precondition of the test does not hold (:func:`precondition`).

Each experiment module writes its rules in ``claims(results)`` before its numbers are seen; the
chapters render them with :func:`claims_table` and state verdicts only through
:func:`verdict_sentences`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from modnets.experiments.harness import seed_stats

__all__ = [
    "VERDICTS",
    "CLAIM_FIELDS",
    "Claim",
    "decide",
    "threshold_claim",
    "comparison_claim",
    "untestable",
    "precondition",
    "claims_frame",
    "claims_table",
    "verdict_sentences",
    "PAPERS",
    "paper_scale_command",
    "reproduction",
    "verdict_counts",
]

VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not testable here")
CLAIM_FIELDS = ("id", "text", "source", "paper", "ours", "rule", "verdict")
DIRECTIONS = {">": "above", "<": "below"}
COLOURS = {"reproduced": "#d4edda", "not reproduced": "#f8d7da", "inconclusive": "#fff3cd",
           "not testable here": "#e2e3e5"}  # fmt: skip


@dataclass(frozen=True)
class Claim:
    """One claim of a paper and its computed verdict (see the module docstring)."""

    id: str
    text: str
    source: str
    paper: str
    ours: str
    rule: str
    verdict: str
    reason: str = ""
    interval: list | None = None  # the 95 % t-interval of the tested quantity
    values: list = field(default_factory=list)  # the tested quantity, one value per seed

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    def as_dict(self) -> dict:
        return asdict(self)


def decide(values: Sequence[float], threshold: float = 0.0, direction: str = ">",
           confidence: float = 0.95) -> tuple[str, list | None, str]:  # fmt: skip
    """``(verdict, interval, reason)`` for "the quantity is ``direction`` ``threshold``", from the
    ``confidence`` t-interval over the per-seed ``values``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {tuple(DIRECTIONS)}, got {direction!r}")
    s = seed_stats(values, confidence)
    if not all(math.isfinite(v) for v in s["values"]):
        return "inconclusive", None, "a seed gave a non-finite value: no interval"
    if s["ci"] is None:
        return "inconclusive", None, "one seed: no interval, so no verdict"
    if s["sd"] == 0.0:  # e.g. accuracies on a tiny set, equal on every seed: no spread measured
        return "inconclusive", s["ci"], "the same value on every seed: no spread, so no interval"
    lo, hi = s["ci"]
    above, below = lo > threshold, hi < threshold
    paper_side, other_side = (above, below) if direction == ">" else (below, above)
    if paper_side:
        return "reproduced", s["ci"], ""
    if other_side:
        return "not reproduced", s["ci"], ""
    return "inconclusive", s["ci"], "the interval contains the threshold: within seed noise"


def _ours(s: dict, scale: float, digits: int, unit: str) -> str:
    return f"{scale * s['mean']:.{digits}f} ± {scale * s['sd']:.{digits}f}{unit} (n={s['n']})"


def _rule(quantity: str, direction: str, threshold: float, scale: float, digits: int,
          unit: str) -> str:  # fmt: skip
    side = DIRECTIONS[direction]
    return (f"{quantity} {direction} {scale * threshold:.{digits}f}{unit}: reproduced if the 95 % "
            f"t-interval over seeds lies wholly {side}, not reproduced if wholly on the other "
            "side, else inconclusive")  # fmt: skip


def threshold_claim(id: str, text: str, source: str, paper: str, values: Sequence[float], *,
                    quantity: str, threshold: float, direction: str = ">", scale: float = 1.0,
                    digits: int = 3, unit: str = "") -> Claim:  # fmt: skip
    """Ours (one value per seed) against a fixed ``threshold``. ``scale``, ``digits`` and
    ``unit`` only format the numbers (e.g. ``scale=100, unit=" %"``)."""
    verdict, interval, reason = decide(values, threshold, direction)
    s = seed_stats(values)
    return Claim(id, text, source, paper, _ours(s, scale, digits, unit),
                 _rule(quantity, direction, threshold, scale, digits, unit), verdict, reason,
                 interval, s["values"])  # fmt: skip


def comparison_claim(id: str, text: str, source: str, paper: str, a: Sequence[float],
                     b: Sequence[float], *, names: tuple[str, str], quantity: str,
                     direction: str = ">", margin: float = 0.0, scale: float = 1.0,
                     digits: int = 3, unit: str = "") -> Claim:  # fmt: skip
    """A against B, paired by seed: the tested quantity is ``a - b`` (against ``margin``)."""
    if len(a) != len(b):
        raise ValueError(f"a and b must have one value per seed each, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    verdict, interval, reason = decide(diffs, margin, direction)
    sa, sb, sd = seed_stats(a), seed_stats(b), seed_stats(diffs)
    ours = (f"{names[0]} {_ours(sa, scale, digits, unit)}; {names[1]} "
            f"{_ours(sb, scale, digits, unit)}; difference {_ours(sd, scale, digits, unit)}")  # fmt: skip
    rule = _rule(f"{quantity} ({names[0]} − {names[1]}, paired by seed)", direction, margin,
                 scale, digits, unit)  # fmt: skip
    return Claim(id, text, source, paper, ours, rule, verdict, reason, interval, sd["values"])


def untestable(id: str, text: str, source: str, paper: str, reason: str, rule: str = "-") -> Claim:
    """A claim this setting cannot test (missing data, ...), with the reason."""
    return Claim(id, text, source, paper, "-", rule, "not testable here", reason)


def precondition(claim: Claim, holds: bool, reason: str) -> Claim:
    """``claim`` as computed when its test's precondition ``holds``; otherwise the same numbers
    with verdict ``inconclusive`` and ``reason`` (e.g. the effect to be removed is not there)."""
    if holds:
        return claim
    return replace(claim, verdict="inconclusive", reason=reason)


# ----------------------------------------------------------------------------- rendering


def _as_claims(claims) -> list[dict]:
    return [c.as_dict() if isinstance(c, Claim) else dict(c) for c in claims]


def claims_frame(claims):
    """A ``pandas.DataFrame``: one row per claim."""
    import pandas as pd

    rows = [{"claim": c["text"], "source": c["source"], "paper": c["paper"], "ours": c["ours"],
             "rule": c["rule"], "verdict": c["verdict"] + (f" ({c['reason']})" if c.get("reason") else "")}
            for c in _as_claims(claims)]  # fmt: skip
    return pd.DataFrame(rows, columns=["claim", "source", "paper", "ours", "rule", "verdict"])


def claims_table(claims, rule: bool = True, commands: list[str] | None = None):
    """The claims as an HTML table (a pandas ``Styler``), verdicts coloured; ``commands`` (one
    per claim) adds a column with the command that reproduces each at the papers' scale."""
    frame = claims_frame(claims)
    if not rule:
        frame = frame.drop(columns="rule")
    if commands is not None:
        frame.insert(2, "reproduce at scale", [f"<code>{c}</code>" for c in commands])

    def colour(v: str) -> str:
        key = next((k for k in sorted(COLOURS, key=len, reverse=True) if v.startswith(k)), "")
        return f"background-color: {COLOURS[key]}" if key else ""

    return (frame.style.hide(axis="index").map(colour, subset=["verdict"])
            .set_properties(**{"text-align": "left", "font-size": "0.85em"}))  # fmt: skip


def verdict_sentences(claims) -> str:
    """One Markdown sentence per claim, generated from its verdict: the only place where the
    chapters state a verdict."""
    lines = []
    for c in _as_claims(claims):
        reason = f" ({c['reason']})" if c.get("reason") else ""
        lines.append(f"- **{c['text']}** ({c['source']}): **{c['verdict']}**{reason}. "
                     f"Paper: {c['paper']}; ours: {c['ours']}.")  # fmt: skip
    return "\n".join(lines)


# ----------------------------------------------------------------------------- chapter 13

#: The experiments whose claims the book tests, by paper.
PAPERS = {
    "Neural Interpreters": ("fuzzy_boolean", "digits"),
    "Neural Attentive Circuits": ("tiny_imagenet",),
    "Neural Function Modules": ("stacked_mnist",),
}


def paper_scale_command(experiment: str) -> str:
    """The command that runs ``experiment`` at the papers' settings (its module may name one in
    ``GPU_COMMAND``, e.g. with ``torchrun``)."""
    from modnets.experiments.harness import import_experiment

    default = f"python -m modnets.experiments.{experiment} --profile gpu"
    return getattr(import_experiment(experiment), "GPU_COMMAND", default)


def reproduction(experiments, profile: str, folder="_build/results"):
    """Every claim of ``experiments`` read from their results files
    (``<folder>/<experiment>_<profile>.json``), one row each with the command that reproduces it
    at the papers' scale, as an HTML table; and a list of the results files that are missing."""
    from modnets.experiments.results import load_results, results_path

    claims, commands, missing = [], [], []
    for name in experiments:
        path = results_path(name, profile, folder)
        if not path.exists():
            missing.append(f"{path} (run its chapter, or `python -m modnets.experiments.{name} "
                           f"--profile {profile} --out {path}`)")  # fmt: skip
            continue
        for c in load_results(path)["claims"]:
            claims.append(c)
            commands.append(paper_scale_command(name))
    return claims_table(claims, rule=False, commands=commands), claims, missing


def verdict_counts(claims) -> str:
    """``"3 reproduced, 1 inconclusive"``: how many claims got each verdict."""
    counts = {v: sum(c["verdict"] == v for c in _as_claims(claims)) for v in VERDICTS}
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "no claims"
