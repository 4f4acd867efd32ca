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
# # 9. The Neural Attentive Circuit
#
# Chapters 1, 7 and 8 built the parts: ModFC and ModFFN (NAC eq. 1), SKMDPA (NAC eqs. 2-3) and the
# graph priors (App. A). This chapter assembles them into a **Neural Attentive Circuit**
# {cite}`weiss2022circuits`, trains one briefly, draws the circuit it learned, and cuts it down at
# inference time.
#
# A NAC has $U = U_p + U_o$ modules. A **circuit design** gives each module three vectors: a
# signature $s_u$ (whom it talks to), a code $c_u$ (what it computes) and an initial state
# $\theta^{(0)}_u$. The **circuit executor** runs the design on an input:
#
# | stage | what happens | equation |
# |---|---|---|
# | tokenizer | input $\to$ a set of vectors $X$ | — |
# | read-in | each read-in module attends to $X$ through its own code | NAC eqs. 4-5 |
# | $L$ propagators | SKMDPA: mediators hear read-in modules and mediators; then a ModFFN per mediator | NAC eqs. 2-3, 1 |
# | read-out | $U_o$ read-out modules attend to the processors; confidences weight their logits | §2.1 |
#
# Processor modules play two roles: *read-in modules* read the input, *mediators* compute and
# communicate. By default every processor module plays both, as NAC §2.1 describes; the public
# NAC code separates them (section *Module roles* below). The **circuit generator** produces the
# design: free parameters (unconditional) or a function of the sample (conditional, App. G).

# %% tags=["hide-input"]
from modnets import diagrams

_ = diagrams.draw("neural_attentive_circuit")

# %% [markdown]
# The generator (top) decides the circuit once: which modules talk, through the signatures' link
# probabilities and a sparse kernel, kept near a graph prior while training. The executor (bottom)
# runs that circuit on each input; every module is the same layers under its own code.

# %%
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import modnets
from modnets.models.nac import NACConfig, NeuralAttentiveCircuit, nac_from_perceiver_io
from modnets.nn.skmdpa import link_probabilities
from modnets.profiles import get_profile, select
from modnets.utils import count_parameters, progress, seed_everything
from modnets.viz import draw_circuit

seed_everything(0)
torch.set_printoptions(precision=4, sci_mode=False)
print("profile:", get_profile())

# %% [markdown]
# ## A small circuit
#
# `NACConfig` holds every size; its defaults are NAC Table 4 (Tiny-ImageNet). Here a toy size.

# %%
cfg = NACConfig(
    input_dim=10,
    num_outputs=4,
    dim=32,
    num_layers=2,
    num_processors=16,
    num_readouts=4,
    num_heads=4,
    ffn_hidden=64,
    sig_dim=8,
    code_dim=16,
    activation="geglu",
    prior="scale_free",
)
model = NeuralAttentiveCircuit(cfg).eval()
x = torch.randn(3, 12, 10)  # 3 samples, 12 tokens of 10 features
print(model(x).shape, f"{count_parameters(model):,} parameters")

# %% [markdown]
# ## The circuit design
#
# The unconditional generator holds signatures and codes as free parameters; the initial state of
# each module is a two-layer MLP of its code (§2.2); in training, per-example noise is added to it
# (section *Training details* below). Processor and read-out modules have separate signatures and
# codes.

# %%
design = model.design()
g = model.generator
for k, v in vars(design).items():
    if v is not None:
        print(f"{k}: {tuple(v.shape)}")
mlp = g.to_state.net
theta0 = mlp[2](F.gelu(mlp[0](g.codes)))
assert torch.allclose(theta0, design.states)

# %% [markdown]
# ## Read-in (NAC eqs. 4-5)
#
# Each processor module $u$ builds its query from its state and reads every token through keys
# and values *conditioned on its own code*: $k_{uj} = \mathrm{ModFC}(x_j; c_u)$. Written out, that
# is a `(batch, U, N, d)` tensor of keys. We add the pre-LayerNorm residual wiring of Perceiver IO
# and of the public NAC code (the equations show only the attention and the ModFFN), and a softmax
# (NAC eq. 5 as extracted shows none).

# %%
r = model.read_in


