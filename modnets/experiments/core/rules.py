"""Every rule that decides a claim, in one place, declared before the numbers it decides.

A :class:`Rule` names the claim (a paper's, quoted with its source and its own number, or one of
ours), the quantity measured once per seed, the test (``>``, ``<`` a threshold, or
``equivalent`` within a margin) and ``paper_effect``: the paper's value of that quantity, where
the paper gives one (``basis`` says how it was read). :mod:`modnets.experiments.core.claims` applies
the rules; the experiments only measure.

Rules are pinned: ``tests/test_rules.py`` checks each rule's :meth:`Rule.fingerprint` against
the newest entry for it in the rule-change log (``rule_log.json`` beside this file, printed by
chapter 13), so a rule cannot change without a logged entry saying what changed, when, why, and
whether results had been seen.
"""

from __future__ import annotations

import json
from pathlib import Path

from modnets.experiments.core.rule import TESTS, Rule

__all__ = [
    "Rule",
    "TESTS",
    "RULES",
    "EXPERIMENT_RULES",
    "LOG_PATH",
    "rule_log",
    "rules_of",
    "unlogged",
]

LOG_PATH = Path(__file__).with_name("rule_log.json")


def _pct(**kw) -> dict:
    return dict(scale=100, digits=1, unit=" pts", **kw)


def _rel(**kw) -> dict:  # a loss relative to the full model, in per cent
    return dict(scale=100, digits=1, unit=" %", **kw)


