"""What NAC §4 measures on a trained model: accuracy with modules or edges dropped, inference
throughput and FLOPs at each sparsity, and the circuit's diagnostics."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from modnets import diagnostics, probes, pruning
from modnets.experiments.tiny_imagenet.data import Data
from modnets.experiments.tiny_imagenet.models import evaluate
from modnets.models.nac import NeuralAttentiveCircuit
from modnets.pruning import pruned
from modnets.timing import median_time
from modnets.training import autocast


def drop_curve(
    model: nn.Module,
    data: Data,
    fractions,
    batch_size: int = 256,
    order: str = "least",
    draws: int = 1,
    seed: int = 0,
) -> list[dict]:
    """Validation top-1 and top-5 with each fraction of modules (latents) dropped (NAC Fig. 5a),
    through :func:`modnets.pruning.drop_curve` (random orders: the mean over ``draws``)."""

    def score(m: nn.Module) -> dict:
        return evaluate(m, data.x_val, data.y_val, batch_size)

    return pruning.drop_curve(model, score, fractions, order, draws, seed)


def edge_curve(
    model: NeuralAttentiveCircuit, data: Data, fractions, batch_size: int = 256
) -> list[dict]:
    """Accuracy as the smallest ``P_ij`` are set to 0 (Fig. 10)."""
    return [
        {"fraction": f, **evaluate(model.eliminate_edges(f), data.x_val, data.y_val, batch_size)}
        for f in fractions
    ]


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
    model: nn.Module, fractions, batch: int, repeats: int, seed: int = 0, seconds: float = 0.2
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
