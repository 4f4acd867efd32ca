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
# # 13. Reproduction: every claim beside the paper's
#
# This page collects, per paper, each claim the book tests: the paper's number, this book's number
# at the active profile (mean ± sd over seeds), the rule that decides, the computed verdict, and
# the command that runs the experiment at the papers' scale. Nothing here is typed in: every row is
# read from the JSON files that the experiment chapters write
# (`_build/results/<experiment>_<profile>.json`) and every verdict is computed by
# `modnets.experiments.claims` from the 95 % t-interval over seeds, so the page is only as current
# as the last run of those chapters. A claim the offline data cannot test says so (`not testable
# here`, with the reason); SVHN, Tiny-ImageNet-R, the full Tiny-ImageNet train split, ImageNet,
# CUB/CIFAR few-shot, NLVR2 and point clouds are not in the offline data.

# %%
from IPython.display import Markdown, display

from modnets.experiments.claims import PAPERS, reproduction, verdict_counts
from modnets.profiles import get_profile

PROFILE = get_profile()
print("profile:", PROFILE)

# %% [markdown]
# ## Neural Interpreters
#
# The claims of {cite}`rahaman2021interpreters`, tested in chapter 5 (fuzzy Boolean expressions, NI
# Table 1) and chapter 6 (digits, NI §4.2).

# %%
table, claims, missing = reproduction(PAPERS["Neural Interpreters"], PROFILE)
for m in missing:
    print("missing:", m)
display(Markdown(f"**{verdict_counts(claims)}** at the `{PROFILE}` profile."))
table

# %% [markdown]
# ## Neural Attentive Circuits
#
# The claims of {cite}`weiss2022circuits`, tested in chapter 10 (Tiny-ImageNet, NAC Table 1, Figs.
# 5, 10, 15).

# %%
table, claims, missing = reproduction(PAPERS["Neural Attentive Circuits"], PROFILE)
for m in missing:
    print("missing:", m)
display(Markdown(f"**{verdict_counts(claims)}** at the `{PROFILE}` profile."))
table

# %% [markdown]
# ## Neural Function Modules
#
# The claims of {cite}`lamb2021nfm`, tested in chapter 11 (stacked MNIST, NFM §4.2, Table 5).

# %%
table, claims, missing = reproduction(PAPERS["Neural Function Modules"], PROFILE)
for m in missing:
    print("missing:", m)
display(Markdown(f"**{verdict_counts(claims)}** at the `{PROFILE}` profile."))
table

# %% [markdown]
# ## What we learned: reading these tables
#
# The `cpu` profile trains for minutes on two CPU cores, on reduced data and smaller models, so its
# absolute numbers sit below the papers'. The claims to check at this scale are the *comparisons*
# (NI vs ViT, NAC vs Perceiver IO, dropped vs full, NFM vs its base network), each over at least
# three seeds: a difference inside seed noise is `inconclusive`, counted neither for nor against the paper. Each
# chapter prints, beside its claims, the diagnostics of the mechanism the claim relies on; the
# `reproduce at scale` column gives the command that runs the paper-scale version.
