"""Every rule that decides a claim, declared before the numbers it decides, and their log.

Each experiment declares its rules in its own package (``<experiment>/rules.py``) as keyword
:class:`Rule` calls passed to :func:`declare`. A :class:`Rule` names the claim (a paper's, quoted
with its source and its own number, or one of ours), the quantity measured once per seed, the
test (``>``, ``<`` a threshold, or ``equivalent`` within a margin) and ``paper_effect``: the
paper's value of that quantity, where the paper gives one (``basis`` says how it was read).
:mod:`modnets.experiments.core.claims` applies the rules; the experiments only measure.

Rules are pinned: ``tests/test_rules.py`` checks each rule's :meth:`Rule.fingerprint` against
the newest entry for it in the rule-change log (``rule_log.json`` beside this file, printed by
chapter 13), so a rule cannot change without a logged entry saying what changed, when, why, and
whether results had been seen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from modnets.experiments.core.rule import TESTS, Rule

__all__ = [
    "Rule",
    "TESTS",
    "RULES",
    "LOG_PATH",
    "declare",
    "get_rule",
    "rule_log",
    "unlogged",
]

LOG_PATH = Path(__file__).with_name("rule_log.json")

#: Every rule declared so far in this process, by id (an experiment's rules join when its
#: package is imported; :func:`modnets.experiments.core.discovery.all_rules` imports every one).
RULES: dict[str, Rule] = {}


def declare(experiment: str, rules: Iterable[Rule]) -> dict[str, Rule]:
    """``rules``, the rules of ``experiment``, by id, each added to :data:`RULES`; an id another
    rule already has is refused."""
    out = {}
    for rule in rules:
        if not isinstance(rule, Rule):
            raise TypeError(f"declare takes Rule objects, got {type(rule).__name__}")
        if rule.experiment not in ("", experiment):
            raise ValueError(
                f"rule {rule.id!r} names experiment {rule.experiment!r}, not {experiment!r}"
            )
        rule = replace(rule, experiment=experiment)
        if rule.id in out or RULES.get(rule.id, rule) != rule:
            raise ValueError(f"two rules share the id {rule.id!r}")
        out[rule.id] = rule
    RULES.update(out)
    return out


def get_rule(rule_id: str) -> Rule:
    """The rule ``rule_id``, declared by an experiment already imported."""
    if rule_id not in RULES:
        raise KeyError(
            f"no rule {rule_id!r} is declared; the experiment that declares it declares it when "
            "imported (modnets.experiments.get(name))"
        )
    return RULES[rule_id]


def rule_log() -> list[dict]:
    """The rule-change log: entries ``{"date", "rules", "fingerprints", "change", "why",
    "results_seen"}``, oldest first."""
    return json.loads(LOG_PATH.read_text())


def unlogged(rules: dict[str, Rule], log: list[dict] | None = None) -> dict[str, str]:
    """``{rule id: fingerprint}`` of every rule of ``rules`` (every experiment's:
    :func:`modnets.experiments.core.discovery.all_rules`) whose fingerprint differs from the
    newest log entry that names it (or that no entry names): the rules changed without a log
    entry."""
    log = rule_log() if log is None else log
    newest: dict[str, str] = {}
    for entry in log:
        newest.update(entry.get("fingerprints", {}))
    return {i: r.fingerprint() for i, r in rules.items() if newest.get(i) != r.fingerprint()}
