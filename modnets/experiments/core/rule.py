"""A rule that decides a claim: the claim it names (a paper's, quoted with its source and its own
number, or one of ours), the quantity measured once per seed, the test and its threshold, and a
fingerprint that pins it (see :mod:`modnets.experiments.core.rules`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

__all__ = ["Rule", "TESTS", "POINTS", "PERCENT", "FIGURE"]

#: ``>`` / ``<``: one direction; ``!=``: either direction (a difference, its sign not claimed);
#: ``equivalent``: within a margin.
TESTS = ("<", ">", "!=", "equivalent")

#: Formatting for a difference of accuracies (fractions) shown in percentage points.
POINTS = {"scale": 100, "digits": 1, "unit": " pts"}
#: Formatting for a loss relative to the full model (a fraction) shown in per cent.
PERCENT = {"scale": 100, "digits": 1, "unit": " %"}
#: How a ``basis`` read from a figure begins: effects read from a figure are the smallest the
#: paper's words imply, declared before running.
FIGURE = "read from a figure: "


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One pre-declared test, its fields given by name. ``threshold`` is the margin of an
    ``equivalent`` test (the quantity must lie within ``±threshold``); ``scale``, ``digits`` and
    ``unit`` only format. ``experiment`` is filled in by
    :func:`~modnets.experiments.core.rules.declare`."""

    id: str
    experiment: str = ""
    kind: str  # "paper": a claim the paper makes; "ours": a question of this book
    text: str
    source: str
    paper: str  # the paper's words and number, as shown beside ours
    quantity: str
    test: str
    threshold: float
    paper_effect: float | None = None
    basis: str = ""  # how paper_effect was read ("NI Table 1", "read from a figure: ...")
    scale: float = 1.0
    digits: int = 3
    unit: str = ""

    def __post_init__(self):
        if self.test not in TESTS:
            raise ValueError(f"test must be one of {TESTS}, got {self.test!r}")
        if self.kind not in ("paper", "ours"):
            raise ValueError(f"kind must be 'paper' or 'ours', got {self.kind!r}")
        if self.kind == "paper" and not self.basis:
            raise ValueError(f"rule {self.id!r}: a paper rule must say how its effect was read")

    def describe(self) -> str:
        """The rule in one line, e.g. ``"type − cls R² > 0.000"``."""
        t = f"{self.scale * self.threshold:.{self.digits}f}{self.unit}"
        if self.test == "equivalent":
            return f"{self.quantity} within ±{t} (TOST)"
        if self.test == "!=":
            return f"{self.quantity} ≠ {t} (either sign)"
        return f"{self.quantity} {self.test} {t}"

    def fingerprint(self) -> str:
        """A hash of every field: what the rule-change log pins."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
