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
# # 7. Stochastic kernel modulated dot-product attention
#
# A Neural Attentive Circuit {cite}`weiss2022circuits` is a set of $U$ modules. Each module keeps
# a state, transforms it with its own ModFFN (chapter 1), and sends messages to other modules with
# attention. Unlike a transformer, not every module hears every other. Each module carries a
# **signature** $s_u$, and two modules can communicate only if their signatures are close. The
# mechanism is *stochastic kernel modulated dot-product attention* (SKMDPA, NAC eqs. 2–3):
#
# 1. signatures give **link probabilities** $P_{ij}$ (NAC eq. 2);
# 2. a **kernel** $K_{ij} \sim \operatorname{Concrete}(P_{ij}, \tau)$, a differentiable sample that
#    is nearly 0 or 1, says which links are open for this example on this forward pass;
# 3. the kernel **gates** ordinary dot-product attention, added to the logits in log space (NAC eq. 3).
#
# We build each step from plain tensors and check it against `modnets.SKMDPA`.
#
# :::{note}
# In this chapter and the next, $\epsilon$ is the *bandwidth* of NAC eq. 2 and $\tau$ the *temperature*
# of the Concrete distribution, as in the NAC paper. In chapters 2–4, $\tau$ was the Neural
# Interpreter's truncation threshold.
# :::

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.colors import LogNorm

import modnets
from modnets.graphs import GraphPriorRegularizer, graphon
from modnets.nn.skmdpa import concrete_sample, link_probabilities
from modnets.profiles import select
from modnets.utils import seed_everything, wrap

seed_everything(0)
# Every tensor in this chapter is small: one thread is faster than several, which would
# synchronise on each tiny operation (and crawl on a busy machine).
torch.set_num_threads(1)
torch.set_printoptions(precision=3, sci_mode=False)
PROFILE = modnets.get_profile()
print("profile:", PROFILE)

# %% [markdown]
# ## Link probabilities from signatures (NAC eq. 2)
#
# The distance between two signatures is one minus their cosine similarity, and the link
# probability decays exponentially with it:
#
# $$
# P_{ij} = \exp\!\Big[-\frac{d(s_i, s_j)}{\epsilon}\Big], \qquad
# d(s_i, s_j) = 1 - \frac{s_i \cdot s_j}{\lVert s_i\rVert\,\lVert s_j\rVert} .
# $$
#
# The cosine distance runs from 0 (same direction) to 2 (opposite directions), so
# $P_{ij} \in [e^{-2/\epsilon}, 1]$. A module is always linked to itself ($P_{ii} = 1$), and $P$ is
# symmetric when queries and keys use the same signatures. We compute it by hand:

# %%
U, d_sig, eps = 6, 8, 0.5
sig = torch.randn(U, d_sig)
unit = sig / sig.norm(dim=-1, keepdim=True)
dist = 1 - unit @ unit.T
P = torch.exp(-dist / eps)
assert torch.allclose(P, link_probabilities(sig, sig, bandwidth=eps), atol=1e-6)
P

# %% [markdown]
# Only the *direction* of a signature matters. The bandwidth $\epsilon$ converts distances into
# probabilities. Below are 32 random signatures in 16 dimensions, at four bandwidths.

# %% tags=["hide-input"]
sig32 = torch.randn(32, 16)
fig, axes = plt.subplots(1, 4, figsize=(13, 3.2), layout="constrained")
for ax, eps in zip(axes, (0.1, 0.3, 1.0, 3.0), strict=True):
    im = ax.imshow(
        link_probabilities(sig32, sig32, eps), cmap="viridis", vmin=0, vmax=1
    )
    ax.set(title=rf"$\epsilon = {eps}$", xlabel="key module $j$")
axes[0].set_ylabel("query module $i$")
fig.colorbar(im, ax=axes.tolist(), shrink=0.85, label="$P_{ij}$");

# %% [markdown]
# At $\epsilon = 0.1$ only the diagonal survives, so each module talks only to itself. At
# $\epsilon = 3$ almost every pair is likely linked. Between these extremes the matrix is an even
# grey, because random directions in 16 dimensions are nearly orthogonal ($\cos \approx 0 \pm 0.25$),
# which puts almost every off-diagonal entry near $e^{-1/\epsilon}$.
#
# ## Sparsity against bandwidth
#
# How dense is the graph? We sweep $\epsilon$ and measure two things: the mean off-diagonal link
# probability, and the fraction of links with $P_{ij} > 1/2$ (the edges drawn in NAC Fig. 8). The
# second jumps where $d = \epsilon \ln 2$ reaches the typical distance 1, that is, at
# $\epsilon = 1/\ln 2 \approx 1.44$.

# %% tags=["hide-input"]
bandwidths = torch.logspace(-1.3, 1, 40)
off = ~torch.eye(256, dtype=torch.bool)
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.2), layout="constrained")
for d in (4, 16, 64):
    s = torch.randn(256, d)
    unit = F.normalize(s, dim=-1)
    dist = (1 - unit @ unit.T)[off]  # NAC eq. 2's distance for every pair i != j
    P_all = torch.exp(-dist / bandwidths[:, None])  # (bandwidths, pairs)
    ax0.semilogx(bandwidths, P_all.mean(1), label=f"$d_{{sig}} = {d}$")
    ax1.semilogx(bandwidths, (P_all > 0.5).float().mean(1), label=f"$d_{{sig}} = {d}$")
