# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% tags=["remove-cell"]
# Colab only: install modnets from the repository (a no-op everywhere else).
import subprocess
import sys

if "google.colab" in sys.modules:
    packages = ["modnets @ git+https://github.com/modnets/modnets@main", "torch>=2.3"]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", *packages], check=True
    )

# %% [markdown]
# # 4b. How we test a claim
#
# From chapter 5 on, the book trains the papers' models and tests what the papers say about
# them: that one model is more accurate than another, that a circuit loses "less than 3 %" with
# most of its modules dropped. This page is the method, in a page: what a claim becomes, how
# many seeds decide it, and what the four verdicts mean. Every experiment chapter and chapter 13
# use exactly these functions (`modnets.experiments.core.claims`).

# %%
import matplotlib.pyplot as plt
import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests

from modnets import diagrams
from modnets.experiments.core.claims import decide, decide_rule, mde, seeds_needed
from modnets.experiments.core.rule import POINTS, Rule

# %% [markdown]
# The whole protocol in one picture, each step below in turn:

# %% tags=["hide-input"]
_ = diagrams.draw("evidence_protocol")

# %% [markdown]
# ## A claim is a rule, written before the numbers
#
# A claim names a *quantity* measured once per seed (say, model A's accuracy minus model B's,
# the two trained from the same seed), a *direction* and a *threshold* (here: the difference is
# above 0), and the paper's own number (its *effect*, here 3 points), quoted with its source. The
# rule is declared in the experiment's `rules.py` before any run that it decides, and a change to
# it is logged in chapter 13 with its reason and what had been seen by then.

# %%
rule = Rule(
    id="a-beats-b",
    kind="paper",
    text="Model A is more accurate than model B",
    source="an example",
    paper="A 80.0 %, B 77.0 %",
    quantity="A − B accuracy, paired by seed",
    test=">",
    threshold=0.0,
    paper_effect=0.03,
    basis="the example's table: 80.0 − 77.0",
    **POINTS,
)
print(rule.describe())

# %% [markdown]
# ## Seeds, and the interval over them
#
# One seed is one whole run: its initialisation, its data order and, where the task is drawn,
# its task and test draws. Seeds that chose anything (a learning rate, a number of epochs) are
# *selection* seeds and never decide a claim. Over $n$ claim seeds with mean $\bar x$ and
# standard deviation $s$, the 95 % t-interval is
#
# $$\bar x \pm t_{0.975,\,n-1}\, \frac{s}{\sqrt n}.$$
#
# The verdict reads the interval: wholly on the claim's side of the threshold, **reproduced**;
# wholly on the other side, **not reproduced**; across it, **inconclusive**. Six seeds of a
# difference that really is 3 points with a spread of 2 points (simulated here):

# %%
rng = np.random.default_rng(0)
values = rng.normal(0.03, 0.02, size=6)
m, s = values.mean(), values.std(ddof=1)
half = stats.t.ppf(0.975, len(values) - 1) * s / np.sqrt(len(values))
print(
    f"mean {100 * m:.2f} pts, interval [{100 * (m - half):.2f}, {100 * (m + half):.2f}]"
)
verdict, interval, reason = decide(values, threshold=0.0, direction=">")
print(verdict, np.round(100 * np.array(interval), 2))
assert np.allclose(interval, [m - half, m + half])  # the library's interval is this one

# %% [markdown]
# ## Power first: the smallest effect the seeds can see
#
# Before running, we ask how small an effect $n$ seeds detect: the **minimal detectable effect**
# (mde), the distance from the threshold that a two-sided test at 5 % finds with 80 % power,
# given the spread $s$ (from a pilot on seeds that are never claim seeds). It shrinks like
# $1/\sqrt n$; the plan takes the $n$ at which it falls below the paper's effect.

# %%
ns = np.arange(2, 21)
sd = 0.02
plt.figure(figsize=(5, 3))
plt.plot(ns, [100 * mde(sd, int(n)) for n in ns], "o-", label="mde at spread 2 pts")
plt.axhline(100 * rule.paper_effect, color="k", ls="--", label="the paper's effect")
plt.xlabel("seeds n")
plt.ylabel("points")
plt.legend()
plt.show()
print("seeds needed:", seeds_needed(rule.paper_effect, sd))