def read_in_by_hand(x, states, codes):
    B, N, _ = x.shape
    d = cfg.dim
    q = r.query(r.norm_states(states).expand(B, -1, -1), codes)  # (B, U, d)
    xn = r.norm_inputs(x)[:, None]  # (B, 1, N, d_in)
    k = r.key(xn, codes[:, None])  # (B, U, N, d): every module its own keys
    v = r.value(xn, codes[:, None])
    w = torch.softmax(torch.einsum("bud,bund->bun", q, k) / d**0.5, dim=-1)
    y = states + r.out(torch.einsum("bun,bund->bud", w, v), codes)
    return y + r.ffn(r.norm_ffn(y), codes)


theta1 = read_in_by_hand(x, design.states, design.codes)
assert torch.allclose(theta1, r(x, design.states, design.codes), atol=1e-5)

# %% [markdown]
# The library never builds those keys. A ModFC is linear in its input once the modulation
# $m_u = 1 + \alpha\,\mathrm{LN}(W_c c_u)$ is fixed, so
# $q_u\cdot k_{uj} = ((W_k^\top q_u)\odot m_u)\cdot x_j + q_u\cdot b_k$: a query per module
# against the *shared* tokens, with the same trick for values. At Table 4's sizes the difference
# is large:

# %%
B, U, N, d = 64, 320, 64, 384
naive = B * U * N * d  # per-module keys (and as many values)
factorised = B * U * N  # attention weights (one read-in head)
print(
    f"naive keys: {naive * 4 / 2**30:.2f} GiB   factorised weights: "
    f"{factorised * 4 / 2**20:.1f} MiB   ratio {naive / factorised:.0f}x"
)

# %% [markdown]
# ## Propagators: SKMDPA among modules, then a ModFFN
#
# Each propagator layer is one round of communication and one of computation. Queries, keys and
# values come from ModFCs conditioned on each module's *own* code; the kernel of chapter 7 gates
# who hears whom. The kernel is truncated ($P_{ij} = 0$ where $d_{ij} > 0.9$) and uses
# `model.bandwidth`, one learnable $\epsilon$ shared by every attention of the circuit (initialised at
# Table 4's 1.0), as chapter 7 motivates. Both residual branches are scaled by a LayerScale, a
# learnable per-channel $\gamma$ initialised at 0.1, as in the public NAC code:
#
# $$
# \theta \leftarrow \theta + \gamma_a \odot \mathrm{SKMDPA}\big(\mathrm{LN}(\theta)\big), \qquad
# \theta \leftarrow \theta + \gamma_f \odot \mathrm{ModFFN}\big(\mathrm{LN}(\theta); c\big) .
# $$
#
# In training, DropPath and code noise also act on these branches (section *Training details*); the
# model here is in evaluation mode, where they are off.

# %%
layer = model.propagators[0]
a = layer.attn