ax0.semilogx(
    bandwidths, torch.exp(-1 / bandwidths), "k--", lw=1, label=r"$e^{-1/\epsilon}$"
)
ax1.axvline(1 / math.log(2), color="gray", ls="--", lw=1)
ax0.set(xlabel=r"bandwidth $\epsilon$", ylabel=r"mean $P_{ij}$, $i \neq j$")
ax1.set(xlabel=r"bandwidth $\epsilon$", ylabel="fraction with $P_{ij} > 0.5$")
ax0.legend(fontsize=8)
ax1.legend(fontsize=8);

# %% [markdown]
# The mean link probability follows $e^{-1/\epsilon}$, more closely the higher the dimension. The fraction of strong
# links climbs from 0 to 1 around $1/\ln 2$ (dashed line), and the jump is sharper in higher
# dimensions, where random signatures are closer to orthogonal. This only holds while the
# signatures are random, though. NAC *learns* its signatures, and nothing in NAC eqs. 2–3 prevents a
# task from pulling them all together ($P \to 1$, a fully connected graph). Chapter 8 is about
# preventing that. The opposite direction holds a surprise: NAC eq. 2 as printed cannot make the
# graph sparse at all.

# %% [markdown]
# ## How sparse can NAC eq. 2 get?
#
# The graph priors of chapter 8 ask for sparse graphs: at $U = 64$ their *density*, the mean
# off-diagonal link probability, runs from 0.026 (scale-free) to 0.23 (planted partition). At
# $\epsilon = 1$, the value in NAC Table 4, NAC eq. 2 as printed cannot get there, whatever the
# signatures. Write $u_i = s_i / \lVert s_i \rVert$. The cosines of all pairs add up to a squared
# norm:
#
# $$
# \sum_{i, j} \cos(s_i, s_j) = \sum_{i, j} u_i \cdot u_j = \Big\lVert \sum_i u_i \Big\rVert^2 \ge 0 .
# $$
#
# The $U$ diagonal terms are 1, so the $U(U-1)$ off-diagonal cosines add up to at least $-U$. Their
# mean is therefore at least $-1/(U-1)$, and the mean off-diagonal distance is
# $\bar d \le 1 + 1/(U-1)$: many unit vectors cannot all point away from each other. The map
# $d \mapsto e^{-d/\epsilon}$ is convex, so Jensen's inequality bounds the mean off-diagonal link
# probability of NAC eq. 2:
#
# $$
# \bar P = \frac{1}{U(U-1)} \sum_{i \ne j} e^{-d_{ij}/\epsilon} \;\ge\; e^{-\bar d/\epsilon}
# \;\ge\; \exp\!\Big[-\frac{1}{\epsilon}\Big(1 + \frac{1}{U-1}\Big)\Big] .
# $$
#
# At $\epsilon = 1$ and $U = 64$ this floor is 0.362 ($e^{-1} \approx 0.37$ for large $U$), fourteen
# times the scale-free density. Equality needs every cosine to equal $-1/(U-1)$: the vertices of a
# regular simplex, which need $d_{sig} \ge U - 1$. We check the floor on random signatures, on
# signatures pushed apart by gradient descent on $\bar P$ itself, and on a simplex
# ($s_i = e_i - \tfrac{1}{U}\mathbf{1}$):

# %%
U = 64
off = ~torch.eye(U, dtype=torch.bool)  # the pairs i != j


def floor(eps, U=U):
    return math.exp(-(1 + 1 / (U - 1)) / eps)


pushed = torch.randn(U, 16, requires_grad=True)
opt = torch.optim.Adam([pushed], lr=0.05)
for _ in range(300):  # minimise the mean off-diagonal P itself
    loss = link_probabilities(pushed, pushed, 1.0)[off].mean()
    opt.zero_grad()
    loss.backward()
    opt.step()

signatures = {
    "random, d_sig = 16": torch.randn(U, 16),
    "pushed apart, d_sig = 16": pushed.detach(),
    "regular simplex, d_sig = 64": torch.eye(U) - 1 / U,
}
print(f"floor at eps = 1: {floor(1.0):.4f}")
print("signatures                    mean cos   mean P   min P")
for name, s in signatures.items():
    unit = F.normalize(s, dim=-1)
    cos, P = unit @ unit.T, link_probabilities(s, s, 1.0)
    print(
        f"{name:28s}  {cos[off].mean():+.4f}    {P[off].mean():.4f}   "
        f"{P[off].min():.4f}"
    )
    assert P[off].mean() >= floor(1.0) - 1e-5

# %% [markdown]
# Random signatures sit near $e^{-1}$: their cosines are near 0. Pushing them apart brings the mean
# cosine down to exactly $-1/(U-1)$ (the unit vectors then add up to zero), yet the mean $P$ hardly
# moves: in 16 dimensions the cosines cannot all be equal, and Jensen's gap remains. The simplex meets
# the floor exactly. No training can make NAC eq. 2 at $\epsilon = 1$ sparser than this, so a graph prior
# that asks for density 0.03 is out of reach and its loss can only push against the floor.
#
# Two levers move the floor, and the public NAC code uses both:
#
# * **learn $\epsilon$.** The floor falls with $\epsilon$. A prior of density $\rho$ is reachable
#   only if $\exp(-(1 + 1/(U-1))/\epsilon) \le \rho$, that is
#   $\epsilon \le (1 + 1/(U-1)) / \ln(1/\rho)$;
# * **truncate.** Set $P_{ij} = 0$ beyond a distance threshold: exact zeros, and no floor at all
#   (next section).
#
# The largest bandwidth each prior of chapter 8 allows:

# %%
for name in ("scale_free", "ring_of_cliques", "erdos_renyi", "planted_partition"):
    rho = graphon(name, U)[off].mean().item()
    eps_max = (1 + 1 / (U - 1)) / math.log(1 / rho)
    print(f"{name:18s} density {rho:.3f}: eps <= {eps_max:.2f}")


