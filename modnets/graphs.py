"""Graph priors for Neural Attentive Circuits (NAC §2.2, App. A, eqs. 6-9).

A *graphon* ``W: [0, 1]^2 -> [0, 1]`` describes a family of random graphs; sampled on the canonical
grid ``r_u = u / (U - 1)`` it gives the prior link-probability matrix ``P0_ij = W(r_i, r_j)`` (eq. 7).
:class:`GraphPriorRegularizer` pulls NAC's link probabilities ``P`` (eq. 2) towards ``P0`` up to a
relabelling of the modules (eq. 6), found with the Hungarian method on the cost of eq. 9.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

__all__ = ["GRAPHONS", "graphon", "to_networkx", "hungarian_permutation", "GraphPriorRegularizer"]

GRAPHONS = ("erdos_renyi", "planted_partition", "ring_of_cliques", "scale_free")


def _grid(num_nodes: int) -> Tensor:
    return torch.linspace(0.0, 1.0, num_nodes, dtype=torch.float64)


def _blocks(num_nodes: int, num_blocks: int) -> Tensor:
    return (_grid(num_nodes) * num_blocks).floor().clamp(max=num_blocks - 1).long()


def graphon(name: str, num_nodes: int, **params) -> Tensor:
    """The graphon ``name`` sampled on the grid (eq. 7): a symmetric ``(U, U)`` matrix in [0, 1].

    * ``erdos_renyi(p=0.1)``: every pair linked with probability ``p``.
    * ``planted_partition(num_blocks=4, p_in=0.9, p_out=0.02)``: a stochastic block model with
      equal blocks of consecutive nodes.
    * ``ring_of_cliques(num_cliques=8, p_in=1.0, p_ring=0.05)``: dense cliques, each linked to its
      two neighbours on a ring.
    * ``scale_free(beta=0.5)``: eq. 8, ``U^beta / 16 (i + 1)^-beta (j + 1)^-beta`` clipped to 1. We
      read the ``r_i`` of eq. 8 as the node *index* ``i``: on the unit grid ``(r + 1)^-beta`` varies
      only by a factor ``2^beta`` and no hubs appear, while index weights are the Chung-Lu weights of a
      graph with power-law degrees. The ``U^beta`` factor keeps the hub's expected degree near
      ``U / (16 (1 - beta))`` (``U / 8`` at ``beta = 0.5``); the density falls like ``U^-beta``.
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 2:
        raise ValueError(f"num_nodes must be an int >= 2, got {num_nodes!r}")
    U = num_nodes
    if name == "erdos_renyi":
        W = torch.full((U, U), float(params.get("p", 0.1)), dtype=torch.float64)
    elif name == "planted_partition":
        b = _blocks(U, int(params.get("num_blocks", 4)))
        same = b[:, None] == b[None, :]
        W = torch.where(same, float(params.get("p_in", 0.9)), float(params.get("p_out", 0.02)))
    elif name == "ring_of_cliques":
        n = int(params.get("num_cliques", 8))
        b = _blocks(U, n)
        gap = (b[:, None] - b[None, :]).abs()
        ring = (gap == 1) | (gap == n - 1)
        W = torch.where(b[:, None] == b[None, :], float(params.get("p_in", 1.0)), 0.0)
        W = torch.where(ring, float(params.get("p_ring", 0.05)), W).to(torch.float64)
    elif name == "scale_free":
        beta = float(params.get("beta", 0.5))
        w = (torch.arange(U, dtype=torch.float64) + 1) ** (-beta)
        W = (U**beta / 16) * w[:, None] * w[None, :]
    else:
        raise ValueError(f"name must be one of {GRAPHONS}, got {name!r}")
    return W.clamp(0.0, 1.0).to(torch.float32)


def to_networkx(P: Tensor, threshold: float = 0.5) -> nx.Graph:
    """An undirected graph with an edge wherever ``P_ij > threshold`` (``i != j``)."""
    A = (P.detach().cpu().numpy() > threshold) & ~np.eye(P.shape[0], dtype=bool)
    return nx.from_numpy_array(A.astype(int))


def hungarian_permutation(P: Tensor, prior: Tensor, refine_steps: int = 0) -> Tensor:
    """The relabelling ``sigma`` (module ``v`` -> prior node ``sigma[v]``) of eq. 6.

    Step 0 solves the linear assignment on eq. 9's cost ``C_vw = sum_i (P_vi - P0_wi)^2`` (scipy's
    Hungarian method). Eq. 9 compares rows without relabelling their columns, so it does not in
    general recover a permutation of the prior; each ``refine_steps`` iteration re-solves with the
    columns of ``P0`` relabelled by the current ``sigma``: ``C_vw = sum_i (P_vi - P0_{w, sigma(i)})^2``.
    It is a heuristic (graph matching is hard): a randomly relabelled planted partition is recovered
    exactly; for a relabelled 24-node ring of cliques the cliques are recovered but the ring order
    is not (a residual loss of 0.45-0.72 remains, depending on the relabelling; chapter 8).
    """
    Pn = P.detach().double().cpu()
    P0 = prior.detach().double().cpu()
    sigma = torch.arange(P.shape[0])
    for _ in range(refine_steps + 1):
        cols = P0[:, sigma]
        # sum_i (P_vi - Q_wi)^2 expanded: O(U^2) memory instead of a (U, U, U) difference
        cost = (Pn**2).sum(1)[:, None] + (cols**2).sum(1)[None, :] - 2 * Pn @ cols.T
        rows, assigned = linear_sum_assignment(cost.numpy())
        new = torch.as_tensor(assigned[np.argsort(rows)])
        if torch.equal(new, sigma):
            break
        sigma = new
    return sigma


class GraphPriorRegularizer(nn.Module):
    """``L = sum_{i != j} (P_ij - P0_{sigma(i) sigma(j)})^2`` (NAC eq. 6), ``sigma`` from
    :func:`hungarian_permutation`. The permutation is not differentiated; ``P`` is."""

    def __init__(self, prior: Tensor, refine_steps: int = 3):
        super().__init__()
        if prior.dim() != 2 or prior.shape[0] != prior.shape[1]:
            raise ValueError(f"prior must be a square matrix, got shape {tuple(prior.shape)}")
        self.register_buffer("prior", prior.float())
        self.refine_steps = refine_steps

    def forward(self, P: Tensor) -> Tensor:
        if P.shape != self.prior.shape:
            raise ValueError(f"P must have shape {tuple(self.prior.shape)}, got {tuple(P.shape)}")
        sigma = hungarian_permutation(P, self.prior, self.refine_steps).to(P.device)
        target = self.prior[sigma][:, sigma]
        off = ~torch.eye(P.shape[0], dtype=torch.bool, device=P.device)
        return ((P - target) ** 2)[off].sum()