def propagator_by_hand(states, codes, sigs):
    h = layer.norm_attn(states)
    q, k, v = a.query(h, codes), a.key(h, codes), a.value(h, codes)
    # eval: K = P, truncated, with the circuit's learned bandwidth (chapter 7)
    P = link_probabilities(sigs, sigs, model.bandwidth, cfg.truncation)
    # log 0 = -inf: no link
    log_K_hat = torch.log(P / (cfg.delta + P.sum(-1, keepdim=True)))
    H = cfg.num_heads

    def split(t):  # (B, T, H d_head) -> (B, H, T, d_head)
        return t.view(t.shape[0], t.shape[1], H, -1).transpose(1, 2)

    logits = split(q) @ split(k).transpose(-1, -2) / (cfg.dim // H) ** 0.5
    msg = (torch.softmax(logits + log_K_hat, -1) @ split(v)).transpose(1, 2).flatten(2)
    states = states + layer.scale_attn(a.out(msg, codes))  # LayerScale: gamma * branch
    return states + layer.scale_ffn(layer.ffn(layer.norm_ffn(states), codes))


theta2 = propagator_by_hand(theta1, design.codes, design.signatures)
assert torch.allclose(theta2, layer(theta1, design.codes, design.signatures), atol=1e-5)

# %% [markdown]
# ## Read-out with confidences
#
# The $U_o$ read-out modules cross-attend (SKMDPA, with their own signatures) to the final
# processor states and apply a ModFFN. Each then emits logits *and* a confidence score; the
# output is the confidence-weighted sum of their logits (§2.1). We turn the scores into weights
# with a softmax over the read-out modules, the natural reading of "weight their additive
# contribution". The residual branches carry LayerScales, as in the propagators.

# %%
ro = model.read_out
states = theta1
for lay in model.propagators:
    states = lay(states, design.codes, design.signatures)
y = design.out_states.expand(3, -1, -1)
kv = ro.norm_kv(states)
y = y + ro.scale_attn(
    ro.attn(
        ro.norm_q(y),
        design.out_codes,
        design.out_signatures,
        kv,
        design.codes,
        design.signatures,
    )
)
y = ro.norm_out(y + ro.scale_ffn(ro.ffn(ro.norm_ffn(y), design.out_codes)))
weights = torch.softmax(ro.confidence(y).squeeze(-1), dim=-1)  # (B, U_o)
logits = (weights[..., None] * ro.head(y)).sum(1)
assert torch.allclose(logits, model(x), atol=1e-5)
print("read-out weights of sample 0:")
print(weights[0])

# %% [markdown]
# The whole forward pass above, chained by hand, equals `model(x)`.
#
# ## Module roles: read-in modules and mediators
#
# So far every processor module does everything: it reads the input, sends and receives in every
# propagator, and the graph prior regularises it. That is how NAC §2.1 describes the executor. The
# public NAC code splits the processor modules into two roles:
#
# * **read-in modules** (64 "input latents" in its Tiny-ImageNet configuration, of Table 4's 320
#   processor modules) attend to the input and then only *send*: no propagator updates their states;
# * **mediators** (the other 256) *receive* through the kernel from read-in modules and
#   mediators alike, are updated by every propagator, and are the only modules the graph prior
#   regularises.
#
# `NACConfig(num_read_in=R)` makes the first $R$ processor modules read-in modules and the other
# $M = U_p - R$ (`config.num_mediators`) mediators; $R = 0$, the default, is the paper's description.
# With roles, the graph prior's matrix is $M \times M$, `mediator_links()` is the mediator block of
# $P$, and the importance of a module is its degree among the mediators,
# $q_i = \sum_{j\,\in\,\text{mediators}} P_{ij}$ (NAC eq. 10, App. F). The forward pass by hand:

# %%
roles_cfg = NACConfig(**{**vars(cfg), "num_read_in": 4})
roles = NeuralAttentiveCircuit(roles_cfg).eval()
R, M = roles_cfg.num_read_in, roles_cfg.num_mediators
d = roles.design()
# only the read-in modules read the input
read = roles.read_in(x, d.states[:R], d.codes[:R])
senders = (read, d.codes[:R], d.signatures[:R])  # ... and then only send
med = d.states[R:].expand(len(x), -1, -1)
for lay in roles.propagators:  # mediators receive from read-in modules and mediators
    med = lay(med, d.codes[R:], d.signatures[R:], senders=senders)
logits, _ = roles.read_out(torch.cat([read, med], 1), d)
assert torch.allclose(logits, roles(x), atol=1e-5)

with torch.no_grad():
    P_roles = roles.link_probabilities()  # (U_p, U_p)
assert torch.equal(roles.mediator_links().detach(), P_roles[R:, R:])
assert torch.allclose(roles.module_importance(), P_roles[:, R:].sum(-1))
print(
    f"{R} read-in modules, {M} mediators: prior "
    f"{tuple(roles.graph_prior.prior.shape)}, "
    f"importances {tuple(roles.module_importance().shape)}"
)

# %% [markdown]
# ## A NAC can be a Perceiver IO
#
# NAC §4.1 and App. B.2 note that for some hyper-parameters a NAC *is* a Perceiver IO
# {cite}`jaegle2022perceiverio`: set ModFC's $\alpha = 0$ (every ModFC becomes `nn.Linear`), drop
# the kernel (dense attention), make the initial states free parameters (the latents) and keep one
# read-out module (the decoder query). `modnets.PerceiverIO` is written independently with
# `nn.Linear` layers; `nac_from_perceiver_io` copies its weights into a NAC so configured.

# %%
pio = modnets.PerceiverIO(cfg).eval()
as_nac = nac_from_perceiver_io(pio).eval()
assert torch.allclose(pio(x), as_nac(x), atol=1e-5)
print(
    f"Perceiver IO {count_parameters(pio):,} parameters; NAC "
    f"{count_parameters(model):,}"
)

# %% [markdown]
# ## Training details
#
# NAC Table 4 gives sizes and optimiser settings but none of the regularisers a NAC trains with; they
# come from the public NAC code's Tiny-ImageNet configuration. `NACConfig` has each of them, on by
# default:
#
# | detail | in training | value | source |
# |---|---|---|---|
# | LayerScale | a learnable per-channel $\gamma$ scales the propagators' and read-out's residual branches (in evaluation too) | $\gamma = 0.1$ at init | public code (`layer_scale_initial_value`) |
# | DropPath | zeroes those branches for a random 10 % of the examples and scales the rest by $1/0.9$ | 0.1 | public code (`path_drop_prob`; its read-out has none) |
# | code noise | each receiving module's code becomes $c \odot (1 + u)$, $u \sim \mathcal U(-a, a)$ per feature | $a = 0.05$ | public code (`VectorScaleNoise`) |
# | noisy initial states | $\theta^{(0)} = \mu(c) + \sigma(c) \odot \xi$, $\xi \sim \mathcal N(0, I)$ per example, $\log \sigma^2$ linear in $c$; evaluation uses $\mu(c)$ | bias of $\log\sigma^2$: $-5$ ($\sigma \approx 0.08$) | public code (latent seeder) |
# | per-example kernels | each example draws its own Concrete kernel (chapter 7) | $\tau = 0.5$ | public code (`rsample(batch_size)`); $\tau$: Table 4 |
# | truncation, learnable $\epsilon$ | $P_{ij} = 0$ beyond $d = 0.9$; one $\epsilon$ per circuit (the public code learns one per propagator) | 0.9; $\epsilon = 1$ at init | public code; $\epsilon$: Table 4 |
#
# `layer_scale=None`, `drop_path=0`, `code_noise=0`, `state_noise=False` and
# `per_example_kernel=False` turn them off. DropPath, the state noise and the kernels are drawn per
# example, so two copies of one input give different outputs in training (and the same output in
# evaluation). The code noise is drawn once per forward pass and shared by the batch: with the three
# per-example draws off, the copies agree in training too.

# %%
twin = x[:1].expand(2, -1, -1)  # two copies of one input
with torch.no_grad():
    out_train = model.train()(twin)
    out_eval = model.eval()(twin)
print(
    "training: the copies' logits differ by up to "
    f"{(out_train[0] - out_train[1]).abs().max():.4f}"
)
assert torch.equal(out_eval[0], out_eval[1])

no_per_example = {"drop_path": 0.0, "state_noise": False, "per_example_kernel": False}
quiet = NeuralAttentiveCircuit(NACConfig(**{**vars(cfg), **no_per_example})).train()
with torch.no_grad():
    out_quiet = quiet(twin)
assert torch.allclose(out_quiet[0], out_quiet[1], atol=1e-6)


# %% [markdown]
# ## Training on a toy task
#
# Each sample is a set of 12 tokens, each a noisy one-hot symbol from an alphabet of 10 with a
# random feature added; the label is which of the first 4 symbols occurs most often. Solving it
# needs aggregation over the set (read-in) and comparison of counts (propagators). We train with
# AdamW, with every training detail above on, and add the scale-free graph-prior regulariser
# (NAC eq. 6) with a small weight.

# %%
def toy_batch(n, generator=None):
    sym = torch.randint(0, 10, (n, 12), generator=generator)
    # half the tokens from the 4
    sym[:, :6] = torch.randint(0, 4, (n, 6), generator=generator)
    x = F.one_hot(sym, 10).float() + 0.1 * torch.randn(n, 12, 10, generator=generator)
    counts = F.one_hot(sym, 10)[..., :4].sum(1).float() + 0.01 * torch.rand(
        n, 4, generator=generator
    )
    return x, counts.argmax(-1)


steps = select({"smoke": 30, "cpu": 600, "gpu": 2000})
seed_everything(0)
model = NeuralAttentiveCircuit(cfg)
opt = torch.optim.AdamW(model.parameter_groups(weight_decay=0.05), lr=2e-3)
graph_weight = 1e-3
history = []
for _ in progress(range(steps), desc="training"):
    xb, yb = toy_batch(64)
    task = F.cross_entropy(model(xb), yb)
    loss = task + graph_weight * model.graph_loss()
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append((task.item(), model.graph_loss().item()))

hist = torch.tensor(history)
k = max(1, steps // 10)
first, last = hist[:k, 0].mean().item(), hist[-k:, 0].mean().item()
print(f"task loss: first {k} steps {first:.3f}  last {k} steps {last:.3f}")
assert last < first

# %% [markdown]
# Both terms fall: the task loss, and the distance of the learned link probabilities from the
# (best permutation of the) scale-free prior.

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))


