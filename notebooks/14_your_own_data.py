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
# # 14. Your own data
#
# The chapters so far trained each architecture on its own paper's task. This one is what a
# researcher copies into a project: a small task of our own, built in a few lines, and the three
# models on it through the library's public surface alone:
#
# | step | call |
# |---|---|
# | build a model | `modnets.create_model(name, **overrides)`, `modnets.list_models()` |
# | read its output | NI and ViT: `(B, num_cls, num_outputs)`, a row per CLS token (task); NAC, Perceiver IO, NFM(CNN): `(B, num_outputs)` |
# | train it | `modnets.training.fit(model, step, TrainConfig(...), n=...)` |
# | save and load it | `model.save_pretrained(folder)`, `NeuralInterpreter.from_pretrained(folder)` |
# | look inside | `diagnostics.ni_routing`, `diagnostics.circuit`, the `nfm.read_weights` probe |
# | cut it down | `remove_functions` (NI), `drop_modules` (NAC) |
#
# Nothing here depends on the experiment modules' data or configurations: replace the data
# cell with yours, and the rest runs as it is.

# %%
import copy
import tempfile

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import modnets
from modnets import diagnostics, probes
from modnets.experiments.tiny_imagenet import graph_penalty
from modnets.profiles import get_profile, select
from modnets.training import TrainConfig, fit
from modnets.utils import seed_everything, show
from modnets.viz import draw_circuit, draw_function_shares

PROFILE = get_profile()
seed_everything(0)
print("profile:", PROFILE)

# %% [markdown]
# ## The task
#
# Each image (3 x 64 x 64, noise in the background) holds a filled square of one of three colours
# and a white bar, horizontal or vertical, both at random places. The label names both: colour
# times orientation, six classes. A model has to find two objects and combine what it sees of
# each, a small version of what the papers' tasks ask. Swap this cell for your own tensors `x`
# (float, `(N, 3, 64, 64)`) and `y` (class indices).

# %%
SIZES = {"smoke": (128, 64, 1), "cpu": (1024, 256, 3), "gpu": (8192, 1024, 10)}
n_train, n_val, epochs = select(SIZES, PROFILE)
COLOURS = torch.tensor([[1.0, 0.2, 0.2], [0.2, 1.0, 0.2], [0.3, 0.4, 1.0]])


def make_images(
    n: int, seed: int, columns: range | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = 0.1 * torch.randn(n, 3, 64, 64, generator=g)
    colour = torch.randint(0, 3, (n,), generator=g)
    vertical = torch.randint(0, 2, (n,), generator=g)
    corners = torch.randint(0, 48, (n, 4), generator=g)  # the square's, then the bar's
    if columns is not None:  # the square's left edge drawn from `columns` instead
        corners[:, 1] = torch.randint(columns.start, columns.stop, (n,), generator=g)
    for i, (r, c, br, bc) in enumerate(corners.tolist()):
        x[i, :, r : r + 12, c : c + 12] = COLOURS[colour[i]][:, None, None]
        if vertical[i]:
            x[i, :, br : br + 16, bc : bc + 3] = 1.0
        else:
            x[i, :, br : br + 3, bc : bc + 16] = 1.0
    return x, 2 * colour + vertical


x_train, y_train = make_images(n_train, seed=0)
x_val, y_val = make_images(n_val, seed=1)
fig, axes = plt.subplots(1, 6, figsize=(10, 2))
for ax, img, label in zip(axes, x_train, y_train, strict=False):
    ax.imshow(img.permute(1, 2, 0).clamp(0, 1))
    ax.set_title(f"class {label.item()}", fontsize=8)
    ax.axis("off")

# %% [markdown]
# What to see: each class is a colour and an orientation; where the two objects sit varies, so a
# model cannot learn a fixed pixel pattern.
#
# ## Three models from the registry
#
# Every model the book trains is registered under a name, one per experiment and profile;
# keyword arguments override its configuration. We take the `cpu` variants and shrink or adapt
# them to the task: six outputs, 64 x 64 inputs (16 x 16 patches: 16 tokens for the NI), a
# narrower NFM around its CNN, fewer modules for the NAC.

# %%
show(modnets.list_models("*_cpu"))
models = {
    "NI": modnets.create_model(
        "ni_digits_cpu", image_size=64, patch_size=16, num_cls=1, num_outputs=6
    ),
    "NAC": modnets.create_model(
        "nac_tiny_imagenet_cpu", num_outputs=6, num_processors=16, num_readouts=4
    ),
    "NFM(CNN)": modnets.create_model(
        "nfm_stacked_mnist_cpu", in_channels=3, num_outputs=6, width=4
    ),
}
for name, model in models.items():
    print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters")

# %% [markdown]
# ## Training with `fit`
#
# `fit` is the one training loop of the book: it owns the optimiser, the warm-up and cosine
# schedule, a progress bar, evaluation after each epoch, checkpoints when given a `state_path`
# (Ctrl-C saves, `resume=True` continues) and `torch.compile` when asked. What is ours is the
# `step`: the loss of one batch of indices. The NI answers per CLS token, `(B, 1, 6)`; the NAC
# adds its graph prior's regulariser (NAC eq. 6) to the loss, as its experiment does.


# %%
def logits_of(model, x):
    out = model(x)
    return out.flatten(1) if out.dim() == 3 else out


def step_for(model):
    def step(net, idx):
        loss = F.cross_entropy(logits_of(net, x_train[idx]), y_train[idx])
        penalty = graph_penalty(model)
        return loss if penalty is None else loss + penalty

    return step


@torch.no_grad()
def accuracy(model, x=x_val, y=y_val) -> float:
    model.eval()
    return (logits_of(model, x).argmax(-1) == y).float().mean().item()


config = TrainConfig(
    epochs=epochs,
    batch_size=32,
    lr=2e-3,
    weight_decay=0.01,
    warmup_fraction=0.1,
    amp=False,
)
histories = {}


def after_each_epoch(model) -> dict:
    return {"acc": accuracy(model)}


for name, model in models.items():
    histories[name] = fit(
        model, step_for(model), config, n=n_train, desc=name, evaluate=after_each_epoch
    )
    print(f"{name}: validation accuracy {accuracy(model):.1%} (chance {1 / 6:.1%})")

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(5, 3))
for name, h in histories.items():
    ax.plot(h["epoch"], [100 * a for a in h["val_acc"]], "o-", label=name)
