"""Neural Function Modules (NFM §3): sparse top-k reads, rescaling, Algorithm 1 and gamma = 0."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modnets.models.nfm import (
    ConvNet,
    NFMAttention,
    NFMNetwork,
    depth_to_space,
    num_candidates,
    read_views,
    rescale,
    space_to_depth,
    topk_softmax,
)

# ----------------------------------------------------------------------------- top-k softmax


def test_topk_softmax_keeps_the_k_largest_and_renormalises():
    scores = torch.randn(200, 12)
    w = torch.softmax(scores, -1)
    for k in range(1, 12):
        out = topk_softmax(scores, k)
        torch.testing.assert_close(out.sum(-1), torch.ones(200))
        assert ((out > 0).sum(-1) == k).all()  # random scores: no ties, exactly k survive
        kept = out > 0
        assert torch.equal(kept, torch.zeros_like(kept).scatter(1, scores.topk(k).indices, True))
        threshold = w.sort(-1, descending=True).values[:, k : k + 1]  # the (k+1)-th largest
        ref = (w - threshold).clamp_min(0)
        torch.testing.assert_close(out, ref / ref.sum(-1, keepdim=True))


def test_topk_softmax_is_the_softmax_when_k_covers_the_candidates():
    scores = torch.randn(5, 6)
    for k in (6, 7, 50):
        torch.testing.assert_close(topk_softmax(scores, k), torch.softmax(scores, -1))
    assert not torch.allclose(topk_softmax(scores, 5), torch.softmax(scores, -1))


def test_topk_softmax_along_a_dim_and_tied_rows():
    scores = torch.randn(3, 7, 4)
    torch.testing.assert_close(
        topk_softmax(scores, 2, dim=1), topk_softmax(scores.transpose(1, 2), 2).transpose(1, 2)
    )
    # every candidate equal (a zero query): nothing stands out -> all weight on the first (the
    # default slot in NFMAttention); rows still sum to 1
    out = topk_softmax(torch.zeros(2, 6), 3)
    assert torch.equal(out, F.one_hot(torch.zeros(2, dtype=torch.long), 6).float())
    with pytest.raises(ValueError, match="k must be"):
        topk_softmax(scores, 0)


def test_exact_topk_keeps_exactly_k_on_ties_lowest_index_first():
    # scores with ties across the k-th place: SAB's threshold drops the tied k-th weight
    scores = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    exact = topk_softmax(scores, 2, mode="exact")
    assert ((exact > 0).sum(-1) == 2).all()
    assert exact[0, :2].gt(0).all() and exact[0, 2:].eq(0).all()  # the tie goes to index 1
    assert exact[1, :2].gt(0).all() and exact[1, 2:].eq(0).all()
    torch.testing.assert_close(exact[0, :2], torch.softmax(scores[0, :2], -1))
    torch.testing.assert_close(exact[1], torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0]))
    sab = topk_softmax(scores, 2)
    assert (sab[0] > 0).sum() == 1  # SAB: the k-th weight ties the (k+1)-th and is dropped
    # without ties the two modes keep the same k arguments
    rand = torch.randn(100, 9)
    for k in (1, 3, 8):
        e, s_ = topk_softmax(rand, k, mode="exact"), topk_softmax(rand, k)
        assert torch.equal(e > 0, s_ > 0) and ((e > 0).sum(-1) == k).all()
        torch.testing.assert_close(e.sum(-1), torch.ones(100))
    torch.testing.assert_close(  # along another dim, too
        topk_softmax(rand.view(100, 9, 1), 3, dim=1, mode="exact")[..., 0],
        topk_softmax(rand, 3, mode="exact"),
    )
    # many ties: the same k as a stable sort (lowest index first), along either dim
    tied = torch.randint(0, 3, (500, 9)).float()
    for k in (1, 2, 4, 8):
        top = tied.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        mask = torch.zeros_like(tied, dtype=torch.bool).scatter(-1, top, True)
        for dim in (-1, 1):
            x = tied if dim == -1 else tied.T.unsqueeze(0)
            e = topk_softmax(x, k, dim=dim, mode="exact")
            e = e if dim == -1 else e[0].T
            assert torch.equal(e > 0, mask)
            torch.testing.assert_close(e.sum(-1), torch.ones(500))
    with pytest.raises(ValueError, match="mode"):
        topk_softmax(rand, 2, mode="sparsemax")


# ----------------------------------------------------------------------------- rescaling


def test_rescale_shapes_and_rules():
    x1 = torch.randn(2, 3, 8)  # 1-D states
    assert rescale(x1, (8,)).shape == (2, 1, 3, 8)
    torch.testing.assert_close(rescale(x1, (8,))[:, 0], x1)  # same size: unchanged
    torch.testing.assert_close(rescale(x1, (32,))[:, 0], F.interpolate(x1, size=32))  # nearest
    assert rescale(x1, (2,)).shape == (2, 4, 3, 2)  # SpaceToDepth: 4 candidates per position
    x2 = torch.randn(2, 3, 16, 16)  # 2-D states
    assert rescale(x2, (4, 4)).shape == (2, 16, 3, 4, 4)
    assert rescale(x2, (64, 64)).shape == (2, 1, 3, 64, 64)
    torch.testing.assert_close(rescale(x2, (48, 48))[:, 0], F.interpolate(x2, size=(48, 48)))
    # mixed: rows shrink (SpaceToDepth), columns grow (nearest)
    mixed = rescale(torch.randn(2, 3, 8, 2), (4, 4))
    assert mixed.shape == (2, 2, 3, 4, 4)
    assert num_candidates((8, 2), (4, 4)) == 2 and num_candidates((32, 32), (4, 4)) == 64
    assert num_candidates((2, 2), (8, 8)) == 1
    with pytest.raises(ValueError, match="SpaceToDepth"):
        rescale(torch.randn(1, 2, 6), (4,))
    with pytest.raises(ValueError, match="spatial dims"):
        rescale(x2, (4,))


def test_read_views_line_states_up_with_the_queries():
    x = torch.randn(2, 3, 8, 2)
    # larger along the first dim, smaller along the second
    qv, sv, cand = read_views((8, 2), (4, 4))
    assert (qv, sv, cand) == ([4, 1, 2, 2], [4, 2, 2, 1], [1])
    # broadcast onto the grid, the state is what rescale copies: candidates, then positions
    grid = x.reshape(2, 3, *sv).expand(2, 3, 4, 2, 2, 2)
    assert torch.equal(grid.permute(0, 3, 1, 2, 4, 5).reshape(2, 2, 3, 4, 4), rescale(x, (4, 4)))
    with pytest.raises(ValueError, match="multiple"):
        read_views((4,), (6,))  # nearest upsampling 4 -> 6 repeats unevenly: no view
    with pytest.raises(ValueError, match="SpaceToDepth"):
        read_views((6,), (4,))
    with pytest.raises(ValueError, match="numbers of dims"):
        read_views((8, 8), (4,))


def test_space_to_depth_loses_nothing():
    x = torch.arange(2 * 3 * 8 * 12, dtype=torch.float).view(2, 3, 8, 12)
    y = space_to_depth(x, (2, 3))
    assert y.shape == (2, 6, 3, 4, 4)
    assert torch.equal(y.flatten().sort().values, x.flatten())  # a permutation of the entries
    assert torch.equal(depth_to_space(y, (2, 3)), x)  # and invertible
    assert torch.equal(rescale(x, (4, 4)), y)
    # each position's candidates are its own window, row-major (pixel_unshuffle's order)
    sq = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(
        rescale(sq, (4, 4)), F.pixel_unshuffle(sq, 2).view(2, 3, 4, 4, 4).transpose(1, 2)
    )
    torch.testing.assert_close(rescale(sq, (4, 4))[0, :, 1, 2, 3], sq[0, 1, 4:6, 6:8].flatten())
    x1 = torch.randn(2, 5, 12)
    assert torch.equal(depth_to_space(space_to_depth(x1, (4,)), (4,)), x1)


# ----------------------------------------------------------------------------- NFMAttention


def reference_attention(attn: NFMAttention, state, memory_states, writers):
    """§3.2.1 written out: project every rescaled state, one head at a time."""
    B, C, *size = state.shape
    H = attn.num_heads
    dk, dv = attn.key_dim // H, attn.value_dim // H
    q = torch.einsum("oc,bc...->b...o", attn.query.weight, state).reshape(B, -1, attn.key_dim)
    keys, values = [], []
    for m, w in zip(memory_states, writers, strict=True):
        r = rescale(m, size)  # (B, S, C_j, *size): rescale first, then project
        keys.append(torch.einsum("oc,bsc...->b...so", w.key.weight, r).flatten(1, -3))
        values.append(torch.einsum("oc,bsc...->b...so", w.value.weight, r).flatten(1, -3))
    T = q.shape[1]
    K = torch.cat([torch.zeros(B, T, 1, attn.key_dim), *keys], 2)  # the default slot first
    V = torch.cat([torch.zeros(B, T, 1, attn.value_dim), *values], 2)
    heads, weights = [], []
    for h in range(H):
        qh, Kh, Vh = (
            q[..., h * dk : (h + 1) * dk],
            K[..., h * dk : (h + 1) * dk],
            V[..., h * dv : (h + 1) * dv],
        )
        w = topk_softmax(torch.einsum("btd,btsd->bts", qh, Kh) / math.sqrt(dk), attn.top_k)
        heads.append(torch.einsum("bts,btsd->btd", w, Vh))
        weights.append(w)
    A = torch.cat(heads, -1)  # (B, T, d_v)
    h1 = attn.out2(torch.relu(attn.out1(A)))  # (B, T, C)
    out = state + attn.gamma * h1.transpose(1, 2).reshape(state.shape)
    return out, torch.stack(weights, 1)


@pytest.mark.parametrize(
    "size, sources",
    [
        ((8, 8), ((8, 8), (16, 16), (2, 2))),  # the same size, SpaceToDepth, upsampling
        ((4, 4), ((8, 2), (2, 8), (4, 4))),  # larger along one dim, smaller along the other
        ((6, 6), ((12, 12), (4, 4), (3, 3))),  # 4 -> 6: nearest upsampling repeats unevenly
        ((6, 6), ((12, 4), (4, 12), (2, 3))),  # unevenly upsampled along one dim only
    ],
)
def test_attention_matches_the_written_out_equations(size, sources):
    torch.manual_seed(0)
    sizes = dict(key_dim=8, value_dim=12, num_heads=2, top_k=3)
    # float64: weights just above the top-k threshold are renormalised differences
    writers = [NFMAttention(4, memory_dim=c, **sizes).double() for c in (6, 5, 3)]
    attn = NFMAttention(4, memory_dim=6, **sizes).double()
    with torch.no_grad():
        attn.gamma.fill_(0.7)
    torch.set_default_dtype(torch.float64)
    try:
        state = torch.randn(3, 4, *size)
        memory_states = [torch.randn(3, c, *s) for c, s in zip((6, 5, 3), sources, strict=True)]
        memory = [w.write(m) for w, m in zip(writers, memory_states, strict=True)]
        out, weights = attn(state, memory, return_weights=True)
        ref, ref_w = reference_attention(attn, state, memory_states, writers)
        empty = attn(state[:0], [(k[:0], v[:0]) for k, v in memory])  # an empty batch
    finally:
        torch.set_default_dtype(torch.float32)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(weights, ref_w)
    assert empty.shape == (0, *state.shape[1:])
    T, S = math.prod(size), sum(num_candidates(s, size) for s in sources)
    assert weights.shape == (3, 2, T, 1 + S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, T, dtype=torch.float64))
    assert ((weights > 0).sum(-1) <= 3).all()  # at most k, the default slot included
    assert ((weights[..., 1:] > 0).sum(-1) <= 3).all()


def test_few_candidates_give_the_plain_softmax_with_the_default_slot():
    torch.manual_seed(1)
    attn = NFMAttention(4, key_dim=4, value_dim=4, num_heads=1, top_k=5)
    state, m = torch.randn(2, 4, 6), torch.randn(2, 4, 6)
    _, w = attn(state, [attn.write(m)], return_weights=True)
    q = attn.query(state.transpose(1, 2))  # (B, T, d)
    k = attn.key(m.transpose(1, 2))
    scores = torch.stack([torch.zeros(2, 6), (q * k).sum(-1) / 2.0], -1)  # default, then m
    torch.testing.assert_close(w[:, 0], torch.softmax(scores, -1))


def test_the_default_slot_lets_a_module_read_nothing():
    torch.manual_seed(2)
    attn = NFMAttention(4, top_k=2)
    with torch.no_grad():
        attn.gamma.fill_(1.0)
    state = torch.zeros(2, 4, 5)  # a zero query scores every candidate 0: nothing stands out
    memory = [attn.write(100 * torch.randn(2, 4, 5)) for _ in range(3)]
    out, w = attn(state, memory, return_weights=True)
    assert torch.equal(w[..., 0], torch.ones_like(w[..., 0]))
    assert torch.equal(out, state)  # no biases: reading nothing adds nothing
    # and with an empty memory there is only the default slot
    x = torch.randn(2, 4, 5)
    out, w = attn(x, [], return_weights=True)
    assert torch.equal(out, x) and w.shape == (2, 4, 5, 1)
    # a real query reads something
    assert not torch.allclose(attn(x, memory), x)


def test_keys_are_projected_before_rescaling_as_if_after():
    """A position-wise linear map commutes with nearest upsampling and SpaceToDepth."""
    attn = NFMAttention(4, memory_dim=6)
    m = torch.randn(2, 6, 8, 8)
    for size in ((2, 2), (8, 8), (32, 32)):
        before = rescale(attn.write(m)[0], size)
        after = torch.einsum("oc,bsc...->bso...", attn.key.weight, rescale(m, size))
        torch.testing.assert_close(before, after)


def test_batch_norm_before_the_activation():
    torch.manual_seed(3)
    attn = NFMAttention(4, batch_norm=True)
    assert isinstance(attn.norm, nn.BatchNorm1d)
    with torch.no_grad():
        attn.gamma.fill_(1.0)
    x, m = torch.randn(4, 4, 6, 6), torch.randn(4, 4, 3, 3)
    out = attn(x, [attn.write(m)])
    assert out.shape == x.shape and attn.norm.num_batches_tracked == 1
    A, _ = attn._attend(x, [attn.write(m)])
    h1 = torch.relu(attn.norm(attn.out1(A.transpose(1, 2)).transpose(1, 2)))
    ref = x + (attn.out2(h1.transpose(1, 2))).transpose(1, 2).reshape(x.shape)
    torch.testing.assert_close(out, ref)


# ----------------------------------------------------------------------------- Algorithm 1


def conv_blocks(channels=(3, 4, 5, 6)):
    """1-D modules that halve the length: sizes 16 -> 8 -> 4 -> 2."""
    return [
        nn.Sequential(nn.Conv1d(a, b, 3, stride=2, padding=1), nn.Tanh())
        for a, b in zip(channels[:-1], channels[1:], strict=True)
    ]


@pytest.mark.parametrize("placement", ["before", "after"])
def test_gamma_zero_keeps_the_base_network(placement):
    """gamma = 0: every pass computes what the wrapped modules compute, so NFM can be added to a
    trained network without changing it."""
    torch.manual_seed(4)
    blocks = conv_blocks()
    base = nn.Sequential(*blocks)
    net = NFMNetwork(blocks, (3, 4, 5, 6), passes=2, placement=placement, top_k=2)
    for p in net.attention.parameters():  # random attention weights, gamma left at 0
        if p.dim() > 0:
            nn.init.normal_(p)
    x = torch.randn(2, 3, 16)
    out = net(x, return_details=True)
    torch.testing.assert_close(out.output, base(x))
    h = x
    for i, b in enumerate(blocks):
        h = b(h)
        torch.testing.assert_close(out.states[0][i], h)  # the first pass is the base network
        torch.testing.assert_close(out.states[1][i], h)  # and so is the second
    with torch.no_grad():
        net.attn(1, 0).gamma.fill_(0.5)
    assert not torch.allclose(net(x), base(x))  # gamma != 0 changes it


def test_convnet_with_nfm_starts_as_the_convnet():
    torch.manual_seed(5)
    cnn = ConvNet(width=2, image_size=32, num_blocks=3).eval()
    x = torch.randn(2, 1, 32, 32)
    for placement in ("after", "before"):
        nfm = cnn.with_nfm(passes=2, top_k=5, placement=placement).eval()
        torch.testing.assert_close(nfm(x), cnn(x))
    with pytest.raises(ValueError, match="already has NFM"):
        nfm.with_nfm()


@pytest.mark.parametrize("passes", [1, 2])
def test_attendable_states_at_each_step(passes):
    """Algorithm 1: the memory grows by one state per module and keeps every earlier pass."""
    N = 3
    for placement in ("before", "after"):
        net = NFMNetwork(conv_blocks(), (3, 4, 5, 6), passes=passes, placement=placement)
        expected = list(range(passes * N))  # (k - 1) N + (i - 1)
        out = net(torch.randn(2, 3, 16), return_details=True)
        assert out.sources == expected == net.memory_sizes()
        assert out.reads.shape == (passes * N, 1 + passes * N)
        for row, n in zip(out.reads, expected, strict=True):
            assert (row[1 + n :] == 0).all()  # states not yet written are not read
            torch.testing.assert_close(row.sum(), torch.tensor(1.0))
    # attendable positions: h1..h3 have sizes 8, 4, 2; "before" reads at 16, 8, 4 (h0..h2),
    # "after" at 8, 4, 2 (the module outputs)
    written = [(8,), (4,), (2,)] * 2
    for placement, reads_at, literal in (
        ("before", [(16,), (8,), (4,)], [0, 1, 3, 3, 4, 7]),
        ("after", [(8,), (4,), (2,)], [0, 2, 6, 3, 6, 13]),
    ):
        net = NFMNetwork(conv_blocks(), (3, 4, 5, 6), passes=2, placement=placement)
        out = net(torch.randn(2, 3, 16), return_details=True)
        expected = [
            sum(num_candidates(s, reads_at[i]) for s in written[: k * N + i])
            for k in range(2)
            for i in range(N)
        ]
        assert out.candidates == expected == literal


def test_later_passes_read_earlier_passes():
    """Top-down feedback: perturbing the last module's output of pass 1 changes the first
    module's output in pass 2, only through the NFM read."""
    torch.manual_seed(6)
    net = NFMNetwork(conv_blocks(), (3, 4, 5, 6), passes=2, top_k=5)
    with torch.no_grad():
        for k in range(2):
            for i in range(3):
                net.attn(k, i).gamma.fill_(1.0)
    x = torch.randn(2, 3, 16)
    out = net(x, return_details=True)
    assert (out.reads[3, 1:4] > 0).all()  # pass 2, module 1 reads pass 1's states
    moved = net.block(0, 2)
    with torch.no_grad():
        moved[0].bias.add_(1.0)  # change h3 of pass 1 only
    out2 = net(x, return_details=True)
    torch.testing.assert_close(out2.states[0][0], out.states[0][0])
    assert not torch.allclose(out2.states[1][0], out.states[1][0])