def smooth(t):
    return torch.nn.functional.avg_pool1d(t[None, None], k, 1)[0, 0]


axes[0].plot(smooth(hist[:, 0]))
axes[0].set(xlabel="step", ylabel="cross-entropy", title="task loss")
axes[1].plot(smooth(hist[:, 1]))
axes[1].set(xlabel="step", ylabel="NAC eq. 6", title="graph-prior regulariser")
plt.tight_layout()

# %%
model.eval()
n_test = select({"smoke": 200, "cpu": 2000, "gpu": 2000})
xt, yt = toy_batch(n_test, torch.Generator().manual_seed(1))
with torch.no_grad():
    acc = (model(xt).argmax(-1) == yt).float().mean().item()
print(
    f"held-out accuracy {acc:.3f} (chance 0.25; majority class "
    f"{torch.bincount(yt).max() / n_test:.3f})"
)

# %% [markdown]
# ## The learned circuit
#
# Left: the link probabilities $P$ among processor modules, sorted by importance
# $q_i = \sum_j P_{ij}$ (App. F). Right: the circuit drawn like NAC Fig. 8, node size by $q_i$, the
# three best-connected modules (hubs) in red. NAC Fig. 8 draws an edge where $P_{ij} > 0.5$, but the
# scale-free prior at $U_p = 16$ has no pair above 0.18 (hub to hub), so a circuit that meets it has
# no such edge; we draw an edge where $P_{ij}$ exceeds half the prior's largest entry. With a
# scale-free prior, look for a few well-connected hubs and a tail of sparsely connected modules.