# %% [markdown]
# The curve crosses the paper's 3 points at the number of seeds printed under the plot: with fewer, an
# inconclusive verdict would say little. That is why an *inconclusive* row says which of two
# things happened: **underpowered** (the interval holds the threshold *and* the paper's effect:
# more seeds could decide) or **smaller than the paper's** (the interval holds the threshold but
# excludes the paper's effect: whatever the truth, it is not the paper's number). A reproduced
# claim whose interval stops short of the paper's effect is counted apart, as reproduced in
# direction with a smaller effect.

# %%
claim = decide_rule("a-beats-b", values, rules={"a-beats-b": rule})
print(claim.verdict, "|", claim.vs_paper, "| mde", round(100 * claim.mde, 2), "pts")

# %% [markdown]
# ## Many claims: Holm's correction
#
# A paper makes several claims, and at 5 % each, one of twenty true-null claims comes out
# "reproduced" by chance. Holm's step-down correction controls the chance of any false verdict
# over a paper's claims: sort the $m$ p-values, compare the smallest with $0.05/m$, the next
# with $0.05/(m-1)$, and so on, stopping at the first that fails. A verdict whose adjusted
# p-value is not below 0.05 becomes inconclusive.

# %%
p_values = [0.003, 0.03, 0.04]
reject, adjusted, _, _ = multipletests(p_values, alpha=0.05, method="holm")
for p, r, a in zip(p_values, reject, adjusted, strict=True):
    print(f"p {p:.3f} -> adjusted {a:.3f}: {'decided' if r else 'inconclusive'}")

# %% [markdown]
# Each of the last two would be decided alone at 5 %; over three claims, neither is.

# %% [markdown]
# ## The regime, the mechanism, and a second set of seeds
#
# Three more conditions stand between a number and a verdict:
#
# * **The regime.** A claim presupposes models that learned their task (above a stated accuracy,
#   trained to convergence). A seed outside the regime makes the claim *not testable here*,
#   with the reason; the bar is a formula declared in advance, not read off the results.
# * **The mechanism.** A claim about dropping modules is empty if the modules carry nothing:
#   removing the part the claim is about must cost more than the seed spread, else the claim is
#   *not testable here: <mechanism> unused*, never reproduced.
# * **Replication.** A verdict counts only when a second, disjoint set of seeds of the same size
#   gives the same one (chapter 13 shows both). Another machine rounds differently and a few
#   seeds are one sample of many; a verdict that comes back from new seeds is one a reader can
#   expect to see.

# %% [markdown]
# ## Summary
#
# * A claim is a rule: a quantity per seed, a direction, a threshold and the paper's number,
#   declared before the runs it decides.
# * The 95 % t-interval over seeds decides: reproduced, not reproduced or inconclusive; the
#   mde says before running whether the seeds can see the paper's effect.
# * Inconclusive is either underpowered or smaller than the paper's; Holm's correction is taken
#   over each paper's claims; the regime and the mechanism come first; two seed sets must agree.
#
# ## Exercises
#
# 1. **The cost of certainty.** How many seeds does the example's claim need at a spread of 4
#    points instead of 2? Why roughly four times as many?
#
# :::{admonition} Hint
# :class: dropdown
# The mde is proportional to $s / \sqrt n$ (its factor changes slowly with $n$), so doubling $s$
# asks for about four times the seeds.
#
# ```python
# print(seeds_needed(0.03, 0.02), seeds_needed(0.03, 0.04))
# ```
# :::
#
# 2. **Smaller than the paper's.** Draw six seeds of a true difference of 0.5 points (spread 0.5)
#    and decide the example's rule on them. Which verdict and which `vs_paper` do you expect?
#
# :::{admonition} Hint
# :class: dropdown
# The interval lies near 0.5 points, far below the paper's 3: whether it clears 0 or not, it
# excludes the paper's effect.
#
# ```python
# small = np.random.default_rng(1).normal(0.005, 0.005, size=6)
# c = decide_rule("a-beats-b", small, rules={"a-beats-b": rule})
# print(c.verdict, c.vs_paper, c.interval)
# ```
# :::

# %% tags=["remove-cell"]
# The exercise hints above, run: one that no longer runs fails the build.
from modnets.exercises import run_hints

run_hints(globals(), "04b_how_we_test_a_claim")
