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
# # 1. Modulated linear layers
#
# Two of the book's three architectures, NI and NAC, have many *modules* (NI calls them functions)
# that compute different things but share almost all of their weights; NFM's modules each keep
# their own (chapter 11). The device that makes the sharing possible is the **modulated linear
# layer**: an ordinary affine map whose input is rescaled, feature by feature, by a vector
# computed from a *code*. A module is then little more than its code.
#
# This chapter derives the four layers the rest of the book uses:
#
# | layer | equation | used by |
# |---|---|---|
# | `ModLin` | NI eq. 4 | Neural Interpreters {cite}`rahaman2021interpreters` |
# | `ModMLP` | NI eq. 5 | Neural Interpreters |
# | `ModFC` | NAC eq. 1 | Neural Attentive Circuits {cite}`weiss2022circuits` |
# | `ModFFN` | NAC §2, App. B.1 | Neural Attentive Circuits |
#
# The idea is a close relative of FiLM {cite}`perez2018film` and of StyleGAN2's weight
# modulation {cite}`karras2020stylegan2`: a conditioning vector scales features. Here the scale
# multiplies the layer's *input*, which is the same as scaling the *columns* of $W$.

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

import modnets
from modnets.nn import modffn_parameter_count
from modnets.utils import count_parameters, seed_everything, wrap

seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## ModLin, step by step
#
# A ModLin layer has the parameters of a linear layer, $W \in \mathbb{R}^{d_\text{out}\times d_\text{in}}$
# and $b \in \mathbb{R}^{d_\text{out}}$, plus a conditioning matrix
# $W_c \in \mathbb{R}^{d_\text{in}\times d_\text{code}}$. Given an input $x$ and a code $c$
# (NI eq. 4):
#
# $$
# y = \operatorname{ModLin}(x; c) = W\big(x \odot \operatorname{LayerNorm}(W_c c)\big) + b .
# $$
#
# We build it from plain tensors first.

# %%
d_in, d_out, d_code = 6, 4, 3
W = torch.randn(d_out, d_in) / d_in**0.5
b = torch.randn(d_out)
W_c = torch.randn(d_in, d_code)

x = torch.randn(d_in)
c = torch.randn(d_code)

# %% [markdown]
# The code is first projected to the input width, one number per input feature:

# %%
projected = W_c @ c
projected


# %% [markdown]
# LayerNorm {cite}`ba2016layernorm` (without learned scale or shift, as in the public NI code)
# centres and rescales this vector. Whatever the size of the code, the modulation has zero mean
# and unit variance across features: the code decides the *pattern* of the scales, not their
# overall size.

# %%
def layer_norm(v, eps=1e-5):
    return (v - v.mean(-1, keepdim=True)) / torch.sqrt(
        v.var(-1, unbiased=False, keepdim=True) + eps
    )


m = layer_norm(projected)
print("modulation:", m)
print(f"mean {m.mean():.2e}, variance {m.var(unbiased=False):.3f}")


# %% [markdown]
# The modulation multiplies the input feature by feature, and the shared affine map does the rest.

# %%
def modlin_from_scratch(x, c, W, b, W_c):
    return W @ (x * layer_norm(W_c @ c)) + b


y = modlin_from_scratch(x, c, W, b, W_c)
y

# %% [markdown]
# The library's `modnets.ModLin` stores the same three tensors as `weight`, `bias` and
# `code_weight`. Loading ours into it must give the same output.

# %%
modlin = modnets.ModLin(d_in, d_out, d_code)
modlin.load_state_dict({"weight": W, "bias": b, "code_weight": W_c})
assert torch.allclose(modlin(x, c), y, atol=1e-6)
modlin

# %% [markdown]
# Because $x \odot m$ followed by $W$ equals $W \operatorname{diag}(m)\, x$, a code selects a
# *column-rescaled* copy of the shared weight matrix. Two codes give two different linear maps from
# one set of weights:

# %%
c1, c2 = torch.randn(d_code), torch.randn(d_code)
W1 = W * layer_norm(W_c @ c1)  # effective weight under code c1 (columns rescaled)
W2 = W * layer_norm(W_c @ c2)
assert torch.allclose(modlin(x, c1), W1 @ x + b, atol=1e-6)
print("max |W1 - W2| =", (W1 - W2).abs().max().item())