# %%
with torch.no_grad():
    P = model.link_probabilities()
order = model.drop_order().flip(0)
fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
im = axes[0].imshow(P[order][:, order], vmin=0, vmax=1, cmap="viridis")
axes[0].set(
    title="learned $P_{ij}$ (most connected first)",
    xlabel="module j",
    ylabel="module i",
)
fig.colorbar(im, ax=axes[0], fraction=0.046)
prior_off = model.graph_prior.prior * ~torch.eye(cfg.num_processors, dtype=torch.bool)
threshold = prior_off.max().item() / 2
G = draw_circuit(P, axes[1], threshold=threshold, num_hubs=3)
axes[1].set_title(
    f"circuit: {G.number_of_edges()} edges with $P_{{ij}} > {threshold:.2f}$"
)
plt.tight_layout()

# %% [markdown]
# ## What each head reads
#
# The circuit says which links may carry a message; the attention decides how much each open
# link carries (NAC eq. 3). We record the first propagator's queries and keys and its kernel
# (the `skmdpa.log_kernel` probe) on one held-out set, recompute each head's weights
# $W_{i\leftarrow j} = \operatorname{softmax}_j(q_i \cdot k_j / \sqrt{d_h} + \log \hat K_{ij})$,
# check that they give the propagator's own messages, and draw them with the modules in the
# order above.

# %%
from modnets import probes

skmdpa = model.propagators[0].attn.attention
seen = []
hooks = [
    skmdpa.register_forward_pre_hook(lambda module, args: seen.append(args)),
    skmdpa.register_forward_hook(lambda module, args, out: seen.append(out)),
]
with torch.no_grad(), probes.trace("skmdpa.log_kernel") as t:
    model(xt[:1])
for h in hooks:
    h.remove()