def test_parameters_per_pass_or_shared():
    blocks = conv_blocks()
    n_block = sum(p.numel() for b in blocks for p in b.parameters())
    shared = NFMNetwork(
        conv_blocks(), (3, 4, 5, 6), passes=3, share_blocks=True, share_attention=True
    )
    per_pass = NFMNetwork(blocks, (3, 4, 5, 6), passes=3)
    n_attn = sum(p.numel() for p in shared.attention.parameters())
    assert sum(p.numel() for p in shared.parameters()) == n_block + n_attn
    assert sum(p.numel() for p in per_pass.parameters()) == 3 * (n_block + n_attn)
    assert shared.block(0, 1) is shared.block(2, 1) and shared.attn(0, 1) is shared.attn(2, 1)
    # per pass: copies that start equal and then are free to differ
    b0, b2 = per_pass.block(0, 1), per_pass.block(2, 1)
    assert b0 is not b2 and b0 is blocks[1]
    for p, q in zip(b0.parameters(), b2.parameters(), strict=True):
        assert torch.equal(p, q) and p is not q
    x = torch.randn(1, 3, 16)
    with pytest.raises(ValueError, match="passes"):
        per_pass(x, passes=4)
    shared(x, passes=5)  # shared parameters run any number of passes
    # each switch on its own shares only what it names
    for blocks_too, attention_too in ((True, False), (False, True)):
        net = NFMNetwork(
            conv_blocks(),
            (3, 4, 5, 6),
            passes=3,
            share_blocks=blocks_too,
            share_attention=attention_too,
        )
        assert (net.block(0, 1) is net.block(2, 1)) is blocks_too
        assert (net.attn(0, 1) is net.attn(2, 1)) is attention_too


