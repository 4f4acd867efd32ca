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
# # 13. Reproduction: the papers' claims, with the power to decide them
#
# This page collects, per paper, each claim the book tests. A row of kind *paper* quotes a claim
# the paper makes, with its source and its own number (`paper effect`, in the units of the tested
# quantity; for a claim made only in a figure, the smallest effect its words imply, declared
# before any run). Rows of kind *ours* are questions this book asks; they are shown apart and
# never counted as reproductions. Nothing is typed in: every row is read from the JSON files the
# experiment chapters write (`_build/results/<experiment>_<profile>.json`), and every verdict is
# computed by `modnets.experiments.core.claims` from a rule declared in the experiment's own
# package (`modnets.experiments.<name>.rules`):
#
# * **verdict**: `reproduced` when the 95 % t-interval over seeds lies wholly on the claim's side of
#   its threshold (an equivalence: two one-sided tests within the margin), `not reproduced` when
#   wholly on the other side, `inconclusive` otherwise, `not testable here` when the data are
#   missing offline or the models missed the regime the claim presupposes;
# * **mde**: the smallest effect (beyond the threshold) the test detects with 80 % power at the
#   seeds and spread of this run (`statsmodels`). An `inconclusive` row says whether it is
#   *underpowered* (mde above the paper's effect, with the seeds that would do) or *smaller than
#   the paper's effect*;
# * **Holm**: the verdict after Holm's correction over all the paper's tested claims.

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from modnets.experiments.core import evidence_report, report
from modnets.profiles import get_profile

PROFILE = get_profile()
print("profile:", PROFILE)


def show_paper(paper: str) -> list:
    names = report.papers()[paper]
    claims, results, missing = report.load_claims(names, PROFILE)
    for m in missing:
        print("missing:", m)
    for name, r in results.items():
        run = f"python -m modnets.experiments.{name} --profile {PROFILE}"
        text = (
            f"`{name}`: claim seeds {r['seeds']}, selection seeds "
            f"{r['selection_seeds'] or 'none'}. {report.regime_sentence(r)} Run it: "
            f"`{run}`; at the papers' scale: `{report.paper_scale_command(name)}`."
        )
        display(Markdown(text))
    display(Markdown(report.paper_sentence(paper, claims)))
    display(report.claims_table(claims, "paper"))
    return claims


def forest(claims: list) -> None:
    if any(c["kind"] == "paper" and c.get("interval") for c in claims):
        report.forest_plot(claims, "paper")
        plt.show()


# %% [markdown]
# ## At a glance
#
# Each bar is one paper's claims, coloured by verdict after Holm's correction. A hatched part of
# the yellow is inconclusive because its test was underpowered (it could not have seen the
# paper's effect at these seeds); the rest of the yellow could have. A dotted part of the green
# is reproduced in direction with an effect smaller than the paper's (its interval stops short
# of the paper's number), counted apart from a full reproduction. The sections below give each
# claim.

# %% tags=["hide-input"]
everything = {
    paper: report.load_claims(names, PROFILE)[0]
    for paper, names in report.papers().items()
}
report.summary_plot(everything)
plt.show()

# %% [markdown]
# ## In words
#
# What the evidence records say, paper by paper: each claim is decided by two disjoint sets of
# seeds (the evidence run below), and counts only where both give the same verdict. The
# numbers are each set's mean of the tested quantity with its 95 % interval, in the claim's
# units, beside the paper's own number; the verdicts are after Holm's correction over the
# paper's claims, so an interval clear of the threshold can still be inconclusive. "Open" says
# why a claim is not decided: the two sets disagree, or the pilot's spread asks for more seeds
# than the plan allows.

# %%
records = evidence_report.evidence_records(PROFILE)
display(Markdown(evidence_report.evidence_sentence(records)))

# %% [markdown]
# ## Neural Interpreters
#
# The claims of {cite}`rahaman2021interpreters`, tested in chapter 5 (fuzzy Boolean expressions,
# NI Table 1) and chapter 6 (digits, NI §4.2).

# %%
ni = show_paper("Neural Interpreters")

# %% [markdown]
# In the forest plot each tested claim is a row, in its own units and turned so that the paper's
# side is to the right of 0 (its threshold): ours is the dot with its 95 % interval, the paper's
# effect the open diamond, and the black tick marks the mde, the smallest effect these seeds
# detect. An interval clear of 0 decides; a diamond left of the tick means the test could not
# have seen the paper's effect.

# %% tags=["hide-input"]
forest(ni)

# %% [markdown]
# Our own checks on these experiments (never counted as reproductions):

# %%
report.claims_table(ni, "ours")

# %% [markdown]
# ## Neural Attentive Circuits
#
# The claims of {cite}`weiss2022circuits`, tested in chapter 10 (Tiny-ImageNet, NAC Table 1,
# §4.1 and App. F).

# %%
nac = show_paper("Neural Attentive Circuits")

# %% tags=["hide-input"]
forest(nac)

# %%
report.claims_table(nac, "ours")

# %% [markdown]
# ## Neural Function Modules
#
# The claims of {cite}`lamb2021nfm`, tested in chapter 11 (stacked MNIST, NFM §4.2, Table 5).

# %%
nfm = show_paper("Neural Function Modules")

# %% tags=["hide-input"]
forest(nfm)

