"""The NI and the ViT of the digits experiment, their multi-task pretraining, and the checkpointed
pretrained model of one seed."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets import distributed
from modnets.experiments.core import harness
from modnets.experiments.core.experiment import RegisteredModel
from modnets.experiments.core.harness import Stage, load_or_train
from modnets.experiments.core.options import RunOptions, resolved
from modnets.experiments.digits.config import KINDS, MODEL_NAMES, NAME, DigitsConfig, DigitsTrain
from modnets.experiments.digits.data import (
    DigitsData,
    load_pretraining_data,
    pretraining_files,
    subset,
    to_rgb32,
)
from modnets.models.baselines import ViT
from modnets.models.ni import NeuralInterpreter
from modnets.training import autocast, save_checkpoint
from modnets.utils import replace_fields


def build_ni(train: DigitsTrain) -> NeuralInterpreter:
    return NeuralInterpreter(train.ni_config())


def build_vit(train: DigitsTrain, small: bool = False) -> ViT:
    """The ViT baseline at ~3x the NI's parameters, or (``small``) the parameter-matched one."""
    if small:
        return ViT(train.vit_config(small=True), depth=train.vit_small_depth)
    return ViT(train.vit_config(), depth=train.vit_depth)


BUILDERS = {"ni": build_ni, "vit": build_vit, "vit_small": lambda t: build_vit(t, small=True)}


def build_model(kind: str, train: DigitsTrain) -> nn.Module:
    """The model ``kind`` of :data:`BUILDERS` (``"ni"``, ``"vit"``, ``"vit_small"``)."""
    if kind not in BUILDERS:
        raise ValueError(f"kind must be one of {sorted(BUILDERS)}, got {kind!r}")
    return BUILDERS[kind](train)


class Preprocess(nn.Module):
    """uint8 images -> floats in [-1, 1], with RandAugment while training (kornia, batch-wise)."""

    def __init__(self, randaugment: tuple[int, int] = (0, 0)):
        super().__init__()
        n, m = randaugment
        self.augment = None
        if n > 0:
            from kornia.augmentation.auto import RandAugment

            self.augment = RandAugment(n=n, m=m)

    def forward(self, x: Tensor, train: bool = False) -> Tensor:
        x = x.float() / 255.0
        if train and self.augment is not None:
            x = self.augment(x).clamp(0, 1)
        return (x - 0.5) / 0.5


def _select_heads(logits: Tensor, dataset: Tensor) -> Tensor:
    """Logits ``(B, num_cls, 10)`` -> the head of each sample's dataset ``(B, 10)``."""
    return logits[torch.arange(len(dataset), device=logits.device), dataset]


def pretrain_loss(net: nn.Module, prep: Preprocess, x: Tensor, y: Tensor, d: Tensor) -> Tensor:
    """The pretraining loss of one minibatch of uint8 images ``x``: augmentation (in float32,
    outside autocast), then cross-entropy of each sample's own dataset head (NI §4.2)."""
    device = x.device
    with torch.autocast(device.type, enabled=False):
        x = prep(x, train=True)
    return F.cross_entropy(_select_heads(net(x), d).float(), y)


