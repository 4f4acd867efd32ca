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
# # 2. Type inference and type matching
#
# A Neural Interpreter {cite}`rahaman2021interpreters` holds a handful of *functions* and must decide,
# for every element of its input set, which functions may read it. It does so with a tiny type
# system:
#
# - every set element $x_i$ gets a **type** $t_i$, computed from $x_i$ by an MLP (type inference);
# - every function $f_u$ has a **signature** $s_u$;
# - both live on the unit hypersphere $\mathcal{T} = S^{d_\text{type}-1}$, and a function may read
#   an element only when its signature and the element's type are close (type matching).
#
# This chapter builds both pieces (NI §2, NI eqs. 2–3) and studies the two knobs that control how
# sparse the routing is: the truncation $\tau$ and the bandwidth $\sigma$.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import modnets
from modnets.nn import random_signatures
from modnets.utils import seed_everything

seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## Type inference
#
# The type of an element is a learned function of its content, projected onto the sphere. The paper
# says only "an MLP"; we follow the public NI code: LayerNorm, a two-layer GELU MLP, then
# L2-normalisation.

# %%
d, d_type = 32, 8
mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, d_type))


def type_inference_from_scratch(x):
    return F.normalize(mlp(x), dim=-1)  # t_i = MLP(x_i) / ||MLP(x_i)||


x = torch.randn(2, 10, d)  # (batch, tokens, d)
with torch.no_grad():  # no training in this chapter
    types = type_inference_from_scratch(x)
types.shape, types.norm(dim=-1)[0]

# %% [markdown]
# Every type has norm 1: it is a *direction*. The library's `TypeInference` holds the same MLP.

# %%
ti = modnets.TypeInference(d, d_type)
ti.net.load_state_dict(mlp.state_dict())
with torch.no_grad():
    assert torch.allclose(ti(x), types, atol=1e-6)

# %% [markdown]
# ## Signatures
#
# A signature is a unit vector too. The paper keeps signatures **fixed at their random
# initialisation** ("Preventing function signatures and variable types from collapsing"): if both
# signatures and types could move, the easiest solution would put them all on one point, every
# function would read every element, and the modular structure would be gone. With the signatures
# pinned to a spread-out configuration, the type-inference MLP must learn to *aim* elements at the
# functions. (The library can train them on request: `NIConfig(learn_signatures=True)`.)

# %%
U = 5
signatures = random_signatures(U, d_type)  # (U, d_type), uniform on the sphere
signatures.norm(dim=-1)

# %% [markdown]
# ## The truncated kernel
#
# The distance between a signature and a type is one minus their cosine similarity, which lies in
# $[0, 2]$ for unit vectors. The compatibility kernel decays exponentially with distance and is cut
# to zero beyond $\tau$ (NI eqs. 2–3):
#
# $$
# d_\mathcal{T}(s_u, t_i) = 1 - s_u\cdot t_i, \qquad
# \tilde C_{ui} = \begin{cases} \exp\!\big(-d_\mathcal{T}(s_u, t_i)/\sigma\big) & d_\mathcal{T}(s_u, t_i) < \tau \\ 0 & \text{otherwise,} \end{cases}
# \qquad C_{ui} = \frac{\tilde C_{ui}}{\epsilon + \sum_{u'} \tilde C_{u'i}} .
# $$
#
# :::{important}
# The text extracted from the paper's NI eq. 3 reads "if $d_\mathcal{T} > \tau$", which would let a
# function read only the elements *far* from its signature. The prose ("if this compatibility is
# larger than a threshold, $f_u$ is permitted access") and the public code keep the pairs whose
# distance is **below** $\tau$. We follow them: the inverted mask would hand each function the
# elements least like its signature.
# :::

# %%
tau, sigma, eps = 1.0, 0.5, 1e-6


def distance(types, signatures):
    return 1 - torch.einsum("ud,btd->but", signatures, types)  # (B, U, T)


def kernel_from_scratch(types, signatures, tau, sigma):
    dist = distance(types, signatures)
    return torch.where(dist < tau, torch.exp(-dist / sigma), torch.zeros_like(dist))


def compatibility_from_scratch(types, signatures, tau, sigma, eps=1e-6):
    k = kernel_from_scratch(types, signatures, tau, sigma)
    return k / (eps + k.sum(dim=1, keepdim=True))  # normalise over functions


C = compatibility_from_scratch(types, signatures, tau, sigma)
C[0]

# %% [markdown]
# Each column is one token: its entries say how much of the token each function receives. Columns
# sum to (nearly) one, or to zero where no function is close enough. `TypeMatching` computes the
# same, with a learnable $\sigma$:

