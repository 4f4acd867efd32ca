"""The NAC and the Perceiver IO of the Tiny-ImageNet experiment, their loss (with the graph prior,
NAC eq. 6), training and top-1, and the checkpointed trained model of one seed."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.data.tiny_imagenet import TinyImageNetAugment, normalize
from modnets.experiments.core.experiment import RegisteredModel
from modnets.experiments.core.harness import Stage, load_or_train
from modnets.experiments.core.options import RunOptions, resolved
from modnets.experiments.tiny_imagenet.config import (
    NAME,
    TRAIN_EVAL_BATCH,
    TinyImageNetConfig,
    TinyImageNetTrain,
)
from modnets.experiments.tiny_imagenet.data import Data, load_data
from modnets.models.baselines import PerceiverIO
from modnets.models.nac import NeuralAttentiveCircuit
from modnets.nn.tokens import ConvTokenizer
from modnets.training import TrainConfig, autocast
from modnets.utils import replace_fields


def build_model(
    kind: str, train: TinyImageNetTrain, *, prior: str | None = "scale_free"
) -> nn.Module:
    """``"nac"`` (with the graph ``prior``) or ``"pio"``, each with the App. C tokeniser."""
    nac_cfg = train.nac_config(prior)
    tokenizer = ConvTokenizer(**train.tokenizer)
    if kind == "nac":
        return NeuralAttentiveCircuit(nac_cfg, tokenizer)
    if kind == "pio":
        return PerceiverIO(nac_cfg, tokenizer)
    raise ValueError(f"kind must be 'nac' or 'pio', got {kind!r}")


def model_name(kind: str, prior: str | None = None) -> str:
    """``"Perceiver IO"`` or ``"NAC (<prior>)"``: the key of a model in the results."""
    return "Perceiver IO" if kind == "pio" else f"NAC ({prior})"


def _full_precision(device: torch.device):
    """No autocast inside (on CUDA): augmentation and the graph prior stay in float32."""
    if device.type == "cuda":
        return torch.autocast("cuda", enabled=False)
    return contextlib.nullcontext()


def graph_penalty(model: nn.Module) -> Tensor | None:
    """The NAC's graph-prior regulariser in float32, NAC eq. 6 as a mean over ordered pairs
    (:meth:`NeuralAttentiveCircuit.graph_loss`; None without a prior)."""
    if isinstance(model, NeuralAttentiveCircuit) and model.graph_prior is not None:
        with _full_precision(model.read_out.head.weight.device):
            return model.graph_loss(reduction="mean")
    return None


def loss(net: nn.Module, model: nn.Module, x: Tensor, soft: Tensor, graph_weight: float) -> dict:
    """The training loss of one batch: soft-target cross-entropy of ``net(x)`` plus, for a NAC,
    ``graph_weight`` times its graph-prior regulariser (``model`` is ``net`` unwrapped).
    ``{"loss", "ce"}`` (+ ``"graph"``, the unweighted regulariser, for a NAC)."""
    logits = net(x)
    ce = torch.sum(-soft * F.log_softmax(logits.float(), -1), -1).mean()
    penalty = graph_penalty(model)
    if penalty is None:
        return {"loss": ce, "ce": ce}
    return {"loss": ce + graph_weight * penalty, "ce": ce, "graph": penalty}


def make_step(model: nn.Module, data: Data, train: TinyImageNetTrain):
    """``step(net, idx)`` for :func:`modnets.training.fit`: the training images ``idx``,
    augmented (crop, flip, RandAugment, mixup / cutmix as configured), through :func:`loss`."""
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    augment = None
    if train.augment is not None:
        augment = TinyImageNetAugment(
            train.augment, mixup=train.mixup, cutmix=train.cutmix, num_classes=train.num_classes
        )

    def step(net: nn.Module, idx: Tensor) -> dict:
        x, y = data.x_train[idx].to(device), data.y_train[idx].to(device)
        with _full_precision(device):
            if augment is None:
                x, soft = normalize(x), F.one_hot(y, train.num_classes).float()
            else:
                x, soft = augment(x, y)
        x = x.to(dtype)  # a float64 model (e.g. in tests) gets float64 images
        return loss(net, model, x, soft, train.graph_weight)

    return step


def _groups(model: nn.Module, config: TrainConfig, train: TinyImageNetTrain) -> list[dict]:
    if isinstance(model, NeuralAttentiveCircuit):
        return model.parameter_groups(config.weight_decay, train.circuit_lr)
    return model.parameter_groups(config.weight_decay)


def train(
    model: nn.Module,
    data: Data,
    train: TinyImageNetTrain,
    config: TrainConfig,
    stage: Stage,
) -> dict:
    """Train ``model`` with :func:`modnets.training.fit` (``config``: optimiser, schedule,
    clipping; the model's own weight-decay groups) and :func:`make_step`; validation top-1 and
    top-5 after each epoch. With ``stage.state_path`` the training state is saved there (every
    ``config.save_every`` steps, at the end and on Ctrl-C) and ``stage.resume`` continues from
    it, ending bit for bit where an uninterrupted run ends (on CPU)."""
    return stage.fit(
        model,
        make_step(model, data, train),
        config,
        n=len(data.x_train),
        evaluate=lambda m: evaluate(m, data.x_val, data.y_val, TRAIN_EVAL_BATCH),
        param_groups=_groups(model, config, train),
        state_config={"train": asdict(train), "fit": asdict(config)},
    )


@torch.no_grad()
def evaluate(
    model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 256, **forward_kwargs
) -> dict:
    """Top-1 and top-5 accuracy on uint8 images (evaluation mode, no augmentation)."""
    model.eval()
    device = next(model.parameters()).device
    top1 = top5 = 0
    for i in range(0, len(x), batch_size):
        with autocast(device):
            xb = normalize(x[i : i + batch_size].to(device)).to(next(model.parameters()).dtype)
            logits = model(xb, **forward_kwargs).float()
        target = y[i : i + batch_size].to(device)
        best = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        top1 += (best[:, 0] == target).sum().item()
        top5 += (best == target[:, None]).any(-1).sum().item()
    return {"top1": top1 / len(x), "top5": top5 / len(x)}


#: What the trained models depend on, besides the configuration (see ``harness.code_fingerprint``).
TRAIN_CODE = (
    "modnets.models.nac",
    "modnets.models.baselines",
    "modnets.nn.tokens",
    "modnets.training",
    "modnets.data.tiny_imagenet",
    load_data,
    build_model,
    graph_penalty,
    loss,
    make_step,
    _groups,
    train,
    evaluate,
)


def trained_model(
    kind: str,
    config: TinyImageNetConfig | TinyImageNetTrain,
    seed: int,
    data: Data | None = None,
    options: RunOptions | None = None,
    *,
    prior: str | None = "scale_free",
    **flags,
) -> tuple[nn.Module, dict]:
    """``(model, history)``: the ``kind`` model ("nac" with ``prior``, or "pio") trained from
    ``seed``, loaded from its checkpoint or trained and saved (:func:`harness.load_or_train`).
    ``options`` (:class:`RunOptions`), or its fields by keyword."""
    options = resolved(options, flags)
    t = config.train if isinstance(config, TinyImageNetConfig) else config
    data = load_data(t, options.root) if data is None else data
    prior = None if kind == "pio" else prior
    label = model_name(kind, prior)
    name = f"{NAME}-pio" if kind == "pio" else f"{NAME}-nac-{prior}"
    t.train_config(kind)  # checks kind

    return load_or_train(
        name,
        t,
        seed,
        lambda: build_model(kind, t, prior=prior),
        lambda model, stage: train(model, data, t, t.train_config(kind), stage),
        code=TRAIN_CODE,
        data=data.fingerprint,
        options=options,
        desc=f"training {label} (seed {seed})",
    )


# -- the models the registry offers (modnets.create_model) ----------------------------------------


#: The overrides of a registered circuit that are its tokenizer's (the others are NACConfig's).
TOKENIZER_FIELDS = ("image_size", "in_channels", "hidden_channels", "out_channels", "pos_dim")


def _registered_circuit(kind: str, config: TinyImageNetConfig, **overrides) -> nn.Module:
    train = config.train
    model = NeuralAttentiveCircuit if kind == "nac" else PerceiverIO
    own = {k: overrides.pop(k) for k in TOKENIZER_FIELDS if k in overrides}
    tokenizer = ConvTokenizer(**{**train.tokenizer, **own})
    overrides = {"input_dim": tokenizer.out_dim, **overrides}  # what the tokenizer gives
    return model(replace_fields(train.nac_config("scale_free"), overrides), tokenizer)


def _images(config: TinyImageNetConfig, batch: int) -> Tensor:
    return torch.randn(batch, 3, 64, 64)


REGISTERED = {
    "nac_tiny_imagenet": RegisteredModel(
        functools.partial(_registered_circuit, "nac"),
        _images,
        "chapter 10, NAC §4.1",
        bench="NAC (Tiny-ImageNet)",
        train=lambda config: config.train.nac_train,
    ),
    "pio_tiny_imagenet": RegisteredModel(
        functools.partial(_registered_circuit, "pio"),
        _images,
        "chapter 10, the baseline",
        bench="Perceiver IO (Tiny-ImageNet)",
        train=lambda config: config.train.pio_train,
    ),
}
