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
# # 4. The Neural Interpreter
#
# We now have every part: types and compatibilities (chapter 2), and lines of code that run one
# stream per function (chapter 3). This chapter assembles them, from the inside out
# {cite}`rahaman2021interpreters`:
#
# 1. the **interpreter** stacks LOCs and pools the function streams back into one set (NI eq. 11);
# 2. a **function iteration** is type matching followed by the interpreter (NI eqs. 12–13);
# 3. a **script** owns a set of functions and applies one function iteration several times,
#    sharing all parameters (NI eq. 14);
# 4. the **Neural Interpreter** tokenises the input, adds CLS tokens, runs a stack of scripts and
#    reads the CLS tokens out (NI eq. 1).
#
# Then we count parameters, draw how one input is routed, train a small model for a minute, and
# use the tricks the design allows: changing the number of iterations, adding and removing
# functions after training.

# %% tags=["hide-input"]
from modnets import diagrams

_ = diagrams.draw("neural_interpreter")

# %% [markdown]
# The top row is the whole model; the panel below opens one script. Orange parts decide routing
# (types, signatures, compatibilities), blue parts compute (functions, each a stack of LOCs), green
# parts are what a function is made of besides the shared weights: its code.

# %%
import time

import matplotlib.pyplot as plt
import networkx as nx
import torch
import torch.nn.functional as F

import modnets
from modnets.profiles import get_profile, select
from modnets.utils import count_parameters, progress, seed_everything, show

seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
PROFILE = get_profile()
print("profile:", PROFILE)

# %% [markdown]
# ## The interpreter and the growth of NI eq. 11
#
# The interpreter broadcasts each token to every function's stream, applies $n_l$ LOCs there, and
# sums the streams back weighted by compatibility. As printed (NI eq. 11):
#
# $$
# y_i = x_i + \sum_u C_{ui}\,\big(\mathrm{LOC}_{n_l} \circ \dots \circ \mathrm{LOC}_1\big)(\{x_j\}_j; c_u, \{C_{uj}\}_j)_{ui} .
# $$
#
# Read literally, this counts $x_i$ twice. Each LOC already has a residual connection, so the stream
# output is $x_i + \delta_{ui}$, and
# $y_i = (1 + \sum_u C_{ui})\,x_i + \sum_u C_{ui}\delta_{ui}$. For a matched token
# ($\sum_u C_{ui} \approx 1$) every function iteration *doubles* it. Let us measure it on the
# digits-sized model of the public code (dim 192, 5 functions, 8 iterations) at initialisation.

# %%
# digits preset: 32x32 images, 4x4 patches, 8 iterations
cfg = modnets.NIConfig(in_channels=1)
model = modnets.NeuralInterpreter(cfg).eval()
images = torch.randn(4, 1, 32, 32)


@torch.no_grad()
def token_norms(model, residual):
    script = model.scripts[0]
    script.iteration.interpreter.residual = residual
    h = model.cls(model.tokenizer(images))
    norms = [h.norm(dim=-1).mean().item()]
    for _ in range(script.num_iterations):
        h, _, _ = script.iteration(h, script.signatures, script.codes)
        norms.append(h.norm(dim=-1).mean().item())
    script.iteration.interpreter.residual = "delta"
    return norms


fig, ax = plt.subplots(figsize=(5, 3.2))
for residual in ("literal", "delta"):
    ax.semilogy(
        token_norms(model, residual), marker="o", label=f"residual='{residual}'"
    )
ax.set(xlabel="function iteration", ylabel="mean token norm")
ax.legend()
fig.tight_layout()

