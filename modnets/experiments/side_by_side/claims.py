"""Our claims on the shared task (each architecture's own promise, tested against its plain
counterpart), the regime they presuppose, the summary table and the computed advice."""

from __future__ import annotations

import numpy as np

from modnets.experiments.core import harness
from modnets.experiments.core.claims import holm, outside_regime, paired
from modnets.utils import wrap

#: What the claims presuppose: both models of a comparison learned the trained digit counts
#: (exact-match on their test canvases at least this, every seed; chance is about 0).
REGIME_EXACT = 0.2

#: Each claim: its rule, the two models it compares and the measure (per seed) it compares.
CLAIMS = {
    "ours-side-nfm-ood": ("NFM(CNN)", "CNN", "ood"),
    "ours-side-ni-adapts": ("NI", "ViT", "few_shot"),
    "ours-side-nac-drops": ("NAC", "Perceiver IO", "kept_at_80"),
}

#: The measures of the summary, their labels, and whether more is better.
MEASURES = {
    "iid": ("IID accuracy (%)", True),
    "ood": ("held-out count (%)", True),
    "few_shot": ("K-MNIST few-shot (%)", True),
    "kept_at_50": ("kept, 50 % dropped (pts)", True),
    "kept_at_80": ("kept, 80 % dropped (pts)", True),
}

#: The measures' column heads in the plain-text summary, which fits 88 characters.
SHORT = {
    "iid": "IID %",
    "ood": "3 digits %",
    "few_shot": "K-MNIST %",
    "kept_at_50": "50% off pts",
    "kept_at_80": "80% off pts",
}


def per_seed(results: dict, name: str, measure: str) -> list[float]:
    """One value of ``measure`` per claim seed for model ``name`` (``nan`` where it has none)."""
    return [r.get(measure, float("nan")) for r in results["models"][name]["per_seed"]]


def regime_of(results: dict, names) -> dict:
    """Whether every model of ``names`` reached :data:`REGIME_EXACT` on the trained counts."""
    checks = {
        f"{n} IID exact-match, worst seed": (min(per_seed(results, n, "iid")), REGIME_EXACT, ">=")
        for n in names
    }
    return harness.regime(
        f"each compared model at ≥ {REGIME_EXACT:.0%} exact-match on the trained counts", checks
    )


def regime(results: dict) -> dict:
    """:func:`regime_of` every model of ``results``."""
    return regime_of(results, list(results["models"]))


def claims(results: dict) -> list:
    """Each of :data:`CLAIMS` as a paired test over seeds, ``not testable here`` where one of
    its two models missed the :func:`regime_of` bar."""
    out = []
    for rule_id, (a, b, measure) in CLAIMS.items():
        claim = paired(
            rule_id, per_seed(results, a, measure), per_seed(results, b, measure), (a, b)
        )
        out.append(outside_regime(claim, regime_of(results, (a, b))))
    return holm(out, "side by side")


def _interval(values: list[float]) -> tuple[float, float]:
    """Mean and 95 % t half-width (nan below two values)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or not np.isfinite(v).all():
        return float(np.mean(v)), float("nan")
    from scipy import stats

    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / len(v) ** 0.5)


def format_summary(results: dict) -> str:
    """Mean ± 95 % half-width over seeds per model and measure (accuracies in %; columns
    :data:`SHORT`), then the parameters, forward GFLOPs and the costs beside the CNN's."""
    names = list(results["models"])
    head = f"{'model':<13}" + "".join(f"{SHORT[m]:>15}" for m in MEASURES)
    lines = [f"profile: {results['profile']}, {len(results['seeds'])} seeds", head]
    for n in names:
        cells = []
        for m in MEASURES:
            mean, half = _interval(per_seed(results, n, m))
            cells.append("-" if np.isnan(mean) else f"{100 * mean:.1f} ± {100 * half:.1f}")
        lines.append(f"{n:<13}" + "".join(f"{c:>15}" for c in cells))
    lines.append(
        f"{'model':<13}{'parameters':>12}{'GFLOPs':>9}{'step vs CNN':>13}{'infer vs CNN':>14}"
    )
    for n in names:
        c = results["models"][n]["costs"]
        lines.append(
            f"{n:<13}{c['parameters']:>12,}{c['gflops']:>9.3f}{c['step_vs_cnn']:>12.2f}x"
            f"{c['infer_vs_cnn']:>13.2f}x"
        )
    return "\n".join(lines)


def advice(results: dict) -> str:
    """What to use when, computed: per measure the best model by its mean over seeds, and
    whether its lead over the next is clear (the paired 95 % interval of their per-seed
    difference above 0) or within the noise of this many seeds."""
    out = []
    for m, (label, _) in MEASURES.items():
        scores = {
            n: per_seed(results, n, m)
            for n in results["models"]
            if np.isfinite(per_seed(results, n, m)).all()
        }
        if len(scores) < 2:
            continue
        ranked = sorted(scores, key=lambda n: -np.mean(scores[n]))
        best, second = ranked[:2]
        diff = np.subtract(scores[best], scores[second])
        mean, half = _interval(list(diff))
        clear = np.isfinite(half) and mean - half > 0
        how = "clearly" if clear else "within the noise of these seeds"
        out.append(
            f"{label}: {best} ({100 * np.mean(scores[best]):.1f}), ahead of {second} by "
            f"{100 * mean:.1f} [{100 * (mean - half):.1f}, {100 * (mean + half):.1f}] pts, {how}."
        )
    cost = {n: r["costs"] for n, r in results["models"].items()}
    fastest = min(cost, key=lambda n: cost[n]["step_ms"])
    slowest = max(cost, key=lambda n: cost[n]["step_ms"])
    out.append(
        f"Cost: {fastest} trains fastest; {slowest} takes "
        f"{cost[slowest]['step_ms'] / cost[fastest]['step_ms']:.1f}x its time per step."
    )
    return wrap(" ".join(out))