# %% [markdown]
# :::{note}
# LayerNorm needs a few features to be useful. With $d_\text{in} = 1$ it maps everything to 0, so
# the layer outputs only $b$; with $d_\text{in} = 2$ every modulation is $\pm(1, -1)$. Modulated
# layers are meant for the widths of transformer blocks (tens to hundreds of features).
# :::

# %% [markdown]
# ## Many programs, one set of weights
#
# What does a code *do*? Below, eight codes modulate a 16-feature input. Each row of the left heat
# map is one code's modulation $\operatorname{LayerNorm}(W_c c_u)$; the right panel feeds one fixed
# input through a three-layer `ModMLP` (defined below) under five codes.

# %%
seed_everything(1)
layer = modnets.ModLin(16, 16, 8)
codes = torch.randn(8, 8)
with torch.no_grad():
    modulations = layer.modulation(codes)  # (codes, d_in)

mlp = modnets.ModMLP(16, 1, 8, hidden_features=64, num_layers=3)
direction, offset = torch.randn(16), torch.randn(16)
t = torch.linspace(-3, 3, 200)
line = offset + t[:, None] * direction  # (200, 16): a line through input space
with torch.no_grad():
    # (200, 5 codes, 1): all codes in one call
    curves = mlp(line[:, None, :], codes[:5])

fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.6))
im = ax0.imshow(modulations, cmap="RdBu_r", vmin=-2.5, vmax=2.5, aspect="auto")
ax0.set(
    xlabel="input feature", ylabel="code $u$", title=r"modulation LayerNorm$(W_c c_u)$"
)
fig.colorbar(im, ax=ax0)
for u in range(5):
    ax1.plot(t, curves[:, u, 0], label=f"code {u}")
ax1.set(
    xlabel="position $t$ along a line in input space",
    ylabel="output",
    title="one ModMLP, five codes",
)
ax1.legend(fontsize=8)
fig.tight_layout()


# %% [markdown]
# On the left, each code switches features up, down, or through zero (a sign flip) in its own
# pattern. On the right, the same weights compute five visibly different functions of the same
# input: the code is the program.

# %% [markdown]
# ## ModMLP
#
# Stacking $L$ ModLins that share one code, with GELU {cite}`hendrycks2016gelu` between them, gives
# the ModMLP of NI eq. 5:
#
# $$
# \operatorname{ModMLP}(x; c) = \big(\operatorname{ModLin}_L(\,\cdot\,; c) \circ \operatorname{GELU}
# \circ \dots \circ \operatorname{ModLin}_1(\,\cdot\,; c)\big)(x).
# $$

# %%
def modmlp_from_scratch(x, c, layers):
    for i, lyr in enumerate(layers):
        if i > 0:
            x = F.gelu(x)
        x = modlin_from_scratch(x, c, lyr.weight, lyr.bias, lyr.code_weight)
    return x


x16, c8 = torch.randn(16), torch.randn(8)
with torch.no_grad():
    assert torch.allclose(
        mlp(x16, c8), modmlp_from_scratch(x16, c8, mlp.layers), atol=1e-5
    )


# %% [markdown]
# ## ModFC: modulation with an off switch
#
# Neural Attentive Circuits modulate more gently (NAC eq. 1):
#
# $$
# y = \operatorname{ModFC}(x; c) = W\big(x \odot (1 + \alpha\, \operatorname{LayerNorm}(W_c c))\big) + b .
# $$
#
# The scale now sits around 1 instead of 0, and the learnable scalar $\alpha$ (initialised to 0.1)
# sets how far a code may move it. At $\alpha = 0$ the code is ignored and the layer is a plain
# `nn.Linear`.

# %%
def modfc_from_scratch(x, c, W, b, W_c, alpha):
    return W @ (x * (1 + alpha * layer_norm(W_c @ c))) + b


modfc = modnets.ModFC(d_in, d_out, d_code)  # alpha starts at 0.1
modfc.load_state_dict(
    {"weight": W, "bias": b, "code_weight": W_c, "alpha": torch.tensor(0.1)}
)
assert torch.allclose(modfc(x, c), modfc_from_scratch(x, c, W, b, W_c, 0.1), atol=1e-6)

linear = nn.Linear(d_in, d_out)
linear.load_state_dict({"weight": W, "bias": b})
with torch.no_grad():
    modfc.alpha.zero_()
    # alpha = 0: exactly nn.Linear
    assert torch.allclose(modfc(x, c), linear(x), atol=1e-6)