# %%
tm = modnets.TypeMatching(truncation=tau, sigma=sigma, eps=eps)
assert torch.allclose(tm(types, signatures), C, atol=1e-6)
assert torch.allclose(
    tm.kernel(types, signatures), kernel_from_scratch(types, signatures, tau, sigma)
)
print("columns sum to", [round(v, 3) for v in C.sum(1)[0].tolist()])

# %% [markdown]
# Two checks of the mask's direction: a type equal to a signature gets $\tilde C = e^0 = 1$, and a
# type beyond $\tau$ gets 0.

# %%
# on s_0, and antipodal to s_0
probe = torch.stack([signatures[0], -signatures[0]])[None]
k = tm.kernel(probe, signatures)
assert k[0, 0, 0] == 1.0 and k[0, 0, 1] == 0.0
k[0, 0].detach()

# %% [markdown]
# The kernel as a function of distance, for several bandwidths, truncated at $\tau = 1$:

# %% tags=["hide-input"]
dist = torch.linspace(0, 2, 400)
fig, ax = plt.subplots(figsize=(5.5, 3.2))
for s in (0.1, 0.3, 1.0, 3.0):
    ax.plot(
        dist, torch.where(dist < tau, torch.exp(-dist / s), 0.0), label=rf"$\sigma$={s}"
    )
ax.axvline(tau, color="gray", ls="--", lw=1)
ax.text(tau + 0.03, 0.9, r"$\tau$", color="gray")
ax.set(xlabel=r"distance $1 - s_u \cdot t_i$", ylabel=r"$\tilde C_{ui}$")
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# $\tau$ decides *whether* a function can see a token (a hard cut), $\sigma$ decides *how strongly*
# closeness is preferred among the functions that can: a small $\sigma$ makes the nearest signature
# dominate after normalisation, a large one spreads the token evenly over all functions within
# reach.

# %% [markdown]
# ## Routing on a circle
#
# With $d_\text{type} = 2$ the sphere is a circle and we can see the whole mechanism. Five
# signatures (stars) and 400 types (dots); each dot is coloured by the function that receives most
# of it, grey if no function is within reach.

# %%
angles = torch.rand(400) * 2 * np.pi
types2 = torch.stack([angles.cos(), angles.sin()], dim=-1)[None]  # (1, 400, 2)
sig_angles = torch.tensor([0.3, 1.4, 2.2, 3.9, 5.1])
sigs2 = torch.stack([sig_angles.cos(), sig_angles.sin()], dim=-1)

fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
for ax, tau_ in zip(axes, (0.05, 0.2, 1.0), strict=True):
    C2 = modnets.TypeMatching(truncation=tau_, sigma=0.1)(types2, sigs2)[0]  # (U, 400)
    owner = C2.argmax(0)
    colours = np.where(
        (C2.sum(0) > 0)[:, None].numpy(), plt.cm.tab10(owner.numpy())[:, :3], 0.8
    )
    ax.scatter(types2[0, :, 0], types2[0, :, 1], c=colours, s=8)
    ax.scatter(
        sigs2[:, 0],
        sigs2[:, 1],
        c=plt.cm.tab10(np.arange(5))[:, :3],
        marker="*",
        s=250,
        edgecolors="k",
    )
    ax.set(
        title=rf"$\tau$ = {tau_}: {(C2.sum(0) > 0).float().mean():.0%} of tokens "
        "routed",
        aspect="equal",
        xticks=[],
        yticks=[],
    )
fig.tight_layout()

# %% [markdown]
# With a small $\tau$ each function owns a narrow arc around its signature and most tokens pass
# through untouched (they will be left unchanged by the interpreter, chapter 4). As $\tau$ grows
# the arcs meet and every token is routed somewhere.

# %% [markdown]
# ## How sparse is the routing? $\tau$ in high dimensions
#
# On a circle, distances spread over the whole range $[0, 2]$. In higher dimensions they do not:
# two random unit vectors in $\mathbb{R}^{d}$ are nearly orthogonal, with $s\cdot t$ of order
# $1/\sqrt{d}$, so their distance concentrates around 1. The fraction of (function, token) pairs
# that survive truncation then jumps from 0 to 1 in a narrow window around $\tau = 1$:

# %% tags=["hide-input"]
taus = torch.linspace(0.01, 2.0, 200)
fig, ax = plt.subplots(figsize=(5.5, 3.2))
for dt in (2, 4, 24, 64):
    t_rand = F.normalize(torch.randn(1, 4000, dt), dim=-1)
    dd = distance(t_rand, random_signatures(8, dt)).flatten()
    ax.plot(
        taus,
        [(dd < tau_).float().mean() for tau_ in taus],
        label=f"$d_{{type}}$ = {dt}",
    )