# Effects read from a figure are the smallest the paper's words imply, declared before running.
_FIG = "read from a figure: "
_R = [
    # --------------------------------------------------------------- NI §4.1, Table 1
    Rule(
        "table1-type-beats-cls",
        "fuzzy_boolean",
        "paper",
        "Re-routing (type inference) adapts better than the CLS tokens alone",
        "NI Table 1",
        "R² .9857 (type) vs .9202 (CLS)",
        "type − cls mean R² on the new functions",
        ">",
        0.0,
        0.9857 - 0.9202,
        "NI Table 1: .9857 − .9202",
        digits=4,
    ),
    Rule(
        "table1-gap-closed",
        "fuzzy_boolean",
        "paper",
        "Relative to the CLS tokens, re-routing comes close to finetuning everything: 'the "
        "performance difference between finetuning all parameters and just the type matching "
        "parameters is small'",
        "NI §4.1, Table 1",
        "gap closed (.9857 − .9202) / (.9953 − .9202) = 0.87",
        "gap closed (type − cls) / (all − cls)",
        ">",
        0.5,
        (0.9857 - 0.9202) / (0.9953 - 0.9202),
        "NI Table 1's three rows; 'small' read as more than half of the gap closed",
        digits=2,
    ),
    Rule(
        "ours-all-beats-type",
        "fuzzy_boolean",
        "ours",
        "Finetuning everything adapts better than re-routing",
        "ours (NI Table 1's rows)",
        "not a claim: Table 1's point is that this gap is small (.9953 vs .9857)",
        "all − type mean R² on the new functions",
        ">",
        0.0,
        digits=4,
    ),
    # --------------------------------------------------------------- NI §4.2, digits
    Rule(
        "fig5a-ni-vs-vit",
        "digits",
        "paper",
        "'Neural Interpreters significantly outperform Vision Transformers at fast-adaptation "
        "in the low-data regime'",
        "NI §4.2, Fig. 5a",
        "NI above the ViT (figure)",
        "NI − ViT K-MNIST accuracy at the fewest samples",
        ">",
        0.0,
        0.03,
        _FIG + "'significantly outperform' read as at least 3 pts",
        **_pct(),
    ),
    Rule(
        "fig5a-gap-closes",
        "digits",
        "paper",
        "'the performance gap is only gradually closed as more data becomes available'",
        "NI §4.2, Fig. 5a",
        "NI − ViT gap narrows with samples (figure)",
        "(NI − ViT) at the fewest − at the most samples",
        ">",
        0.0,
        0.01,
        _FIG + "'gradually closed' read as at least 1 pt narrower",
        **_pct(),
    ),
    Rule(
        "fig6-pretrained-vs-resampled",
        "digits",
        "paper",
        "'keeping the functions acquired from pretraining intact leads to significantly "
        "improved adaptation performance'",
        "NI §4.2, Fig. 6",
        "pretrained above re-sampled functions (figure)",
        "NI − NI (re-sampled codes and signatures) K-MNIST accuracy at the fewest samples",
        ">",
        0.0,
        0.03,
        _FIG + "'significantly improved' read as at least 3 pts",
        **_pct(),
    ),
    Rule(
        "fig5b-capacity",
        "digits",
        "paper",
        "'the performance improves as new functions are added at adaptation-time'",
        "NI §4.2, Fig. 5b",
        "accuracy rises with added functions (figure)",
        "most − fewest functions, K-MNIST accuracy (signatures and codes trained)",
        ">",
        0.0,
        0.01,
        _FIG + "'improves' read as at least 1 pt",
        **_pct(),
    ),
    Rule(
        "fig5c-drop-one",
        "digits",
        "paper",
        "'the performance on all datasets degrades gracefully as more functions are removed'",
        "NI §4.2, Fig. 5c",
        "graceful degradation (figure)",
        "validation accuracy lost with 1 function dropped",
        "<",
        0.10,
        0.03,
        _FIG + "'gracefully' read as a few pts (3) per function, against a 10 pt bar",
        **_pct(),
    ),
    Rule(
        "fig3-paths-differ",
        "digits",
        "paper",
        "'there is diversity in how samples are routed through the network, and [...] the "
        "routing mechanism discriminates between samples'",
        "NI §4.2, Fig. 3",
        "paths that vary between samples (figure)",
        "routing-path distance between samples of different digits − of the same digit",
        ">",
        0.0,
        0.02,
        _FIG + "'discriminates between samples' read as ≥ 2 % more of the routing weight on "
        "other routes between different digits than between equal ones",
        scale=100,
        digits=1,
        unit=" %",
    ),
    Rule(
        "fig4-types-cluster",
        "digits",
        "paper",
        "'Types are more clustered in the later function iterations'",
        "NI §4.2, Fig. 4 caption",
        "t-SNE of the types, clusters forming over iterations (figure)",
        "silhouette of the types by closest signature, last − first function iteration",
        ">",
        0.0,
        0.1,
        _FIG + "'more clustered' read as a silhouette gain of 0.1, a tenth of its range up "
        "to types on their signatures (1)",
    ),
    Rule(
        "val-match",
        "digits",
        "paper",
        "NI and ViT reach 'almost identical performance on the validation set'",
        "NI §4.2",
        "'the difference being less than 0.2% in favor of Vision Transformers'",
        "NI − ViT mean validation accuracy (signed)",
        "equivalent",
        0.01,
        -0.002,
        "NI §4.2 text: −0.2 pts; 'almost identical' read as within ±1 pt",
        **_pct(),
    ),
    Rule(
        "ours-fig5a-matched",
        "digits",
        "ours",
        "The NI adapts better than the ViT from snapshots at matched validation accuracy",
        "ours (NI Fig. 5a's condition)",
        "-",
        "NI − ViT K-MNIST accuracy, the model ahead adapted from its matched snapshot",
        ">",
        0.0,
        **_pct(),
    ),
    Rule(
        "ours-fig5a-params",
        "digits",
        "ours",
        "The NI adapts better than a ViT with its parameter count",
        "ours (NI Fig. 5a)",
        "-",
        "NI − ViT (parameter-matched) K-MNIST accuracy",
        ">",
        0.0,
        **_pct(),
    ),
    Rule(
        "ours-more-iterations",
        "digits",
        "ours",
        "More function iterations help on digits, up to the trained number",
        "ours (NI Fig. 8 is the PGM task)",
        "-",
        "validation accuracy at n_i − at n_i // 2 iterations",
        ">",
        0.0,
        **_pct(),
    ),
    Rule(
        "ours-extra-iterations",
        "digits",
        "ours",
        "Extra function iterations do not break the model on digits",
        "ours (NI Fig. 8 is the PGM task)",
        "-",
        "validation accuracy at 2 n_i − at n_i iterations",
        ">",
        -0.05,
        **_pct(),
    ),
    Rule(
        "svhn",
        "digits",
        "paper",
        "Pretraining on SVHN, MNIST-M and MNIST",
        "NI §4.2",
        "SVHN is one of the three pretraining datasets",
        "-",
        ">",
        0.0,
        None,
        "NI §4.2",
    ),
    Rule(
        "fig8-pgm",
        "digits",
        "paper",
        "'the model maintains at least 70% of its original performance while using only half "
        "the amount of compute'",
        "NI §4.3, Fig. 8",
        "PGM abstract reasoning",
        "-",
        ">",
        0.0,
        None,
        "NI §4.3",
    ),
    # --------------------------------------------------------------- NAC §4.1, Tiny-ImageNet
    Rule(
        "table1-nac-vs-pio",
        "tiny_imagenet",
        "paper",
        "The NAC is more accurate than Perceiver IO in distribution",
        "NAC Table 1",
        "60.76 vs 58.89 top-1 (200 classes)",
        "NAC − Perceiver IO top-1",
        ">",
        0.0,
        0.6076 - 0.5889,
        "NAC Table 1: 60.76 − 58.89 (scale-free prior)",
        **_pct(),
    ),
    Rule(
        "fig15-flops",
        "tiny_imagenet",
        "paper",
        "At a fifth of the FLOPs the NAC loses 'roughly 1%', Perceiver IO 'loses 5.3%' at "
        "'roughly the same amount of FLOPs'",
        "NAC App. F, Fig. 15",
        "5.3 − ~1 = 4.3 pts (ring-of-cliques prior)",
        "Perceiver IO − NAC top-1 lost at the NAC's FLOPs / 5 (or the largest common cut)",
        ">",
        0.0,
        0.053 - 0.01,
        "NAC App. F text: 5.3 % − ~1 %",
        **_pct(),
    ),
    Rule(
        "fig5a-drop80",
        "tiny_imagenet",
        "paper",
        "'more than 80% of the modules' can be removed 'at little cost to accuracy' ('less "
        "than 3 percent', abstract)",
        "NAC §4.1, Fig. 5a, abstract",
        "< 3 % lost; ~1 % at a fifth of the FLOPs (App. F)",
        "relative top-1 loss at 80 % dropped",
        "<",
        0.03,
        0.01,
        "NAC App. F text: ~1 % lost at a fifth of the FLOPs",
        **_rel(),
    ),
    Rule(
        "fig10-edges",
        "tiny_imagenet",
        "paper",
        "'≈ 90% of connections can be disallowed without incurring a significant loss'",
        "NAC App. F, Fig. 10",
        "scale-free 60.76 → 59.1 at ~90 % (2.7 % relative)",
        "relative top-1 loss at 90 % of edges removed",
        "<",
        0.03,
        1 - 59.1 / 60.76,
        "NAC App. F text: 60.76 → 59.1, scale-free prior",
        **_rel(),
    ),
    Rule(
        "fig5b-speedup",
        "tiny_imagenet",
        "paper",
        "'a ∼ 8× speedup' with over 80 % of the modules dropped",
        "NAC §4.1, Fig. 5b",
        "~8x samples/s (A100, batch 64)",
        "throughput at 80 % dropped / full",
        ">",
        6.0,
        8.0,
        "NAC §4.1 text",
        digits=2,
        unit="x",
    ),
    Rule(
        "priors-differ",
        "tiny_imagenet",
        "paper",
        "'different graph priors offer different amounts of robustness towards dropped modules'",
        "NAC §4.1, Fig. 5a, App. F",
        "ring-of-cliques loses ~1 % at a fifth of the FLOPs (App. F), more robust (figure)",
        "scale-free − ring-of-cliques relative top-1 loss at 80 % dropped",
        ">",
        0.0,
        0.01,
        _FIG + "the priors' curves separate, read as at least 1 %, ring-of-cliques the robust "
        "one as App. F names it",
        **_rel(),
    ),
    Rule(
        "ours-throughput-tracks-flops",
        "tiny_imagenet",
        "ours",
        "Throughput tracks the FLOP cut when modules are dropped",
        "ours (NAC Fig. 5b)",
        "-",
        "speed-up / FLOP cut at 80 % dropped",
        ">",
        0.5,
        digits=2,
    ),
    Rule(
        "ours-least-vs-random",
        "tiny_imagenet",
        "ours",
        "Dropping least connected first beats a random order",
        "ours (NAC App. F's order)",
        "-",
        "least first − random top-1 at 80 % dropped",
        ">",
        0.0,
        **_pct(),
    ),
    Rule(
        "ours-least-vs-most",
        "tiny_imagenet",
        "ours",
        "Dropping least connected first beats most connected first",
        "ours (NAC App. F's order)",
        "-",
        "least first − most first top-1 at 80 % dropped",
        ">",
        0.0,
        **_pct(),
    ),
    Rule(
        "ood-r",
        "tiny_imagenet",
        "paper",
        "Out-of-distribution accuracy on Tiny-ImageNet-R",
        "NAC Table 1",
        "17.57 (Perceiver IO) vs 19.42-20.03 top-1",
        "-",
        ">",
        0.0,
        None,
        "NAC Table 1",
    ),
    # --------------------------------------------------------------- NFM §4.2, Table 5
    *[
        Rule(
            f"table5-{c}",
            "stacked_mnist",
            "paper",
            f"NFM(CNN) beats the CNN on {c} digits (never trained on)",
            "NFM Table 5",
            f"{nfm:.2f} vs {cnn:.2f} (trained on 1 and 3 digits)",
            f"NFM(CNN) − CNN exact-match accuracy on {c} digits",
            ">",
            0.0,
            (nfm - cnn) / 100,
            f"NFM Table 5: {nfm:.2f} − {cnn:.2f}",
            **_pct(),
        )
        for c, nfm, cnn in ((2, 88.36, 76.7), (4, 66.12, 62.57), (5, 29.48, 24.27))
    ],
    Rule(
        "table5-interaction",
        "stacked_mnist",
        "paper",
        "NFM helps where 'the train and test set differ systematically': its gain on held-out "
        "counts exceeds its gain on trained ones",
        "NFM Table 5, §4.2",
        "mean gain 6.81 pts on 2, 4, 5 digits vs −0.05 on 1, 3",
        "mean gain on held-out counts − mean gain on trained counts",
        ">",
        0.0,
        ((88.36 - 76.7) + (66.12 - 62.57) + (29.48 - 24.27)) / 300
        - ((99.23 - 99.27) + (87.78 - 87.83)) / 200,
        "NFM Table 5 (trained on 1 and 3 digits)",
        **_pct(),
    ),
    # --------------------------------------------------------------- ours: one task, one budget
    Rule(
        "ours-side-nfm-ood",
        "side_by_side",
        "ours",
        "NFM's promise on a shared task: around the same CNN, NFM generalises better to a digit "
        "count it never saw",
        "ours (after NFM §4.2)",
        "not a paper's number: NFM Table 5 tests it on its own task",
        "NFM(CNN) − CNN exact-match on 3-digit canvases (trained on 1 and 2)",
        ">",
        0.0,
        **_pct(),
    ),
    Rule(
        "ours-side-ni-adapts",
        "side_by_side",
        "ours",
        "NI's promise on a shared task: from a few examples of a new domain, the NI adapts "
        "better than a ViT of the same size",
        "ours (after NI §4.2)",
        "not a paper's number: NI Fig. 5a tests it on its own task",
        "NI − ViT K-MNIST exact-match after finetuning on a few canvases",
        ">",
        0.0,
        **_pct(),
    ),
    Rule(
        "ours-side-nac-drops",
        "side_by_side",
        "ours",
        "NAC's promise on a shared task: with 80 % of its modules dropped, the NAC keeps more "
        "of its accuracy than a Perceiver IO of the same size with 80 % of its latents dropped",
        "ours (after NAC §4, Fig. 5a)",
        "not a paper's number: NAC Fig. 5a tests it on its own task",
        "(NAC − Perceiver IO) accuracy kept with 80 % dropped",
        ">",
        0.0,
        **_pct(),
    ),
]

