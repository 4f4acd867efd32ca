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
# # 3. ModAttn and lines of code
#
# Chapter 2 decided *which* tokens each function may read: the compatibilities $C_{ui}$. This
# chapter builds what a function *does* with them. A Neural Interpreter runs one computational
# **stream** per function. In stream $u$, tokens attend to each other with projections programmed
# by the function's code $c_u$ (ModAttn), then pass through a ModMLP; both updates are weighted by
# $C_{ui}$, so a function leaves untouched what it may not read. One attention plus one MLP is a
# **line of code** (LOC), NI eqs. 6–10 {cite}`rahaman2021interpreters`.

# %% tags=["hide-input"]
from modnets import diagrams

_ = diagrams.draw("function_streams")

# %% [markdown]
# Every function runs its own stream of the same tokens; the stream's code programs the attention's
# projections, and the compatibilities decide what each stream may read and how much of it changes.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import modnets
from modnets.nn import random_signatures
from modnets.nn.config import use_fused_attn
from modnets.utils import seed_everything

seed_everything(0)
torch.set_grad_enabled(False)  # this chapter only evaluates
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## The stream layout
#
# All functions run at once on one tensor of shape `(batch, functions, tokens, dim)`: token $i$
# as seen by function $u$ is `x[:, u, i]`. At the first LOC every stream holds the same tokens, so
# the input is broadcast along the function axis (a view, no copy); later LOCs differ per stream.
# Codes are `(U, d_code)`, compatibilities `(batch, U, tokens)`.

# %%
B, U, T, d, d_code, H = 2, 3, 6, 16, 8, 2
tokens = torch.randn(B, T, d)
x = tokens[:, None].expand(B, U, T, d)  # (B, U, T, d)
codes = torch.randn(U, d_code)

types = F.normalize(torch.randn(B, T, 4), dim=-1)
C = modnets.TypeMatching(truncation=1.0, sigma=0.5)(types, random_signatures(U, 4))
C[0]

# %% [markdown]
# ## ModAttn, step by step
#
# Queries, keys and values come from ModLins conditioned on the function's code (NI eq. 6). One ModLin
# of width $d = H \cdot d_\text{head}$ per projection gives every head its own rows of $W$; all heads
# share the conditioning matrix $W_c$, as in the public NI code.

# %%
attn = modnets.ModAttn(d, d_code, num_heads=H)
d_head = d // H
code_per_stream = codes[:, None, :]  # (U, 1, d_code): broadcast over batch and tokens


def heads(t):
    return t.view(B, U, T, H, d_head)


q = heads(attn.query(x, code_per_stream))
k = heads(attn.key(x, code_per_stream))
v = heads(attn.value(x, code_per_stream))
q.shape  # (B, U, T, H, d_head)

# %% [markdown]
# Scaled dot-product attention, in every stream and head at once, then the modulation by both
# tokens' compatibilities and a **renormalisation** over keys (NI eq. 7):
#
# $$
# \tilde W_{uhij} = C_{ui}\,C_{uj}\,\operatorname{softmax}_j\!\Big(\frac{q_{uhi}\cdot k_{uhj}}{\sqrt{d_\text{key}}}\Big),
# \qquad W_{uhij} = \frac{\tilde W_{uhij}}{\epsilon + \sum_j \tilde W_{uhij}} .
# $$

# %%
logits = torch.einsum("buihc,bujhc->buhij", q, k) / math.sqrt(d_head)
softmax = logits.softmax(dim=-1)  # (B, U, H, T, T)
W_tilde = C[:, :, None, :, None] * C[:, :, None, None, :] * softmax
W = W_tilde / (1e-6 + W_tilde.sum(-1, keepdim=True))
assert torch.allclose(attn.attention_weights(x, codes, C), W, atol=1e-6)

# %% [markdown]
# The values are mixed with these weights, the heads folded back into channels, and a last ModLin
# gives the output (NI eq. 8). The library's forward pass must agree:

# %%
mixed = torch.einsum("buhij,bujhc->buihc", W, v).flatten(-2)  # (B, U, T, d)
y = attn.out(mixed, code_per_stream)
assert torch.allclose(attn(x, codes, C), y, atol=1e-5)
y.shape