(q, k, v, *_), message = seen[0], seen[1]
log_k = t["skmdpa.log_kernel"][0]  # the first propagator's, the first SKMDPA call
H, U = skmdpa.num_heads, q.shape[1]


def heads(z):
    return z.view(1, U, H, -1).transpose(1, 2)  # (1, H, U, d_h)


scores = heads(q) @ heads(k).transpose(-1, -2) / heads(q).shape[-1] ** 0.5
W = torch.softmax(scores + log_k, dim=-1).nan_to_num(0.0)[0]  # (H, U, U)
mine = (W @ heads(v)[0]).transpose(0, 1).reshape(1, U, -1)
torch.testing.assert_close(
    mine, message
)  # the propagator's messages, from these weights
fig, axes = plt.subplots(1, H, figsize=(3.2 * H, 3.2))
for h, ax in enumerate(axes):
    ax.imshow(W[h][order][:, order], vmin=0, vmax=1, cmap="Blues")
    ax.set(title=f"head {h + 1}", xlabel="module j (sender)")
axes[0].set_ylabel("module i (receiver)")
plt.tight_layout()
closed = torch.isneginf(log_k.squeeze())
assert torch.all(W[:, closed] == 0)  # a closed link carries nothing, in every head

# %% [markdown]
# What to see: a link the kernel closed is empty in every head, so all heads share one circuit;
# among the open links, most weight goes to a module's own state (the diagonal) and a few
# senders, and where the heads differ, they read the same circuit differently.

# %% [markdown]
# ## Dropping modules at inference time (App. F)
#
# `drop_modules(n)` returns a copy without the $n$ least connected mediators (here, with $R = 0$,
# processor modules). Signatures and codes are the only per-module parameters, so the copy is a
# *smaller* network: every attention and ModFFN over processor modules runs on fewer rows. It
# computes exactly what masking those modules in the full model computes:

# %%
mask = model.keep_mask(6)
small = model.drop_modules(6)
with torch.no_grad():
    assert torch.allclose(
        small(xt[:64]), model(xt[:64], processor_mask=mask), atol=1e-5
    )
print(small.generator.codes.shape, "codes left of", model.generator.codes.shape)

# %% [markdown]
# With module roles, which modules may go? `among="mediators"`, the default, ranks and drops
# mediators only: the read-in modules always stay. That is our reading of the paper, whose largest
# drop, 80 % of 320 modules, is exactly the public code's 256 mediators; a fraction dropped is then a
# fraction of the mediators. `among="processors"` ranks the read-in modules too, by the same $q_i$,
# but never drops the last read-in module, since without one nothing reads the input. Either way the
# smaller copy computes what masking computes. Chapter 10 drops mediators only.

# %%
n = M // 2
for among in ("mediators", "processors"):
    small_roles = roles.drop_modules(n, among=among)
    with torch.no_grad():
        masked = roles(xt[:64], processor_mask=roles.keep_mask(n, among=among))
        assert torch.allclose(small_roles(xt[:64]), masked, atol=1e-5)
    dropped = roles.drop_order(among=among)[:n].tolist()
    print(
        f"among={among!r:12}: drops modules {sorted(dropped)}, "
        f"{small_roles.config.num_read_in} of {R} read-in modules left"
    )
assert roles.keep_mask(n)[:R].all()  # mediators only: every read-in module stays
# every module but one read-in module is droppable
last = roles.drop_order(among="processors")
assert len(last) == roles_cfg.num_processors - 1 and (last < R).sum() == R - 1

# %% [markdown]
# Accuracy on the toy task as modules go, least connected first, against dropping them in a
# random order (`order="random"`, three draws). The gap between the curves is what the connectivity
# ranking buys. Chapter 10 draws the same curves on Tiny-ImageNet, so both take them from
# `modnets.pruning`: `drop_curve(model, score, fractions, order, draws)` drops each fraction of the
# mediators in that order and averages `score` over the random draws.

# %%
from modnets.pruning import drop_curve


def accuracy(m):
    with torch.no_grad():
        return {"accuracy": (m(xt).argmax(-1) == yt).float().mean().item()}