# %% [markdown]
# With the literal form the token norm grows geometrically, by a factor close to two per
# iteration: after 8 iterations the tokens are about $2^8 = 256$ times larger, and the deeper
# iterations see inputs far outside what their LayerNorms and type MLP were initialised for. We
# therefore pool the streams' **updates**:
#
# $$
# y_i = x_i + \sum_u C_{ui}\,\big(\mathrm{LOCs}(x)_{ui} - x_i\big)
#     = \Big(1 - \sum_u C_{ui}\Big)x_i + \sum_u C_{ui}\,\mathrm{LOCs}(x)_{ui} .
# $$
#
# It keeps both properties the paper derives from NI eq. 11: a token no function matches is left
# unchanged, and nothing depends on the number of functions. It is a convex combination of the
# input and the streams' outputs, the "gating" residual of the public code. This is the library's
# default (`NIConfig(residual="delta")`); `residual="literal"` gives NI eq. 11 as printed.

# %%
interp = model.scripts[0].iteration.interpreter
x = torch.randn(2, 7, cfg.dim)
codes = model.scripts[0].codes
C = torch.rand(2, cfg.num_functions, 7).softmax(dim=1)


def interpreter_from_scratch(x, codes, C, residual):
    streams = x[:, None].expand(-1, codes.shape[0], -1, -1)
    for loc in interp.locs:
        streams = loc(streams, codes, C)
    if residual == "delta":
        streams = streams - x[:, None]
    return x + torch.einsum("but,butd->btd", C, streams)


with torch.no_grad():
    for residual in ("delta", "literal"):
        interp.residual = residual
        assert torch.allclose(
            interp(x, codes, C),
            interpreter_from_scratch(x, codes, C, residual),
            atol=1e-5,
        )
    interp.residual = "delta"

# %% [markdown]
# ## Function iterations and scripts
#
# A function iteration infers types from the *current* tokens, matches them against the
# signatures, and runs the interpreter (NI eqs. 12–13). A script applies the same function iteration
# $n_i$ times (NI eq. 14): depth without new parameters, and a token may visit the same function
# again later, which the paper calls weight sharing in depth.

# %%
script = model.scripts[0]


def function_iteration_from_scratch(x, it, signatures, codes):
    types = it.type_inference(x)
    C = it.type_matching(types, signatures)
    return it.interpreter(x, codes, C)


def script_from_scratch(x, script):
    for _ in range(script.num_iterations):
        x = function_iteration_from_scratch(
            x, script.iteration, script.signatures, script.codes
        )
    return x


h = torch.randn(2, 65, cfg.dim)
with torch.no_grad():
    assert torch.allclose(script(h), script_from_scratch(h, script), atol=1e-4)


# %% [markdown]
# ## The whole model
#
# The input is tokenised (here 4×4 patches with learned positions), CLS tokens are prepended, the
# scripts run one after another (NI eq. 1), and each CLS token is read out by its head.

# %%
def neural_interpreter_from_scratch(model, images):
    h = model.cls(model.tokenizer(images))  # (B, num_cls + 64, dim)
    for s in model.scripts:
        h = script_from_scratch(h, s)
    return model.heads(h[:, : model.config.num_cls])  # (B, num_cls, num_outputs)


with torch.no_grad():
    logits = model(images)
    assert torch.allclose(
        logits, neural_interpreter_from_scratch(model, images), atol=1e-4
    )
show(model.config)
logits.shape

# %% [markdown]
# ## Parameters do not grow with the number of functions
#
# A function is a signature ($d_\text{type}$ numbers) and a code ($d_\text{code}$ numbers); the
# type MLP, the interpreter's LOCs and the heads are shared by all functions. The digits model
# with 1 to 64 functions, beside a ViT baseline of the same width and sequential depth
# ($n_s n_i n_l = 8$ blocks):

# %%
Us = [1, 2, 5, 10, 20, 40, 64]
counts = [
    count_parameters(modnets.NeuralInterpreter(cfg.replace(num_functions=u)))
    for u in Us
]
vit_count = count_parameters(modnets.ViT(cfg))
per_function = cfg.num_scripts * (cfg.type_dim + cfg.code_dim)
assert all(
    n - counts[0] == (u - 1) * per_function for u, n in zip(Us, counts, strict=True)
)