def test_every_attention_parameter_learns_once_gamma_is_nonzero():
    """All but two: the first read of the first pass, whose memory is still empty, and the keys
    and values of the last module of the last pass, whose output no one reads."""
    torch.manual_seed(7)
    for placement in ("after", "before"):
        nfm = {"passes": 2, "top_k": 2, "placement": placement}
        net = ConvNet(width=2, image_size=32, num_blocks=3, nfm=nfm)
        with torch.no_grad():
            for p in net.nfm.attention.parameters():
                if p.dim() == 0:
                    p.fill_(0.5)
        net(torch.randn(4, 1, 32, 32)).square().sum().backward()
        for name, p in net.nfm.attention.named_parameters():
            first_read = name.startswith("0.0.") and not name.startswith(("0.0.key", "0.0.val"))
            if first_read or name.startswith(("1.2.key", "1.2.value")):
                assert p.grad is None, name
            else:
                assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_gradcheck_float64():
    torch.manual_seed(8)
    attn = NFMAttention(3, memory_dim=2, key_dim=4, value_dim=4, num_heads=2, top_k=2).double()
    with torch.no_grad():
        attn.gamma.fill_(0.8)
    state = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    m1 = torch.randn(2, 2, 8, dtype=torch.float64, requires_grad=True)  # SpaceToDepth
    m2 = torch.randn(2, 2, 2, dtype=torch.float64, requires_grad=True)  # upsampled

    def f(s, a, b):
        return attn(s, [attn.write(a), attn.write(b)])

    assert torch.autograd.gradcheck(f, (state, m1, m2))
    net = NFMNetwork(conv_blocks((2, 3, 3)), (2, 3, 3), passes=2, top_k=2).double()
    with torch.no_grad():
        for p in net.attention.parameters():
            if p.dim() == 0:
                p.fill_(0.6)
    x = torch.randn(2, 2, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(net, (x,))


# ----------------------------------------------------------------------------- configuration


def test_convnet_shapes_and_reads():
    torch.manual_seed(9)
    for block, pool in (("plain", "max"), ("preact", "flatten"), ("plain", "mean")):
        cnn = ConvNet(width=2, block=block, pool=pool, norm=True, image_size=32)
        x = torch.randn(3, 1, 32, 32)
        assert cnn(x).shape == (3, 10)
        nfm = cnn.with_nfm(passes=2)
        logits, out = nfm(x, return_details=True)
        assert logits.shape == (3, 10) and out.reads.shape == (8, 9)
        assert [s.shape[-1] for s in out.states[1]] == [16, 8, 4, 2]
    with pytest.raises(ValueError, match="return_details"):
        cnn(x, return_details=True)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: NFMAttention(8, num_heads=3, key_dim=12, value_dim=16), "value_dim"),
        (lambda: NFMAttention(8, num_heads=3), "key_dim"),
        (lambda: NFMAttention(8, top_k=0), "top_k"),
        (lambda: NFMAttention(0), "dim"),
        (lambda: NFMAttention(8, activation="tanh"), "activation"),
        (lambda: NFMAttention(8, hidden_dim=-1), "hidden_dim"),
        (lambda: NFMNetwork(conv_blocks(), (3, 4, 5)), "dims"),
        (lambda: NFMNetwork(conv_blocks(), (3, 4, 5, 6), passes=0), "passes"),
        (lambda: NFMNetwork(conv_blocks(), (3, 4, 5, 6), placement="inside"), "placement"),
        (lambda: NFMNetwork(conv_blocks(), (3, 4, 5, 6), topk=3), "unknown"),
        (lambda: NFMNetwork([], (3,)), "blocks"),
        (lambda: ConvNet(block="dense"), "block"),
        (lambda: ConvNet(pool="sum"), "pool"),
        (lambda: ConvNet(image_size=40), "image_size"),
        (lambda: ConvNet(width=0), "width"),
    ],
)
def test_bad_configs_name_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError, match="num_heads must be a positive int, got float"):
        NFMAttention(8, num_heads=2.0)
    with pytest.raises(TypeError, match="passes"):
        NFMNetwork(conv_blocks(), (3, 4, 5, 6), passes=True)
    with pytest.raises(TypeError, match="batch_norm"):
        NFMAttention(8, batch_norm=1)
    with pytest.raises(TypeError, match="state must be a torch.Tensor"):
        NFMAttention(4)([[0.0] * 4], [])
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        NFMNetwork(conv_blocks(), (3, 4, 5, 6))(None)