ax.axhline(100 / 6, color="grey", ls=":", label="chance")
ax.set(xlabel="epoch", ylabel="validation accuracy (%)")
ax.legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# What to see: each model's accuracy after each epoch against chance (the dotted line); at
# `smoke` one epoch on 128 images shows only that the loop runs.
#
# ## Save and load
#
# `model.save_pretrained(folder)` (or `modnets.save_pretrained(model, folder)`) writes a folder
# with `config.json` -- the model's class and every argument it is built from, every field of its
# configuration included, so that a default changed in a later version does not change the saved
# model -- and `weights.pt`. `NeuralInterpreter.from_pretrained(folder)` (or
# `modnets.from_pretrained(folder)`) builds it again and loads the weights with
# `torch.load(weights_only=True)`: neither file runs code. The reloaded model computes the same
# logits to the last bit.

# %%
with tempfile.TemporaryDirectory() as folder:
    for name, model in models.items():
        modnets.save_pretrained(model.eval(), f"{folder}/{name}")
        again = modnets.from_pretrained(f"{folder}/{name}")
        with torch.no_grad():
            assert torch.equal(logits_of(again, x_val[:8]), logits_of(model, x_val[:8]))
    print(open(f"{folder}/NI/config.json").read()[:600], "...")

# %% [markdown]
# ## Looking inside
#
# **The NI's routing.** For each function iteration, how the image tokens' routing weight is
# shared among the functions (`diagnostics.ni_routing`, read through the `ni.compatibility`
# probe).

# %%
ni = models["NI"]
routing = diagnostics.ni_routing(ni, x_val[:256])
draw_function_shares(
    [{**routing, "seed": 0}], title="NI: share of routing per function"
)
print("regime:", routing["regime"], "| functions used:", routing["functions_used"])

# %% [markdown]
# What to see: equal segments mean every function gets every token (no modularity yet); one or
# two segments mean routing collapsed onto few functions; in between, tokens are shared out.
#
# **The NAC's circuit.** The link probabilities among its processor modules, drawn as a graph
# (edges where $P_{ij} > 0.5$, node size by how connected a module is), and the numbers
# `diagnostics.circuit` reads off it.

# %%
nac = models["NAC"]
with torch.no_grad():
    P = nac.mediator_links().float()
fig, ax = plt.subplots(figsize=(4, 4))
draw_circuit(P, ax=ax, num_hubs=3)
summary = diagnostics.circuit(nac)
show({k: round(v, 3) for k, v in summary.items() if isinstance(v, float)})