fig, ax = plt.subplots(figsize=(5, 3.2))
ax.plot(Us, counts, marker="o", label="Neural Interpreter")
ax.axhline(vit_count, color="gray", ls="--", label="ViT, same width and depth")
ax.set(xlabel="number of functions $U$", ylabel="parameters", ylim=(0, 1.1 * vit_count))
ax.legend()
fig.tight_layout()
print(
    f"each function adds {per_function} parameters; NI with 5 functions: "
    f"{counts[2]:,}; ViT: {vit_count:,}"
)

# %% [markdown]
# The NI line is flat: 64 functions cost 13 k parameters more than one. The NI is also much smaller
# than a ViT of the same depth, because its eight "layers" are one function iteration applied
# eight times.

# %% [markdown]
# ## Training a small interpreter
#
# A toy problem that runs in about a minute on two CPU cores: six numbers drawn uniformly from
# $[0, 1]$ form the input set (one token each, with learned positional embeddings), and two CLS
# tokens must answer two different questions about them: the **maximum**, and $x_0 x_1 + x_2$.
# Targets are standardised. The step count comes from the profile.

# %%
steps = select({"smoke": 100, "cpu": 1500, "gpu": 3000})
toy = modnets.NIConfig(
    dim=32,
    type_dim=8,
    num_functions=4,
    num_iterations=3,
    num_locs=1,
    num_heads=2,
    mlp_hidden=64,
    truncation=1.2,
    input_kind="vector",
    num_elements=6,
    num_cls=2,
    num_outputs=1,
)
g = torch.Generator().manual_seed(0)


def toy_batch(n):
    x = torch.rand(n, 6, generator=g)
    return x, torch.stack([x.max(1).values, x[:, 0] * x[:, 1] + x[:, 2]], dim=1)


x_val, y_val = toy_batch(2000)
mu, sd = y_val.mean(0), y_val.std(0)
seed_everything(0)
net = modnets.NeuralInterpreter(toy)
print(f"{count_parameters(net):,} parameters, {steps} steps")

# %%
opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
losses, start = [], time.perf_counter()
for _ in progress(range(steps), desc="training"):
    x, y = toy_batch(128)
    loss = F.mse_loss(net(x)[..., 0], (y - mu) / sd)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    losses.append(loss.item())
print(f"trained in {time.perf_counter() - start:.0f} s")