ax.axvline(1.42, color="gray", ls=":", lw=1)
ax.set(xlabel=r"truncation $\tau$", ylabel="fraction of pairs kept")
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# At $d_\text{type} = 24$ (the NI digits setting, dotted line at $\tau = 1.42$) *random* types would
# reach almost every function. Sparsity at that setting is not given by chance: the
# type-inference MLP must learn to place types near some signatures and far (distance above 1.42,
# i.e. cosine below −0.42) from others. Smaller $\tau$ forces sparsity from the start.

# %% [markdown]
# ## $\tau$ and $\sigma$ together
#
# For types spread on $S^{23}$ we measure two things over a grid of $\tau$ and $\sigma$: the
# fraction of tokens that reach at least one function, and the *effective number of functions* per
# routed token, $\exp(H)$ with $H$ the entropy of its normalised compatibilities (1 = one function
# takes it all; $U = 5$ = spread evenly).

# %%
dt, n_tok = 24, 4000
t_rand = F.normalize(torch.randn(1, n_tok, dt), dim=-1)
sig5 = random_signatures(5, dt)
taus_grid = [0.8, 0.9, 1.0, 1.1, 1.2, 1.42, 1.7, 2.0]
sigmas_grid = [0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
routed = np.zeros((len(sigmas_grid), len(taus_grid)))
eff = np.full_like(routed, np.nan)
for a, s in enumerate(sigmas_grid):
    for b, tau_ in enumerate(taus_grid):
        Cg = modnets.TypeMatching(truncation=tau_, sigma=s)(t_rand, sig5)[
            0
        ].detach()  # (U, tokens)
        ok = Cg.sum(0) > 0.5
        routed[a, b] = ok.float().mean()
        p = Cg[:, ok] / Cg[:, ok].sum(0)
        if ok.any():
            eff[a, b] = (
                torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum(0)).mean().item()
            )

fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
for ax, data, title in (
    (axes[0], routed, "fraction of tokens routed"),
    (axes[1], eff, "effective functions per routed token"),
):
    im = ax.imshow(data, cmap="viridis", aspect="auto", origin="lower")
    ax.set(
        xticks=range(len(taus_grid)),
        xticklabels=taus_grid,
        yticks=range(len(sigmas_grid)),
        yticklabels=sigmas_grid,
        xlabel=r"$\tau$",
        ylabel=r"$\sigma$",
        title=title,
    )
    fig.colorbar(im, ax=ax)
fig.tight_layout()

# %% [markdown]
# Above the bottom rows, the left map depends on $\tau$ alone: the cut decides who is routed. The
# bottom rows hold a trap. With $\sigma = 0.02$ a typical distance of 1 gives
# $\tilde C = e^{-50} \approx 2\cdot 10^{-22}$, far below $\epsilon = 10^{-6}$, so
# $C = \tilde C/(\epsilon + \sum_u \tilde C)$ is essentially zero and the token is silently
# *unrouted* although it lies within $\tau$. (Blank cells on the right: no token was routed.) Too
# small a bandwidth switches the functions off. The right map shows $\sigma$'s intended job: at small bandwidth each routed token goes to about
# one function (hard routing), at large bandwidth to all functions within reach (soft routing).
# Because $\sigma$ is learned, the model can move between the two during training.

# %% [markdown]
# ## Gradients through the cut
#
# Truncation has no gradient: a pair beyond $\tau$ contributes an exact zero and the type MLP gets
# no signal to move it closer. The public code offers a *straight-through* variant: the forward pass
# uses the truncated kernel, the backward pass the untruncated one. It is off by default here
# (`NIConfig(straight_through=True)` turns it on).

# %%
# beyond tau for function 0
far_type = (-signatures[:1])[None].clone().requires_grad_(True)
for st in (False, True):
    k0 = modnets.TypeMatching(truncation=tau, sigma=sigma, straight_through=st).kernel(
        far_type, signatures
    )
    (g,) = torch.autograd.grad(k0[0, 0, 0], far_type)
    print(
        f"straight_through={st}: value {k0[0, 0, 0].item():.1f}, gradient norm "
        f"{g.norm():.3f}"
    )

# %% [markdown]
# ## Summary
#
# - Types (from an MLP) and signatures (fixed random unit vectors) live on a sphere; the
#   compatibility $C_{ui}$ is a truncated exponential kernel of their cosine distance, normalised
#   over functions (NI eqs. 2–3). Functions see tokens **closer** than $\tau$.
# - $\tau$ sets the sparsity of routing; in high dimensions its useful range is a narrow window
#   around 1. $\sigma$ (learned) sets how hard the routing is among the functions within reach.
#
# Next: what a function does with the tokens it is allowed to read — ModAttn and lines of code.