# %% [markdown]
# ## Truncation and a straight-through gradient
#
# The public NAC code truncates the kernel: $P_{ij} = 0$ where the distance exceeds a threshold $t$
# ($t = 0.9$, a cosine below 0.1). The threshold is on the distance, so it does not move with
# $\epsilon$:
#
# $$
# P_{ij} = e^{-d_{ij}/\epsilon}\,\big[d_{ij} \le t\big] .
# $$
#
# A truncated pair is an exact zero, and so are its Concrete samples (below): the link is closed and
# carries nothing. It also has zero gradient, so nothing pulls two modules back together once their
# signatures have drifted past $t$. The public code has a `straight_through` flag, but it applies it
# to a distance it has already set to infinity, where $e^{-d}$ has zero derivative, so the flag
# changes nothing there. `modnets` offers a working straight-through option: the forward value is
# truncated, and the gradient is that of the untruncated kernel,
#
# $$
# P^{\mathrm{ST}} = P + \operatorname{sg}\big[P^{\mathrm{trunc}} - P\big],
# $$
#
# with $\operatorname{sg}$ the stop-gradient (`.detach()`). We write both from scratch and compare
# values, exact zeros and gradients with `link_probabilities(..., truncation, straight_through)`:

# %%
def truncated_from_scratch(sig, eps, t, straight_through):
    unit = F.normalize(sig, dim=-1)
    dist = 1 - unit @ unit.T
    P = torch.exp(-dist / eps)
    P_trunc = torch.where(dist > t, 0.0, P)
    return (P + (P_trunc - P).detach() if straight_through else P_trunc), dist


sig = torch.randn(U, 16, requires_grad=True)
w = torch.randn(U, U)  # a loss sum_ij w_ij P_ij, to compare gradients
for st in (False, True):
    ours, dist = truncated_from_scratch(sig, 1.0, 0.9, st)
    lib = link_probabilities(sig, sig, 1.0, truncation=0.9, straight_through=st)
    assert torch.allclose(lib, ours, atol=1e-6)
    assert torch.equal(lib == 0, dist > 0.9)  # exact zeros, exactly where d > t
    (g_ours,) = torch.autograd.grad((w * ours).sum(), sig)
    (g_lib,) = torch.autograd.grad((w * lib).sum(), sig, retain_graph=True)
    assert torch.allclose(g_lib, g_ours, atol=1e-5)
    cut = (dist > 0.9).float()  # a loss on the truncated pairs only
    (g_cut,) = torch.autograd.grad((lib * cut).sum(), sig)
    assert (g_cut.norm() > 0) == st
    print(
        f"straight_through={st!s:5}: gradient norm through the truncated pairs "
        f"{g_cut.norm():.3f}"
    )
P_full = link_probabilities(sig, sig, 1.0).detach()
print(
    f"{cut[off].mean():.0%} of the pairs truncated; mean P "
    f"{lib.detach()[off].mean():.3f} (untruncated {P_full[off].mean():.3f})"
)


# %% [markdown]
# The random cosines of 16-dimensional signatures are roughly $\mathcal N(0, 1/16)$, so about two
# thirds of the pairs start beyond $d = 0.9$, and truncation cuts the mean link probability by more
# than half at initialisation. `SKMDPA(truncation=..., straight_through=...)` computes its kernel with this
# function; a NAC (chapter 9) uses the public code's truncation 0.9 and a learnable $\epsilon$ by
# default. Whether the straight-through gradient helps is an empirical question, which the last
# section of this chapter measures.

# %% [markdown]
# ## The Concrete distribution
#
# The kernel is not $P$ itself but a sample from the binary Concrete distribution (the relaxed
# Bernoulli) {cite}`maddison2017concrete` (the Gumbel-softmax of {cite}`jang2017gumbel` is the same
# idea). With success probability $p$ and temperature $\tau$:
#
# $$
# K = \sigma\!\left(\frac{\log p - \log(1-p) + \log u - \log(1-u)}{\tau}\right), \qquad
# u \sim \mathcal{U}(0, 1),
# $$
#
# where $\sigma$ is the logistic sigmoid. The noise $L = \log u - \log(1 - u)$ follows the standard
# logistic distribution, and all of the randomness sits in $u$. The sample is therefore a
# differentiable function of $p$: this is the reparameterisation trick.

# %%
def concrete_from_scratch(p, tau, eps=1e-6):
    # the library keeps p and u away from 0 and 1, and so do we
    p = p.clamp(eps, 1 - eps)
    u = torch.rand_like(p).clamp(eps, 1 - eps)
    logistic_noise = torch.log(u) - torch.log(1 - u)
    return torch.sigmoid((torch.log(p) - torch.log(1 - p) + logistic_noise) / tau)


p = torch.rand(1000)
torch.manual_seed(7)
ours = concrete_from_scratch(p, 0.5)
torch.manual_seed(7)
theirs = concrete_sample(p, 0.5)
assert torch.allclose(ours, theirs, atol=1e-6)
print("concrete_sample agrees with the formula; first samples:")
print(theirs[:5])

# %% [markdown]
# Why is this a *relaxed Bernoulli*? $K > 1/2$ exactly when $\operatorname{logit} p + L > 0$.
# The logistic CDF is $\sigma$, so that event has probability
# $\sigma(\operatorname{logit} p) = p$. **Thresholding $K$ at $1/2$ gives a Bernoulli($p$) sample at
# every temperature.** The temperature only controls how close to 0 and 1 the soft sample lies. We
# take many samples for $p = 0.3$:

