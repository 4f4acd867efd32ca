"""Graphons: the link-probability matrices of NAC's graph priors (NAC §2.3, App. B), and their
graphs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:  # networkx loads where a graph is drawn, not with the models
    import networkx as nx

GRAPHONS = ("erdos_renyi", "planted_partition", "ring_of_cliques", "scale_free")


def _grid(num_nodes: int) -> Tensor:
    return torch.linspace(0.0, 1.0, num_nodes, dtype=torch.float64)


def _blocks(num_nodes: int, num_blocks: int) -> Tensor:
    return (_grid(num_nodes) * num_blocks).floor().clamp(max=num_blocks - 1).long()


def graphon(name: str, num_nodes: int, **params) -> Tensor:
    """The graphon ``name`` sampled on the grid (NAC eq. 7): a symmetric ``(U, U)`` matrix in [0, 1].

    * ``erdos_renyi(p=0.1)``: every pair linked with probability ``p``.
    * ``planted_partition(num_blocks=4, p_in=0.9, p_out=0.02)``: a stochastic block model with
      equal blocks of consecutive nodes.
    * ``ring_of_cliques(num_cliques=8, p_in=1.0, p_ring=0.05)``: dense cliques, each linked to its
      two neighbours on a ring.
    * ``scale_free(beta=0.5)``: NAC eq. 8, ``U^beta / 16 (i + 1)^-beta (j + 1)^-beta`` clipped to 1. We
      read the ``r_i`` of NAC eq. 8 as the node *index* ``i``: on the unit grid ``(r + 1)^-beta`` varies
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
    import networkx as nx

    A = (P.detach().cpu().numpy() > threshold) & ~np.eye(P.shape[0], dtype=bool)
    return nx.from_numpy_array(A.astype(int))