fractions = [n / cfg.num_mediators for n in range(0, cfg.num_mediators, 2)]
by_q = drop_curve(model, accuracy, fractions)  # least connected first
rand = drop_curve(model, accuracy, fractions, "random", draws=3)
assert by_q[3]["modules"] == cfg.num_processors - 6  # 6 of 16 dropped
assert by_q[3]["accuracy"] == accuracy(model.drop_modules(6))["accuracy"]
ns = [cfg.num_processors - row["modules"] for row in by_q]
plt.figure(figsize=(5, 3.2))
plt.plot(
    ns, [row["accuracy"] for row in by_q], "o-", label="least connected first ($q_i$)"
)
plt.plot(ns, [row["accuracy"] for row in rand], "s--", label="random order (mean of 3)")
plt.xlabel(f"processor modules dropped (of {cfg.num_processors})")
plt.ylabel("accuracy")
plt.legend()
plt.tight_layout()

# %% [markdown]
# ## A thousand modules on a CPU
#
# Because a module is a signature and a code, the parameter count barely moves with $U_p$: 1,008
# more modules cost $1{,}008 \times (d_{sig} + d_{code})$ parameters. Compute grows linearly in
# $U_p$ for the read-in and the ModFFNs, and quadratically (with a small constant) in SKMDPA.

# %%
big_cfg = NACConfig(
    input_dim=10,
    num_outputs=4,
    dim=64,
    num_layers=2,
    num_processors=1024,
    num_readouts=8,
    num_heads=4,
    ffn_hidden=128,
    sig_dim=16,
    code_dim=32,
    prior=None,
)
small_cfg = NACConfig(**{**vars(big_cfg), "num_processors": 16})
big, little = NeuralAttentiveCircuit(big_cfg), NeuralAttentiveCircuit(small_cfg)
print(
    f"U_p = 16: {count_parameters(little):,} parameters; U_p = 1024: "
    f"{count_parameters(big):,}"
)
xb = torch.randn(8, 64, 10)
t0 = time.perf_counter()
loss = big(xb).square().mean()
loss.backward()
print(
    "1,024 modules, batch 8, 64 tokens: forward + backward "
    f"{time.perf_counter() - t0:.2f} s"
)

# %% [markdown]
# ## Summary
#
# * A NAC is a set of modules described by signatures (connectivity), codes (computation) and
#   initial states; a generator designs the circuit, an executor runs it: read-in, $L$
#   propagators, a confidence-weighted read-out.
# * Every per-module quantity is a row of one tensor, so all modules run at once, the read-in
#   never materialises per-module keys, and dropping a module shrinks the network for real.
# * Processor modules can take roles, as in the public code: read-in modules read the input and only
#   send; mediators receive, are graph-regularised, and are what `drop_modules` drops by default.
# * A NAC trains with the public code's LayerScale, DropPath, code noise, noisy initial states and
#   per-example kernels, a truncated kernel and a learnable $\epsilon$; evaluation is deterministic.
# * With $\alpha = 0$, a dense kernel, free states and one read-out module, a NAC computes exactly
#   what a Perceiver IO computes: Perceiver IO is the natural baseline.
#
# Next, chapter 10 trains a NAC and a Perceiver IO on Tiny-ImageNet and asks how many mediators
# the NAC can lose at inference time.