# %% [markdown]
# ## Side by side (ours)
#
# Chapter 11b's claims are our own: each architecture's promise tested against its plain
# counterpart on one shared task. They are never counted as reproductions. (Every experiment
# that tests no paper's claims is read here, `report.own_experiments()`.)

# %%
side, side_results, side_missing = report.load_claims(report.own_experiments(), PROFILE)
for m in side_missing:
    print("missing:", m)
report.claims_table(side, "ours")

# %% [markdown]
# ## Verdicts that replicate: the evidence records
#
# The tables above read what each chapter showed: its evidence record's claim seeds where the
# record is complete, else the few seeds the chapter trained while the book was made. A verdict
# from a few seeds may not come back: another machine rounds differently, training takes
# another path, and a few seeds are another sample each time. The evidence run
# (`python -m modnets.reproduce`, hours, apart from the build) decides each claim the way a
# verdict should be decided:
#
# 1. a pilot on three seeds that are never claim seeds measures the spread of each claim's
#    tested quantity, and must reach the experiment's regime: a pilot outside it stops the run
#    before any claim seed, since its claims would not be testable;
# 2. from that spread, the number of seeds $n$ at which each paper claim would see the paper's
#    effect with 80 % power; the plan takes the largest (at least 4, at most 12) and fixes it,
#    with two disjoint sets of $n$ seeds, before either runs;
# 3. every seed of both sets is measured and committed as one record, with the machine, the
#    torch and the code it ran with;
# 4. each set decides every claim as this chapter does (Holm over each paper's claims). **A
#    claim counts as decided only where both sets give the same verdict.**
#
# Where the experiments stand:

# %%
display(Markdown(evidence_report.evidence_status(records, PROFILE)))

# %% [markdown]
# Each claim under both seed sets: *decided* is the verdict both gave; *undecided* says why (the
# sets disagree, or the claim needs more seeds than the cap).

# %%
table = evidence_report.evidence_table(records)
if table is not None:
    display(table)

# %% [markdown]
# The build checks itself against the records: each claim's value at every claim seed this
# build trained must lie within its record's range over the claim seeds, widened by their
# spread (machines round differently, so the check is not to the bit). A value outside shows
# here and fails `make audit`.

# %%
checks, sentence = evidence_report.record_checks(records, PROFILE)
display(Markdown(sentence))
if checks is not None:
    display(checks)

# %% [markdown]
# ## The rule-change log
#
# Every rule above is pinned: a test compares each rule's fingerprint with the newest entry for it
# in this log, so no rule changes without an entry saying what changed, when, why, and whether
# results had been seen by then.

# %%
display(Markdown(report.rule_log_markdown()))

# %% [markdown]
# ## Reading these tables
#
# The `cpu` profile trains for minutes on two CPU cores, on reduced data and smaller models, so
# its absolute numbers sit below the papers'. What it can test is the papers' *comparisons*, and
# only where its models reach the regime each claim presupposes (each experiment states it
# above). Where a row is `inconclusive` and underpowered, the `gpu` profile (the papers'
# settings, more seeds at the same cost per seed on a GPU) is what would decide it.

# %% [markdown]
# ## Summary
#
# * Every claim is a rule declared before the runs it decides, tested on the seeds power asks
#   for, with Holm's correction over each paper's claims; a claim whose regime or mechanism is
#   missing is not testable here, and says why.
# * A verdict counts when two disjoint seed sets, recorded by the evidence run, give the same
#   one; the paragraphs under *In words* say per paper what both sets reproduce, what neither
#   does, what is smaller than the paper's, and why the rest is open.
# * The build checks its own seeds against the records, and every rule change is in the log
#   above with what had been seen when it was made.
#
# ## Exercises
#
# 1. **Seeds against spread.** Fuzzy Booleans' `table1-gap-closed` needs more seeds than the
#    plan allows. From the record's claim seeds, compute how many it would need, and how many at
#    half that spread.
#
# :::{admonition} Hint
# :class: dropdown
# The mde falls like $s / \sqrt n$, so the seeds needed fall about fourfold when the spread
# halves.
#
# ```python
# import numpy as np
#
# from modnets.experiments.core.claims import seeds_needed
#
# cpu = evidence_report.evidence_records("cpu")
# claims = cpu["fuzzy_boolean"].results["claim"]["claims"]
# gap = next(c for c in claims if c["id"] == "table1-gap-closed")
# sd, effect = np.std(gap["values"], ddof=1), gap["paper_effect"] - gap["threshold"]
# print(seeds_needed(effect, sd), seeds_needed(effect, sd / 2))
# ```
# :::
#
# 2. **Why two sets?** For each claim of the NI paper, which verdict would the claim seeds alone
#    have given, and which does the book count?
#
# :::{admonition} Hint
# :class: dropdown
# `evidence.agreements` gives both sets' verdicts and what is decided.
#
# ```python
# from modnets.experiments.core import evidence
#
# cpu = evidence_report.evidence_records("cpu")
# names = report.papers()["Neural Interpreters"]
# ni_records = [cpu[n] for n in names if cpu.get(n) and cpu[n].complete]
# for a in evidence.agreements(ni_records, "Neural Interpreters"):
#     print(f"{a.id}: claim seeds {a.verdicts['claim']}; counted: {a.decided}")
# ```
# :::

# %% tags=["remove-cell"]
# The exercise hints above, run: one that no longer runs fails the build.
from modnets.exercises import run_hints

run_hints(globals(), "13_reproduction")
