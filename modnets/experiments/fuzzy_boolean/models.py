"""The NI of the fuzzy-Boolean experiment, what each finetuning trains, its loss and R^2,
and the checkpointed pretraining and finetuning of one seed."""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from modnets.data import fuzzy_boolean as fuzzy_data
from modnets.data.fuzzy_boolean import MultiTaskData
from modnets.experiments.core.experiment import RegisteredModel
from modnets.experiments.core.harness import Stage, load_or_train
from modnets.experiments.core.options import RunOptions, resolved
from modnets.experiments.fuzzy_boolean.config import (
    FINETUNINGS,
    NAME,
    FuzzyBooleanConfig,
    FuzzyBooleanTrain,
)
from modnets.experiments.fuzzy_boolean.data import fit_points, load_data, target_scaler
from modnets.models.ni import NeuralInterpreter
from modnets.training import TrainConfig, r2_score, trainable_parameters
from modnets.utils import replace_fields


def build_model(kind: str, train: FuzzyBooleanTrain) -> NeuralInterpreter:
    """The NI (``kind="ni"``, the experiment's one model) of ``train``."""
    if kind != "ni":
        raise ValueError(
            f"kind must be 'ni' (the fuzzy-Boolean experiment's one model), got {kind!r}"
        )
    return NeuralInterpreter(train.model_config())


def set_trainable(model: NeuralInterpreter, finetuning: str) -> int:
    """Freeze everything but the parameters of ``finetuning``; return the trainable count.

    ``cls``: CLS tokens. ``type``: + type-inference MLPs, signatures and kernel bandwidths of every
    script. ``all``: everything (signatures included).
    """
    if finetuning not in FINETUNINGS:
        raise ValueError(f"finetuning must be one of {FINETUNINGS}, got {finetuning!r}")
    for p in model.parameters():
        p.requires_grad_(finetuning == "all")
    model.cls.tokens.requires_grad_(True)
    if finetuning == "type":
        for script in model.scripts:
            script.iteration.type_inference.requires_grad_(True)
            script.iteration.type_matching.requires_grad_(True)
            for sig in script.signature_chunks:
                sig.requires_grad_(True)
    return trainable_parameters(model)


@torch.no_grad()
def evaluate(model: nn.Module, data: MultiTaskData, batch_size: int = 256) -> torch.Tensor:
    """R^2 per function on the validation split, on the original scale of the targets.

    The model predicts standardised targets; mapping its predictions back by the same affine map
    leaves R^2 unchanged, so this is also the R^2 on the standardised scale.
    """
    model.eval()
    mu, sd = target_scaler(data)
    device = next(model.parameters()).device
    x = data.x_val
    preds = [
        model(x[i : i + batch_size].to(device))[..., 0].float().cpu()
        for i in range(0, len(x), batch_size)
    ]
    return r2_score(torch.cat(preds) * sd + mu, data.y_val).float()


def loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss: MSE on standardised targets, every function at once."""
    return F.mse_loss(net(x)[..., 0], y)


def train(
    model: nn.Module,
    data: MultiTaskData,
    config: TrainConfig,
    stage: Stage,
) -> dict:
    """Train the trainable parameters on standardised targets (MSE) with :func:`fit`, as
    ``stage`` says (its name, seed and saved state)."""
    device = next(model.parameters()).device
    mu, sd = target_scaler(data)
    x, y = data.x_train.to(device), ((data.y_train - mu) / sd).to(device)

    def step(net, idx):
        idx = idx.to(device)
        return loss(net, x[idx], y[idx])

    return stage.fit(
        model, step, config, n=len(x), evaluate=lambda m: {"r2": evaluate(m, data).mean().item()}
    )


#: What the trained models depend on, besides the configuration (see ``harness.code_fingerprint``).
TRAIN_CODE = (
    "modnets.models.ni",
    "modnets.training",
    fuzzy_data,
    load_data,
    build_model,
    set_trainable,
    target_scaler,
    evaluate,
    loss,
    train,
)


def pretrained(
    t: FuzzyBooleanTrain,
    seed: int,
    points: MultiTaskData,
    *,
    fingerprint: str,
    desc: str,
    options: RunOptions,
) -> tuple:
    """The pretrained model of ``t`` at ``seed`` (checkpoint ``fuzzy_boolean-pretrain``, keyed
    without the finetuning rates, which pretraining does not use)."""

    return load_or_train(
        f"{NAME}-pretrain",
        replace(t, finetune_lrs=()),
        seed,
        lambda: build_model("ni", t),
        lambda model, stage: train(model, points, t.pretrain, stage),
        code=TRAIN_CODE,
        data=fingerprint,
        options=options,
        desc=desc,
    )


def finetuned(
    t: FuzzyBooleanTrain,
    finetuning: str,
    seed: int,
    weights: dict,
    points: MultiTaskData,
    *,
    fingerprint: str,
    desc: str,
    options: RunOptions,
) -> tuple:
    """``finetuning`` finetuned from the pretrained ``weights`` at its rate in ``t`` (checkpoint
    ``fuzzy_boolean-<finetuning>``, keyed by that rate alone)."""
    tc = t.finetune_config(finetuning)

    def build():
        ft = build_model("ni", t)
        ft.load_state_dict(weights)
        ft.reset_cls_tokens(t.num_finetune_functions)
        set_trainable(ft, finetuning)
        return ft

    model, hist = load_or_train(
        f"{NAME}-{finetuning}",
        replace(t, finetune_lrs=((finetuning, tc.lr),)),
        seed,
        build,
        lambda model, stage: train(model, points, tc, stage),
        code=TRAIN_CODE,
        data=fingerprint,
        options=options,
        desc=desc,
    )
    set_trainable(model, finetuning)
    return model, hist


def trained_models(
    config: FuzzyBooleanConfig,
    seed: int,
    data=None,
    options: RunOptions | None = None,
    **flags,
) -> dict[str, tuple[nn.Module, dict]]:
    """``{"pretrain" | finetuning: (model, history)}`` at ``seed``: each loaded from its checkpoint
    or trained (pretraining first, then each finetuning from the same pretrained weights), on the
    points of :func:`fit_points`. ``config.train`` is used as it is: pass the one
    :func:`sweep` returns (as :func:`measure` does) to get the swept choice. ``options``
    (:class:`RunOptions`), or its fields by keyword."""
    options = resolved(options, flags)
    t = config.train
    data = load_data(t) if data is None else data
    pre_fit, new_fit, fingerprint = fit_points(config, data)
    pre, history = pretrained(
        t,
        seed,
        pre_fit,
        fingerprint=fingerprint,
        desc=f"pretraining (seed {seed})",
        options=options,
    )
    out = {"pretrain": (pre, history)}
    weights = copy.deepcopy(pre.state_dict())
    for finetuning in FINETUNINGS:
        out[finetuning] = finetuned(
            t,
            finetuning,
            seed,
            weights,
            new_fit,
            fingerprint=fingerprint,
            desc=f"finetune [{finetuning}] (seed {seed})",
            options=options,
        )
    return out


# -- the model the registry offers (modnets.create_model) -----------------------------------------


def _registered_ni(config: FuzzyBooleanConfig, **overrides) -> NeuralInterpreter:
    return NeuralInterpreter(replace_fields(config.train.model_config(), overrides))


def _points(config: FuzzyBooleanConfig, batch: int) -> torch.Tensor:
    return torch.rand(batch, config.train.num_variables)


REGISTERED = {
    "ni_fuzzy_boolean": RegisteredModel(
        _registered_ni,
        _points,
        "chapter 5, NI §4.1",
        bench="NI (fuzzy Booleans)",
        train=lambda config: config.train.pretrain,
    )
}