print("alpha = 0 recovers nn.Linear")

# %% [markdown]
# How much does the code change the output as $\alpha$ grows? For a batch of inputs and codes we
# measure the distance to the unmodulated output, relative to its size.

# %%
xs, cs = torch.randn(256, d_in), torch.randn(256, d_code)
alphas = torch.linspace(0, 2, 21)
rel = []
with torch.no_grad():
    for a in alphas:
        modfc.alpha.fill_(a)
        rel.append(((modfc(xs, cs) - linear(xs)).norm() / linear(xs).norm()).item())
    modfc.alpha.fill_(0.1)

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(alphas, rel, marker="o", ms=3)
ax.axvline(0.1, color="gray", ls="--", lw=1)
ax.set(
    xlabel=r"$\alpha$",
    ylabel="relative change of output",
    title="ModFC: strength of conditioning",
)
fig.tight_layout()


# %% [markdown]
# The change grows linearly from zero: $\alpha$ is a dial between "every module computes the same
# linear map" and "each module computes its own". The dashed line marks the initial value 0.1, so a
# freshly initialised NAC starts close to an ordinary transformer and learns how much to specialise.

# %% [markdown]
# ## ModFFN
#
# NAC's feed-forward block is two ModFCs sharing a code with an activation between: GELU, or GEGLU
# {cite}`shazeer2020glu`, where the first layer produces twice the hidden width and one half gates
# the other.

# %%
def geglu(h):
    value, gate = h.chunk(2, dim=-1)
    return value * F.gelu(gate)


ffn = modnets.ModFFN(d_in, d_in, d_code, hidden_features=10, activation="geglu")
with torch.no_grad():
    h = modfc_from_scratch(
        x, c, ffn.fc1.weight, ffn.fc1.bias, ffn.fc1.code_weight, ffn.fc1.alpha
    )
    ref = modfc_from_scratch(
        geglu(h), c, ffn.fc2.weight, ffn.fc2.bias, ffn.fc2.code_weight, ffn.fc2.alpha
    )
    assert torch.allclose(ffn(x, c), ref, atol=1e-6)
ffn

# %% [markdown]
# ## All modules in one call
#
# A network with $U$ modules runs every module on its own input. Nothing here needs a loop: the
# modulation is computed once per code, shape `(U, d_in)`, and broadcast against the inputs. The
# leading dimensions of `x` and `code` broadcast like any PyTorch operands:
#
# | inputs `x` | codes | meaning |
# |---|---|---|
# | `(batch, U, d_in)` | `(U, d_code)` | one code per module (NAC states) |
# | `(batch, U, d_in)` | `(batch, U, d_code)` | per-sample codes |
# | `(batch, U, tokens, d_in)` | `(U, 1, d_code)` | NI's function streams |

# %%
B, U = 4, 5
states = torch.randn(B, U, d_in)
module_codes = torch.randn(U, d_code)
with torch.no_grad():
    batched = modlin(states, module_codes)  # (B, U, d_out)
    looped = torch.stack(
        [modlin(states[:, u], module_codes[u]) for u in range(U)], dim=1
    )
assert torch.allclose(batched, looped, atol=1e-6)

streams = torch.randn(B, U, 9, d_in)  # (batch, functions, tokens, d_in)
with torch.no_grad():
    out = modlin(streams, module_codes[:, None, :])
assert torch.allclose(out[:, 2], modlin(streams[:, 2], module_codes[2]), atol=1e-6)
batched.shape, out.shape

# %% [markdown]
# Inputs of the wrong width are refused at the boundary with a message that names the argument:

# %%
try:
    modlin(torch.randn(2, d_in + 1), c)
except ValueError as err:
    print(wrap(f"ValueError: {err}"))

# %% [markdown]
# ## Counting parameters (NAC App. B.1)
#
# The promise of modulation is that adding a module costs only its code. NAC's appendix counts the
# parameters of $L = 8$ two-layer ModFFNs with $d_\text{in} = d_\text{out} = 384$, hidden width
# $d_h = 1536$ and $d_c = 384$-dimensional codes for $U$ modules as
#
# $$
# L\,(2\, d_\text{in} d_h + 2\, d_c d_h) + U d_c = 1.89\times10^{7} + 384\,U .
# $$
#
# We build exactly that and count.

