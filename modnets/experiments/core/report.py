"""Claims as a reader sees them: tables, sentences and forest plots (chapters 5, 6, 10, 11, 13).

Nothing here decides anything: verdicts come from :mod:`modnets.experiments.core.claims`, read from
the experiments' results files.
"""

from __future__ import annotations

import math

from modnets.experiments.core.claims import VERDICTS, holm
from modnets.experiments.core.discovery import get, list_experiments

__all__ = [
    "papers",
    "own_experiments",
    "COLOURS",
    "claims_frame",
    "claims_table",
    "verdict_sentences",
    "verdict_counts",
    "regime_sentence",
    "paper_scale_command",
    "load_claims",
    "reproduction",
    "paper_sentence",
    "forest_plot",
    "summary_plot",
    "rule_log_markdown",
]


def papers() -> dict[str, tuple[str, ...]]:
    """The experiments that test a paper's claims, by paper (the family of Holm's correction),
    in the book's order."""
    out: dict[str, tuple[str, ...]] = {}
    for name in list_experiments():
        paper = get(name).paper
        if paper:
            out[paper] = (*out.get(paper, ()), name)
    return out


def own_experiments() -> tuple[str, ...]:
    """The experiments of our own questions only (no paper's claims)."""
    return tuple(name for name in list_experiments() if not get(name).paper)


COLOURS = {
    "reproduced": "#d4edda",
    "not reproduced": "#f8d7da",
    "inconclusive": "#fff3cd",
    "not testable here": "#e2e3e5",
}


def _as_dicts(claims) -> list[dict]:
    return [c if isinstance(c, dict) else c.as_dict() for c in claims]


