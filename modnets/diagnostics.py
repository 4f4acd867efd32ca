"""Numbers that say whether a mechanism a paper relies on is at work, from :mod:`modnets.probes`.

* :func:`routing` -- NI: how spread the routing ``C`` is, and :func:`routing_regime` whether it
  is collapsed, modular or uniform;
  :func:`ni_routing` runs a model under a trace and applies it to the input elements.
* :func:`links` -- NAC: how sparse the link probabilities ``P`` are and how unequal the
  module importances ``q_i`` (App. F).
* :func:`nfm_reads` -- NFM: how much weight each read puts on reading nothing (the default slot).

Each returns plain floats and lists, ready for the ``"diagnostics"`` of a results file.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from modnets.utils import wrap

__all__ = ["routing", "routing_regime", "regime_line", "ni_routing", "links", "nfm_reads"]


#: :func:`routing_regime`: a function is *used* when it carries at least this share of the
#: tokens' total routing weight; routing is *collapsed* when at most ``COLLAPSED_FUNCTIONS`` are
#: used (issue #17: the fuzzy NI routed every variable token through the same two of six), and
#: *uniform* when the tokens' routing entropy is at least ``UNIFORM_ENTROPY`` of ``log U`` (equal
#: weight on 4.3 of 5 functions gives 0.91, on 3 of 5 0.68). Fixed before any experiment's
#: numbers were read against them.
USED_SHARE = 0.05
COLLAPSED_FUNCTIONS = 2
UNIFORM_ENTROPY = 0.85


def routing(compat: Tensor, tokens: slice | None = None) -> dict:
    """Spread of NI routing ``C`` stacked over function iterations, ``(n_i, B, U, T)``.

    Per iteration, over the tokens selected by ``tokens`` (e.g. the variable tokens):
    ``functions_per_token`` (functions with ``C > 0``, i.e. within the truncation), ``share``
    (each function's share of the tokens' total weight), ``unmatched`` (fraction of tokens no
    function matches), ``entropy`` (mean entropy of ``C`` over functions, in nats; ``log U``
    is uniform routing), ``routing_entropy`` (mean over matched tokens of the entropy of
    ``C_u / sum_u C_u``, divided by ``log U``: 0 for one function, 1 for all alike),
    ``functions_used`` (functions with at least :data:`USED_SHARE` of the weight) and
    ``regime`` (:func:`routing_regime`).
    """
    if compat.dim() != 4:
        raise ValueError(f"compat must be (iterations, batch, U, T), got {tuple(compat.shape)}")
    C = compat.float()
    if tokens is not None:
        C = C[..., tokens]
    U = C.shape[2]
    matched = C > 0
    share = C.sum((1, 3))
    share = share / share.sum(-1, keepdim=True).clamp_min(1e-12)
    entropy = -(C * C.clamp_min(1e-12).log()).sum(2)  # (n_i, B, T)
    total = C.sum(2, keepdim=True)
    p = C / total.clamp_min(1e-12)
    h = -(p * p.clamp_min(1e-12).log()).sum(2) / max(math.log(U), 1e-12)  # (n_i, B, T)
    live = (total[:, :, 0] > 0).float()
    routing_entropy = (h * live).sum((1, 2)) / live.sum((1, 2)).clamp_min(1)
    out = {
        "functions_per_token": matched.sum(2).float().mean((1, 2)).tolist(),
        "share": share.tolist(),
        "unmatched": (~matched.any(2)).float().mean((1, 2)).tolist(),
        "entropy": entropy.mean((1, 2)).tolist(),
        "uniform_entropy": math.log(U),
        "routing_entropy": routing_entropy.tolist(),
        "functions_used": (share >= USED_SHARE).sum(-1).tolist(),
    }
    out["regime"] = routing_regime(out)
    return out


def routing_regime(r: dict) -> str:
    """``"collapsed"``, ``"uniform"`` or ``"modular"`` for a :func:`routing` summary: collapsed
    when at every iteration at most :data:`COLLAPSED_FUNCTIONS` functions are used, uniform when
    at every iteration the routing entropy is at least :data:`UNIFORM_ENTROPY`, else modular
    (the regime in which re-routing, dropping or adding functions can matter)."""
    if all(n <= COLLAPSED_FUNCTIONS for n in r["functions_used"]):
        return "collapsed"
    if all(h >= UNIFORM_ENTROPY for h in r["routing_entropy"]):
        return "uniform"
    return "modular"


def regime_line(entries: list[dict]) -> str:
    """One sentence for a chapter or a results summary: the routing regime of each seed
    (wrapped to the book's column)."""
    by = {}
    for e in entries:
        by.setdefault(e["regime"], []).append(str(e.get("seed", "?")))
    parts = [
        f"{regime} (seed{'s' if len(s) > 1 else ''} {', '.join(s)})" for regime, s in by.items()
    ]
    warn = ""
    if set(by) - {"modular"}:
        warn = (
            " -- where it is collapsed or uniform, the modular routing the claims rely on is weak"
        )
    return wrap("routing after pretraining: " + "; ".join(parts) + warn)


@torch.no_grad()
def ni_routing(model, inputs: Tensor) -> dict:
    """:func:`routing` of a Neural Interpreter's input elements (its CLS tokens left out) on
    ``inputs``, read through the ``ni.compatibility`` probe in evaluation mode."""
    from modnets.probes import trace

    model.eval()
    with trace("ni.compatibility") as t:
        model(inputs.to(next(model.parameters()).device))
    return routing(t.stack("ni.compatibility"), tokens=slice(model.config.num_cls, None))


def routing_shift(before: Tensor, after: Tensor) -> list[float]:
    """How far routing moved, per function iteration: the mean over tokens of the total-variation
    distance ``1/2 sum_u |C_ui - C'_ui|`` between two routings of the same tokens, each stacked
    ``(n_i, B, U, T)``. 0: unchanged; 1: every token's weight moved to other functions."""
    if before.shape != after.shape or before.dim() != 4:
        raise ValueError(f"before and after must be equal (iterations, batch, U, T) shapes, got "
                         f"{tuple(before.shape)} and {tuple(after.shape)}")  # fmt: skip
    return (0.5 * (before.float() - after.float()).abs().sum(2)).mean((1, 2)).tolist()


@torch.no_grad()
def ni_routing_shift(before, after, inputs: Tensor) -> list[float]:
    """:func:`routing_shift` of the input elements (CLS tokens left out) between two Neural
    Interpreters on the same ``inputs`` (e.g. a pretrained model and a finetuned copy, whose
    numbers of CLS tokens may differ)."""
    from modnets.probes import trace

    stacks = []
    for model in (before, after):
        model.eval()
        with trace("ni.compatibility") as t:
            model(inputs.to(next(model.parameters()).device))
        stacks.append(t.stack("ni.compatibility")[..., model.config.num_cls :])
    return routing_shift(*stacks)


def links(P: Tensor) -> dict:
    """Sparsity of NAC link probabilities ``P`` ``(U, U)``: the mean off-diagonal ``P``, and the
    importances ``q_i = sum_j P_ij`` (NAC App. F) with their coefficient of variation (0: every
    module equally connected, so "least connected first" has nothing to go by)."""
    if P.dim() != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"P must be square (U, U), got {tuple(P.shape)}")
    P = P.detach().float()
    U = P.shape[0]
    off = P[~torch.eye(U, dtype=torch.bool, device=P.device)]
    q = P.sum(-1)
    return {
        "mean_offdiagonal_P": off.mean().item(),
        "q": q.tolist(),
        "q_cv": (q.std() / q.mean()).item() if U > 1 else 0.0,
    }