# %%
L, d_model, d_h, d_c = 8, 384, 1536, 384


class ModFFNStack(nn.Module):
    """L ModFFNs shared by U modules, each module owning one code."""

    def __init__(self, num_modules):
        super().__init__()
        self.ffns = nn.ModuleList(
            modnets.ModFFN(
                d_model, d_model, d_c, hidden_features=d_h, activation="gelu"
            )
            for _ in range(L)
        )
        self.codes = nn.Parameter(torch.randn(num_modules, d_c))


rows = []
for U_ in (1, 64, 1024):
    counted = count_parameters(ModFFNStack(U_))
    formula = modffn_parameter_count(L, d_model, d_h, d_c, U_)
    assert counted == formula["exact"]
    rows.append((U_, counted, formula["paper"]))
    print(
        f"U={U_:5d}  counted={counted:,}  App. B.1 formula={formula['paper']:,}  "
        f"ratio={counted / formula['paper']:.3f}"
    )

# %% [markdown]
# Our count is about a fifth *below* the appendix's. The gap is not modules: App. B.1 counts both
# conditioning matrices as $d_c \times d_h$, but NAC eq. 1 makes the first layer's $W_c$ only
# $d_\text{in} \times d_c$ (it modulates the 384 inputs, not the 1536 hidden units), and it leaves
# out the biases and the two $\alpha$s. What the two counts agree on is the point of the appendix:
# **the only term that grows with the number of modules is $U d_c$.**

# %%
per_module = (rows[2][1] - rows[1][1]) / (rows[2][0] - rows[1][0])
assert per_module == d_c
print(f"each extra module adds {per_module:.0f} parameters (= d_c)")

# %% [markdown]
# Without sharing, each module would need its own FFN stack. The figure compares the two on a log
# scale.

# %% tags=["hide-input"]
Us = sorted({round(u) for u in torch.logspace(0, 4, 40).tolist()})
shared = [modffn_parameter_count(L, d_model, d_h, d_c, u)["exact"] for u in Us]
independent = [u * L * (2 * d_model * d_h + d_h + d_model) for u in Us]

fig, ax = plt.subplots(figsize=(5.5, 3.4))
ax.loglog(Us, shared, label="modulated (shared W, one code per module)")
ax.loglog(Us, independent, label="independent FFNs per module")
ax.set(xlabel="number of modules $U$", ylabel="parameters")
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# The modulated network's curve is flat until thousands of modules (the appendix notes that the
# codes matter only beyond about 10 000), while independent modules grow linearly from the start.
# (For a single module the plain FFN is smaller: it has no conditioning matrices.)
#
# ## Summary
#
# - `ModLin` (NI eq. 4) rescales the input of a shared linear map by $\operatorname{LayerNorm}(W_c c)$;
#   a code picks a column-rescaled copy of $W$. `ModMLP` (NI eq. 5) stacks them around one code.
# - `ModFC` (NAC eq. 1) rescales by $1 + \alpha\,\operatorname{LayerNorm}(W_c c)$; $\alpha = 0$ is
#   `nn.Linear`. `ModFFN` stacks two, with GELU or GEGLU.
# - All modules run in one broadcasted call, and a module costs only its code.
#
# Next, Neural Interpreters decide *which* inputs each function sees: type inference and type
# matching.