def format_value(c: dict, x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    digits = 1 if c.get("scale", 1) == 100 else 3
    return f"{c.get('scale', 1) * x:.{digits}f}"


def format_interval(c: dict) -> str:
    if not c.get("interval"):
        return "-"
    lo, hi = c["interval"]
    return f"[{format_value(c, lo)}, {format_value(c, hi)}]"


def claims_frame(claims, kind: str | None = None):
    """A ``pandas.DataFrame``, one row per claim (of ``kind`` only, if given): the paper's
    effect, ours (mean and 95 % interval of the tested quantity), the threshold, the minimal
    detectable effect, and both verdicts."""
    import pandas as pd

    rows = []
    for c in _as_dicts(claims):
        if kind is not None and c.get("kind") != kind:
            continue
        s = c.get("scale", 1)
        mean = sum(c["values"]) / len(c["values"]) if c.get("values") else None
        rows.append(
            {
                "claim": c["text"],
                "source": c["source"],
                "quantity": c["rule"],
                "paper effect": format_value(c, c.get("paper_effect")),
                "ours [95 % CI]": "-"
                if mean is None
                else f"{s * mean:.{1 if s == 100 else 3}f} {format_interval(c)}",
                "mde": format_value(c, c.get("mde")),
                "vs paper": c.get("vs_paper", "-"),
                "verdict": c["verdict"] + (f" ({c['reason']})" if c.get("reason") else ""),
                "Holm": c.get("verdict_holm") or c["verdict"],
            }
        )
    columns = [
        "claim",
        "source",
        "quantity",
        "paper effect",
        "ours [95 % CI]",
        "mde",
        "vs paper",
        "verdict",
        "Holm",
    ]
    return pd.DataFrame(rows, columns=columns)


def claims_table(claims, kind: str | None = None):
    """The claims as an HTML table (a pandas ``Styler``), verdicts coloured."""
    frame = claims_frame(claims, kind)
    if kind == "ours":
        frame = frame.drop(columns=["paper effect", "vs paper", "Holm"])

    def colour(v: str) -> str:
        key = next((k for k in sorted(COLOURS, key=len, reverse=True) if v.startswith(k)), "")
        return f"background-color: {COLOURS[key]}" if key else ""

    subset = [c for c in ("verdict", "Holm") if c in frame.columns]
    return (
        frame.style.hide(axis="index")
        .map(colour, subset=subset)
        .set_properties(**{"text-align": "left", "font-size": "0.85em"})
    )


def verdict_sentences(claims) -> str:
    """One Markdown sentence per claim, generated from its verdict: the only place where the
    chapters state a verdict."""
    lines = []
    for c in _as_dicts(claims):
        reason = f" ({c['reason']})" if c.get("reason") else ""
        label = "paper" if c.get("kind") == "paper" else "ours"
        lines.append(
            f"- [{label}] **{c['text']}** ({c['source']}): **{c['verdict']}**{reason}. "
            f"Paper: {c['paper']}; ours: {c['ours']}."
        )
    return "\n".join(lines)


def verdict_counts(claims, kind: str | None = "paper") -> str:
    """``"3 reproduced, 1 inconclusive"``: how many claims (of ``kind``) got each verdict."""
    cs = [c for c in _as_dicts(claims) if kind is None or c.get("kind") == kind]
    counts = {v: sum(c["verdict"] == v for c in cs) for v in VERDICTS}
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "no claims"


def regime_sentence(results: dict) -> str:
    """What the claims presuppose of the trained models, whether this run reached it, and
    whether the models use the parts the claims are about (mechanism checks)."""
    from modnets.experiments.core.mechanism import Mechanism

    r = results["regime"]
    if not r:
        return "No regime declared."
    if r["reached"]:
        out = f"**Regime reached**: {r['required']}."
    else:
        out = (
            f"**Regime not reached** ({r['required']}): {r['shortfall']}. Every claim of this "
            "run is therefore `not testable here`; its numbers are shown all the same."
        )
    for m in map(Mechanism.from_dict, r.get("mechanisms", ())):
        verdict = "used" if m.used else "not checked" if not m.checked else "**unused**"
        if m.unused:
            verdict += ", so its claims are not testable here"
        out += f" {m.name[0].upper()}{m.name[1:]}: {m.describe()}: {verdict}."
    return out


def paper_scale_command(experiment: str) -> str:
    """The command that runs ``experiment`` at the papers' settings (it may declare its own,
    e.g. with ``torchrun``)."""
    return get(experiment).command


def load_claims(experiments, profile: str, folder="_build/results") -> tuple[list, dict, list]:
    """``(claims, results_by_experiment, missing)``: every claim of ``experiments`` read from
    their results files (``<folder>/<experiment>_<profile>.json``), with Holm's correction
    recomputed over all their paper claims (one family)."""
    from modnets.experiments.core.claims import Claim
    from modnets.experiments.core.results import load_results, results_path

    claims, results, missing = [], {}, []
    for name in experiments:
        path = results_path(name, profile, folder)
        if not path.exists():
            missing.append(
                f"{path} (run its chapter, or `python -m modnets.experiments.{name} "
                f"--profile {profile} --out {path}`)"
            )
            continue
        results[name] = load_results(path)
        claims += [Claim(**c) for c in results[name]["claims"]]
    family = " + ".join(experiments)
    return [c.as_dict() for c in holm(claims, family)], results, missing


def reproduction(experiments, profile: str, folder="_build/results"):
    """``(paper_table, ours_table, claims, missing)`` for chapter 13."""
    claims, _, missing = load_claims(experiments, profile, folder)
    return claims_table(claims, "paper"), claims_table(claims, "ours"), claims, missing


def paper_sentence(paper: str, claims) -> str:
    """One sentence on a paper, generated from its claims' verdicts (Holm-adjusted)."""
    cs = [c for c in _as_dicts(claims) if c.get("kind") == "paper"]
    tested = [c for c in cs if c["verdict"] != "not testable here"]
    if not tested:
        return f"None of the {paper} claims could be tested here ({len(cs)} not testable)."
    holm_v = [c.get("verdict_holm") or c["verdict"] for c in tested]
    yes = sum(v == "reproduced" for v in holm_v)
    smaller = sum(_part(c) == "smaller than the paper's" for c in tested)
    no = sum(v == "not reproduced" for v in holm_v)
    under = sum(
        c["verdict"] == "inconclusive" and c.get("reason", "").startswith("underpowered")
        for c in tested
    )
    full = f" ({smaller} of them with an effect smaller than the paper's)" if smaller else ""
    parts = [
        f"{yes} of the {len(tested)} claims of {paper} tested here are reproduced after "
        f"Holm's correction{full}, {no} not reproduced"
    ]
    rest = len(tested) - yes - no
    if rest:
        parts.append(f"{rest} inconclusive ({under} of them underpowered at these seeds)")
    untested = len(cs) - len(tested)
    if untested:
        parts.append(f"and {untested} cannot be tested here")
    return ", ".join(parts) + "."


#: The parts of a verdict's bar drawn hatched: inconclusive because underpowered, and
#: reproduced with an interval below the paper's effect (counted apart from a full one).
HATCHES = {"underpowered": "//", "smaller than the paper's": ".."}


def _part(c: dict) -> str | None:
    """Which hatched part of its verdict's bar claim ``c`` falls in (None: the plain part)."""
    if c.get("reason", "").startswith("underpowered"):
        return "underpowered"
    verdict = c.get("verdict_holm") or c["verdict"]
    if verdict == "reproduced" and c.get("vs_paper") == "smaller than the paper's":
        return "smaller than the paper's"
    return None


def summary_plot(claims_by_paper: dict, ax=None):
    """One bar per paper: how many of its paper claims got each Holm-adjusted verdict; hatched,
    the inconclusive ones that were underpowered and the reproduced ones whose effect is smaller
    than the paper's."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * len(claims_by_paper)))
    papers = list(claims_by_paper)
    for row, paper in enumerate(papers):
        cs = [c for c in _as_dicts(claims_by_paper[paper]) if c.get("kind") == "paper"]
        left = 0
        for verdict in VERDICTS:
            chosen = [c for c in cs if (c.get("verdict_holm") or c["verdict"]) == verdict]
            for part in (None, *HATCHES):
                n = sum(_part(c) == part for c in chosen)
                if n:
                    hatch = HATCHES.get(part)
                    style = dict(color=COLOURS[verdict], edgecolor="#555555", hatch=hatch)
                    ax.barh(row, n, left=left, lw=0.6, **style)
                    left += n
    handles = [Patch(fc=COLOURS[v], ec="#555555", label=v) for v in VERDICTS]
    handles += [Patch(fc="white", ec="#555555", hatch=h, label=p) for p, h in HATCHES.items()]
    most = max(
        (
            len([c for c in _as_dicts(v) if c.get("kind") == "paper"])
            for v in claims_by_paper.values()
        ),
        default=1,
    )
    ax.set_xlim(0, max(most, 1))
    ax.set_ylim(len(papers) - 0.5, -0.5)
    ax.set_yticks(range(len(papers)), papers)
    ax.set_xlabel("paper claims (Holm-adjusted verdicts)")
    ax.legend(handles=handles, fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return ax


def _unit(c: dict) -> float:
    """What one unit on the forest plot's axis is for claim ``c``: the paper's effect beyond the
    threshold (the margin of an equivalence), else its mde, else 1."""
    thr, test = c.get("threshold") or 0.0, c.get("test")
    if test == "equivalent" and thr > 0:
        return thr
    pe = c.get("paper_effect")
    if pe is not None:
        d = abs(pe - thr) if test == "!=" else (pe - thr) * (-1 if test == "<" else 1)
        if d > 0:
            return d
    return c.get("mde") or 1.0


def forest_plot(claims, kind: str = "paper", ax=None):
    """Per claim of ``kind`` with an interval: ours (the mean with its 95 % interval), the
    threshold at 0, the paper's effect at 1 (a diamond) and the mde (a tick: the smallest effect
    the seeds detect), each claim measured beyond its threshold in the direction it claims, in
    units of the paper's effect (an equivalence: of its margin, around 0; a two-sided claim,
    ``!=``: in the direction its mean lies, the paper's effect being a size whatever its sign)."""
    import matplotlib.pyplot as plt

    cs = [c for c in _as_dicts(claims) if c.get("kind") == kind and c.get("interval")]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.45 * max(len(cs), 2) + 1.2))
    for i, c in enumerate(cs):
        thr, test, unit = c.get("threshold") or 0.0, c.get("test"), _unit(c)
        mean = sum(c["values"]) / len(c["values"])
        sign, shift = (1, 0.0) if test == "equivalent" else (-1 if test == "<" else 1, thr)
        if test == "!=":
            sign = 1 if mean >= thr else -1

        def at(x, sign=sign, shift=shift, unit=unit):
            return sign * (x - shift) / unit

        colour = {"reproduced": "tab:green", "not reproduced": "tab:red"}.get(c["verdict"], "0.5")
        ax.plot(sorted(at(x) for x in c["interval"]), [i, i], color=colour, lw=2.5)
        ax.plot(at(mean), i, "o", color=colour)
        pe = c.get("paper_effect")
        if pe is not None:
            pe_at = abs(pe - thr) / unit if test == "!=" else at(pe)
            ax.plot(pe_at, i, "D", color="tab:blue", ms=7, mfc="none")
        if test == "equivalent":
            ax.plot([-1, 1], [i, i], ":", color="tab:blue")
        if c.get("mde"):
            m = c["mde"] / unit
            ticks = [-m, m] if test in ("equivalent", "!=") else [m]
            ax.plot(ticks, [i] * len(ticks), "|", color="k", ms=12)
    ax.axvline(0, color="k", lw=0.8)
    labels = [f"{c['id']} ({c['verdict_holm'] or c['verdict']})" for c in cs]
    ax.set_yticks(range(len(cs)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("effect beyond the threshold, in units of the paper's effect (paper = 1)")
    ax.set_title(f"{kind} claims: ours ● with 95 % interval, paper ◇, mde |", fontsize=9)
    return ax


def rule_log_markdown() -> str:
    """The rule-change log in full, as Markdown (oldest first): per entry its date, the rules
    it touches, the change, why, and what results had been seen before it."""
    from modnets.experiments.core.rules import rule_log

    bare = {"yes": "yes (the entry records no more)", "no": "no (the entry records no more)"}
    entries = []
    for e in rule_log():
        rules = ", ".join(f"`{r}`" for r in e["rules"]) or "the protocol, no single rule"
        seen = bare.get(e["results_seen"].strip().lower(), e["results_seen"])
        entries.append(
            f"**{e['date']}** ({rules}). {e['change']}\n\n"
            f"*Why:* {e['why']}\n\n*Results seen before the change:* {seen}"
        )
    return "\n\n---\n\n".join(entries)
