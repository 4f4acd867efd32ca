"""The six models at about the same size, the one loss and training loop they share, their
evaluation, few-shot adaptation and dropped modules."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets import pruning
from modnets.data.digits import mnist_files
from modnets.data.stacked_mnist import StackedMNIST
from modnets.experiments.core import harness
from modnets.experiments.core.harness import Stage
from modnets.experiments.core.options import RunOptions, resolved
from modnets.experiments.side_by_side.config import (
    ARCH,
    MODEL_NAMES,
    NAME,
    SideBySideConfig,
    SideBySideTrain,
)
from modnets.experiments.side_by_side.data import inputs, training_data
from modnets.models.baselines import PerceiverIO, ViT
from modnets.models.nac import NACConfig, NeuralAttentiveCircuit
from modnets.models.nfm import ConvNet
from modnets.models.ni import NeuralInterpreter, NIConfig
from modnets.nn.tokens import ConvTokenizer
from modnets.training import TrainConfig, autocast, group_batches
from modnets.utils import seed_everything


def _ni_config(train: SideBySideTrain, dim: int, mlp_hidden: int, **kw) -> NIConfig:
    return NIConfig(
        dim=dim,
        mlp_hidden=mlp_hidden,
        num_heads=4,
        image_size=train.canvas,
        patch_size=8,
        in_channels=1,
        num_outputs=10,
        **kw,
    )


def _nac_config(dim: int, ffn_hidden: int, num_processors: int, prior: str | None) -> NACConfig:
    tok = ARCH["tokenizer"]
    return NACConfig(
        input_dim=tok["out_channels"] + tok["pos_dim"],
        num_outputs=10,
        dim=dim,
        num_layers=2,
        num_processors=num_processors,
        num_readouts=4,
        num_heads=4,
        ffn_hidden=ffn_hidden,
        sig_dim=16,
        code_dim=32,
        prior=prior,
    )


def build_model(kind: str, train: SideBySideTrain, *, seed: int | None = None) -> nn.Module:
    """Model ``kind`` (a key of :data:`MODEL_NAMES`) at :data:`ARCH`'s size for ``train``'s
    canvases; ``seed`` seeds the RNGs first. NFM(CNN) is the CNN of the same seed with NFM added
    (``gamma = 0``: at initialisation it computes what the CNN computes)."""
    if kind not in MODEL_NAMES:
        raise ValueError(f"kind must be one of {tuple(MODEL_NAMES)}, got {kind!r}")
    if seed is not None:
        seed_everything(seed)
    if kind in ("cnn", "nfm"):
        cnn = ConvNet(1, 10, image_size=train.canvas, **ARCH["cnn"])
        return cnn if kind == "cnn" else cnn.with_nfm(**ARCH["nfm"], share_blocks=True)
    if kind == "ni":
        return NeuralInterpreter(_ni_config(train, mlp_hidden=ARCH["ni_mlp"], **ARCH["ni"]))
    if kind == "vit":
        v = ARCH["vit"]
        return ViT(_ni_config(train, v["dim"], v["mlp_hidden"]), depth=v["depth"])
    tokenizer = ConvTokenizer(image_size=train.canvas, in_channels=1, **ARCH["tokenizer"])
    if kind == "nac":
        return NeuralAttentiveCircuit(_nac_config(**ARCH["nac"], prior="scale_free"), tokenizer)
    return PerceiverIO(_nac_config(**ARCH["pio"], prior=None), tokenizer)


def logits(model: nn.Module, x: Tensor) -> Tensor:
    """The ten logits ``(B, 10)`` of any of the six models (the NI and ViT give one CLS token's,
    the NAC its :class:`~modnets.models.nac.NACOutput`'s)."""
    out = model(x)
    return getattr(out, "logits", out).reshape(len(x), -1)


def loss(net: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Binary cross-entropy over the ten labels (which digits appear), in float32; plus the
    NAC's graph prior (NAC eq. 6 as a mean over ordered pairs)."""
    out = F.binary_cross_entropy_with_logits(logits(net, x).float(), y)
    model = getattr(net, "_orig_mod", net)
    if isinstance(model, NeuralAttentiveCircuit) and model.graph_prior is not None:
        out = out + model.graph_loss(reduction="mean").float()
    return out


@torch.no_grad()
def evaluate(model: nn.Module, data: StackedMNIST, batch_size: int = 250) -> dict:
    """``exact``: the fraction of canvases with all ten labels right; ``label``: of right
    binary decisions."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(data), batch_size):
        with autocast(device):
            out.append(logits(model, inputs(data.images[i : i + batch_size], device)).float())
    right = (torch.cat(out).cpu() > 0) == (data.targets > 0.5)
    return {"exact": right.all(1).float().mean().item(), "label": right.float().mean().item()}


def mean_exact(model: nn.Module, sets: dict[int, StackedMNIST], batch_size: int = 250) -> float:
    """:func:`evaluate`'s ``exact`` averaged over the digit counts of ``sets``."""
    return float(np.mean([evaluate(model, ds, batch_size)["exact"] for ds in sets.values()]))


def train(model: nn.Module, data: dict, optim: TrainConfig, stage: Stage) -> dict:
    """Train with :func:`modnets.training.fit` as ``stage`` says, on ``data["train"]`` (batches
    of one digit count, shuffled from the stage's seed and the epoch); the validation accuracy
    on ``data["val"]`` (when given) after each epoch."""
    device = next(model.parameters()).device
    sets = data["train"]

    def batches(epoch: int) -> list:
        return group_batches(
            sets, optim.batch_size, torch.Generator().manual_seed(stage.seed + epoch)
        )

    def step(net, batch):
        c, idx = batch
        return loss(net, inputs(sets[c].images[idx], device), sets[c].targets[idx].to(device))

    val = data.get("val")
    scores = (lambda m: {"acc": mean_exact(m, val)}) if val else None
    return stage.fit(
        model, step, optim, batches=batches, evaluate=scores, find_unused_parameters=True
    )


#: What the trained models depend on, besides the configuration (see ``harness.code_fingerprint``).
TRAIN_CODE = (
    "modnets.models",
    "modnets.nn",
    "modnets.training",
    "modnets.data.stacked_mnist",
    "modnets.data.digits",
    training_data,
    inputs,
    build_model,
    logits,
    loss,
    evaluate,
    mean_exact,
    train,
)


def trained_model(
    kind: str,
    config: SideBySideConfig,
    seed: int,
    data: dict | None = None,
    options: RunOptions | None = None,
    *,
    lr: float,
    **flags,
) -> tuple[nn.Module, dict]:
    """Model ``kind`` trained from ``seed`` at learning rate ``lr``, and its history: loaded from
    its checkpoint or trained (:func:`harness.load_or_train`). ``options``
    (:class:`RunOptions`), or its fields by keyword."""
    options = resolved(options, flags)
    t = config.train
    data = training_data(t, options.root, options.verify) if data is None else data
    key = replace(t, lrs=(lr,))  # the checkpoint is of this rate alone

    return harness.load_or_train(
        f"{NAME}-{kind}",
        key,
        seed,
        lambda: build_model(kind, t),
        lambda model, stage: train(model, data, t.optim(lr), stage),
        code=TRAIN_CODE,
        data=harness.data_fingerprint(*mnist_files("train", options.root)),
        options=options,
        desc=f"{MODEL_NAMES[kind]} (seed {seed}, lr {lr:g})",
    )


def adapt(model: nn.Module, tests: dict, config: SideBySideConfig, lr: float, seed: int) -> float:
    """Few-shot adaptation: a copy of ``model`` finetuned (every parameter, the model's own
    learning rate) on the few K-MNIST canvases of ``tests``, then its exact-match accuracy on
    the K-MNIST test canvases."""
    net = copy.deepcopy(model)
    optim = TrainConfig(
        epochs=config.few_shot_epochs, batch_size=config.few_shot_batch, lr=lr, amp=False
    )
    seed_everything(seed)
    train(
        net, {"train": tests["kmnist_train"]}, optim, Stage("adapting", seed, show_progress=False)
    )
    return mean_exact(net, tests["kmnist_test"], config.eval_batch)


def droppable(kind: str) -> bool:
    """Whether model ``kind`` runs with part of its modules (functions, latents) dropped."""
    return kind in ("ni", "nac", "pio")


def dropped(model: nn.Module, fraction: float, seed: int) -> nn.Module:
    """``model`` with ``fraction`` of its modules dropped: the NAC's least connected mediators
    (NAC App. F), the Perceiver IO's latents or the NI's functions at random (drawn from
    ``seed``)."""
    if not isinstance(model, NeuralInterpreter):
        return pruning.pruned(model, fraction, "least", seed)
    net = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    for script in net.scripts:
        U = script.num_functions
        off = torch.randperm(U, generator=g)[: pruning.num_dropped(fraction, U)]
        script.function_mask[off.to(script.function_mask.device)] = False
    return net