# %% tags=["hide-input"]
n = select({"smoke": 5_000, "cpu": 200_000, "gpu": 1_000_000})
p = torch.full((n,), 0.3)
taus = (0.1, 0.5, 1.0, 2.0)
samples = {tau: concrete_sample(p, tau) for tau in taus}

fig, axes = plt.subplots(1, 4, figsize=(13, 2.8), sharey=True, layout="constrained")
for ax, tau in zip(axes, taus, strict=True):
    ax.hist(samples[tau], bins=50, range=(0, 1), density=True)
    ax.set(title=rf"$\tau = {tau}$", xlabel="$K$", yscale="log")
axes[0].set_ylabel("density (log scale)");

# %% [markdown]
# At $\tau = 0.1$ almost all of the mass sits in two spikes at 0 and 1, so the sample is nearly
# binary. As $\tau$ grows the spikes melt, and at $\tau = 2$ hardly any sample comes near 0 or 1. NAC uses
# $\tau = 0.5$, "small but non-zero ... to allow for exploration". A table makes the same point
# with numbers, and checks the thresholding argument by Monte Carlo:

# %%
se = math.sqrt(0.3 * 0.7 / n)  # standard error of a Bernoulli(0.3) frequency
print(f"p = 0.3, {n:,} samples per temperature, standard error {se:.4f}")
print(" tau   mean K   mean [K > 0.5]   within 0.05 of {0, 1}")
for tau, K in samples.items():
    hard = (K > 0.5).float().mean().item()
    near = ((K < 0.05) | (K > 0.95)).float().mean().item()
    print(f"{tau:4.1f}   {K.mean():.3f}    {hard:.4f}           {near:.3f}")
    assert abs(hard - 0.3) < 5 * se

# %% [markdown]
# At every temperature the thresholded kernel is open about 30% of the time, as it should be.
# The mean of the *soft* sample, however, is not $p$: it drifts towards $1/2$ as $\tau$ grows. At
# $\tau = 0.5$ the soft kernel of a link with $P_{ij} = 0.3$ averages about 0.33.
#
# Because $u$ does not depend on the signatures, gradients flow from a sampled kernel back to the
# signatures. A truncated link ($P_{ij} = 0$) is never sampled open:

# %%
s = torch.randn(5, 8, requires_grad=True)
K = concrete_sample(link_probabilities(s, s, 0.5), temperature=0.5)
K.sum().backward()
print("gradient norm on the signatures:", s.grad.norm().item())
P_t = link_probabilities(s, s, 0.5, truncation=0.9).detach()
assert torch.equal(concrete_sample(P_t, 0.5) == 0, P_t == 0)

# %% [markdown]
# ## From kernel to attention weights (NAC eq. 3)
#
# The whole path so far, from signatures to the messages, in one picture: distances become link
# probabilities, the truncation and a Concrete sample make the kernel, and its log joins the
# attention logits, so a closed link ($K_{ij} = 0$) gets no weight at all.

# %% tags=["hide-input"]
from modnets import diagrams

_ = diagrams.draw("skmdpa_kernel")

# %% [markdown]
#
# With the scaled dot-product score $A_{i\leftarrow j} = q_i \cdot k_j / \sqrt{d}$, NAC eq. 3 adds
# the kernel to the logits in log space:
#
# $$
# W_{i\leftarrow j} = \operatorname{softmax}_j\big[A_{i\leftarrow j} + \log \hat K_{ij}\big], \qquad
# \hat K_{ij} = \frac{K_{ij}}{\delta + \sum_j K_{ij}}, \qquad y_i = \sum_j W_{i\leftarrow j}\, v_j .
# $$
#
# Writing out the softmax shows what this does:
#
# $$
# W_{i\leftarrow j} = \frac{\hat K_{ij}\, e^{A_{i\leftarrow j}}}{\sum_k \hat K_{ik}\, e^{A_{i\leftarrow k}}}
#                  = \frac{K_{ij}\, e^{A_{i\leftarrow j}}}{\sum_k K_{ik}\, e^{A_{i\leftarrow k}}} .
# $$
#
# The kernel *multiplies* the unnormalised attention weights. $K_{ij} = 0$ closes a link,
# $K_{ij} = 1$ leaves it as in ordinary attention. The normalisation $\hat K$ cancels: for a fixed
# $i$, $\log(\delta + \sum_j K_{ij})$ is the same constant for every $j$, and a softmax does not
# see constants. The normalisation does not change $W$; it only keeps $\log \hat K \le 0$. We check
# all three forms:

# %%
A = torch.randn(4, 6)
K = concrete_sample(torch.rand(4, 6), temperature=0.5)
K_hat = K / (1e-6 + K.sum(-1, keepdim=True))
W_eq3 = torch.softmax(A + torch.log(K_hat), dim=-1)
W_gate = K * A.exp() / (K * A.exp()).sum(-1, keepdim=True)
assert torch.allclose(W_eq3, W_gate, atol=1e-6)
assert torch.allclose(W_eq3, torch.softmax(A + torch.log(K), dim=-1), atol=1e-6)
W_eq3.sum(-1)


# %% [markdown]
# Why log space? Adding $\log K$ to the logits lets the softmax subtract its maximum as usual, so
# a large score and a tiny kernel entry never overflow or underflow together. The public NAC code
# goes one step further and computes the kernel itself in log space (at evaluation,
# $\log P_{ij} = -d_{ij}/\epsilon$ needs no `exp` followed by `log`). `modnets` computes $\hat K$
# and takes its log with a floor at $10^{-30}$. When $e^{-d/\epsilon}$ underflows (small
# $\epsilon$), a link then gets weight $e^{-69}$ instead of $e^{-d/\epsilon}$. Both are zero for
# every practical purpose.