# %% [markdown]
# ## Exercises
#
# 1. **How $\sigma$ splits a token.** Suppose two functions are within reach of a token, at
#    distances $d_1 < d_2$. Show from NI eqs. 2–3 that their compatibilities satisfy
#    $C_1 / C_2 = \exp\big((d_2 - d_1)/\sigma\big)$, whatever the other functions and $\epsilon$.
#    How small must $\sigma$ be for the nearer function to receive 99 % of what the two receive
#    together when $d_2 - d_1 = 0.1$? Check the ratio on the chapter's `types` and `signatures`.
#
# :::{admonition} Hint
# :class: dropdown
# The normaliser $\epsilon + \sum_{u'} \tilde C_{u'i}$ is the same for both functions and cancels
# in the ratio. A share of 99 % is a ratio of 99, so $\sigma \le 0.1/\ln 99 \approx 0.022$. With
# $\tau = 2$ every pair but exact antipodes is within reach:
#
# ```python
# tm_wide = modnets.TypeMatching(truncation=2.0, sigma=0.1)
# with torch.no_grad():
#     Cw, dw = tm_wide(types, signatures), tm_wide.distance(types, signatures)
# print(((Cw[0, 0] / Cw[0, 1]).log() - (dw[0, 1] - dw[0, 0]) / 0.1).abs().max())
# ```
# :::
#
# 2. **The smallest useful bandwidth.** The grid above showed that with $\sigma = 0.02$ tokens
#    within $\tau$ are silently unrouted. Take a token whose only function within reach lies at
#    distance 1. Derive the $\sigma$ below which that function receives less than half of the
#    token ($C < 1/2$) at $\epsilon = 10^{-6}$, and check the boundary with `TypeMatching`. Why
#    does this boundary matter more in high dimensions than on the circle?
#
# :::{admonition} Hint
# :class: dropdown
# $C = e^{-1/\sigma} / (\epsilon + e^{-1/\sigma}) \ge 1/2$ exactly when
# $e^{-1/\sigma} \ge \epsilon$, that is $\sigma \ge 1/\ln(1/\epsilon) \approx 0.072$. In high
# dimensions the distances concentrate near 1 (the previous section), so the boundary concerns
# almost every token; on the circle they spread over $[0, 2]$.
#
# ```python
# s0 = torch.tensor([[1.0, 0.0]])  # one signature
# t0 = torch.tensor([[[0.0, 1.0]]])  # one type, at distance 1
# for s in (0.05, 0.07, 0.075, 0.1):
#     print(s, modnets.TypeMatching(truncation=1.5, sigma=s)(t0, s0).item())
# ```
# :::
#
# 3. **Predicting the fraction of pairs kept.** For random unit vectors in $\mathbb{R}^d$,
#    $s \cdot t$ has mean 0 and variance $1/d$, and is close to normal for large $d$. Use this to
#    predict the fraction of (signature, type) pairs that survive truncation at $\tau = 0.9$ with
#    $d_\text{type} = 24$, then measure it as in the figure above.
#
# :::{admonition} Hint
# :class: dropdown
# A pair survives when $1 - s \cdot t < \tau$, that is $s \cdot t > 0.1$:
# $0.1\sqrt{24} \approx 0.49$ standard deviations above the mean, which leaves about 31 % of a
# normal distribution.
#
# ```python
# t_rand = F.normalize(torch.randn(1, 4000, 24), dim=-1)
# kept = distance(t_rand, random_signatures(8, 24)) < 0.9
# print(kept.float().mean())
# ```
# :::
#
# 4. **Straight-through only in training.** Repeat the chapter's last experiment with the
#    `TypeMatching` in evaluation mode (`.eval()`). Which gradient does `straight_through=True`
#    give then, and why is that the right behaviour?
#
# :::{admonition} Hint
# :class: dropdown
# `TypeMatching` passes the untruncated gradient only while it is training. The straight-through
# gradient is a device for learning; outside training, a gradient (taken for an analysis, say)
# should be the true derivative of what the module computes, and the truncated kernel of NI eq. 3
# has zero derivative beyond $\tau$. The forward value is the same in both modes.
#
# ```python
# tm_st = modnets.TypeMatching(truncation=tau, sigma=sigma, straight_through=True)
# for training in (True, False):
#     k0 = tm_st.train(training).kernel(far_type, signatures)
#     (g,) = torch.autograd.grad(k0[0, 0, 0], far_type)
#     print(f"training={training}: value {k0[0, 0, 0].item():.1f}, grad {g.norm():.3f}")
# ```
# :::

# %% tags=["remove-cell"]
# The exercise hints above, run: one that no longer runs fails the build.
from modnets.exercises import run_hints

run_hints(globals(), "02_type_matching")
