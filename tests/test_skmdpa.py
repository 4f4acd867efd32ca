"""NAC eqs. 2-3 (SKMDPA): the kernel gates messages, sampling is seeded, evaluation deterministic."""

import math

import pytest
import torch
import torch.nn.functional as F

from modnets.nn.skmdpa import SKMDPA, concrete_sample, link_probabilities


def inputs(B=2, U=5, d=8, ds=4):
    return torch.randn(B, U, d), torch.randn(B, U, d), torch.randn(B, U, d), torch.randn(U, ds)


def test_link_probabilities_equation_2():
    s = torch.randn(5, 4)
    P = link_probabilities(s, s, bandwidth=0.3)
    cos = F.cosine_similarity(s[:, None], s[None], dim=-1)
    torch.testing.assert_close(P, torch.exp(-(1 - cos) / 0.3))
    torch.testing.assert_close(P.diagonal(), torch.ones(5))
    assert torch.allclose(P, P.T) and (P > 0).all() and (P <= 1 + 1e-6).all()


def test_against_reference_and_rows_sum_to_one():
    attn = SKMDPA(num_heads=2, bandwidth=0.5).eval()
    q, k, v, s = inputs()
    out = attn(q, k, v, s, s)
    P = link_probabilities(s, s, 0.5)
    K_hat = P / (1e-6 + P.sum(-1, keepdim=True))
    ref = []
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        A = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(4)
        W = torch.softmax(A + torch.log(K_hat), dim=-1)
        assert torch.allclose(W.sum(-1), torch.ones(2, 5))
        ref.append(W @ v[..., sl])
    torch.testing.assert_close(out, torch.cat(ref, dim=-1))


def test_zero_kernel_blocks_the_message():
    attn = SKMDPA(num_heads=1).eval()
    q, k, v, s = inputs()
    edges = torch.ones(5, 5, dtype=torch.bool)
    edges[1, 3] = False  # module 3 may not send to module 1
    out = attn(q, k, v, s, s, edge_mask=edges)
    v2 = v.clone()
    v2[:, 3] += 100.0
    out2 = attn(q, k, v2, s, s, edge_mask=edges)
    torch.testing.assert_close(out2[:, 1], out[:, 1])
    assert not torch.allclose(out2[:, 0], out[:, 0])
    dropped = attn(q, k, v2, s, s, key_mask=torch.tensor([True, True, True, False, True]))
    torch.testing.assert_close(
        dropped, attn(q, k, v, s, s, key_mask=torch.tensor([True, True, True, False, True]))
    )


def test_evaluation_deterministic_training_seeded():
    attn = SKMDPA(num_heads=2, temperature=0.5)
    q, k, v, s = inputs()
    attn.eval()
    assert torch.equal(attn(q, k, v, s, s), attn(q, k, v, s, s))
    attn.train()
    torch.manual_seed(3)
    a = attn(q, k, v, s, s)
    torch.manual_seed(3)
    b = attn(q, k, v, s, s)
    torch.manual_seed(4)
    c = attn(q, k, v, s, s)
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_concrete_sample_mean_and_sharpness():
    torch.manual_seed(0)
    p = torch.full((20000,), 0.3)
    soft = concrete_sample(p, temperature=1.0)
    hard = concrete_sample(p, temperature=0.05)
    assert abs((hard > 0.5).float().mean().item() - 0.3) < 0.02  # P(K > 1/2) = p
    assert ((hard < 0.05) | (hard > 0.95)).float().mean() > (
        (soft < 0.05) | (soft > 0.95)
    ).float().mean()


def test_threshold_kernel_and_gradcheck():
    s = torch.randn(4, 3, dtype=torch.float64)
    q, k, v = (torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    attn = SKMDPA(num_heads=2, bandwidth=0.7).eval()
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: attn(q, k, v, s, s), (q, k, v, s.requires_grad_())
    )
    thr = SKMDPA(eval_kernel="threshold", bandwidth=0.7).eval()
    assert set(thr.kernel(link_probabilities(s, s, 0.7)).unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_heads": 0}, "num_heads"),
        ({"bandwidth": 0}, "bandwidth"),
        ({"temperature": -1}, "temperature"),
        ({"eval_kernel": "mean"}, "eval_kernel"),
    ],
)
def test_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SKMDPA(**kwargs)


def test_query_without_links_reads_nothing():
    """Every key of query 0 masked: its message is zero (not plain attention, not NaN)."""
    attn = SKMDPA(num_heads=2).eval()
    q, k, v, s = inputs()
    edges = torch.ones(5, 5, dtype=torch.bool)
    edges[0] = False
    out = attn(q, k, v, s, s, edge_mask=edges)
    assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))
    assert torch.isfinite(out).all() and out[:, 1:].abs().sum() > 0
    # a masked key gets exactly zero weight
    keys = torch.ones(5, dtype=torch.bool)
    keys[3] = False
    v2 = v.clone()
    v2[:, 3] += 100.0
    torch.testing.assert_close(
        attn(q, k, v, s, s, key_mask=keys), attn(q, k, v2, s, s, key_mask=keys)
    )


