"""The CNN and the NFM of the stacked-MNIST experiment, their loss, training and accuracy, and the
checkpointed trained model of one seed."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets import distributed
from modnets.data.digits import mnist_files
from modnets.data.stacked_mnist import CANVAS_SIZE, StackedMNIST
from modnets.experiments.core import harness
from modnets.experiments.core.experiment import RegisteredModel
from modnets.experiments.core.harness import Stage, load_or_train
from modnets.experiments.core.options import RunOptions, resolved
from modnets.experiments.stacked_mnist.config import (
    MODEL_NAMES,
    NAME,
    NFM_ONLY,
    VAL_BATCH,
    StackedMNISTConfig,
    StackedMNISTTrain,
)
from modnets.experiments.stacked_mnist.data import (
    inputs,
    training_data,
)
from modnets.models.nfm import ConvNet
from modnets.training import TrainConfig, autocast, group_batches
from modnets.utils import seed_everything


def build_model(kind: str, train: StackedMNISTTrain, *, seed: int | None = None) -> ConvNet:
    """``"cnn"`` (App. C's CNN) or ``"nfm"``: the same CNN (the same initial weights when built
    from the same RNG state, e.g. the same ``seed``) with NFM added around its stages,
    ``gamma = 0``. ``seed`` seeds the RNGs first (:func:`harness.load_or_train` does that)."""
    if kind not in MODEL_NAMES:
        raise ValueError(f"kind must be one of {tuple(MODEL_NAMES)}, got {kind!r}")
    if seed is not None:
        seed_everything(seed)
    cnn = ConvNet(
        in_channels=1, num_outputs=10, width=train.width, block=train.block, pool=train.pool
    )
    return cnn if kind == "cnn" else cnn.with_nfm(**train.nfm())


def loss(net: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The training loss: binary cross-entropy over the ten labels (in float32)."""
    return F.binary_cross_entropy_with_logits(net(x).float(), y)