# %% [markdown]
# ## NI eq. 7 without the weights
#
# The `(B, U, H, T, T)` tensor $W$ need not exist. Write $s_{ij} = \operatorname{softmax}_j(q_i \cdot k_j/\sqrt{d_\text{key}})$
# for the plain softmax of one stream and head. Then
#
# $$
# \sum_j W_{ij} v_j = \frac{C_i \sum_j s_{ij} C_j v_j}{\epsilon + C_i \sum_j s_{ij} C_j}
# = \frac{C_i N_i}{\epsilon + C_i D_i},
# \qquad [N_i, D_i] = \sum_j s_{ij}\,[C_j v_j,\; C_j],
# $$
#
# and $[N_i, D_i]$ is an ordinary attention output: the plain softmax applied to values with one
# extra channel, $[C_j v_j, C_j]$. So a fused attention kernel (`F.scaled_dot_product_attention`,
# which never stores the weights) computes NI eq. 7 exactly, $\epsilon$ included. There is no
# $\log C$ anywhere, so the exact zeros of a truncated kernel are ordinary numbers.

# %%
Ci = C[:, :, :, None, None]  # (B, U, T, 1, 1)
values = torch.cat([Ci * v, Ci.expand(B, U, T, H, 1)], dim=-1)  # [C_j v_j, C_j]
# the plain softmax: no C in the weights
ND = torch.einsum("buhij,bujhc->buihc", softmax, values)
N, D = ND[..., :d_head], ND[..., d_head:]
assert torch.allclose((Ci * N / (1e-6 + Ci * D)).flatten(-2), mixed, atol=1e-6)

# the library's fused path: the same algebra in F.scaled_dot_product_attention
with use_fused_attn(True):
    assert torch.allclose(attn(x, codes, C), y, atol=1e-5)

# %% [markdown]
# Which form is faster depends on the number of tokens. On a GPU the fused kernel wins. On a CPU
# with few tokens (chapter 6 at the `cpu` profile has 6: four 16×16 patches and 2 CLS tokens), $W$
# is no larger than the queries, and the fused kernel's overhead per head costs more than it
# saves; from some tens of tokens on it is faster, and where exactly moves with the machine (a CPU
# with faster matrix products favours the fused kernel sooner). Chapter 12 measures this. So by
# default ModAttn uses the fused kernel on a GPU, and on a CPU it has both paths timed at the
# first call of each shape and keeps the faster, as cuDNN's benchmark mode does. The timing runs
# in another process, so a training that measures on its first step goes on bit for bit as one
# that found the choice cached (`ModAttn.takes_fused` says which path; the choices are cached on
# the machine, `modnets.nn.autotune.reset()` forgets them). One switch sets the path of every
# ModAttn, as
# timm's `use_fused_attn` does: `modnets.nn.config.set_fused_attn(True | False | None)`, or
# `with use_fused_attn(...)` for a block as above; a ModAttn built with its own `fused=` argument
# keeps it.

# %% [markdown]
# ## What the modulation does
#
# Below, for one sample and head, the plain softmax of each function (top) and the modulated weights
# $W$ (bottom). Above each column is the function's compatibility with each token.

# %% tags=["hide-input"]
fig, axes = plt.subplots(2, U, figsize=(10, 6.2))
for u in range(U):
    axes[0, u].imshow(softmax[0, u, 0], vmin=0, vmax=1, cmap="Blues")
    axes[0, u].set_title(
        f"function {u}: softmax\nC = {[round(c, 2) for c in C[0, u].tolist()]}",
        fontsize=8,
    )
    axes[1, u].imshow(W[0, u, 0], vmin=0, vmax=1, cmap="Blues")
    axes[1, u].set_title(f"function {u}: modulated W", fontsize=8)
    for ax in axes[:, u]:
        ax.set(xlabel="key j", ylabel="query i", xticks=range(T), yticks=range(T))
fig.tight_layout()

# %% [markdown]
# In the bottom row, the rows and columns of tokens a function may not read ($C_{ui} = 0$) are
# blank: such a token neither attends nor is attended to in that stream. Among the tokens it may
# read, the attention pattern is the softmax's, reweighted by compatibility and renormalised: keys
# that match the function strongly draw more attention (key 0 in function 0's stream).

# %%
rows = W.sum(-1)  # (B, U, H, T)
print("row sums, function 0, head 0:", rows[0, 0, 0])
print("compatibilities:             ", C[0, 0])

# %% [markdown]
# Rows sum to one where the query is matched and to zero where it is not (more precisely to
# $S/(\epsilon+S)$ with $S = \sum_j \tilde W_{uhij}$, which is 1 up to $\epsilon$ unless the
# compatibilities are themselves tiny).
#
# :::{important}
# NI eq. 7 renormalises by **division**. A second softmax over $\tilde W$ looks similar but is
# wrong: $\exp(0) = 1$, so every masked token would get attention weight again. The check:
# :::