# %% [markdown]
# ## Exercises
#
# 1. **The read-in without per-module keys.** With $k_{uj} = \mathrm{ModFC}(x_j; c_u)$ and
#    $m_u = 1 + \alpha\,\mathrm{LN}(W_c c_u)$ (NAC eq. 1), show that
#    $q_u \cdot k_{uj} = ((W_k^\top q_u) \odot m_u) \cdot x_j + q_u \cdot b_k$. Check it for one
#    token and every processor module with the read-in's `key` ModFC. How large is the tensor the
#    read-in then needs per head?
#
# :::{admonition} Hint
# :class: dropdown
# $k_{uj} = W_k(x_j \odot m_u) + b_k$, and
# $q^\top W_k (x \odot m) = ((W_k^\top q) \odot m) \cdot x$. The vector $(W_k^\top q_u) \odot m_u$
# is computed once per module and dotted with the shared tokens: the read-in keeps `(B, U, N)`
# weights instead of `(B, U, N, d)` keys, and values work the same way.
#
# ```python
# r = model.read_in
# codes = model.design().codes.detach()
# with torch.no_grad():
#     q = torch.randn(cfg.num_processors, cfg.dim)  # one query per module
#     xj = torch.randn(cfg.input_dim)  # one token
#     k = r.key(xj, codes)  # (U_p, d): the token's key in every module
#     m = r.key.modulation(codes)  # (U_p, d_in)
#     lhs = (q * k).sum(-1)
#     rhs = ((q @ r.key.weight) * m) @ xj + q @ r.key.bias
# print((lhs - rhs).abs().max())
# ```
# :::
#
# 2. **What a module costs.** Predict how many parameters one more processor module adds to the
#    chapter's `cfg`, one more read-out module, and one more processor module when
#    `initial_states="free"`. Check with `count_parameters`.
#
# :::{admonition} Hint
# :class: dropdown
# A module is its signature ($d_{sig} = 8$) and its code ($d_{code} = 16$); its initial state
# comes from the code through the shared MLP. So 24 parameters for a processor or read-out module,
# and with free initial states the state itself ($d = 32$) as well: 56.
#
# ```python
# def n_params(**changes):
#     config = NACConfig(**{**vars(cfg), **changes})
#     return count_parameters(NeuralAttentiveCircuit(config))
#
#
# print(n_params(num_processors=17) - n_params(), n_params(num_readouts=5) - n_params())
# free = n_params(num_processors=17, initial_states="free")
# print(free - n_params(initial_states="free"))
# ```
# :::
#
# 3. **A hard graph at evaluation.** SKMDPA can evaluate with $K = [P > 1/2]$
#    (`eval_kernel="threshold"`, chapter 7). Before you switch the trained `model` to it, count
#    its processor pairs with $P_{ij} > 1/2$ and predict what the propagators can still do. Then
#    measure the held-out accuracy with both kernels.
#
# :::{admonition} Hint
# :class: dropdown
# With the hard graph a module hears only the modules linked to it above 1/2, and itself
# ($P_{ii} = 1$). With few such pairs (the scale-free prior at $U_p = 16$ asks for none), the
# propagators are left with little more than each module's own ModFFN. The read-out's links are
# thresholded too, and a read-out module with no link left reads nothing.
#
# ```python
# off = ~torch.eye(cfg.num_processors, dtype=torch.bool)
# with torch.no_grad():
#     print("pairs with P > 1/2:", (model.link_probabilities()[off] > 0.5).sum().item())
# print("K = P:", accuracy(model))
# for m in model.modules():
#     if isinstance(m, modnets.SKMDPA):
#         m.eval_kernel = "threshold"
# print("K = [P > 1/2]:", accuracy(model))
# for m in model.modules():  # back to the default
#     if isinstance(m, modnets.SKMDPA):
#         m.eval_kernel = "probs"
# ```
# :::
#
# 4. **Codes when $\alpha = 0$.** With $\alpha = 0$ every ModFC is an `nn.Linear` (NAC eq. 1), yet
#    the codes of an untrained NAC with `alpha=0.0, learn_alpha=False` still change its output.
#    Find where, by giving such a model new random codes and comparing outputs, once with the
#    default `initial_states="codes"` and once with `"free"`.
#
# :::{admonition} Hint
# :class: dropdown
# The initial states are an MLP of the codes (§2.2), so new codes give new states. With free
# states nothing reads the codes any more: the modules differ only by their states and signatures.
# Add a dense kernel and a single read-out module and this is the Perceiver IO of the chapter.
#
# ```python
# for states in ("codes", "free"):
#     changes = {"alpha": 0.0, "learn_alpha": False, "initial_states": states}
#     flat = NeuralAttentiveCircuit(NACConfig(**{**vars(cfg), **changes})).eval()
#     with torch.no_grad():
#         before = flat(xt[:64])
#         flat.generator.codes.normal_()
#         flat.generator.out_codes.normal_()
#         print(states, (flat(xt[:64]) - before).abs().max().item())
# ```
# :::

# %% tags=["remove-cell"]
# The exercise hints above, run: one that no longer runs fails the build.
from modnets.exercises import run_hints

run_hints(globals(), "09_neural_attentive_circuit")