@torch.no_grad()
def predict(model: nn.Module, data: StackedMNIST, batch_size: int = VAL_BATCH) -> Tensor:
    """Logits ``(N, 10)`` in evaluation mode."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(data), batch_size):
        with autocast(device):
            out.append(model(inputs(data.images[i : i + batch_size], device)).float().cpu())
    return torch.cat(out) if out else torch.zeros(0, 10)


def evaluate(model: nn.Module, data: StackedMNIST, batch_size: int = VAL_BATCH) -> dict:
    """``exact``: the fraction of canvases with all ten labels right (Table 5's accuracy);
    ``label``: the fraction of right binary decisions."""
    right = (predict(model, data, batch_size) > 0) == (data.targets > 0.5)
    return {"exact": right.all(1).float().mean().item(), "label": right.float().mean().item()}


def _val_accuracy(model: nn.Module, data: dict[int, StackedMNIST]) -> float:
    return float(np.mean([evaluate(model, ds)["exact"] for ds in data.values()]))


def train(model: nn.Module, data: dict, optim: TrainConfig, stage: Stage) -> dict:
    """Train with :func:`modnets.training.fit` as ``stage`` says: batches of one digit count
    (each count's canvases shuffled anew every epoch from the stage's seed and the epoch; the
    order of the batches is
    drawn by the resumable loop), the binary cross-entropy (:func:`loss`), the validation
    accuracy after each epoch and the best epoch's weights restored at the end (``optim.best``).
    ``data`` holds ``"train"`` and ``"val"`` (:func:`training_data`)."""
    device = next(model.parameters()).device
    train_sets, val_sets = data["train"], data["val"]

    def batches(epoch: int) -> list:
        g = torch.Generator().manual_seed(1_000_003 * stage.seed + epoch)
        return group_batches(train_sets, optim.batch_size, g)

    def step(net, batch):
        c, idx = batch
        idx = distributed.shard(idx)  # this rank's share of the global batch
        ds = train_sets[c]
        return loss(net, inputs(ds.images[idx], device), ds.targets[idx].to(device))

    def val(m):  # the validation accuracy, and the NFM's gamma per read
        nfm = m.nfm if isinstance(m, ConvNet) else None
        return {"acc": _val_accuracy(m, val_sets), **({"gamma": nfm.gammas()} if nfm else {})}

    return stage.fit(model, step, optim, batches=batches, evaluate=val, find_unused_parameters=True)


#: What the trained models depend on, besides the configuration (see ``harness.code_fingerprint``).
TRAIN_CODE = (
    "modnets.models.nfm",
    "modnets.training",
    "modnets.distributed",
    "modnets.data.stacked_mnist",
    "modnets.data.digits",
    training_data,
    inputs,
    build_model,
    loss,
    predict,
    evaluate,
    _val_accuracy,
    train,
)


def trained_model(
    kind: str,
    config: StackedMNISTConfig,
    seed: int,
    data: dict | None = None,
    options: RunOptions | None = None,
    **flags,
) -> tuple[ConvNet, dict]:
    """``kind`` ("cnn" or "nfm") trained from ``seed``, and its history: loaded from its
    checkpoint or trained (:func:`harness.load_or_train`). ``data`` holds the training and
    validation canvases (:func:`training_data`; loaded when not given). ``options``
    (:class:`RunOptions`), or its fields by keyword.

    With ``finetune_epochs`` (see :class:`StackedMNISTTrain`) the CNN is first trained for
    ``optim.epochs`` (its own checkpoint, shared by both kinds), then ``kind`` goes on from it;
    the pretraining's history is kept in the returned history as ``"pretrain"``."""
    if kind not in MODEL_NAMES:
        raise ValueError(f"kind must be one of {tuple(MODEL_NAMES)}, got {kind!r}")
    options = resolved(options, flags)
    t = config.train
    data = training_data(t, options.root, options.verify) if data is None else data
    fingerprint = harness.data_fingerprint(*mnist_files("train", options.root))

    if not t.finetune_epochs:
        return load_or_train(
            f"{NAME}-{kind}",
            t,
            seed,
            lambda: build_model(kind, t),
            lambda model, stage: train(model, data, t.scratch_optim(kind), stage),
            code=TRAIN_CODE,
            data=fingerprint,
            options=options,
            desc=f"{MODEL_NAMES[kind]} (seed {seed})",
        )
    cnn, pre_hist = pretrained_cnn(config, seed, data, options)
    weights = {k: v.detach().clone() for k, v in cnn.state_dict().items()}

    def build() -> ConvNet:
        model = build_model("cnn", t)
        model.load_state_dict(weights)
        return model if kind == "cnn" else model.with_nfm(**t.nfm())

    optim = t.finetune_optim(kind)
    model, hist = load_or_train(
        f"{NAME}-{kind}-finetuned",
        t,
        seed,
        build,
        lambda model, stage: train(model, data, optim, stage),
        code=TRAIN_CODE,
        data=fingerprint,
        options=options,
        desc=f"{MODEL_NAMES[kind]}, finetuning (seed {seed})",
    )
    return model, {**hist, "pretrain": pre_hist}


def pretrained_cnn(
    config: StackedMNISTConfig,
    seed: int,
    data: dict | None = None,
    options: RunOptions | None = None,
    **flags,
) -> tuple[ConvNet, dict]:
    """The CNN that both kinds go on from when ``finetune_epochs`` is set, and its history:
    trained for ``optim.epochs``, keyed without what only the finetuning uses."""
    options = resolved(options, flags)
    t = config.train
    data = training_data(t, options.root, options.verify) if data is None else data
    pre_t = replace(t, finetune_epochs=0, **{f: getattr(StackedMNISTTrain, f) for f in NFM_ONLY})
    fingerprint = harness.data_fingerprint(*mnist_files("train", options.root))
    build = functools.partial(build_model, "cnn", pre_t)
    return load_or_train(
        f"{NAME}-cnn",
        pre_t,
        seed,
        build,
        lambda model, stage: train(model, data, t.optim, stage),
        code=TRAIN_CODE,
        data=fingerprint,
        options=options,
        desc=f"CNN (seed {seed})",
    )


# -- the models the registry offers (modnets.create_model) ----------------------------------------


def _registered_convnet(nfm: bool, config: StackedMNISTConfig, **overrides) -> ConvNet:
    t = config.train
    kwargs = dict(in_channels=1, num_outputs=10, width=t.width, block=t.block, pool=t.pool)
    return ConvNet(**{**kwargs, "nfm": t.nfm() if nfm else None, **overrides})


def _canvases(config: StackedMNISTConfig, batch: int) -> Tensor:
    return torch.randn(batch, 1, CANVAS_SIZE, CANVAS_SIZE)


def _nfm_optim(train: StackedMNISTTrain) -> TrainConfig:
    """How NFM(CNN) trains: on from a CNN where ``finetune_epochs`` is set, else from scratch."""
    return train.finetune_optim("nfm") if train.finetune_epochs else train.scratch_optim("nfm")


REGISTERED = {
    "cnn_stacked_mnist": RegisteredModel(
        functools.partial(_registered_convnet, False),
        _canvases,
        "chapter 11, NFM App. C",
        bench="CNN (stacked MNIST)",
        train=lambda config: config.train.optim,
    ),
    "nfm_stacked_mnist": RegisteredModel(
        functools.partial(_registered_convnet, True),
        _canvases,
        "chapter 11, NFM §4.2",
        bench="NFM (stacked MNIST)",
        train=lambda config: _nfm_optim(config.train),
    ),
}