# %%
resoftmax = W_tilde.softmax(dim=-1)
masked_key = (C[0, 0] == 0).nonzero()[0].item()
print(
    f"weight on masked key {masked_key}: renormalised "
    f"{W[0, 0, 0, :, masked_key].max():.3f}, "
    f"re-softmaxed {resoftmax[0, 0, 0, :, masked_key].max():.3f}"
)

# %% [markdown]
# ## A line of code
#
# A LOC is ModAttn followed by a ModMLP (chapter 1) sharing the code $c_u$, each behind a
# LayerNorm and a residual weighted by compatibility (NI eqs. 9–10):
#
# $$
# a_{ui} = x_{ui} + C_{ui}\,\operatorname{ModAttn}\big(\{\operatorname{LayerNorm}(x_{uj})\}_j;\, c_u, \{C_{uj}\}_j\big)_i,
# \qquad
# y_{ui} = a_{ui} + C_{ui}\,\operatorname{ModMLP}\big(\operatorname{LayerNorm}(a_{ui});\, c_u\big).
# $$
#
# The picture follows one function's stream through a LOC: the code $c_u$ programs both halves
# and the compatibility $C_{ui}$ scales both residual branches, so a token the function does not
# match leaves it as it came.

# %% tags=["hide-input"]
_ = diagrams.draw("loc_inside")

# %%
loc = modnets.LOC(d, d_code, num_heads=H, mlp_hidden=32)


def loc_from_scratch(x, codes, C):
    gate = C[..., None]
    a = x + gate * loc.attn(loc.norm_attn(x), codes, C)
    return a + gate * loc.mlp(loc.norm_mlp(a), codes[:, None, :])


out = loc(x, codes, C)
assert torch.allclose(out, loc_from_scratch(x, codes, C), atol=1e-6)

# %% [markdown]
# The parameterisation guarantees $y_{ui} = x_{ui}$ whenever $C_{ui} = 0$: "if a function is not
# granted access to a variable by the typing mechanism, it acts as an identity function for this
# variable". Exactly, not approximately:

# %%
blocked = C == 0
print(f"{int(blocked.sum())} of {blocked.numel()} (function, token) pairs are blocked")
assert torch.equal(out[blocked], x[blocked])
changed = (out - x).norm(dim=-1)
print("how far each token moved, function 0:", changed[0, 0])

# %% [markdown]
# ## Vectorised = one function at a time
#
# The stream layout is only an implementation device: running the LOC for one function at a time
# must give the same numbers.

# %%
looped = torch.stack(
    [
        loc_from_scratch(x[:, u : u + 1], codes[u : u + 1], C[:, u : u + 1])[:, 0]
        for u in range(U)
    ],
    dim=1,
)
assert torch.allclose(out, looped, atol=1e-5)

# %% [markdown]
# ## In memory, function by function
#
# The LOC's interface is `(batch, functions, tokens, dim)`, but the library computes it with the
# functions first in memory, `(U, B, T, d)`. Each function's $B \cdot T$ rows are then one block,
# one matrix of a single batched product (`baddbmm`) per layer, and the element-wise work between
# the products (the LayerNorms, GELU, the gates $C_{ui}$) reads and writes that same layout. Kept
# batch-first, every product would copy its input into function order and its gradient back;
# chapter 12 times the compiled step. `ModAttn.per_function` and `ModMLP.per_function` take the
# streams in that order (a transpose, a view) and compute the same numbers:

# %%
assert out.transpose(0, 1).is_contiguous()  # the LOC's output is stored (U, B, T, d)
xu, Cu = x.transpose(0, 1), C.transpose(0, 1)  # (U, B, T, d), (U, B, T): views
attn_u = loc.attn.per_function(xu, codes, Cu)
assert torch.allclose(attn_u, loc.attn(x, codes, C).transpose(0, 1), atol=1e-6)
mlp_u = loc.mlp.per_function(xu, codes)
assert torch.allclose(mlp_u, loc.mlp(x, codes[:, None, :]).transpose(0, 1), atol=1e-6)

