"""NAC App. A: graphons (eqs. 7-8) and the graph-prior regulariser (eqs. 6, 9)."""

import itertools

import numpy as np
import pytest
import torch

from modnets.graphs import (
    GRAPHONS,
    GraphPriorRegularizer,
    graphon,
    hungarian_permutation,
    to_networkx,
)


@pytest.mark.parametrize("name", GRAPHONS)
def test_graphons_are_symmetric_probabilities(name):
    W = graphon(name, 64)
    assert W.shape == (64, 64)
    assert torch.equal(W, W.T)
    assert (W >= 0).all() and (W <= 1).all()


def test_graphon_defining_properties():
    assert graphon("erdos_renyi", 10, p=0.3).unique().tolist() == pytest.approx([0.3])
    sbm = graphon("planted_partition", 40, num_blocks=4, p_in=0.8, p_out=0.1)
    assert sbm[0, 9] == pytest.approx(0.8) and sbm[0, 10] == pytest.approx(0.1)  # blocks of 10
    ring = graphon("ring_of_cliques", 40, num_cliques=4, p_in=1.0, p_ring=0.2)
    block = torch.stack(
        [
            torch.stack([ring[10 * a : 10 * a + 10, 10 * b : 10 * b + 10].mean() for b in range(4)])
            for a in range(4)
        ]
    )
    expected = torch.tensor(
        [[1, 0.2, 0, 0.2], [0.2, 1, 0.2, 0], [0, 0.2, 1, 0.2], [0.2, 0, 0.2, 1]]
    )
    torch.testing.assert_close(block, expected)
    sf = graphon("scale_free", 320)
    degrees = sf.sum(1)
    assert (degrees[:-1] >= degrees[1:]).all()  # hubs first
    assert degrees.max() / degrees.median() > 5  # heavy tail
    with pytest.raises(ValueError, match="name"):
        graphon("small_world", 10)


def test_networkx_conversion():
    G = to_networkx(graphon("ring_of_cliques", 12, num_cliques=3, p_ring=0.0))
    assert G.number_of_nodes() == 12 and nx_components(G) == 3


def nx_components(G):
    import networkx as nx

    return nx.number_connected_components(G)


def test_hungarian_agrees_with_brute_force():
    rng = torch.Generator().manual_seed(0)
    for U in (3, 5, 6):
        P, P0 = torch.rand(U, U, generator=rng), torch.rand(U, U, generator=rng)
        cost = ((P.double()[:, None, :] - P0.double()[None, :, :]) ** 2).sum(-1)
        best = min(
            itertools.permutations(range(U)), key=lambda s: sum(cost[v, s[v]] for v in range(U))
        )
        sigma = hungarian_permutation(P, P0)
        assert sum(cost[v, sigma[v]] for v in range(U)) == pytest.approx(
            sum(cost[v, best[v]] for v in range(U))
        )


def test_regularizer_zero_at_prior_and_at_permuted_block_prior():
    prior = graphon("planted_partition", 24, num_blocks=3, p_in=0.9, p_out=0.05)
    reg = GraphPriorRegularizer(prior)
    assert reg(prior).item() == pytest.approx(0.0, abs=1e-10)
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(1))
    assert reg(prior[perm][:, perm]).item() == pytest.approx(0.0, abs=1e-10)
    noisy = (prior + 0.1 * torch.rand(24, 24)).clamp(0, 1)
    assert reg(noisy).item() > 0


def test_regularizer_gradient_moves_p_towards_prior():
    prior = graphon("ring_of_cliques", 16, num_cliques=4)
    P = torch.rand(16, 16, requires_grad=True)
    reg = GraphPriorRegularizer(prior)
    loss = reg(P)
    loss.backward()
    assert torch.isfinite(P.grad).all() and P.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="shape"):
        reg(torch.rand(4, 4))
    assert np.isfinite(loss.item())