# %% [markdown]
# ## Multi-head SKMDPA by hand
#
# As in ordinary multi-head attention {cite}`vaswani2017attention`, the features are split into
# $H$ heads, and each head computes its own scores $A^{(h)}$. All heads share one kernel. In
# training each example of the batch draws **its own kernel**, as the public NAC code does
# (`rsample(batch_size)`); in evaluation the kernel $K = P$ depends only on the signatures and
# the whole batch shares it.
# `SKMDPA` receives queries, keys and values that are already projected; the projections belong to
# the NAC layers of chapter 9.

# %%
def skmdpa_from_scratch(
    q, k, v, sig_q, sig_k, heads, eps, tau, delta=1e-6, train=False
):
    P = link_probabilities(sig_q, sig_k, eps)
    # training: one sample per example, (B, Uq, Uk); evaluation: K = P
    K = concrete_from_scratch(P.expand(q.shape[0], *P.shape), tau) if train else P
    log_K_hat = torch.log((K / (delta + K.sum(-1, keepdim=True))).clamp_min(1e-30))
    d_head = q.shape[-1] // heads
    out = []
    for h in range(heads):
        sl = slice(h * d_head, (h + 1) * d_head)
        A = q[..., sl] @ k[..., sl].transpose(-1, -2) / math.sqrt(d_head)
        out.append(torch.softmax(A + log_K_hat, dim=-1) @ v[..., sl])
    return torch.cat(out, dim=-1)


# %% [markdown]
# In evaluation mode with the default `eval_kernel="probs"`, the library uses $K = P$. In training
# mode it draws one Concrete sample per example from the global random number generator, so the
# same seed gives the same kernels:

# %%
B, U, d, H = 2, 6, 16, 4
q, k, v = torch.randn(3, B, U, d).unbind(0)
sig = torch.randn(U, 8)
attn = modnets.SKMDPA(num_heads=H, bandwidth=0.5, temperature=0.5)

attn.eval()
ref = skmdpa_from_scratch(q, k, v, sig, sig, H, eps=0.5, tau=0.5)
assert torch.allclose(attn(q, k, v, sig, sig), ref, atol=1e-6)

attn.train()
torch.manual_seed(11)
lib = attn(q, k, v, sig, sig)
torch.manual_seed(11)
ref = skmdpa_from_scratch(q, k, v, sig, sig, H, eps=0.5, tau=0.5, train=True)
assert torch.allclose(lib, ref, atol=1e-6)
print(
    "SKMDPA matches the hand-written version in evaluation and in training:",
    tuple(lib.shape),
)

# %% [markdown]
# ## A closed link blocks the message
#
# NAC notes that $K_{ij} \approx 0$ implies $W_{i\leftarrow j} \approx 0$: module $j$ then cannot
# influence module $i$. We build two groups of four modules whose signatures point in opposite
# directions ($d \approx 2$). At $\epsilon = 0.1$, a link between the groups has
# $P \approx e^{-20} \approx 2\times10^{-9}$. We add 10 to one value $v_j$ at a time and record
# how far each output $y_i$ moves.

# %%
seed_everything(2)
U, d = 8, 16
group_b = torch.arange(U) >= 4
centre = torch.randn(8)
sig = torch.where(group_b[:, None], -centre, centre) + 0.3 * torch.randn(U, 8)
attn = modnets.SKMDPA(num_heads=2, bandwidth=0.1).eval()
q, k, v = torch.randn(3, 1, U, d).unbind(0)

base = attn(q, k, v, sig, sig)
# influence[i, j]: largest change of y_i when v_j moves by 10
influence = torch.zeros(U, U)
for j in range(U):
    v_moved = v.clone()
    v_moved[:, j] += 10.0
    influence[:, j] = (attn(q, k, v_moved, sig, sig) - base).abs().amax(-1)[0]

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
norm = LogNorm(vmin=1e-12, vmax=10)
for ax, M, title in zip(
    axes,
    (link_probabilities(sig, sig, 0.1), influence),
    ("link probability $P_{ij}$", r"change of $y_i$ when $v_j$ moves by 10"),
    strict=True,
):
    im = ax.imshow(M.clamp_min(1e-12), norm=norm, cmap="magma")
    ax.set(title=title, xlabel="module $j$ (sender)", ylabel="module $i$ (receiver)")
fig.colorbar(im, ax=axes.tolist(), shrink=0.85)
within = influence[~group_b][:, ~group_b]
across = influence[~group_b][:, group_b]
print(f"within a group: changes from {within.min():.2f} to {within.max():.1f}")
print(f"across the groups: at most {across.max():.1e}")
assert across.max() < 1e-5

# %% [markdown]
# On a log colour scale the two maps show the same two blocks. Within a group, moving a value by
# 10 moves the outputs by between a few hundredths and several units, depending on the attention
# scores. Across the groups the change is at the level of float32 rounding: the closed links carry
# no information at all.

# %% [markdown]
# ## Dropping modules and edges
#
# `SKMDPA` accepts two masks that zero entries of the kernel before normalisation:
#
# * `key_mask` of shape `(U_k,)`: `False` drops a module as a *sender*, so no query reads from it;
# * `edge_mask` of shape `(U_q, U_k)`: `False` drops the single link $i \leftarrow j$.
#
# Dropping a module with the mask gives the same result as deleting its key, value and signature:

# %%
keep = torch.tensor([True, True, False, True, True, False, True, True])
dropped = attn(q, k, v, sig, sig, key_mask=keep)
deleted = attn(q, k[:, keep], v[:, keep], sig, sig[keep])  # 8 queries, 6 keys
assert torch.allclose(dropped, deleted, atol=1e-6)