# %% [markdown]
# What to see: how sparse the learned circuit is (few edges: the graph prior and the sparse
# kernel at work) and whether a few modules (red) carry most links.
#
# **NFM's reads.** How much weight each NFM read puts on its default slot, that is, on reading
# nothing (`diagnostics.nfm_reads` over the `nfm.read_weights` probe).

# %%
nfm = models["NFM(CNN)"].eval()
with torch.no_grad(), probes.trace("nfm.read_weights") as t:
    nfm(x_val[:64])
reads = diagnostics.nfm_reads(t["nfm.read_weights"])
print(
    "weight on the default slot per read:",
    [round(w, 2) for w in reads["default_weight"]],
)

# %% [markdown]
# ## Cutting models down
#
# Modular models can lose parts at inference time: the NI its functions
# (`remove_functions`), the NAC its processor modules, least connected first (`drop_modules`,
# NAC App. F). Accuracy after each cut, beside the whole model's:

# %%
rows = {"NI": [accuracy(ni)], "NAC": [accuracy(nac)]}
for k in (1, 2):
    cut = copy.deepcopy(ni)  # a new model: the trained one stays whole
    cut.remove_functions(list(range(k)))
    rows["NI"].append(accuracy(cut))
    rows["NAC"].append(accuracy(nac.drop_modules(k * nac.config.num_processors // 4)))
print("NI, 0 / 1 / 2 functions removed:", [f"{a:.1%}" for a in rows["NI"]])
print("NAC, 0 / 25 / 50 % of modules dropped:", [f"{a:.1%}" for a in rows["NAC"]])

# %% [markdown]
# ## Summary
#
# * The three models train on a task of your own with one loop, `fit`: a step function and a
#   `TrainConfig`; the NAC adds its graph penalty to the loss.
# * `save_pretrained` / `from_pretrained` keep every constructor argument, so a saved model
#   loads as it was, bit for bit.
# * Each model shows what it does: the NI's routing per function, the NAC's circuit, the NFM's
#   reads; and each can be cut down (functions removed, modules dropped) to see what a part
#   carries.
#
# ## Exercises
#
# 1. **Your task.** Replace the data cell with a dataset of your own (any `(N, 3, 64, 64)`
#    images) and rerun the chapter. Which of the three models needs the fewest epochs?
#
# :::{admonition} Hint
# :class: dropdown
# Read it off the histories: the first epoch whose validation accuracy reaches 90 % of the
# model's best.
#
# ```python
# for name, h in histories.items():
#     best = max(h["val_acc"])
#     first = next(e for e, a in zip(h["epoch"], h["val_acc"]) if a >= 0.9 * best)
#     print(f"{name}: 90 % of its best ({best:.1%}) at epoch {first}")
# ```
# :::
#
# 2. **Out of distribution.** Train on squares in the left half of the image only and test on
#    the right half. Which model loses least?
#
# :::{admonition} Hint
# :class: dropdown
# `make_images(n, seed, columns=range(0, 21))` draws every square in the left half (its left
# edge at column 0-20, so it ends before column 32) and `range(32, 53)` in the right. Train the
# three models on the left half as above and compare their accuracy on the two halves; the
# models of this chapter, trained on both halves, give the baseline:
#
# ```python
# halves = {"left": range(0, 21), "right": range(32, 53)}
# tests = {k: make_images(n_val, seed=2, columns=cols) for k, cols in halves.items()}
# for name, m in models.items():
#     print(name, {k: f"{accuracy(m, *xy):.1%}" for k, xy in tests.items()})
# ```
# :::
#
# 3. **Adding a function.** Call `ni.add_functions(1)`, finetune only the new function's code
#    and signature (freeze the rest with `requires_grad_(False)`), and check with
#    `diagnostics.ni_routing` whether the tokens route to it.
#
# :::{admonition} Hint
# :class: dropdown
# Freeze the whole model first: `add_functions` then adds the only trainable parameters.
# A function that gets tokens has a share of the routing above zero.
#
# ```python
# grown = copy.deepcopy(ni)
# grown.requires_grad_(False)
# grown.add_functions(1)
# print("trainable:", [n for n, p in grown.named_parameters() if p.requires_grad])
# one_epoch = TrainConfig(epochs=1, batch_size=32, lr=2e-3, amp=False)
# fit(grown, step_for(grown), one_epoch, n=n_train, show_progress=False)
# share = diagnostics.ni_routing(grown, x_val[:256])["share"]
# print("the new function's share per iteration:", [round(s[-1], 3) for s in share])
# ```
# :::

# %% tags=["remove-cell"]
# The exercise hints above, run: one that no longer runs fails the build.
from modnets.exercises import run_hints

run_hints(globals(), "14_your_own_data")
