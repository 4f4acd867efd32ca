"""The claims' rules are pinned: none changes without a rule-change log entry, and each rule
decides as its test says (threshold, direction, equivalence, power, Holm)."""

import dataclasses
import json

import numpy as np
import pytest
from statsmodels.stats.power import TTestPower

from modnets.experiments.core import claims as cl
from modnets.experiments.core import discovery
from modnets.experiments.core import rules as rl

TOY = {
    "up": rl.Rule(
        id="up",
        experiment="toy",
        kind="paper",
        text="A beats B",
        source="Table 1",
        paper="1.0 vs 0.5",
        quantity="A − B",
        test=">",
        threshold=0.0,
        paper_effect=0.5,
        basis="Table 1",
    ),
    "eq": rl.Rule(
        id="eq",
        experiment="toy",
        kind="paper",
        text="A equals B",
        source="§4",
        paper="on par",
        quantity="A − B",
        test="equivalent",
        threshold=0.1,
        paper_effect=0.0,
        basis="§4 text",
    ),
    "down": rl.Rule(
        id="down",
        experiment="toy",
        kind="ours",
        text="little lost",
        source="ours",
        paper="-",
        quantity="loss",
        test="<",
        threshold=0.1,
    ),
}
# "up" as a difference of either sign
TOY["differ"] = dataclasses.replace(TOY["up"], id="differ", text="A and B differ", test="!=")


def test_every_rule_is_logged_with_its_fingerprint():
    assert rl.unlogged(discovery.all_rules()) == {}, (
        "a rule changed without a rule-change log entry (rule_log.json)"
    )


def test_a_changed_rule_fails_until_logged():
    rules = discovery.all_rules()
    rule = rules["table1-gap-closed"]
    changed = dataclasses.replace(rule, threshold=0.4)
    rules[rule.id] = changed
    assert set(rl.unlogged(rules)) == {rule.id}
    entry = {
        "date": "-",
        "rules": [rule.id],
        "fingerprints": {rule.id: changed.fingerprint()},
        "change": "threshold",
        "why": "-",
        "results_seen": "no",
    }
    assert rl.unlogged(rules, [*rl.rule_log(), entry]) == {}


def test_the_log_entries_say_what_when_why_and_whether_results_were_seen():
    for e in rl.rule_log():
        assert {"date", "rules", "fingerprints", "change", "why", "results_seen"} <= set(e)
        assert e["change"] and e["why"] and e["results_seen"]
    json.dumps(rl.rule_log())


def test_every_paper_rule_says_how_its_effect_was_read_and_ours_never_claim_a_paper_effect():
    for r in discovery.all_rules().values():
        if r.kind == "paper":
            assert r.basis
        else:
            assert r.paper_effect is None and r.source.startswith("ours")
    with pytest.raises(ValueError, match="must say how"):
        rl.Rule(
            id="x",
            experiment="toy",
            kind="paper",
            text="t",
            source="s",
            paper="p",
            quantity="q",
            test=">",
            threshold=0.0,
            paper_effect=1.0,
        )
    with pytest.raises(ValueError, match="test must be"):
        rl.Rule(
            id="x",
            experiment="toy",
            kind="ours",
            text="t",
            source="s",
            paper="p",
            quantity="q",
            test=">=",
            threshold=0.0,
        )


@pytest.mark.parametrize(
    "values, verdict",
    [
        ([0.4, 0.5, 0.6, 0.5, 0.45], "reproduced"),
        ([-0.4, -0.5, -0.6, -0.45, -0.5], "not reproduced"),
        ([0.3, -0.2, 0.1, -0.1, 0.2], "inconclusive"),
    ],
)
def test_one_sided_rule_decides_by_the_95_interval(values, verdict):
    c = cl.decide_rule("up", values, rules=TOY)
    assert c.verdict == verdict and c.kind == "paper"
    assert c.p_value is not None and (c.p_value < 0.05) == (verdict != "inconclusive")


def test_mde_is_statsmodels_power_and_underpowered_says_how_many_seeds():
    values = [0.3, -0.2, 0.1, -0.1, 0.2]
    c = cl.decide_rule("up", values, rules=TOY)
    sd = np.std(values, ddof=1)
    d = TTestPower().solve_power(nobs=5, alpha=0.05, power=0.8, alternative="two-sided")
    assert c.mde == pytest.approx(d * sd)
    assert c.mde < 0.5 and "smaller than the paper's" in c.reason
    noisy = [2.0, -1.5, 1.0, -2.2, 0.4]
    c = cl.decide_rule("up", noisy, rules=TOY)
    assert c.verdict == "inconclusive" and c.reason.startswith("underpowered")
    assert c.seeds_needed > 5 and f"{c.seeds_needed} seeds would" in c.reason
    # with that many seeds at that spread, the mde falls to the paper's effect
    assert (
        cl.mde(np.std(noisy, ddof=1), c.seeds_needed)
        <= 0.5
        < cl.mde(np.std(noisy, ddof=1), c.seeds_needed - 1)
    )


