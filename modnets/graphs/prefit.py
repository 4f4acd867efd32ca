"""Signatures pre-fitted to a graph, as the public NAC code starts its mediators
(``preset_graph_signatures``): wired as a graph of a named kind rather than at random.

The graph is drawn (:func:`signature_graph`), then signatures start orthogonal and take Adam
steps on a hinge loss on their cosine distances ``d_ij = 1 - cos(s_i, s_j)`` (NAC eq. 2's)::

    loss = mean_ij  max(d_ij, tau)    if i ~ j      (linked: pulled below the truncation)
                    max(-d_ij, -tau)  otherwise     (unlinked: pushed beyond it)

so that the kernel truncated at ``tau`` has, as nearly as the signatures allow, the graph's
edges.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: The graphs the public code pre-fits to, with its parameters
SIGNATURE_GRAPHS = ("watts_strogatz", "barabasi_albert")


def signature_graph(name: str, num_nodes: int, seed: int) -> Tensor:
    """The ``(U, U)`` adjacency of a graph of kind ``name`` on ``num_nodes`` nodes: Watts-Strogatz
    with ``k = round(0.1 U)`` neighbours rewired at ``p = 0.4`` (the public Tiny-ImageNet run) or
    Barabási-Albert with ``m = 2`` (its ImageNet run); ``seed`` draws it."""
    import networkx as nx  # only here: a process that trains never loads it

    if name == "watts_strogatz":
        g = nx.watts_strogatz_graph(num_nodes, k=round(0.1 * num_nodes), p=0.4, seed=seed)
    elif name == "barabasi_albert":
        if num_nodes <= 2:
            raise ValueError(f"a Barabási-Albert graph with m = 2 needs > 2 nodes, got {num_nodes}")
        g = nx.barabasi_albert_graph(num_nodes, m=2, seed=seed)
    else:
        raise ValueError(f"name must be one of {SIGNATURE_GRAPHS}, got {name!r}")
    return torch.from_numpy(nx.to_numpy_array(g, nodelist=range(num_nodes))).float()


def prefit_signatures(
    adjacency: Tensor, sig_dim: int, truncation: float, steps: int = 1000, lr: float = 1e-3
) -> Tensor:
    """Signatures ``(U, sig_dim)`` whose cosine distances fall below ``truncation`` on the edges
    of ``adjacency`` and beyond it elsewhere (the hinge loss above; the public code's 1,000 Adam
    steps at ``1e-3``). Draws from torch's global generator."""
    linked = adjacency == 1
    signatures = nn.init.orthogonal_(torch.empty(adjacency.shape[0], sig_dim)).requires_grad_()
    optimiser = torch.optim.Adam([signatures], lr=lr)
    with torch.enable_grad():  # also where a model is built under no_grad
        for _ in range(steps):
            s = F.normalize(signatures, dim=-1)
            d = 1.0 - s @ s.T
            loss = torch.where(linked, d.clamp_min(truncation), (-d).clamp_min(-truncation))
            optimiser.zero_grad()
            loss.mean().backward()
            optimiser.step()
    return signatures.detach()