def test_untruncated_kernel_has_a_mean_floor():
    """NAC eq. 2 as printed: mean off-diagonal P >= exp(-(1 + 1/(U-1))) for any signatures (Jensen +
    sum_ij cos_ij = |sum_i s_i|^2 >= 0), even for signatures pushed apart."""
    U = 32
    floor = math.exp(-(1 + 1 / (U - 1)))
    for s in (torch.randn(U, 8), torch.eye(U), torch.cat([torch.eye(16), -torch.eye(16)])):
        P = link_probabilities(s, s, 1.0)
        off = ~torch.eye(U, dtype=torch.bool)
        assert P[off].mean() >= floor - 1e-6


def test_truncation_gives_exact_zeros_and_straight_through_gradients():
    torch.manual_seed(0)
    s = torch.randn(12, 4, requires_grad=True)
    d = 1 - F.cosine_similarity(s[:, None], s[None], dim=-1).detach()
    far = d > 0.9
    assert far.any() and (~far).any()
    for st in (False, True):
        P = link_probabilities(s, s, 1.0, truncation=0.9, straight_through=st)
        assert (P[far] == 0).all() and (P[~far] > 0).all()  # exact zeros, nothing else changed
        torch.testing.assert_close(P[~far], torch.exp(-d[~far]))
        # a loss on the truncated pairs only: its gradient reaches the signatures only through
        # the straight-through path
        (g,) = torch.autograd.grad(P[far].sum(), s, allow_unused=True)
        if st:
            assert g is not None and g.abs().sum() > 0
        else:
            assert g is None or g.abs().sum() == 0


def test_learnable_bandwidth_gets_a_gradient_and_does_not_move_the_cut():
    s = torch.randn(10, 4)
    bw = torch.tensor(0.5, requires_grad=True)
    P = link_probabilities(s, s, bw, truncation=0.9)
    P.sum().backward()
    assert bw.grad is not None and bw.grad != 0
    zeros = link_probabilities(s, s, 2.0, truncation=0.9) == 0
    assert torch.equal(P.detach() == 0, zeros)  # the cut is on the distance, not on d / epsilon


def test_kernel_sampled_per_example_in_training_only():
    torch.manual_seed(0)
    attn = SKMDPA(num_heads=1, truncation=0.9)
    s = torch.randn(6, 4)
    P = attn.probabilities(s, s)
    K = attn.train().kernel(P, batch=3)
    assert K.shape == (3, 6, 6)
    assert not torch.allclose(K[0], K[1]) and not torch.allclose(K[1], K[2])
    assert (K[:, P == 0] == 0).all()  # a truncated link is never sampled
    torch.testing.assert_close(attn.eval().kernel(P, batch=3), P)  # deterministic, shared
    shared = SKMDPA(num_heads=1, per_example=False).train().kernel(P, batch=3)
    assert shared.shape == (6, 6)
    # in the attention: two identical examples get different outputs in training only
    q, k, v, _ = inputs(B=1, U=6)
    q, k, v = (t.expand(2, -1, -1) for t in (q, k, v))
    out = attn.train()(q, k, v, s, s)
    assert not torch.allclose(out[0], out[1])
    out = attn.eval()(q, k, v, s, s)
    torch.testing.assert_close(out[0], out[1])


def _fit_scale_free(straight_through: bool, U: int = 64, steps: int = 1500) -> float:
    """Chapter 7's fit: 64 signatures and a learned bandwidth, truncated at 0.9, fitted to the
    scale-free prior by NAC eq. 6 per pair; the final loss of the deterministic kernel."""
    from modnets.graphs import GraphPriorRegularizer, graphon

    reg = GraphPriorRegularizer(graphon("scale_free", U))
    torch.manual_seed(0)
    sig = torch.randn(U, 16, requires_grad=True)
    eps = torch.tensor(1.0, requires_grad=True)
    opt = torch.optim.Adam([sig, eps], lr=1e-2)
    for _ in range(steps):
        loss = reg(link_probabilities(sig, sig, eps, 0.9, straight_through)) / (U * (U - 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return (reg(link_probabilities(sig, sig, eps, 0.9)) / (U * (U - 1))).item()


@pytest.mark.long
def test_the_experiments_take_the_straight_through_that_fits_the_prior_better():
    """Chapter 7 decides whether the Tiny-ImageNet NACs pass a straight-through gradient to
    truncated links: whichever kernel ends nearer the scale-free prior."""
    from modnets.experiments.tiny_imagenet import CONFIGS
    from modnets.models.nac import NACConfig

    better = _fit_scale_free(True) < _fit_scale_free(False)
    for name, experiment in CONFIGS.items():
        assert experiment.train.nac.get("straight_through", NACConfig.straight_through) == better, (
            name
        )