def test_vs_paper_says_when_the_interval_excludes_the_papers_effect():
    small = cl.decide_rule("up", [0.10, 0.12, 0.11, 0.13, 0.09], rules=TOY)
    assert small.verdict == "reproduced" and small.vs_paper == "smaller than the paper's"
    near = cl.decide_rule("up", [0.45, 0.55, 0.5, 0.52, 0.48], rules=TOY)
    assert near.vs_paper == "consistent with the paper's"


def test_equivalence_is_a_signed_tost():
    assert cl.decide_rule("eq", [0.01, -0.02, 0.0, 0.015, -0.01], rules=TOY).verdict == "reproduced"
    # |mean| small but one-signed far beyond the margin on every seed: abs() would not show it
    assert cl.decide_rule("eq", [0.3, 0.31, 0.29, 0.3, 0.32], rules=TOY).verdict == "not reproduced"
    assert cl.decide_rule("eq", [0.2, -0.2, 0.15, -0.1, 0.05], rules=TOY).verdict == "inconclusive"


def test_holm_is_statsmodels_over_the_paper_claims_only():
    from statsmodels.stats.multitest import multipletests

    values = (
        [0.5, 0.3, 0.4, 0.45, 0.38],
        [0.05, 0.3, 0.2, 0.25, 0.02],
        [0.05, 0.4, 0.1, 0.3, 0.02],
    )
    cs = [cl.decide_rule("up", v, rules=TOY) for v in values]
    cs.append(cl.decide_rule("down", [0.0, 0.01, 0.02], rules=TOY))
    out = cl.holm(cs, "toy")
    reject = multipletests([c.p_value for c in cs[:3]], 0.05, "holm")[0]
    for c, r in zip(out[:3], reject, strict=True):
        assert c.verdict_holm == (c.verdict if r else "inconclusive") and c.holm_family == "toy"
    assert out[3].verdict_holm == out[3].verdict and out[3].holm_family == ""
    # p = 0.0003, 0.041, 0.080: the second is reproduced alone, not after Holm (0.041 x 2 > 0.05)
    assert [c.verdict for c in out[:3]] == ["reproduced", "reproduced", "inconclusive"]
    assert [c.verdict_holm for c in out[:3]] == ["reproduced", "inconclusive", "inconclusive"]


def test_outside_the_regime_is_not_testable_with_the_shortfall():
    c = cl.decide_rule("up", [0.4, 0.5, 0.6], rules=TOY)
    from modnets.experiments.core.harness import regime

    reg = regime("fit", {"R²": (0.8, 0.99, ">=")})
    assert not reg["reached"] and "R² 0.8 (needs >= 0.99)" in reg["shortfall"]
    out = cl.outside_regime(c, reg)
    assert out.verdict == "not testable here" and "R² 0.8" in out.reason and out.values == c.values
    assert cl.outside_regime(c, regime("fit", {"R²": (0.995, 0.99, ">=")})) is c


def test_declare_names_each_rule_with_its_experiment_and_refuses_a_clash():
    up = rl.Rule(
        id="toy-declared",
        kind="ours",
        text="t",
        source="ours",
        paper="-",
        quantity="q",
        test=">",
        threshold=0.0,
    )
    (declared,) = rl.declare("toy", [up]).values()
    assert declared.experiment == "toy" and rl.get_rule("toy-declared") is declared
    with pytest.raises(ValueError, match="names experiment 'toy', not 'other'"):
        rl.declare("other", [declared])
    with pytest.raises(ValueError, match="share the id"):
        rl.declare("toy", [dataclasses.replace(up, threshold=1.0)])
    with pytest.raises(TypeError, match="Rule objects"):
        rl.declare("toy", [{"id": "x"}])
    rl.RULES.pop("toy-declared")