# %% [markdown]
# ## Exercises
#
# 1. **The length of a code.** Show from NI eq. 4 that a ModLin ignores the length of its code:
#    for every $\lambda > 0$, $\operatorname{ModLin}(x; \lambda c) = \operatorname{ModLin}(x; c)$
#    up to LayerNorm's $\epsilon$. What does $\operatorname{ModLin}(x; -c)$ give? Check both with
#    the chapter's `modlin`.
#
# :::{admonition} Hint
# :class: dropdown
# LayerNorm subtracts the mean, which scales with $\lambda$, and divides by the standard
# deviation, which scales with $|\lambda|$:
# $\operatorname{LayerNorm}(\lambda v) = \operatorname{LayerNorm}(v)$ for $\lambda > 0$ and
# $\operatorname{LayerNorm}(-v) = -\operatorname{LayerNorm}(v)$. So only the direction of a code
# programs the layer, and with $m = \operatorname{LayerNorm}(W_c c)$,
# $\operatorname{ModLin}(x; -c) = -W(x \odot m) + b = 2b - \operatorname{ModLin}(x; c)$.
#
# ```python
# c = torch.randn(d_code)
# with torch.no_grad():
#     print((modlin(x, 3 * c) - modlin(x, c)).abs().max())  # small: LayerNorm's eps
#     print((modlin(x, -c) - (2 * modlin.bias - modlin(x, c))).abs().max())
# ```
# :::
#
# 2. **A dial that is exactly linear.** The relative change of ModFC's output against $\alpha$ was
#    a straight line through 0. Show from NAC eq. 1 that it is exactly linear in $\alpha$, not
#    only for small $\alpha$, so that one point predicts the whole line. Is the same true of a
#    whole `ModFFN`?
#
# :::{admonition} Hint
# :class: dropdown
# With $m = \operatorname{LayerNorm}(W_c c)$, subtract the plain linear map:
# $\operatorname{ModFC}(x; c) - (Wx + b) = \alpha\, W(x \odot m)$, $\alpha$ times a tensor that
# does not depend on $\alpha$. Its norm, divided by the fixed $\lVert Wx + b \rVert$, is therefore
# proportional to $\alpha$: the chapter's `rel` divided by `alphas` is one constant. A `ModFFN`
# puts GELU or GEGLU between two ModFCs, so the second layer's input, and with it the output,
# depends on $\alpha$ nonlinearly.
#
# ```python
# print([r / a for r, a in zip(rel[1:], alphas[1:].tolist(), strict=True)][::5])
# ```
# :::
#
# 3. **Where modulations live.** Show that every modulation $m = \operatorname{LayerNorm}(W_c c)$
#    has zero mean and, up to LayerNorm's $\epsilon$, norm $\sqrt{d_\text{in}}$: it lies on a
#    sphere of dimension $d_\text{in} - 2$. What is left of that sphere at $d_\text{in} = 2$ (the
#    note above)? Check the mean and the norm on 1000 random codes of a `modnets.ModLin(3, 2, 4)`.
#
# :::{admonition} Hint
# :class: dropdown
# Zero mean and unit variance over $d_\text{in}$ features say $\sum_k m_k = 0$ and
# $\sum_k m_k^2 = d_\text{in}$: a sphere of radius $\sqrt{d_\text{in}}$ inside the
# $(d_\text{in} - 1)$-dimensional hyperplane of zero-mean vectors. At $d_\text{in} = 2$ the sphere
# is two points, $\pm(1, -1)$. LayerNorm's $\epsilon$ pulls a few modulations inside the sphere:
# those of codes for which $W_c c$ is nearly the same in every feature.
#
# ```python
# layer = modnets.ModLin(3, 2, 4)
# with torch.no_grad():
#     m = layer.modulation(torch.randn(1000, 4))
# print(m.sum(-1).abs().max(), m.norm(dim=-1).min(), m.norm(dim=-1).max(), 3**0.5)
# ```
# :::
#
# 4. **What a code costs.** Write the number of parameters of a `ModMLP` with widths
#    $d_0, \dots, d_L$ and codes of size $d_\text{code}$, and check it against
#    `count_parameters(mlp)` for the chapter's three-layer ModMLP. How many parameters does
#    doubling $d_\text{code}$ from 8 to 16 add, and to which matrices?
#
# :::{admonition} Hint
# :class: dropdown
# Each ModLin holds $W$ ($d_\text{out} \times d_\text{in}$), $b$ ($d_\text{out}$) and $W_c$
# ($d_\text{in} \times d_\text{code}$). Only the conditioning matrices grow with $d_\text{code}$,
# by $(16 + 64 + 64) \times 8 = 1{,}152$ numbers; each module's code grows by 8 as well.
#
# ```python
# def modmlp_count(widths, d_code):
#     pairs = zip(widths[:-1], widths[1:], strict=True)
#     return sum(o * i + o + i * d_code for i, o in pairs)
#
#
# print(modmlp_count([16, 64, 64, 1], 8), count_parameters(mlp))
# print(modmlp_count([16, 64, 64, 1], 16) - modmlp_count([16, 64, 64, 1], 8))
# ```
# :::

# %% tags=["remove-cell"]
# The exercise hints above, run: one that no longer runs fails the build.
from modnets.exercises import run_hints

run_hints(globals(), "01_modulated_linear")