def test_bad_inputs_name_the_argument():
    attn = NFMAttention(4, memory_dim=6)
    with pytest.raises(ValueError, match="dim=4"):
        attn(torch.randn(2, 5, 3), [])
    with pytest.raises(ValueError, match="memory_dim=6"):
        attn.write(torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="key_dim"):
        attn(torch.randn(2, 4, 3), [(torch.randn(2, 8, 3), torch.randn(2, 16, 3))])
    with pytest.raises(ValueError, match="spatial dims"):
        attn(torch.randn(2, 4, 3), [attn.write(torch.randn(2, 6, 3, 3))])
    net = NFMNetwork(conv_blocks(), (3, 4, 5, 6))
    with pytest.raises(ValueError, match="x must be"):
        net(torch.randn(2, 4, 16))
    with pytest.raises(ValueError, match="dims says"):
        NFMNetwork(conv_blocks(), (3, 4, 5, 7))(torch.randn(2, 3, 16))


# ----------------------------------------------------------------------------- reader-side projections


def _open_gates(net: NFMNetwork) -> None:
    with torch.no_grad():
        for attn in net.modules():
            if isinstance(attn, NFMAttention):
                attn.gamma.fill_(0.7)


def test_reader_projections_equal_the_writers_when_copied_from_them():
    # NFM §3.2.1: each reading module has its own W_k, W_v per source. Given the writers'
    # weights, the reads (and so the output) are those of writer-side projections.
    torch.manual_seed(0)
    dims = (3, 4, 5, 6)
    writer = NFMNetwork(conv_blocks(dims), dims, passes=2, share_attention=True, top_k=2)
    _open_gates(writer)
    reader = NFMNetwork(
        copy.deepcopy(conv_blocks(dims)),
        dims,
        passes=2,
        share_attention=True,
        projections="reader",
        top_k=2,
    )
    reader.blocks.load_state_dict(writer.blocks.state_dict())
    with torch.no_grad():
        for i, r in enumerate(reader.attention[0]):
            w = writer.attention[0][i]
            r.gamma.copy_(w.gamma)
            for name in ("query", "out1", "out2"):
                getattr(r, name).weight.copy_(getattr(w, name).weight)
            for j in range(len(dims) - 1):  # reader i's projection of source j = writer j's
                r.source_keys[j].weight.copy_(writer.attention[0][j].key.weight)
                r.source_values[j].weight.copy_(writer.attention[0][j].value.weight)
    assert reader.attention[0][0].key is None  # readers project: no writer-side weights
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(reader(x), writer(x))
    with pytest.raises(ValueError, match="project"):
        reader.attention[0][0].write(torch.randn(2, 4, 8))