def nfm_reads(weights: list[Tensor]) -> dict:
    """Per NFM read with something to read (in call order; weights ``(B, H, T, 1 + S)``; a read
    of an empty memory passes the state through and records nothing), the mean weight on the
    default slot (reading nothing) and ``S``, the number of candidates per query position
    (every position of every earlier state, after rescaling)."""
    return {
        "default_weight": [w[..., 0].float().mean().item() for w in weights],
        "candidates": [w.shape[-1] - 1 for w in weights],
    }


def circuit(model) -> dict:
    """The learned circuit of a NAC against its graph prior (NAC App. A, F), on the mediators:
    :func:`links` of ``P``, the learned bandwidth, and with a prior its density (mean off-diagonal
    ``P0``) and the Spearman correlation of ``q_i`` with the degree of the prior node module ``i``
    is matched to (the regulariser's permutation): near 1 when the hubs the prior asks for are
    the modules that became hubs; ``nan`` when every prior node has the same degree."""
    from scipy.stats import spearmanr

    from modnets.graphs import match_permutation

    with torch.no_grad():
        P = model.mediator_links().detach().float().cpu()
    out = {**links(P), "bandwidth": float(model.bandwidth)}
    reg = model.graph_prior
    if reg is not None:
        prior = reg.prior.detach().float().cpu()
        U = prior.shape[0]
        out["prior_density"] = prior[~torch.eye(U, dtype=torch.bool)].mean().item()
        matched = prior.sum(-1)[match_permutation(P, prior, reg.refine_steps)]
        q = P.sum(-1)
        rho = spearmanr(q.numpy(), matched.numpy()).statistic if matched.std() > 0 else float("nan")
        out["q_prior_spearman"] = float(rho)
    return out
