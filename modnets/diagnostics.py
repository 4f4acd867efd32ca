"""Numbers that say whether a mechanism a paper relies on is at work, from :mod:`modnets.probes`.

* :func:`routing` -- NI: how spread the routing ``C`` is, and :func:`routing_regime` whether it
  is collapsed, modular or uniform;
  :func:`ni_routing` runs a model under a trace and applies it to the input elements;
  :func:`path_contrast` (NI Fig. 3) says how differently samples are routed and
  :func:`type_clustering` (NI Fig. 4) how clustered the inferred types are, per iteration.
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

__all__ = [
    "routing",
    "routing_regime",
    "regime_line",
    "ni_routing",
    "path_distances",
    "path_contrast",
    "type_clustering",
    "ni_paths_and_types",
    "links",
    "nfm_reads",
]


#: :func:`routing_regime`: a function is *used* when it carries at least this share of the
#: tokens' total routing weight; routing is *collapsed* when at most ``COLLAPSED_FUNCTIONS`` are
#: used (a fuzzy NI once routed every variable token through the same two of six), and
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


def path_distances(compat: Tensor) -> Tensor:
    """How differently each pair of samples is routed (NI Fig. 3), ``(B, B)``. Each element's
    *path* is its routing ``C`` at every iteration, with one more entry, ``1 - sum_u C_u``, for
    the weight no function takes (so an unmatched element is a route of its own); two samples
    are compared element by element (same position) with the total-variation distance
    ``1/2 sum |p - p'|``, averaged over iterations and positions, for ``compat``
    ``(n_i, B, U, T)``. 0: routed alike; 1: no weight on a shared route anywhere."""
    if compat.dim() != 4 or compat.shape[1] < 2:
        raise ValueError(
            f"compat must be (iterations, batch >= 2, U, T), got {tuple(compat.shape)}"
        )
    C = compat.float()
    none = (1 - C.sum(2, keepdim=True)).clamp_min(0)
    p = torch.cat([C, none], 2)
    p = p / p.sum(2, keepdim=True)  # (n_i, B, U + 1, T)
    p = p.permute(1, 0, 3, 2).flatten(1)  # (B, n_i * T * (U + 1)): one path per sample
    # the L1 distance of whole paths is the sum over elements of 2 TV: divide by 2 n_i T
    return torch.cdist(p, p, p=1) / (2 * C.shape[0] * C.shape[3])


def path_contrast(compat: Tensor, labels: Tensor) -> dict:
    """NI Fig. 3 as numbers, from :func:`path_distances`: the mean distance between two samples
    (``path_distance``), and between samples of different ``labels`` minus between samples of
    the same label (``path_contrast``): above 0 when the routing tells the samples' classes
    apart, about 0 when paths differ only as noise does."""
    d = path_distances(compat)
    same = labels[:, None] == labels[None]
    off = ~torch.eye(len(d), dtype=torch.bool)
    if not (same & off).any() or not (~same).any():
        raise ValueError("labels must give at least two samples of one label and two labels")
    return {
        "path_distance": float(d[off].mean()),
        "path_contrast": float(d[~same].mean() - d[same & off].mean()),
    }


def silhouette(x: Tensor, labels: Tensor) -> float:
    """Mean silhouette of unit vectors ``x`` ``(M, d)`` grouped by ``labels`` ``(M,)`` in the
    distance ``1 - x·x'`` (NI eq. 3's type distance): per point ``(b - a) / max(a, b)`` with ``a``
    its mean distance to its own group, ``b`` to the nearest other group; 0 for a point alone
    in its group, and 0 when there is only one group (no cluster structure to speak of)."""
    groups = labels.unique()
    if len(groups) < 2:
        return 0.0
    d = 1 - x.float() @ x.float().T
    onehot = (labels[:, None] == groups[None]).float()  # (M, G)
    sizes = onehot.sum(0)
    sums = d @ onehot  # (M, G): summed distance to each group
    own = (onehot * sums).sum(1) / (onehot @ sizes - 1).clamp_min(1)
    other = (sums / sizes).masked_fill(onehot.bool(), math.inf).min(1).values
    s = (other - own) / torch.maximum(own, other).clamp_min(1e-12)
    alone = (onehot @ sizes) == 1
    return float(s.masked_fill(alone, 0.0).mean())


def type_clustering(types: Tensor, signatures: Tensor) -> list[float]:
    """NI Fig. 4 as numbers: per function iteration, the :func:`silhouette` of the inferred
    types ``(n_i, M, d_type)`` grouped by their closest signature ``(U, d_type)`` (the colours of
    the paper's t-SNE). Higher: the elements have developed a type."""
    if types.dim() != 3 or signatures.dim() != 2 or types.shape[-1] != signatures.shape[-1]:
        shapes = f"{tuple(types.shape)} and {tuple(signatures.shape)}"
        raise ValueError(
            f"types must be (iterations, elements, d_type), signatures (U, d_type); got {shapes}"
        )
    closest = (types.float() @ signatures.float().T).argmax(-1)
    return [silhouette(t, c) for t, c in zip(types, closest, strict=True)]


@torch.no_grad()
def ni_paths_and_types(model, inputs: Tensor, labels: Tensor, max_elements: int = 4096) -> dict:
    """A Neural Interpreter's :func:`path_contrast` (over ``labels``) and :func:`type_clustering`
    (per iteration, over every script) for its input elements (CLS tokens left out) on
    ``inputs``, in evaluation mode. Each element's type is matched against its own script's
    signatures. The silhouette uses at most ``max_elements`` elements (a fixed draw): its cost
    is their number squared."""
    from modnets.probes import trace

    model.eval()
    with trace("ni.compatibility", "ni.types") as t:
        model(inputs.to(next(model.parameters()).device))
    cls = model.config.num_cls
    compat = t.stack("ni.compatibility")[..., cls:].cpu()
    types = t.stack("ni.types")[:, :, cls:].flatten(1, 2).cpu()  # (iterations, B * T, d_type)
    if types.shape[1] > max_elements:
        keep = torch.randperm(types.shape[1], generator=torch.Generator().manual_seed(0))
        types = types[:, keep[:max_elements]]
    scripts = [s for s in model.scripts for _ in range(s.num_iterations)]
    clustering = [
        type_clustering(t[None], s.signatures.cpu())[0] for t, s in zip(types, scripts, strict=True)
    ]
    return {**path_contrast(compat, labels.cpu()), "type_silhouette": clustering}


def routing_shift(before: Tensor, after: Tensor) -> list[float]:
    """How far routing moved, per function iteration: the mean over tokens of the total-variation
    distance ``1/2 sum_u |C_ui - C'_ui|`` between two routings of the same tokens, each stacked
    ``(n_i, B, U, T)``. 0: unchanged; 1: every token's weight moved to other functions."""
    if before.shape != after.shape or before.dim() != 4:
        raise ValueError(
            f"before and after must be equal (iterations, batch, U, T) shapes, got "
            f"{tuple(before.shape)} and {tuple(after.shape)}"
        )
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
    out = {**links(P), "bandwidth": float(torch.as_tensor(model.bandwidth).detach())}
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