# %% [markdown]
# NAC drops modules at test time to trade a little accuracy for speed (NAC Fig. 5); in a whole
# model the dropped modules must also stop *computing*, which is a matter for the full circuit. An edge mask
# is finer grained. Below, module 1 may no longer send to module 0, but it still reaches the
# other modules of its group:

# %%
edges = torch.ones(U, U, dtype=torch.bool)
edges[0, 1] = False
v_moved = v.clone()
v_moved[:, 1] += 10.0
change = attn(q, k, v_moved, sig, sig, edge_mask=edges) - attn(
    q, k, v, sig, sig, edge_mask=edges
)
change = change.abs().amax(-1)[0]
print("change of y_0 ... y_3:", change[:4])
assert change[0] < 1e-5 and change[1:4].min() > 1e-3

# %% [markdown]
# ## Sampling in training, a fixed kernel in evaluation
#
# In training, every forward pass draws new kernels, one per example, like dropout on the links. In
# evaluation the kernel is fixed. The library's default is `eval_kernel="probs"` ($K = P$), which is
# also what the public NAC code does: it does not sample at evaluation. `eval_kernel="threshold"` uses
# the hard graph $K = [P > 1/2]$, and `"sample"` keeps sampling. To look at the attention weights
# themselves, we feed one-hot values, $v_j = e_j$: then $y_i = \sum_j W_{i\leftarrow j} e_j$ *is*
# row $i$ of $W$.

# %%
seed_everything(3)
U = 8
sig, q, k = torch.randn(U, 8), torch.randn(1, U, U), torch.randn(1, U, U)
onehot = torch.eye(U)[None]  # v_j = e_j
attn = modnets.SKMDPA(num_heads=1, bandwidth=0.5, temperature=0.5)

attn.eval()
W_eval = attn(q, k, onehot, sig, sig)[0]
# evaluation is deterministic
assert torch.equal(W_eval, attn(q, k, onehot, sig, sig)[0])
attn.eval_kernel = "threshold"
W_thr = attn(q, k, onehot, sig, sig)[0]
attn.eval_kernel = "probs"
attn.train()
# (300, U, U)
draws = torch.stack([attn(q, k, onehot, sig, sig)[0] for _ in range(300)])

# %%
i = 0
fig, ax = plt.subplots(figsize=(6.5, 3.4))
jitter = 0.12 * torch.randn(len(draws))
for j in range(U):
    ax.scatter(
        j + jitter,
        draws[:, i, j],
        s=4,
        alpha=0.25,
        color="tab:blue",
        label="training draws" if j == 0 else None,
    )
ax.plot(
    range(U),
    draws[:, i].mean(0),
    "_",
    ms=22,
    mew=2,
    color="tab:blue",
    label="mean of draws",
)
ax.plot(range(U), W_eval[i], "x", ms=9, mew=2, color="tab:red", label="eval, $K = P$")
ax.plot(
    range(U),
    W_thr[i],
    "o",
    ms=7,
    mfc="none",
    color="black",
    label="eval, $K = [P > 0.5]$",
)
ax.set(
    xlabel="key module $j$",
    ylabel=rf"$W_{{{i} \leftarrow j}}$",
    ylim=(-0.03, 1.03),
    title=f"attention weights of query module {i}",
)
ax.legend(fontsize=8, loc="upper right")
fig.tight_layout()

# %% [markdown]
# Each blue dot is one training forward pass. A key can take almost all of query 0's attention on
# one pass and none on the next, because its link opened or closed. The evaluation weights are
# fixed, but they are *not* the average of the training weights: as with dropout, training and
# evaluation see different models, and no simple rescaling makes them agree. Whether $K = P$ or
# the hard graph works better at test time is an empirical question. The library follows the
# public code, also in drawing one kernel per example: two copies of one input get different
# kernels, and so different outputs, in training, and the same output in evaluation.
# `per_example=False` shares one draw across the batch instead:

# %%
twins = torch.cat([q, q]), torch.cat([k, k]), torch.cat([onehot, onehot])
attn.train()
# (2, U, U): one draw per example
K = attn.kernel(link_probabilities(sig, sig, 0.5), batch=2)
print(f"the two copies' kernels differ by up to {(K[0] - K[1]).abs().max():.2f}")
W_twins = attn(*twins, sig, sig)
assert not torch.allclose(W_twins[0], W_twins[1])
attn.per_example = False  # one draw for the whole batch
W_twins = attn(*twins, sig, sig)
assert torch.equal(W_twins[0], W_twins[1])
attn.per_example = True
attn.eval()
W_twins = attn(*twins, sig, sig)
assert torch.equal(W_twins[0], W_twins[1])

# %% [markdown]
# ## Fitting a sparse graph: which gradient for truncated links?
#
# We end by using what we built: link probabilities alone, fitted to a graph. $U = 64$ modules with
# random 16-dimensional signatures (and, where it is learned, $\epsilon$ starting at 1) are trained
# with Adam (learning rate $10^{-2}$) on the graph-prior loss of chapter 8 (NAC eq. 6) towards the
# scale-free prior, divided by the $U(U-1)$ pairs. Until chapter 8 the loss is a black box: it
# compares $P$ with the prior's matrix $P_0$ up to a relabelling of the modules. Four kernels: NAC eq. 2
# as printed ($\epsilon = 1$), NAC eq. 2 with a learnable $\epsilon$, and the truncated kernel
# ($t = 0.9$, learnable $\epsilon$) without and with the straight-through gradient. For each we
# report the final loss, the mean off-diagonal $P$ against the prior's density, the fraction of
# exact zeros, and the coefficient of variation (std / mean) of the degrees
# $q_i = \sum_{j \ne i} P_{ij}$. A scale-free graph has hubs and a tail, so its degrees vary; chapter 9
# ranks modules by $q_i$ when it drops them.