# %% [markdown]
# The cost of this parallelism is memory: the attention weights are `(B, U, H, T, T)`, $U$ times a
# transformer's. For the paper's digits setting (chapter 6 at the `gpu` profile: batch 128,
# 5 functions, 4 heads, 64 patches and 3 CLS tokens, so 67 tokens) that is 11.5 M floats per LOC,
# about 46 MB, unless the fused form above is used, which never keeps them. Performance is measured in `bench/` and chapter 12.
#
# ## Summary
#
# - ModAttn (NI eqs. 6–8) runs attention in one stream per function with code-programmed projections,
#   multiplies the weights by $C_{ui}C_{uj}$ and renormalises by division.
# - The same output is one ordinary attention over values $[C_j v_j, C_j]$, so a fused kernel
#   computes NI eq. 7 exactly without storing the weights.
# - A LOC (NI eqs. 9–10) adds ModAttn and ModMLP updates weighted by $C_{ui}$, so blocked pairs pass
#   through unchanged.
#
# Next: stacking LOCs into an interpreter, iterating it, and assembling a full Neural Interpreter.

# %% [markdown]
# ## Exercises
#
# 1. **Full access is plain attention.** Show from NI eq. 7 that when every compatibility is 1 the
#    modulated weights are the plain softmax divided by $1 + \epsilon$. Check it with
#    `attn.attention_weights` and the chapter's `softmax`.
#
# :::{admonition} Hint
# :class: dropdown
# With $C \equiv 1$, $\tilde W_{uhij}$ is the softmax $s_{ij}$, whose row sums are 1, so
# $W_{uhij} = s_{ij} / (\epsilon + 1)$.
#
# ```python
# W_all = attn.attention_weights(x, codes, torch.ones_like(C))
# print((W_all - softmax / (1 + 1e-6)).abs().max())
# ```
# :::
#
# 2. **Scaling the compatibilities.** Multiply every compatibility by $\lambda = 0.3$. Predict
#    what happens to the weights $W$ of NI eq. 7, to ModAttn's output, and to the update $y - x$
#    of a LOC (NI eqs. 9–10), then check.
#
# :::{admonition} Hint
# :class: dropdown
# $\tilde W$ scales by $\lambda^2$ in the numerator and in the sum that divides it, so $W$ changes
# only through $\epsilon$ (most in the rows whose sum $S$ is small), and ModAttn's output hardly
# moves. In a LOC the gates $C_{ui}$ multiply both updates, so $y - x$ shrinks by about $\lambda$
# (not exactly: the ModMLP reads a different $a$).
#
# ```python
# print((attn.attention_weights(x, codes, 0.3 * C) - W).abs().max())
# print((attn(x, codes, 0.3 * C) - attn(x, codes, C)).abs().max())
# print((loc(x, codes, 0.3 * C) - x).norm() / (out - x).norm())
# ```
# :::
#
# 3. **Heads are free.** Count the parameters of `modnets.ModAttn(16, 8, num_heads=H)` for
#    $H = 1, 2, 4, 8$ and explain the result from how the library builds the per-head ModLins of
#    NI eq. 6. What does grow with $H$?
#
# :::{admonition} Hint
# :class: dropdown
# Each projection is one ModLin of width $d = H d_\text{head}$: head $h$ uses its own rows of $W$,
# and all heads share $W_c$. So the count is $4(d^2 + d + d\, d_\text{code}) = 1{,}600$ for every
# $H$. More heads make each head narrower ($d_\text{head} = d/H$, and the scores are divided by
# $\sqrt{d_\text{head}}$), and the weights of NI eq. 7 hold $H$ attention patterns per stream:
# `(B, U, H, T, T)` numbers.
#
# ```python
# from modnets.utils import count_parameters
#
# print([count_parameters(modnets.ModAttn(16, 8, num_heads=h)) for h in (1, 2, 4, 8)])
# ```
# :::
#
# 4. **A blocked token is invisible.** Pick a blocked pair ($C_{ui} = 0$), add 5 to every feature
#    of that token in stream $u$ only, and run the LOC again. Predict which outputs change and by
#    how much, then check.
#
# :::{admonition} Hint
# :class: dropdown
# In stream $u$ the token's row and column of $W$ are zero, so no other token reads it, and its
# own updates are gated by $C_{ui} = 0$. Only $y_{ui}$ changes, by exactly the perturbation (norm
# $5\sqrt{16} = 20$); the other streams never see stream $u$.
#
# ```python
# b, u, j = (C == 0).nonzero()[0].tolist()
# x2 = x.clone()  # x is a broadcast view: copy it before writing
# x2[b, u, j] += 5.0
# print((loc(x2, codes, C) - out).norm(dim=-1))  # (B, U, T)
# ```
# :::

# %% tags=["remove-cell"]
# The exercise hints above, run: one that no longer runs fails the build.
from modnets.exercises import run_hints

run_hints(globals(), "03_modattn_and_loc")