def test_an_interval_excluding_the_papers_effect_says_so_before_any_lack_of_power():
    """Inconclusive, underpowered by its mde, yet the interval lies wholly below the paper's
    effect: the reason says "smaller than the paper's" first (it holds at any power)."""
    values = [-0.6, 0.4, -0.5, 0.3, -0.1]
    c = cl.decide_rule("up", values, rules=TOY)
    assert c.verdict == "inconclusive" and c.interval[1] < 0.5 < c.mde
    assert c.vs_paper == "smaller than the paper's"
    assert "smaller than the paper's" in c.reason and "underpowered" not in c.reason


def test_no_comparison_with_the_paper_without_a_spread():
    c = cl.decide_rule("up", [0.25, 0.25, 0.25], rules=TOY)
    assert c.verdict == "inconclusive" and c.vs_paper == "-"


def test_a_claim_whose_mechanism_is_unused_is_not_testable_never_reproduced():
    """Removing the part a claim is about must cost more than the intact model's seed spread;
    where it does not, the claim is "not testable here: <part> unused", however clear its
    interval; the other claims keep their verdicts."""
    from modnets.experiments.core import harness
    from modnets.experiments.core.mechanism import mechanism

    intact = [0.40, 0.42, 0.38, 0.41]
    unused = mechanism(
        "the toy's edges", "removing every edge", ("up",), intact, [0.40, 0.41, 0.39, 0.40]
    )
    used = mechanism(
        "the toy's modules", "dropping them", ("down",), intact, [0.1, 0.12, 0.09, 0.1]
    )
    assert not unused.used and used.used
    reg = harness.regime("toy", {"top-1": (0.38, 0.1, ">=")}, mechanisms=[unused, used])
    assert reg["reached"] and [m["used"] for m in reg["mechanisms"]] == [False, True]
    up = cl.decide_rule("up", [0.5, 0.55, 0.6, 0.52], rules=TOY)
    assert up.verdict == "reproduced"
    gated = cl.outside_regime(up, reg)
    assert gated.verdict == gated.verdict_holm == "not testable here"
    assert gated.reason.startswith("the toy's edges unused: removing every edge costs 0.2 points")
    assert gated.values == up.values  # its numbers kept
    down = cl.decide_rule("down", [0.0, 0.01, 0.02], rules=TOY)
    assert cl.outside_regime(down, reg) == down
    # one seed: no spread to compare with, so the claim keeps its verdict
    alone = mechanism("the toy's edges", "removing every edge", ("up",), [0.4], [0.4])
    assert not alone.checked and not alone.used and not alone.unused
    one = harness.regime("toy", {"top-1": (0.4, 0.1, ">=")}, mechanisms=[alone])
    assert cl.outside_regime(up, one) == up
    assert "no seed spread" in alone.describe()
    with pytest.raises(ValueError, match="one score per seed"):
        mechanism("x", "y", (), [0.1, 0.2], [0.1])


def test_a_difference_of_either_sign_is_reproduced_by_an_interval_on_either_side():
    """``!=``: an interval wholly above or wholly below the threshold reproduces it; one that
    spans it is inconclusive (no interval shows there is no difference); the paper's effect is a
    size, compared whatever the sign."""
    up = cl.decide_rule("differ", [0.5, 0.55, 0.6, 0.52], rules=TOY)
    down = cl.decide_rule("differ", [-0.5, -0.55, -0.6, -0.52], rules=TOY)
    assert up.verdict == down.verdict == "reproduced"
    assert up.p_value == pytest.approx(down.p_value)
    assert up.vs_paper == down.vs_paper == "consistent with the paper's"
    small = cl.decide_rule("differ", [-0.1, -0.12, -0.11, -0.13], rules=TOY)
    assert small.verdict == "reproduced" and small.vs_paper == "smaller than the paper's"
    spans = cl.decide_rule("differ", [0.3, -0.2, 0.1, -0.25], rules=TOY)
    assert spans.verdict == "inconclusive"
    assert TOY["differ"].describe() == "A − B ≠ 0.000 (either sign)"


def test_every_claim_a_mechanism_gates_is_a_declared_rule():
    """A typo in a mechanism's claim ids would gate nothing: each id names a rule of its
    experiment."""
    import importlib

    digits_claims = importlib.import_module("modnets.experiments.digits.claims")
    tiny_claims = importlib.import_module("modnets.experiments.tiny_imagenet.claims")

    for ids, experiment in (
        (digits_claims.ABOUT_FUNCTIONS, "digits"),
        (tiny_claims.ABOUT_EDGES + tiny_claims.ABOUT_MODULES, "tiny_imagenet"),
    ):
        assert set(ids) <= set(discovery.rules_of(experiment)), experiment