# %%
U = 64  # U and off were reused above; back to 64 modules
off = ~torch.eye(U, dtype=torch.bool)
prior = graphon("scale_free", U)
reg = GraphPriorRegularizer(prior)
fit_steps = select(
    {"smoke": 100, "cpu": 1500, "gpu": 1500}
)  # settled well before 1,500


def degree_cv(P):
    q = (P * off).sum(1)  # q_i = sum_{j != i} P_ij
    return (q.std() / q.mean()).item()


def fit_graph(truncation, straight_through, learn_eps, seed=0):
    torch.manual_seed(seed)
    sig = torch.randn(U, 16, requires_grad=True)
    eps = torch.tensor(1.0, requires_grad=learn_eps)
    opt = torch.optim.Adam([sig, eps] if learn_eps else [sig], lr=1e-2)
    curve = []
    for _ in range(fit_steps):
        P = link_probabilities(sig, sig, eps, truncation, straight_through)
        loss = reg(P) / (U * (U - 1))  # NAC eq. 6, per pair
        opt.zero_grad()
        loss.backward()
        opt.step()
        curve.append(P.detach()[off].mean().item())
    with torch.no_grad():
        P = link_probabilities(sig, sig, eps, truncation)
        loss = reg(P) / (U * (U - 1))
    zeros = (P[off] == 0).float().mean().item()
    return dict(
        loss=loss.item(),
        mean_P=P[off].mean().item(),
        zeros=zeros,
        cv=degree_cv(P),
        eps=eps.item(),
        curve=curve,
    )


kernels = {  # truncation, straight_through, learn_eps
    "NAC eq. 2, eps = 1": (None, False, False),
    "NAC eq. 2, learned eps": (None, False, True),
    "truncated": (0.9, False, True),
    "truncated + straight-through": (0.9, True, True),
}
fits = {name: fit_graph(*args) for name, args in kernels.items()}
print(
    f"scale-free prior: density {prior[off].mean():.3f}, degree CV "
    f"{degree_cv(prior):.2f}\n"
)
print("kernel                          loss     mean P   zeros   degree CV   eps")
for name, f in fits.items():
    print(
        f"{name:28s}  {f['loss']:.2e}   {f['mean_P']:.3f}   {f['zeros']:.2f}    "
        f"{f['cv']:.2f}        {f['eps']:.2f}"
    )

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(6.5, 3.4))
for name, f in fits.items():
    ax.plot(f["curve"], label=name)
ax.axhline(floor(1.0), color="gray", ls=":", lw=1, label=r"floor at $\epsilon = 1$")
ax.axhline(prior[off].mean(), color="black", ls="--", lw=1, label="prior density")
ax.set(xlabel="step", ylabel=r"mean $P_{ij}$, $i \neq j$", yscale="log")
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# NAC eq. 2 at $\epsilon = 1$ (blue) sits on its floor (dotted) from the first steps, and all its
# degrees are alike. Every kernel with a learnable $\epsilon$ drops to the prior's density (dashed)
# within about 150 steps, as $\epsilon$ falls to about 0.2, where the floor is below 0.01. The
# two truncated kernels start lower, since truncation zeroes two thirds of the random pairs. Without
# straight-through the mean $P$ undershoots the density and climbs back slowly, because a link cut
# early gets no gradient to reopen it; with straight-through it settles nearer the density. Learning
# $\epsilon$ alone fits the prior about as well, but closes no link exactly: truncation is what gives
# exact zeros, links that no Concrete sample reopens.
#
# Between the two truncated kernels, the one with the lower final loss decides the option that the
# experiments use (a test, `tests/test_skmdpa.py`, keeps chapter 10's configurations in step):

# %%
from modnets.experiments.tiny_imagenet import CONFIGS
from modnets.models.nac import NACConfig

plain, st = fits["truncated"], fits["truncated + straight-through"]
use_st = st["loss"] < plain["loss"]
print(
    wrap(
        f"final loss {plain['loss']:.2e} without straight-through, "
        f"{st['loss']:.2e} with it: the experiments use straight_through={use_st}."
    )
)
used = {
    e.train.nac.get("straight_through", NACConfig.straight_through)
    for e in CONFIGS.values()
}
print(f"chapter 10's configurations: straight_through={sorted(used)}")

# %% [markdown]
# ## Summary
#
# - Signatures set link probabilities $P_{ij} = \exp(-(1 - \cos(s_i, s_j))/\epsilon)$ (NAC eq. 2). For
#   random signatures the mean is about $e^{-1/\epsilon}$, and the hard graph $P > 1/2$ switches
#   from empty to full around $\epsilon = 1/\ln 2$.
# - As printed, NAC eq. 2 cannot be sparse: unit vectors cannot all point apart, so the mean
#   off-diagonal $P$ is at least $\exp(-(1 + 1/(U-1))/\epsilon)$, 0.36 at $\epsilon = 1$, far above
#   the graph priors' densities. A learnable $\epsilon$ lowers the floor, and truncation at
#   $d > 0.9$ (public NAC code) gives exact zeros. A straight-through gradient lets truncated links
#   reopen; fitting the scale-free prior decided whether the experiments use it.
# - The kernel is a binary Concrete sample, $\sigma((\operatorname{logit} p + L)/\tau)$ with
#   logistic noise $L$. Thresholded at $1/2$ it is exactly Bernoulli($p$) at any $\tau$, and
#   $\tau \to 0$ pushes the soft sample to $\{0, 1\}$. It is reparameterised, so signatures get
#   gradients, and a truncated link is never sampled open.
# - NAC eq. 3 multiplies the unnormalised attention weights by $K$. The normalisation $\hat K$ cancels
#   inside the softmax. $K_{ij} \approx 0$ blocks every influence of $v_j$ on $y_i$, and `key_mask`
#   and `edge_mask` drop modules and links exactly.
# - Training samples one kernel per example and forward pass, shared by the heads (as the public
#   NAC code does). Evaluation is deterministic ($K = P$ by default, as in the public NAC code).
#
# Nothing so far keeps learned signatures from collapsing onto one direction, which would make
# $P_{ij} = 1$ everywhere and the graph fully connected. Chapter 8 introduces the **graph priors**
# of NAC App. A, which keep the learned graph sparse and shape it.