def test_each_reader_has_its_own_projection_of_a_source():
    torch.manual_seed(1)
    dims = (3, 4, 5, 6)
    net = NFMNetwork(conv_blocks(dims), dims, passes=2, projections="reader", top_k=2)
    _open_gates(net)
    x = torch.randn(2, 3, 16)
    net(x).square().sum().backward()
    first, last = net.attn(1, 0), net.attn(1, 2)  # pass 2: modules 1 and 3 both read h(1), h(2)
    assert [lin.in_features for lin in first.source_keys] == [4, 5, 6]  # one per source
    for attn in (first, last):
        assert attn.source_keys[0].weight.grad.abs().sum() > 0  # each reader's own W_k learns
    assert first.source_keys[0] is not last.source_keys[0]
    with torch.no_grad():  # changing one reader's projection changes only what it reads
        h = torch.randn(2, 4, 8)
        before = last.project(0, h)
        first.source_keys[0].weight.add_(1.0)
        torch.testing.assert_close(last.project(0, h), before)
        assert not torch.allclose(first.project(0, h)[0], before[0])
    with pytest.raises(ValueError, match="projections"):
        NFMNetwork(conv_blocks(dims), dims, projections="both")


def test_nfm_around_a_cnn_trains_under_autocast_and_still_refuses_a_wrong_dtype():
    """Under autocast (bf16 on a GPU, or here on the CPU) the NFM reads the CNN's bf16
    activations: they are what autocast hands it, not a caller's mistake. Outside autocast a
    bf16 input to a float32 model is still refused, naming the conversion."""
    from modnets.models.nfm import ConvNet

    torch.manual_seed(0)
    net = ConvNet(1, 10, width=8, nfm=dict(passes=2, top_k=2, num_heads=2, key_dim=8, value_dim=8))
    x = torch.randn(2, 1, 64, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
    out.float().square().mean().backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    with pytest.raises(TypeError, match=r"pass x\.to\(torch\.float32\)"):
        net(x.bfloat16())