#: Every rule, by id.
RULES: dict[str, Rule] = {r.id: r for r in _R}
if len(RULES) != len(_R):
    raise RuntimeError("two rules share an id")

#: Rule ids by experiment, in the order the experiments report them.
EXPERIMENT_RULES: dict[str, tuple[str, ...]] = {}
for _r in _R:
    EXPERIMENT_RULES.setdefault(_r.experiment, ())
    EXPERIMENT_RULES[_r.experiment] += (_r.id,)


def rules_of(experiment: str) -> dict[str, Rule]:
    """The rules of ``experiment``, by id."""
    return {i: RULES[i] for i in EXPERIMENT_RULES.get(experiment, ())}


def rule_log() -> list[dict]:
    """The rule-change log: entries ``{"date", "rules", "fingerprints", "change", "why",
    "results_seen"}``, oldest first."""
    return json.loads(LOG_PATH.read_text())


def unlogged(log: list[dict] | None = None) -> dict[str, str]:
    """``{rule id: fingerprint}`` of every rule whose fingerprint differs from the newest
    log entry that names it (or that no entry names): the rules changed without a log entry."""
    log = rule_log() if log is None else log
    newest: dict[str, str] = {}
    for entry in log:
        newest.update(entry.get("fingerprints", {}))
    return {i: r.fingerprint() for i, r in RULES.items() if newest.get(i) != r.fingerprint()}


if __name__ == "__main__":  # prints the fingerprints a new log entry must record
    print(json.dumps(unlogged(), indent=1))
