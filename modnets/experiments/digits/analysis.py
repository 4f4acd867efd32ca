"""What NI §4.2 does to a pretrained model: few-shot adaptation to K-MNIST (its learning rate chosen
on a selection split), re-sampled functions, dropped functions, more or fewer iterations, and
the inferred types."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.experiments.digits.config import DigitsConfig
from modnets.experiments.digits.data import DigitsData, balanced_sample
from modnets.experiments.digits.models import Preprocess, evaluate, predict
from modnets.models.ni import NeuralInterpreter
from modnets.training import amp_dtype, autocast, minibatches, warmup_cosine
from modnets.utils import seed_everything


def _resample_functions(model: NeuralInterpreter, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for script in model.scripts:
            for s, c in zip(script.signature_chunks, script.code_chunks, strict=True):
                s.copy_(F.normalize(torch.randn(s.shape, generator=g), dim=-1))
                c.copy_(torch.randn(c.shape, generator=g))


def adaptation_seed(pretrain_seed: int, index: int) -> int:
    """The seed of adaptation run ``index`` of the model pretrained from ``pretrain_seed``: each
    pretraining seed draws its own K-MNIST samples, shared by the NI, the ViT and the re-sampled
    NI (the pairing of the claims)."""
    return 1000 * pretrain_seed + index


def prepare_adaptation(
    pretrained: nn.Module,
    seed: int = 0,
    mode: str = "all",
    *,
    resample: bool = False,
    num_functions: int | None = None,
    reuse_cls: int | None = None,
) -> nn.Module:
    """A copy of ``pretrained`` ready for K-MNIST: one fresh CLS token and head (or, with
    ``reuse_cls``, pretrained CLS token ``reuse_cls`` and its head), and the trainable
    parameters of ``mode``.

    ``mode="all"`` trains every parameter that pretraining trained (Figs. 5a, 6): the signatures
    stay fixed, as the paper keeps them. ``mode="functions"`` grows the NI to ``num_functions``
    functions and trains only signatures and codes, plus the new CLS token and head (Fig. 5b).
    ``resample`` re-draws all codes and signatures first (Fig. 6).
    """
    if mode not in ("all", "functions"):
        raise ValueError(f"mode must be 'all' or 'functions', got {mode!r}")
    device = next(pretrained.parameters()).device
    model = copy.deepcopy(pretrained)
    seed_everything(1_000_000 + seed)
    if resample:
        _resample_functions(model, 2_000_000 + seed)
    if reuse_cls is None:
        model.reset_cls_tokens(1)
    else:
        model.keep_cls_token(reuse_cls)
    model.to(device)
    if mode == "functions":
        extra = (num_functions or 0) - model.scripts[0].num_functions
        if extra > 0:
            model.add_functions(extra)
        for p in model.parameters():
            p.requires_grad_(False)
        for script in model.scripts:
            for p in [*script.signature_chunks, *script.code_chunks]:
                p.requires_grad_(True)
        for p in [*model.cls.parameters(), *model.heads.parameters()]:
            p.requires_grad_(True)
    return model


def adapt(
    pretrained: nn.Module,
    kmnist: dict,
    n: int,
    config: DigitsConfig,
    seed: int = 0,
    mode: str = "all",
    resample: bool = False,
    num_functions: int | None = None,
    lr: float | None = None,
) -> float:
    """Finetune a copy on ``n`` class-balanced K-MNIST samples (unaugmented, NI §4.2) for
    ``finetune_epochs``; return the accuracy on the disjoint K-MNIST evaluation set.
    See :func:`prepare_adaptation` for ``seed``, ``mode``, ``resample`` and ``num_functions``;
    ``lr`` defaults to ``capacity_lr`` (``mode="functions"``) or ``finetune_lr``.
    Short and never checkpointed: its own small loop (every sample each epoch, no clipping)."""
    reuse = None if config.reuse_cls is None else config.train.datasets.index(config.reuse_cls)
    model = prepare_adaptation(
        pretrained, seed, mode, resample=resample, num_functions=num_functions, reuse_cls=reuse
    )
    device = next(model.parameters()).device
    if lr is None:
        lr = config.capacity_lr if mode == "functions" else config.finetune_lr
    idx = balanced_sample(kmnist["y_pool"], n, seed=seed)
    x_train, y_train = kmnist["x_pool"][idx], kmnist["y_pool"][idx]
    prep = Preprocess()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=config.finetune_weight_decay)
    steps = max(1, config.finetune_epochs * -(-n // config.finetune_batch_size))
    sched = warmup_cosine(opt, steps, 0)
    g = torch.Generator().manual_seed(seed)
    # loss scaling under float16 autocast (a GPU without bf16); a pass-through otherwise
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype(device) == torch.float16)
    for _ in range(config.finetune_epochs):
        model.train()
        for b in minibatches(n, config.finetune_batch_size, g, drop_last=False):
            with autocast(device):
                logits = model(prep(x_train[b].to(device)))[:, 0].float()
            loss = F.cross_entropy(logits, y_train[b].to(device))
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
    pred = predict(model, kmnist["x_eval"])[:, 0].argmax(-1)
    return (pred == kmnist["y_eval"]).float().mean().item()


def selection_split(kmnist: dict, config: DigitsConfig) -> dict:
    """The K-MNIST split that chooses finetuning learning rates: samples come from the pool but
    its last ``selection_val`` images, which score. Built from the pool alone: the evaluation
    set is not read."""
    V = config.selection_val
    if not 0 < V < len(kmnist["y_pool"]):
        raise ValueError(f"selection_val must be in (0, {len(kmnist['y_pool'])}), got {V}")
    return {
        "x_pool": kmnist["x_pool"][:-V],
        "y_pool": kmnist["y_pool"][:-V],
        "x_eval": kmnist["x_pool"][-V:],
        "y_eval": kmnist["y_pool"][-V:],
    }


def select_finetune_lr(
    pretrained: nn.Module, kmnist: dict, config: DigitsConfig, seed: int = 0, resample: bool = False
) -> tuple[float, dict]:
    """``(lr, {lr: selection accuracy})``: the candidate of ``config.finetune_lrs`` with which
    :func:`adapt` does best at the smallest sample count on :func:`selection_split` (ties: the
    smaller rate). ``config.finetune_lr`` when there are no candidates."""
    if not config.finetune_lrs:
        return config.finetune_lr, {}
    split = selection_split(kmnist, config)
    n = min(config.sample_counts)
    scores = {
        lr: adapt(pretrained, split, n, config, seed, resample=resample, lr=lr)
        for lr in sorted(config.finetune_lrs)
    }
    return max(scores, key=lambda lr: (scores[lr], -lr)), scores


def drop_functions(
    model: NeuralInterpreter, data: DigitsData, counts, trials: int, seed: int = 0
) -> dict:
    """Accuracy per dataset with ``k`` functions masked at random at test time (Fig. 5c):
    ``{k: {dataset: [accuracy per trial]}}``."""
    g = torch.Generator().manual_seed(seed)
    U = model.scripts[0].num_functions
    out = {}
    for k in counts:
        accs = []
        for _ in range(trials if k > 0 else 1):
            mask = torch.ones(U, dtype=torch.bool)
            mask[torch.randperm(U, generator=g)[:k]] = False
            accs.append(
                evaluate(model, data, function_mask=mask.to(next(model.parameters()).device))
            )
        out[k] = {name: [a[name] for a in accs] for name in data.names}
    return out


def anytime(model: NeuralInterpreter, data: DigitsData, iterations) -> dict:
    """Accuracy per dataset when running ``n`` function iterations at test time (Fig. 8)."""
    return {n: evaluate(model, data, num_iterations=n) for n in iterations}


@torch.no_grad()
def inferred_types(model: NeuralInterpreter, images: Tensor) -> tuple[Tensor, Tensor]:
    """The input elements' types (CLS tokens left out) at each function iteration of every
    script, ``(iterations, N*T, d_type)``, and the index of each one's closest signature in its
    script (Fig. 4)."""
    model.eval()
    device = next(model.parameters()).device
    out = model(Preprocess()(images.to(device)), return_routing=True)
    cls = model.config.num_cls
    types, closest = [], []
    for script, t in zip(model.scripts, out.types, strict=True):  # t: (N, n_i, T, d_type)
        t = t[:, :, cls:].float().cpu().transpose(0, 1).flatten(1, 2)
        types.append(t)
        closest.append((t @ script.signatures.float().cpu().T).argmax(-1))
    return torch.cat(types), torch.cat(closest)
