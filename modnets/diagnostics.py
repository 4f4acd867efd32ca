"""Numbers that say whether a mechanism a paper relies on is at work, from :mod:`modnets.probes`.

* :func:`routing` -- NI: how spread the routing ``C`` is (collapsed, modular or uniform);
  :func:`ni_routing` runs a model under a trace and applies it to the input elements.
* :func:`links` -- NAC: how sparse the link probabilities ``P`` are and how unequal the
  module importances ``q_i`` (App. F).
* :func:`nfm_reads` -- NFM: how much weight each read puts on reading nothing (the default slot).

Each returns plain floats and lists, ready for the ``"diagnostics"`` of a results file.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["routing", "ni_routing", "links", "nfm_reads"]


def routing(compat: Tensor, tokens: slice | None = None) -> dict:
    """Spread of NI routing ``C`` stacked over function iterations, ``(n_i, B, U, T)``.

    Per iteration, over the tokens selected by ``tokens`` (e.g. the variable tokens):
    ``functions_per_token`` (functions with ``C > 0``, i.e. within the truncation), ``share``
    (each function's share of the tokens' total weight), ``unmatched`` (fraction of tokens no
    function matches) and ``entropy`` (mean entropy of ``C`` over functions, in nats; ``log U``
    is uniform routing).
    """
    if compat.dim() != 4:
        raise ValueError(f"compat must be (iterations, batch, U, T), got {tuple(compat.shape)}")
    C = compat.float()
    if tokens is not None:
        C = C[..., tokens]
    matched = C > 0
    share = C.sum((1, 3))
    share = share / share.sum(-1, keepdim=True).clamp_min(1e-12)
    entropy = -(C * C.clamp_min(1e-12).log()).sum(2)  # (n_i, B, T)
    return {
        "functions_per_token": matched.sum(2).float().mean((1, 2)).tolist(),
        "share": share.tolist(),
        "unmatched": (~matched.any(2)).float().mean((1, 2)).tolist(),
        "entropy": entropy.mean((1, 2)).tolist(),
        "uniform_entropy": float(torch.log(torch.tensor(float(C.shape[2])))),
    }


@torch.no_grad()
def ni_routing(model, inputs: Tensor) -> dict:
    """:func:`routing` of a Neural Interpreter's input elements (its CLS tokens left out) on
    ``inputs``, read through the ``ni.compatibility`` probe in evaluation mode."""
    from modnets.probes import trace

    model.eval()
    with trace("ni.compatibility") as t:
        model(inputs.to(next(model.parameters()).device))
    return routing(t.stack("ni.compatibility"), tokens=slice(model.config.num_cls, None))


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
