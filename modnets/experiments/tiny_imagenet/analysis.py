"""What NAC §4 measures on a trained model: accuracy with modules or edges dropped, inference
throughput and FLOPs at each sparsity, and the circuit's diagnostics."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from modnets import diagnostics, probes, pruning
from modnets.data.tiny_imagenet import normalize
from modnets.experiments.tiny_imagenet.data import Data
from modnets.experiments.tiny_imagenet.models import evaluate
from modnets.models.nac import NeuralAttentiveCircuit
from modnets.pruning import pruned
from modnets.timing import median_time
from modnets.training import autocast


@torch.no_grad()
def val_tokens(model: nn.Module, data: Data, batch_size: int = 256) -> list[Tensor]:
    """What ``model``'s tokenizer makes of each validation batch, cut and normalised as
    :func:`~modnets.experiments.tiny_imagenet.models.evaluate` does. Dropping modules or edges
    leaves the tokenizer as it is, and it is most of what an evaluation costs: a curve computes
    the tokens once and scores every pruned model on them."""
    model.eval()
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    tokenizer = nn.Identity() if model.tokenizer is None else model.tokenizer
    out = []
    for i in range(0, len(data.x_val), batch_size):
        with autocast(device):
            out.append(tokenizer(normalize(data.x_val[i : i + batch_size].to(device)).to(dtype)))
    return out


@torch.no_grad()
def evaluate_tokens(model: nn.Module, tokens: list[Tensor], y: Tensor) -> dict:
    """Top-1 and top-5 accuracy of ``model`` on :func:`val_tokens` (its tokenizer skipped): the
    same computation as ``evaluate`` on the images, bit for bit. The tokens are float32 under
    autocast too (the tokenizer ends in a LayerNorm), as the model's input check asks."""
    model.eval()
    device = next(model.parameters()).device
    tokenizer, model.tokenizer = model.tokenizer, None
    top1 = top5 = start = 0
    try:
        for t in tokens:
            with autocast(device):
                logits = model(t).float()
            target = y[start : start + len(t)].to(device)
            start += len(t)
            best = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
            top1 += (best[:, 0] == target).sum().item()
            top5 += (best == target[:, None]).any(-1).sum().item()
    finally:
        model.tokenizer = tokenizer
    if start != len(y):
        raise ValueError(
            f"tokens hold {start} examples and y {len(y)}: pass val_tokens of y's data"
        )
    return {"top1": top1 / len(y), "top5": top5 / len(y)}


def scorer(model: nn.Module, data: Data, batch_size: int = 256) -> Callable[[nn.Module], dict]:
    """Top-1 and top-5 of ``model`` or of any model pruned from it (its tokenizer), on the
    validation tokens computed once (:func:`val_tokens`); ``model`` itself is scored once, so
    curves that share a scorer (every order of a drop curve begins with nothing dropped) share
    its score."""
    tokens = val_tokens(model, data, batch_size)
    full = {}

    def score(m: nn.Module) -> dict:
        if m is not model:
            return evaluate_tokens(m, tokens, data.y_val)
        if not full:
            full.update(evaluate_tokens(m, tokens, data.y_val))
        return dict(full)

    return score


def drop_curve(
    model: nn.Module,
    data: Data,
    fractions,
    batch_size: int = 256,
    order: str = "least",
    draws: int = 1,
    seed: int = 0,
    score: Callable[[nn.Module], dict] | None = None,
) -> list[dict]:
    """Validation top-1 and top-5 with each fraction of modules (latents) dropped (NAC Fig. 5a),
    through :func:`modnets.pruning.drop_curve` (random orders: the mean over ``draws``).
    ``score``: ``model``'s :func:`scorer`, to share its tokens with other curves."""
    score = scorer(model, data, batch_size) if score is None else score
    return pruning.drop_curve(model, score, fractions, order, draws=draws, seed=seed)


def edge_curve(
    model: NeuralAttentiveCircuit,
    data: Data,
    fractions,
    batch_size: int = 256,
    score: Callable[[nn.Module], dict] | None = None,
) -> list[dict]:
    """Accuracy as the smallest ``P_ij`` are set to 0 (Fig. 10); ``score`` as in
    :func:`drop_curve`."""
    score = scorer(model, data, batch_size) if score is None else score
    return [{"fraction": f, **score(model.eliminate_edges(f))} for f in fractions]


@torch.inference_mode()
def throughput(
    model: nn.Module, batch: int = 64, repeats: int = 5, warmup: int = 2, seconds: float = 0.2
) -> float:
    """Samples per second at ``batch`` (the median over at least ``repeats`` timed blocks of
    forward passes, for at least ``seconds``: :func:`modnets.timing.median_time`)."""
    model.eval()
    device = next(model.parameters()).device
    x = torch.randn(batch, 3, 64, 64, device=device)

    def forward():
        with autocast(device):
            model(x)

    return batch / median_time(forward, repeats, warmup, device, seconds)


def gflops_per_sample(model: nn.Module, batch: int = 4) -> float:
    """Forward GFLOPs per sample, counted by ``torch.utils.flop_counter`` (matmuls, convs,
    attention; elementwise operations are not counted)."""
    model.eval()
    device = next(model.parameters()).device
    x = torch.randn(batch, 3, 64, 64, device=device)
    with FlopCounterMode(display=False) as counter:  # (under no_grad its module hooks fail)
        model(x)
    return counter.get_total_flops() / batch / 1e9


def speed_curve(
    model: nn.Module,
    fractions,
    batch: int,
    repeats: int,
    *,
    seed: int = 0,
    seconds: float = 0.2,
) -> list[dict]:
    """Throughput (:func:`throughput`) and GFLOPs per sample with each fraction dropped (Fig. 5b,
    Fig. 15); the order does not matter: every order leaves a model of the same size."""
    out = []
    for f in fractions:
        small = pruned(model, f, "least", seed)
        out.append(
            {
                "fraction": f,
                "samples_per_s": throughput(small, batch, repeats, seconds=seconds),
                "gflops": gflops_per_sample(small),
            }
        )
    return out


def point_at(curve: list[dict], fraction: float) -> dict:
    return next(d for d in curve if abs(d["fraction"] - fraction) < 1e-9)


def relative_loss(full: float, at: float) -> float:
    return (full - at) / full if full > 0 else math.nan


@torch.no_grad()
def nac_diagnostics(
    model: NeuralAttentiveCircuit, initial: NeuralAttentiveCircuit, data: Data, n: int
) -> dict:
    """The learned circuit against its prior, after training and at initialisation
    (:func:`modnets.diagnostics.circuit`: mean off-diagonal ``P`` of the mediators and the prior's
    density, the coefficient of variation of ``q_i``, its Spearman correlation with the matched
    prior degree), and the mean entropy of the read-out confidences on ``n`` validation images
    (``log U_o``: every read-out module weighted alike), via the probes."""
    model.eval()
    with probes.trace("nac.confidences") as t:
        evaluate(model, data.x_val[:n], data.y_val[:n], n)
    w = torch.cat(t["nac.confidences"]).float()
    entropy = -(w * w.clamp_min(1e-12).log()).sum(-1).mean().item()
    return {
        "links_trained": diagnostics.circuit(model),
        "links_init": diagnostics.circuit(initial),
        "readout_entropy": entropy,
        "uniform_readout_entropy": math.log(model.config.num_readouts),
    }