def pretrain(
    model: nn.Module,
    data: DigitsData,
    train: DigitsTrain,
    kind: str,
    stage: Stage,
    *,
    snapshots: list | None = None,
    max_snapshots: int = 25,
) -> dict:
    """Multi-task training with :func:`modnets.training.fit`, as ``stage`` says (its name, seed and
    saved state): each sample trains the head of its dataset (NI §4.2). History: the mean loss per
    log point and, per epoch, the validation accuracy of each dataset (``val_<dataset>``) and their
    mean (``val_mean``).

    ``snapshots``: a list that receives ``{"epoch", "val_mean", "state"}`` (weights on the CPU)
    after every epoch, thinned to at most ``max_snapshots`` evenly spaced epochs with the last
    kept. With a ``stage.state_path`` they are saved beside it after every epoch, so that a
    resumed run has those of the epochs before the interruption too."""
    state_path, resume = stage.state_path, stage.resume
    device = next(model.parameters()).device
    prep = Preprocess(train.randaugment)
    taken: list = []
    # one file per epoch in a folder beside the state (epoch k: k.pt), each written once
    side = None if state_path is None or snapshots is None else Path(f"{state_path}.snapshots")
    saved = sorted(side.glob("*.pt"), key=lambda f: int(f.stem)) if resume and side else []
    earlier = [torch.load(f, weights_only=True) for f in saved]

    def step(net, idx):
        return pretrain_loss(
            net,
            prep,
            data.x_train[idx].to(device),
            data.y_train[idx].to(device),
            data.d_train[idx].to(device),
        )

    def val(m):
        acc = evaluate(m, data)
        out = {**acc, "mean": float(np.mean(list(acc.values())))}
        if snapshots is not None:
            taken.append(
                {
                    "val_mean": out["mean"],
                    "state": {k: v.detach().cpu().clone() for k, v in m.state_dict().items()},
                }
            )
            if side is not None and distributed.is_main():
                side.mkdir(parents=True, exist_ok=True)
                save_checkpoint(taken[-1], side / f"{len(earlier) + len(taken)}.pt")
        return out

    history = stage.fit(model, step, train.train_config(kind), n=len(data.x_train), evaluate=val)
    if snapshots is not None:
        epochs = len(history["val_mean"])  # those of a resumed run's first part included
        # one per epoch: those saved before the interruption, then this run's own
        each = earlier[: epochs - len(taken)] + taken
        every = -(-epochs // max_snapshots)
        for i, snap in enumerate(each, start=epochs - len(each) + 1):
            if i % every == 0 or i == epochs:
                snapshots.append({"epoch": i, **snap})
        if side is not None:
            shutil.rmtree(side, ignore_errors=True)
    return history


def matched_snapshot(snapshots: list[dict], target: float) -> dict:
    """The snapshot whose ``val_mean`` is closest to ``target`` (ties: the earliest): the
    checkpoint of a model at the other model's validation accuracy (NI §4.2)."""
    if not snapshots:
        raise ValueError("snapshots is empty: pretrain with snapshots=[...] first")
    return min(snapshots, key=lambda s: (abs(s["val_mean"] - target), s["epoch"]))


@torch.no_grad()
def predict(model: nn.Module, x: Tensor, batch_size: int = 512, **forward_kwargs) -> Tensor:
    """Logits ``(N, num_cls, num_outputs)`` for uint8 images, in evaluation mode."""
    model.eval()
    device = next(model.parameters()).device
    prep = Preprocess()
    out = []
    for i in range(0, len(x), batch_size):
        with autocast(device):
            out.append(
                model(prep(x[i : i + batch_size].to(device)), **forward_kwargs).float().cpu()
            )
    return torch.cat(out)


def evaluate(model: nn.Module, data: DigitsData, **forward_kwargs) -> dict[str, float]:
    """Validation accuracy per dataset (each read out by its own head)."""
    logits = predict(model, data.x_val, **forward_kwargs)
    pred = _select_heads(logits, data.d_val).argmax(-1)
    return {
        name: (pred[data.d_val == d] == data.y_val[data.d_val == d]).float().mean().item()
        for d, name in enumerate(data.names)
    }


#: What the pretrained models depend on, besides the configuration (``harness.code_fingerprint``).
TRAIN_CODE = (
    "modnets.models.ni",
    "modnets.models.baselines",
    "modnets.training",
    "modnets.data.digits",
    DigitsTrain,
    to_rgb32,
    subset,
    load_pretraining_data,
    build_ni,
    build_vit,
    Preprocess,
    _select_heads,
    pretrain_loss,
    pretrain,
    predict,
    evaluate,
)


def trained_model(
    kind: str,
    config: DigitsConfig,
    seed: int,
    data: DigitsData | None = None,
    options: RunOptions | None = None,
    *,
    snapshots: bool = False,
    **flags,
) -> tuple:
    """The pretrained ``kind`` (one of :data:`KINDS`) at ``seed`` and its history, loaded from
    its checkpoint (``digits-<kind>``) or pretrained and saved; with ``snapshots=True`` also its
    pretraining snapshots (:func:`pretrain`; kept in the checkpoint), ``(model, history,
    snapshots)``. ``options`` (:class:`RunOptions`), or its fields by keyword."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    options = resolved(options, flags)
    t = config.train
    data = load_pretraining_data(t, options.root, options.verify) if data is None else data

    def train(model, stage):
        snaps: list = []
        history = pretrain(
            model, data, t, kind, stage, snapshots=snaps, max_snapshots=config.max_snapshots
        )
        return history, snaps

    model, history, snaps = load_or_train(
        f"{NAME}-{kind}",
        t,
        seed,
        lambda: BUILDERS[kind](t),
        train,
        code=TRAIN_CODE,
        data=harness.data_fingerprint(*pretraining_files(t, options.root)),
        options=options,
        desc=f"pretraining {MODEL_NAMES[kind]} (seed {seed})",
        extra=True,
    )
    return (model, history, snaps) if snapshots else (model, history)


# -- the models the registry offers (modnets.create_model) ----------------------------------------


def _registered_ni(config: DigitsConfig, **overrides) -> NeuralInterpreter:
    return NeuralInterpreter(replace_fields(config.train.ni_config(), overrides))


def _registered_vit(
    config: DigitsConfig, small: bool = False, depth: int | None = None, **overrides
) -> ViT:
    t = config.train
    default = t.vit_small_depth if small else t.vit_depth
    return ViT(
        replace_fields(t.vit_config(small=small), overrides),
        depth=default if depth is None else depth,
    )


def _images(config: DigitsConfig, batch: int) -> Tensor:
    c = config.train.ni_config()
    return torch.randn(batch, c.in_channels, c.image_size, c.image_size)


REGISTERED = {
    "ni_digits": RegisteredModel(
        _registered_ni,
        _images,
        "chapter 6, NI §4.2",
        bench="NI (digits)",
        train=lambda config: config.train.ni_train,
    ),
    "vit_digits": RegisteredModel(
        _registered_vit,
        _images,
        "chapter 6, NI §4.2's baseline",
        bench="ViT (digits)",
        train=lambda config: config.train.vit_train,
    ),
    "vit_small_digits": RegisteredModel(
        functools.partial(_registered_vit, small=True), _images, "chapter 6, size-matched"
    ),
}