# %% [markdown]
# ## Exercises
#
# 1. **The mean of a soft kernel.** Show that for $p = 1/2$ the Concrete sample has mean exactly
#    $1/2$ at every temperature. Then predict the limits of the mean of $K$ for $p = 0.3$ as
#    $\tau \to 0$ and $\tau \to \infty$, and check them with `concrete_sample` at $\tau = 0.01$
#    and $\tau = 100$.
#
# :::{admonition} Hint
# :class: dropdown
# At $p = 1/2$ the logit is 0 and $K = \sigma(L/\tau)$. $L$ is symmetric about 0 and
# $\sigma(-z) = 1 - \sigma(z)$, so $K$ and $1 - K$ have the same distribution and $E[K] = 1/2$. As
# $\tau \to 0$, $K \to [\operatorname{logit} p + L > 0]$, a Bernoulli($p$) sample with mean $p$;
# as $\tau \to \infty$, $K \to \sigma(0) = 1/2$.
#
# ```python
# for p0 in (0.5, 0.3):
#     p = torch.full((100_000,), p0)
#     print(p0, [round(concrete_sample(p, t).mean().item(), 3) for t in (0.01, 100.0)])
# ```
# :::
#
# 2. **The floor at the paper's size.** Compute the floor of NAC eq. 2 at $\epsilon = 1$ for the
#    $U = 320$ modules of NAC Table 4, and the density of the scale-free prior at that size. Up to
#    which bandwidth is the prior reachable without truncation?
#
# :::{admonition} Hint
# :class: dropdown
# The floor is $\exp(-(1 + 1/319)) \approx 0.367$. The scale-free density falls like $U^{-\beta}$
# (chapter 8) and is about 0.013 at $U = 320$, so
# $\epsilon \le (1 + 1/319)/\ln(1/0.013) \approx 0.23$.
#
# ```python
# off320 = ~torch.eye(320, dtype=torch.bool)
# rho = graphon("scale_free", 320)[off320].mean().item()
# print(floor(1.0, 320), rho, (1 + 1 / 319) / math.log(1 / rho))
# ```
# :::
#
# 3. **Truncation and the signature width.** At initialisation the truncation at $d > 0.9$ cut
#    about two thirds of the pairs of 16-dimensional random signatures. Predict the fraction for
#    $d_{sig} = 64$ from $\cos(s_i, s_j) \approx \mathcal N(0, 1/d_{sig})$, and measure it. What
#    does it mean for a circuit of that width at its first training step?
#
# :::{admonition} Hint
# :class: dropdown
# A pair is cut when its cosine is below 0.1, that is $0.1\sqrt{d_{sig}}$ standard deviations
# above the mean: $\Phi(0.4) \approx 0.66$ at $d_{sig} = 16$ and $\Phi(0.8) \approx 0.79$ at
# $d_{sig} = 64$. About four links in five start closed, and without the straight-through option
# they get no gradient to open.
#
# ```python
# s64 = torch.randn(256, 64)
# P64 = link_probabilities(s64, s64, 1.0, truncation=0.9)
# print((P64[~torch.eye(256, dtype=torch.bool)] == 0).float().mean())
# ```
# :::
#
# 4. **A closed link, alone.** In the two-group example, $K_{ij} \approx 0$ blocked every message
#    across the groups. With `key_mask`, leave every query a single sender, module 5 of group B,
#    and predict $y_0$ (module 0 is in group A) before you compute it. What changes at
#    $\epsilon = 0.01$?
#
# :::{admonition} Hint
# :class: dropdown
# NAC eq. 3 normalises over a row's links: with one key left, $W_{0\leftarrow 5} = 1$ however
# small $K_{05}$ is, so $y_0 = v_5$. A small kernel entry closes a link only relative to the other
# open links. At $\epsilon = 0.01$, $P_{05} \approx e^{-190}$ underflows to an exact 0 in float32;
# an exact zero is no link at all, and a query without links receives a zero message.
#
# ```python
# seed_everything(2)  # the two groups of that section, drawn again
# U = 8
# group_b = torch.arange(U) >= 4
# centre = torch.randn(8)
# sig = torch.where(group_b[:, None], -centre, centre) + 0.3 * torch.randn(U, 8)
# q, k, v = torch.randn(3, 1, U, 16).unbind(0)
# only5 = torch.arange(U) == 5
# for eps in (0.1, 0.01):
#     attn = modnets.SKMDPA(num_heads=2, bandwidth=eps).eval()
#     y = attn(q, k, v, sig, sig, key_mask=only5)
#     print(eps, (y[0, 0] - v[0, 5]).abs().max().item(), y[0, 0].abs().max().item())
# ```
# :::

# %% tags=["remove-cell"]
# The exercise hints above, run: one that no longer runs fails the build.
from modnets.exercises import run_hints

run_hints(globals(), "07_skmdpa")