# %%
window = max(1, steps // 20)
smooth = torch.tensor(losses).unfold(0, window, 1).mean(1)
fig, ax = plt.subplots(figsize=(5, 3.2))
ax.semilogy(losses, alpha=0.3, label="per step")
ax.semilogy(range(window - 1, steps), smooth, label=f"mean of {window} steps")
ax.set(xlabel="step", ylabel="MSE (standardised targets)")
ax.legend()
fig.tight_layout()

first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
print(f"loss: first {window} steps {first:.3f} -> last {window} steps {last:.4f}")
assert last < 0.5 * first, "the loss did not fall"

# %% [markdown]
# The line above gives how far the loss fell at this profile (at `smoke` the run is too short to
# say much). On held-out inputs, the fraction of variance explained ($R^2$) per task:

# %%
net.eval()
with torch.no_grad():
    pred = net(x_val)[..., 0] * sd + mu
r2 = 1 - ((pred - y_val) ** 2).mean(0) / y_val.var(0, unbiased=False)
print(f"R^2  max: {r2[0]:.3f}   x0*x1 + x2: {r2[1]:.3f}")

# %% [markdown]
# ## How one input is routed
#
# With `return_routing=True` the model also returns the compatibilities $C$ of every function
# iteration, without changing its outputs. Following NI Fig. 3, we draw the computational path of
# each CLS token through the script: columns are function iterations, nodes are functions, a node's
# size is the share of the token that the function receives, and an edge's width is the product of
# the shares at its two ends.

# %%
with torch.no_grad():
    routing = net(x_val[:1], return_routing=True)
assert torch.allclose(routing.logits, net(x_val[:1]))
C_path = routing.compatibilities[0][0]  # (iterations, functions, tokens)


def draw_path(ax, C_tok, title):
    n_it, n_fn = C_tok.shape
    G = nx.DiGraph()
    pos = {"in": (0, (n_fn - 1) / 2)}
    for k in range(n_it):
        for u in range(n_fn):
            G.add_node((k, u), share=C_tok[k, u].item())
            pos[(k, u)] = (k + 1, n_fn - 1 - u)
            prev = (
                [("in", 1.0)]
                if k == 0
                else [((k - 1, v), C_tok[k - 1, v].item()) for v in range(n_fn)]
            )
            for node, share in prev:
                w = share * C_tok[k, u].item()
                if w > 1e-3:
                    G.add_edge(node, (k, u), weight=w)
    sizes = [900 * G.nodes[n].get("share", 0.4) + 20 for n in G.nodes]
    nx.draw_networkx_nodes(G, pos, ax=ax, node_size=sizes, node_color="tab:blue")
    nx.draw_networkx_edges(
        G, pos, ax=ax, width=[4 * G.edges[e]["weight"] for e in G.edges], arrows=False
    )
    ax.set_xticks(range(n_it + 1), ["input"] + [f"iter {k + 1}" for k in range(n_it)])
    ax.set_yticks(range(n_fn), [f"f{n_fn - 1 - u}" for u in range(n_fn)])
    ax.tick_params(left=True, bottom=True, labelleft=True, labelbottom=True)
    ax.set_title(title)


fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
for cls, name in enumerate(("CLS 0: max", "CLS 1: x0*x1 + x2")):
    draw_path(axes[cls], C_path[:, :, cls], name)
fig.tight_layout()

# %% [markdown]
# Each CLS token follows its own path, and the shares change from one iteration to the next: the
# same interpreter is programmed differently at each step. One input says little about the
# routing as a whole. `modnets.diagnostics.ni_routing` summarises it over validation inputs, for
# the variable tokens (CLS tokens left out), at each function iteration. It gives how many functions
# match a token, how many carry at least 5 % of the weight ("used"), and how evenly a token's weight
# is spread (routing entropy: 0 for one function, 1 for all alike). It also names the regime:
# *collapsed* (at most 2 functions used), *uniform* (routing entropy at least 0.85) or *modular*.
# Only the modular regime gives functions distinct roles. Chapter 2 showed the knobs that move it
# ($\tau$, $\sigma$); chapters 5 and 6 print the same summary next to their claims.

# %%
from modnets import diagnostics

r = diagnostics.ni_routing(net, x_val[:256])
for k in range(len(r["functions_per_token"])):
    print(
        f"iteration {k + 1}: {r['functions_per_token'][k]:.2f} functions match a "
        f"token, {r['functions_used'][k]} of {net.scripts[0].num_functions} used, "
        f"entropy {r['routing_entropy'][k]:.2f}, unmatched {r['unmatched'][k]:.0%}"
    )
print("regime:", r["regime"])

# %% [markdown]
# ## What each function attends to
#
# Inside a function, ModAttn mixes the tokens it was given (NI eq. 7): token $i$ reads token $j$
# with weight $W_{uij}$, and both ends are scaled by the compatibilities, so a token the function
# does not match neither reads nor is read. We record the input of the trained model's LOC at
# every function iteration and recompute the weights of the last iteration for one validation
# input, averaged over the heads (`ModAttn.attention_weights`).

# %%
loc = net.scripts[0].iteration.interpreter.locs[0]
seen = []
hook = loc.register_forward_pre_hook(lambda module, args: seen.append(args))
with torch.no_grad():
    net(x_val[:1])
hook.remove()
x_in, codes_in, compat_in = seen[-1]  # the last function iteration
with torch.no_grad():
    W = loc.attn.attention_weights(loc.norm_attn(x_in), codes_in, compat_in)[0].mean(1)
names = ["CLS 1", "CLS 2"] + [f"$x_{j + 1}$" for j in range(6)]
fig, axes = plt.subplots(1, W.shape[0], figsize=(2.6 * W.shape[0], 2.8))
for u, ax in enumerate(axes):
    ax.imshow(W[u], vmin=0, vmax=1, cmap="Blues")
    ax.set_title(f"function {u + 1}", fontsize=9)
    ax.set_xticks(range(8), names, fontsize=6, rotation=90)
    ax.set_yticks(range(8), names if u == 0 else [], fontsize=6)
axes[0].set_ylabel("token $i$ reads ...")
fig.supxlabel("... token $j$", fontsize=9)
plt.tight_layout()
matched = compat_in[0, :, :].gt(0)
assert torch.all(W.sum(-1)[~matched] == 0)  # an unmatched token reads nothing

# %% [markdown]
# What to see: each function has its own pattern, and a row is empty where the function does
# not match that token (its compatibility is 0); the CLS tokens' rows show which elements each
# function gathers for the outputs.

# %% [markdown]
# ## Anytime inference
#
# Because every iteration of a script shares its parameters, the model can run with a different
# number of iterations than it was trained with (NI Fig. 8, on the PGM task of NI §4.3). Here,
# the validation loss of the toy model against the number of iterations at inference:

# %% tags=["hide-input"]
with torch.no_grad():
    iters = list(range(0, 2 * toy.num_iterations + 1))
    val = [
        F.mse_loss(net(x_val, num_iterations=n)[..., 0], (y_val - mu) / sd).item()
        for n in iters
    ]
fig, ax = plt.subplots(figsize=(5, 3.2))
ax.semilogy(iters, val, marker="o")
ax.axvline(toy.num_iterations, color="gray", ls="--", lw=1)
ax.set(xlabel="function iterations at inference", ylabel="validation MSE")
fig.tight_layout()

# %% [markdown]
# The loss is best at the trained number of iterations (dashed line) and degrades as we cut
# computation; running longer than trained is not free either, since this model never learned to
# be stable beyond three iterations. Chapter 6 measures it on the digits NI, as our own check:
# the paper shows anytime inference (Fig. 8) on its PGM model of §4.3, trained with a fixed
# number of function iterations.

# %% [markdown]
# ## Adding and removing functions
#
# Functions can be added after training (new signatures and codes, NI Fig. 5b) and removed or
# masked at test time (Fig. 5c). Added functions that are masked off change nothing; removing a
# function is the same as masking it.

# %%
with torch.no_grad():
    before = net(x_val)
    net.add_functions(2, freeze_existing=True, active=False)
    assert torch.allclose(net(x_val), before)  # new functions masked: outputs unchanged
    mask = torch.tensor([True, False, True, True, False, False])
    masked = net(x_val, function_mask=mask)
    net.remove_functions([1, 4, 5])
    assert torch.allclose(net(x_val), masked, atol=1e-5)  # equal up to float rounding
print("functions per script now:", net.scripts[0].num_functions)
print(
    "validation MSE without function 1: "
    f"{F.mse_loss(masked[..., 0], (y_val - mu) / sd):.4f}"
)

# %% [markdown]
# ## Summary
#
# - The interpreter pools the function streams by compatibility (NI eq. 11). Read literally, NI eq. 11
#   doubles matched tokens at every iteration; we pool the streams' updates instead (a convex
#   combination, the public code's gating), which keeps the paper's properties.
# - A script iterates one function iteration (type matching + interpreter); a Neural Interpreter
#   stacks scripts between a tokeniser with CLS tokens and per-token heads.
# - Parameters grow by $d_\text{type} + d_\text{code}$ per function; routing is inspectable; the
#   number of iterations, and the set of functions, can change after training.
#
# Next, the paper's experiments: learning fuzzy Boolean functions with reusable functions.

# %% [markdown]
# ## Exercises
#
# 1. **NI eq. 11, literal against delta.** Show that, for the same streams, the two residuals
#    differ by exactly $\big(\sum_u C_{ui}\big)\, x_i$. Check it with the digits model's `interp`,
#    `codes` and `C` (whose compatibilities sum to one over functions). What does this make of
#    eight iterations of the literal form?
#
# :::{admonition} Hint
# :class: dropdown
# With the stream outputs $\mathrm{LOCs}(x)_{ui}$, the delta form is
# $x_i + \sum_u C_{ui}(\mathrm{LOCs}(x)_{ui} - x_i)$ and the literal one
# $x_i + \sum_u C_{ui}\mathrm{LOCs}(x)_{ui}$. With $\sum_u C_{ui} = 1$ every literal iteration
# adds one more copy of its input, which compounds to a factor near $2^8 = 256$ over eight
# iterations (the first figure of the chapter). The training loop rebound `x`, so draw a new one:
#
# ```python
# x = torch.randn(2, 7, cfg.dim)
# with torch.no_grad():
#     interp.residual = "literal"
#     y_literal = interp(x, codes, C)
#     interp.residual = "delta"
#     y_delta = interp(x, codes, C)
# print((y_literal - y_delta - C.sum(1)[..., None] * x).abs().max())
# ```
# :::
#
# 2. **What a function costs with two scripts.** Predict how many parameters one more function
#    adds to the toy model with `num_scripts=2`, and how many the second script adds as a whole.
#    Check both with `count_parameters`.
#
# :::{admonition} Hint
# :class: dropdown
# Every script has its own functions, so one more function costs
# $n_s(d_\text{type} + d_\text{code}) = 2 (8 + 32) = 80$ parameters. A script also has its own
# function iteration (type-inference MLP, $\sigma$, the interpreter's LOCs), so the second script
# costs a whole function iteration besides its four functions.
#
# ```python
# two = toy.replace(num_scripts=2)
# n_two = count_parameters(modnets.NeuralInterpreter(two))
# n_more = count_parameters(modnets.NeuralInterpreter(two.replace(num_functions=5)))
# print(n_more - n_two, n_two - count_parameters(modnets.NeuralInterpreter(toy)))
# ```
# :::
#
# 3. **Zero iterations.** The anytime-inference plot starts at 0 function iterations. Show that
#    `net(x_val, num_iterations=0)` gives the same output for every input, and predict its
#    validation MSE roughly.
#
# :::{admonition} Hint
# :class: dropdown
# Without a function iteration the CLS tokens never meet the input tokens, and the heads read the
# learned CLS embeddings: constants. A constant prediction $c$ of a standardised target has an MSE
# of about $1 + c^2$, so expect an MSE a little above 1.
#
# ```python
# with torch.no_grad():
#     out0 = net(x_val, num_iterations=0)
# print((out0 - out0[:1]).abs().max(), out0[0, :, 0])
# ```
# :::
#
# 4. **Changing $\tau$ after training.** The toy model was trained with $\tau = 1.2$. Set the
#    truncation of every script to 1.0 and to 1.4 at test time (`type_matching.truncation` of each
#    script's `iteration`), and predict the effect on the routing and on the validation MSE before
#    you measure them. Set it back to `toy.truncation` afterwards.
#
# :::{admonition} Hint
# :class: dropdown
# A smaller $\tau$ cuts pairs: tokens that the trained functions used to read become unmatched and
# pass through unchanged (`unmatched` in `diagnostics.ni_routing`). A larger one lets functions
# read tokens they never saw in training. Either way the functions run on routing they were not
# trained for, so expect the MSE to rise in both directions; by how much depends on how many pairs
# lie near the cut.
#
# ```python
# for tau in (1.0, 1.2, 1.4):
#     for s in net.scripts:
#         s.iteration.type_matching.truncation = tau
#     with torch.no_grad():
#         mse = F.mse_loss(net(x_val)[..., 0], (y_val - mu) / sd).item()
#     r = diagnostics.ni_routing(net, x_val[:256])
#     print(tau, f"MSE {mse:.4f}, unmatched", [f"{u:.0%}" for u in r["unmatched"]])
# for s in net.scripts:
#     s.iteration.type_matching.truncation = toy.truncation
# ```
# :::

# %% tags=["remove-cell"]
# The exercise hints above, run: one that no longer runs fails the build.
from modnets.exercises import run_hints

run_hints(globals(), "04_neural_interpreter")
