"""Neural Interpreters (chapters 2-4): the properties the paper derives, and the details a failed
public reproduction got wrong (mask direction, normalisation, per-function streams, renormalisation)."""

import math

import pytest
import torch
import torch.nn.functional as F

import modnets
from modnets.nn import random_signatures
from modnets.nn.config import set_fused_attn, use_fused_attn


def tiny_config(**kw):
    base = dict(
        dim=16,
        code_dim=8,
        type_dim=4,
        num_functions=3,
        num_scripts=2,
        num_iterations=2,
        num_locs=2,
        num_heads=2,
        truncation=1.5,
        input_kind="vector",
        num_elements=5,
        num_cls=2,
        num_outputs=3,
    )
    base.update(kw)
    return modnets.NIConfig(**base)


def streams(B=2, U=3, T=5, d=16, dc=8):
    x = torch.randn(B, U, T, d)
    codes = torch.randn(U, dc)
    compat = torch.rand(B, U, T)
    compat = compat / compat.sum(1, keepdim=True)
    return x, codes, compat


# ---------------------------------------------------------------- type matching (NI eqs. 2-3)


def test_types_and_signatures_have_unit_norm():
    ti = modnets.TypeInference(16, 5)
    t = ti(torch.randn(3, 7, 16) * 10)
    torch.testing.assert_close(t.norm(dim=-1), torch.ones(3, 7))
    s = random_signatures(11, 5)
    torch.testing.assert_close(s.norm(dim=-1), torch.ones(11))
    script = modnets.Script(tiny_config(learn_signatures=True))
    with torch.no_grad():
        script.signature_chunks[0].mul_(3.0)  # a trained signature drifting off the sphere
    torch.testing.assert_close(script.signatures.norm(dim=-1), torch.ones(3))


def test_mask_direction_close_types_pass_far_types_are_cut():
    tm = modnets.TypeMatching(truncation=0.5, sigma=0.7)
    s = random_signatures(3, 4)
    far = -s[0]  # distance 2 from s_0
    types = torch.stack([s[0], far])[None]  # (1, T=2, 4)
    k = tm.kernel(types, s)
    assert k[0, 0, 0].item() == pytest.approx(1.0)  # type == signature -> C~ = exp(0) = 1
    assert k[0, 0, 1].item() == 0.0  # beyond tau -> 0
    d = tm.distance(types, s)
    expected = torch.where(d < 0.5, torch.exp(-d / 0.7), torch.zeros_like(d))
    torch.testing.assert_close(k, expected)


def test_compatibilities_normalised_over_functions():
    tm = modnets.TypeMatching(truncation=1.2, eps=1e-6)
    types = F.normalize(torch.randn(4, 9, 6), dim=-1)
    s = random_signatures(5, 6)
    C = tm(types, s)
    assert C.shape == (4, 5, 9)
    assert (C >= 0).all() and (C.sum(1) <= 1 + 1e-6).all()
    k = tm.kernel(types, s)
    torch.testing.assert_close(C, k / (1e-6 + k.sum(1, keepdim=True)))
    matched = k.sum(1) > 0.1
    torch.testing.assert_close(C.sum(1)[matched], torch.ones(int(matched.sum())), atol=1e-4, rtol=0)


def test_type_matching_straight_through_passes_gradient_beyond_tau():
    s = random_signatures(2, 4)
    types = (-s[:1])[None].clone().requires_grad_(True)  # beyond tau for function 0
    for st, expect_grad in ((False, False), (True, True)):
        tm = modnets.TypeMatching(truncation=0.5, straight_through=st).train()
        k = tm.kernel(types, s)
        assert k[0, 0, 0].item() == 0.0
        (g,) = torch.autograd.grad(k[0, 0, 0], types)
        assert (g.abs().sum() > 0) == expect_grad


def test_straight_through_gradient_stays_bounded_where_every_function_truncates():
    # a type beyond tau from both signatures: the truncated normaliser is 0, and a gradient
    # through it would be 1 / eps times too large; the straight-through gradient is instead the
    # untruncated compatibilities' (tau = 2 truncates nothing here)
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    weights = torch.tensor([1.0, -2.0])[None, :, None]

    def input_grad(tau: float) -> torch.Tensor:
        t = torch.tensor([[[-0.6, -0.8]]], requires_grad=True)
        tm = modnets.TypeMatching(truncation=tau, straight_through=True).train()
        C = tm(t, s)
        (C * weights).sum().backward()
        return C.detach(), t.grad

    C, g = input_grad(1.0)
    assert C.abs().sum() == 0  # the forward value is the truncated one: no function reads it
    _, g_full = input_grad(2.0)
    assert g.norm() > 0
    assert g.norm() <= 10 * g_full.norm()
    torch.testing.assert_close(g, g_full)  # the untruncated compatibilities' gradient


@pytest.mark.parametrize("field,value", [("truncation", 0.0), ("truncation", 2.5), ("sigma", 0)])
def test_type_matching_rejects_bad_hyperparameters(field, value):
    with pytest.raises(ValueError, match=field):
        modnets.TypeMatching(**{field: value})


# ---------------------------------------------------------------- ModAttn (NI eqs. 6-8)


def modattn_loop_reference(attn, x, codes, compat):
    """NI eqs. 6-8 one function and one head at a time."""
    B, U, T, d = x.shape
    H, dh = attn.num_heads, attn.head_dim
    out = torch.zeros_like(x)
    for u in range(U):
        c = codes[u]
        q = attn.query(x[:, u], c).view(B, T, H, dh)
        k = attn.key(x[:, u], c).view(B, T, H, dh)
        v = attn.value(x[:, u], c).view(B, T, H, dh)
        heads = []
        for h in range(H):
            p = torch.softmax(q[:, :, h] @ k[:, :, h].transpose(1, 2) / math.sqrt(dh), dim=-1)
            w = compat[:, u, :, None] * compat[:, u, None, :] * p
            w = w / (attn.eps + w.sum(-1, keepdim=True))
            heads.append(w @ v[:, :, h])
        out[:, u] = attn.out(torch.cat(heads, dim=-1), c)
    return out


@pytest.mark.parametrize("fused", [False, True])
def test_modattn_vectorised_equals_loop(fused):
    attn = modnets.ModAttn(16, 8, num_heads=4, fused=fused)
    x, codes, compat = streams()
    torch.testing.assert_close(
        attn(x, codes, compat), modattn_loop_reference(attn, x, codes, compat)
    )


def _zeroed_streams(dtype=torch.float64, B=2, U=3, T=6, d=8, tiny=True):
    """Streams whose compatibilities have exact zeros (truncation), tiny values (where eps
    matters) and a function that may read nothing."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, U, T, d, generator=g, dtype=dtype)
    compat = torch.rand(B, U, T, generator=g, dtype=dtype)
    compat[compat < 0.3] = 0.0
    if tiny:  # C_i D_i comparable with eps, where the renormalisation is not 1
        compat[0, 0, :2] = 1e-7
        compat[-1, -1] = 0.0  # the last function reads nothing in the last sample
    return x, torch.randn(U, 4, generator=g, dtype=dtype), compat


def test_modattn_fused_equals_eq7_reference_eps_included():
    # The fused path computes C_i N_i / (eps + C_i D_i): NI eq. 7 exactly, eps included, so the two
    # agree to rounding (float64: 1e-12) even where C_i is tiny and eps shapes the row.
    attn = modnets.ModAttn(8, 4, num_heads=2).double()
    x, codes, compat = _zeroed_streams()
    with use_fused_attn(True):
        fused = attn(x, codes, compat)
    with use_fused_attn(False):
        reference = attn(x, codes, compat)
    torch.testing.assert_close(fused, reference, atol=1e-12, rtol=1e-10)
    # where eps matters, the output is visibly not the eps -> 0 limit
    row_sum = attn.attention_weights(x, codes, compat)[0, 0, :, 0].sum(-1)
    assert (row_sum < 0.99).all()
    # float32 agrees to 1e-5
    attn32 = modnets.ModAttn(8, 4, num_heads=2)
    x32, codes32, compat32 = (t.float() for t in _zeroed_streams())
    ys = []
    for path in (True, False):
        with use_fused_attn(path):
            ys.append(attn32(x32, codes32, compat32))
    torch.testing.assert_close(ys[0], ys[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("align", [1, 8, 16])
def test_modattn_fused_padded_heads_equal_eq7_reference(align, monkeypatch):
    # On a GPU the fused path rounds its head width (dh + 1) up to FUSED_ALIGN with zero channels,
    # so that the memory-efficient kernel takes it: the result must not change (checked here on
    # the CPU with the GPU's alignment, including a bias and a width that is already aligned).
    from modnets.nn import modattn

    monkeypatch.setitem(modattn.FUSED_ALIGN, "cpu", align)
    assert modattn._fused_width(16, torch.device("cpu")) == -(-17 // align) * align
    attn = modnets.ModAttn(8, 4, num_heads=2).double()
    x, codes, compat = _zeroed_streams()
    bias = torch.randn(3, 2, 6, 6, dtype=torch.float64, requires_grad=True)
    outs = []
    for path in (True, False):
        with use_fused_attn(path):
            out = attn(x, codes, compat, bias)
        outs.append((out, *torch.autograd.grad(out.square().sum(), bias)))
    for fused, reference in zip(*outs, strict=True):
        torch.testing.assert_close(fused, reference, atol=1e-12, rtol=1e-10)


def test_modattn_fused_gradcheck_with_exact_zeros():
    # NI eq. 7's output C_i N_i / (eps + C_i D_i) changes by O(1) within |C_i| ~ eps of an exact
    # zero, so finite differences (step 1e-6) cannot be taken *at* a zero: the zeros stay exact
    # and fixed, and gradcheck perturbs x, the codes and the non-zero compatibilities (the test
    # below checks the gradients at the zeros against the reference: finite and equal).
    attn = modnets.ModAttn(8, 4, num_heads=2, fused=True).double()
    x, codes, compat = _zeroed_streams(B=1, U=2, T=4, tiny=False)
    live = compat > 0
    assert not live.all()

    def f(x, codes, values):
        return attn(x, codes, torch.zeros_like(compat).masked_scatter(live, values))

    inputs = (x.requires_grad_(), codes.requires_grad_(), compat[live].requires_grad_())
    assert torch.autograd.gradcheck(f, inputs)


def test_modattn_fused_gradients_equal_reference_and_are_finite():
    attn = modnets.ModAttn(8, 4, num_heads=2).double()
    grads = []
    for path in (True, False):
        x, codes, compat = (t.requires_grad_() for t in _zeroed_streams())
        attn.zero_grad()
        with use_fused_attn(path):
            attn(x, codes, compat).square().sum().backward()
        grads.append([x.grad, codes.grad, compat.grad] + [p.grad for p in attn.parameters()])
    for fused, reference in zip(*grads, strict=True):
        assert torch.isfinite(fused).all()
        torch.testing.assert_close(fused, reference, atol=1e-9, rtol=1e-7)


def _largest_saved(attn, x, codes, compat, bias=None) -> int:
    """Elements of the largest storage autograd keeps (an expanded view counts as its storage)."""
    sizes = []

    def pack(t):
        sizes.append(t.untyped_storage().nbytes() // t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attn(x, codes, compat, bias)
    return max(sizes)


@pytest.mark.parametrize("T", [6, 70])
def test_modattn_fused_saves_no_attention_weights(T):
    # (a batch of 8: the fused path's stacked q, k, v weights, 8 x 24 numbers per function and row
    # block whatever the batch, must not pass for attention weights at 6 tokens)
    B, U, H = 8, 3, 2
    attn = modnets.ModAttn(8, 4, num_heads=H)
    x = torch.randn(B, U, T, 8, requires_grad=True)
    codes, compat = torch.randn(U, 4), torch.rand(B, U, T)
    weights = B * U * H * T * T
    with use_fused_attn(True):
        assert _largest_saved(attn, x, codes, compat) < weights
        assert not _saved_weights(attn, x, codes, compat)
    with use_fused_attn(False):  # the reference keeps them: the check can fail
        assert _largest_saved(attn, x, codes, compat) >= weights
        assert _saved_weights(attn, x, codes, compat)  # (the shape check above can fail too)
    # the default: memory follows the path measured faster at this shape (measured first: the
    # measurement's own tensors pass through the hooks too)
    C = compat.expand(B, U, T).transpose(0, 1)
    fused = attn.takes_fused(x.transpose(0, 1), codes, C)
    assert (_largest_saved(attn, x, codes, compat) < weights) == fused


def test_modattn_fused_projects_q_k_v_in_one_product():
    # ModAttn.project stacks each function's three ModLins (NI eqs. 4, 6) into one product: the
    # same q / sqrt(d_key), k and v as the reference path's three ModLins, with x stored either
    # way and each function's rows in 2 blocks (3 functions on 2 threads)
    attn = modnets.ModAttn(8, 4, num_heads=2).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p)
    B, U, T = 2, 3, 6
    codes = torch.randn(U, 4, dtype=torch.float64)
    scales = (1 / math.sqrt(attn.head_dim), 1.0, 1.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for x in (
            torch.randn(B, U, T, 8, dtype=torch.float64),
            torch.randn(U, B, T, 8, dtype=torch.float64).movedim(0, 1),
        ):
            got = attn.project(x, codes)
            for g, proj, scale in zip(got, (attn.query, attn.key, attn.value), scales, strict=True):
                want = scale * proj(x, codes[:, None, :]).unflatten(-1, (2, 4)).transpose(2, 3)
                assert g.shape == (B, U, 2, T, 4)
                torch.testing.assert_close(g, want, atol=1e-12, rtol=1e-12)
    finally:
        torch.set_num_threads(threads)


def test_modattn_auto_runs_the_path_measured_faster_bias_or_not():
    """fused=None runs exactly the path the measurement at the shape chose, with a learned bias
    too (torch's fused CPU kernel gives it no gradient and falls back to a math kernel), on both
    sides of the default crossover."""
    from modnets.nn.modattn import FUSED_MIN_TOKENS

    B, U, H = 2, 3, 2
    attn = modnets.ModAttn(8, 4, num_heads=H)
    for T in (FUSED_MIN_TOKENS + 6, FUSED_MIN_TOKENS - 6):
        x, codes, compat = torch.randn(B, U, T, 8), torch.randn(U, 4), torch.rand(B, U, T)
        bias = torch.randn(U, H, T, T, requires_grad=True)
        out = {}
        for path in (False, True, None):
            with use_fused_attn(path):
                y = attn(x, codes, compat, bias)
            (g,) = torch.autograd.grad(y.square().sum(), bias)
            out[path] = (y, g)
        expected = attn.takes_fused(x.transpose(0, 1), codes, compat.transpose(0, 1), bias)
        torch.testing.assert_close(out[False][0], out[True][0])  # the two paths agree ...
        # ... and fused=None ran exactly one of them (bit for bit, bias gradient included)
        for a, b in zip(out[None], out[expected], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert not torch.equal(out[None][0], out[not expected][0])  # (the check can fail)


def test_the_measured_crossover_is_cached_reset_and_overridden(monkeypatch):
    """The first call at a shape has both paths timed in another process; the second takes the
    cached choice without measuring; reset forgets it; set_fused_attn and a ModAttn's own
    fused win."""
    from modnets.nn import autotune, modattn
    from modnets.nn.modattn import ModAttn

    autotune.reset()
    attn = modnets.ModAttn(8, 4, num_heads=2)
    B, U, T = 2, 3, 5
    x, codes, C = torch.randn(U, B, T, 8), torch.randn(U, 4), torch.rand(U, B, T)
    measured = []
    measure = autotune._measure

    def counting(measurement):
        measured.append(measurement)
        return measure(measurement)

    monkeypatch.setattr(autotune, "_measure", counting)

    def not_here(*args, **kwargs):
        raise AssertionError("the paths were timed in this process")

    monkeypatch.setattr(modattn, "time_paths", not_here)  # the other process imports its own
    rng = torch.get_rng_state()
    first = attn.takes_fused(x, codes, C)
    assert len(measured) == 1 and autotune.cache_path().exists()
    assert measured[0].kwargs["T"] == T and measured[0].threads == torch.get_num_threads()
    assert torch.equal(torch.get_rng_state(), rng)  # nothing drawn here
    assert attn.takes_fused(x, codes, C) == first and len(measured) == 1
    autotune._choices = None  # another process: the file holds the choice
    assert attn.takes_fused(x, codes, C) == first and len(measured) == 1
    attn.per_function(x, codes, C)
    assert len(measured) == 1
    for switch in (True, False):
        with use_fused_attn(switch):
            assert attn.takes_fused(x, codes, C) is switch
        own = ModAttn(8, 4, num_heads=2, fused=switch)
        assert own.takes_fused(x, codes, C) is switch
    assert len(measured) == 1
    autotune.reset()
    assert not autotune.cache_path().exists()
    attn.takes_fused(x, codes, C)
    assert len(measured) == 2


def test_a_measured_shape_trains_bit_for_bit_as_a_cached_one():
    """Measuring on the first step leaves the training exactly as a run that found the choice
    cached: the timing allocates nothing in this process (in-process timing did, and moved a
    training's last bits)."""
    from modnets.nn import autotune

    def train() -> list[torch.Tensor]:
        torch.manual_seed(0)
        attn = modnets.ModAttn(8, 4, num_heads=2)
        opt = torch.optim.Adam(attn.parameters(), lr=1e-2)
        for _ in range(3):
            x, codes, compat = torch.randn(4, 3, 7, 8), torch.randn(3, 4), torch.rand(4, 3, 7)
            opt.zero_grad()
            attn(x, codes, compat).square().mean().backward()
            opt.step()
        return [p.detach().clone() for p in attn.parameters()]

    autotune.reset()
    measuring = train()
    assert autotune.cache_path().exists()  # (the check can fail: it did measure)
    for a, b in zip(measuring, train(), strict=True):
        assert torch.equal(a, b)


def test_autotune_keeps_the_default_unless_another_path_wins_by_the_margin(tmp_path, monkeypatch):
    from modnets.nn import autotune

    monkeypatch.setenv("MODNETS_AUTOTUNE", str(tmp_path / "choices.json"))
    autotune.reset()
    timing = autotune.Measurement("unused:here")

    def measuring(seconds):
        monkeypatch.setattr(autotune, "_measure", lambda measurement: seconds)

    paths = ("x", "y")
    measuring({"x": 0.001, "y": 0.02})
    assert autotune.choose("a", timing, paths, default="y") == "x"
    measuring({"x": 0.001, "y": 0.00105})  # within the margin: the default stays
    assert autotune.choose("b", timing, paths, default="y") == "y"
    # cached: a later call measures nothing, whatever the paths cost now
    measuring({"x": 0.02, "y": 0.001})
    assert autotune.choose("a", timing, paths, default="y") == "x"
    assert autotune.choice("b") == "y" and autotune.choice("c") is None
    with pytest.raises(ValueError, match="default"):
        autotune.choose("c", timing, ("x",), default="z")

    # another process measured "f" while this one did: its choice, stored first, holds
    def measured_elsewhere(measurement):
        autotune.cache_path().write_text('{"f": "y"}')
        return {"x": 0.001, "y": 0.02}

    monkeypatch.setattr(autotune, "_measure", measured_elsewhere)
    assert autotune.choose("f", timing, paths, default="y") == "y" == autotune.choice("f")
    measuring({"x": 0.001})
    with pytest.raises(ValueError, match="expected"):
        autotune.choose("c", timing, paths, default="y")
    # under a dispatch mode (here FLOP counting) it would time the mode: the default, uncached
    from torch.utils.flop_counter import FlopCounterMode

    measuring({"x": 0.001, "y": 0.02})
    with FlopCounterMode(display=False):
        assert autotune.choose("d", timing, paths, default="y") == "y"
    assert autotune.choice("d") is None
    autotune.reset()


def test_a_failed_measurement_keeps_the_default_with_a_warning(tmp_path, monkeypatch):
    """The other process cannot import the function: the default holds for this process, the
    file is not written, and the warning says why."""
    from modnets.nn import autotune

    monkeypatch.setenv("MODNETS_AUTOTUNE", str(tmp_path / "choices.json"))
    autotune.reset()
    timing = autotune.Measurement("modnets.nn.no_such_module:f")
    with pytest.warns(UserWarning, match="kept y.*no_such_module"):
        assert autotune.choose("e", timing, ("x", "y"), default="y") == "y"
    assert autotune.choice("e") == "y" and not autotune.cache_path().exists()


def _saved_weights(attn, x, codes, compat) -> list[tuple]:
    """Shapes of the saved tensors that hold (B, U, H, T, T) attention weights."""
    (B, U, T, _), H = x.shape, attn.num_heads
    shapes = []

    def pack(t):
        if t.shape[-2:] == (T, T) and t.numel() >= B * U * H * T * T:
            shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attn(x, codes, compat)
    return shapes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim, T", [(64, 18), (192, 67)])  # the cpu and gpu digits NIs
def test_modattn_fused_takes_a_fused_gpu_kernel(dim, T, dtype):
    """On CUDA the fused path must run a fused kernel, a learned bias included: with only flash
    and memory-efficient attention allowed, ``F.scaled_dot_product_attention`` raises instead of
    falling back to its math kernel. Without a bias it keeps no (B, U, H, T, T) tensor. (With a
    learned bias, torch's memory-efficient kernel keeps a padded copy of the bias of that size:
    seen on an H100 with torch 2.11; see :mod:`modnets.nn.modattn`.)"""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, U, H = 4, 5, 4
    attn = modnets.ModAttn(dim, dim, num_heads=H).cuda()
    x = torch.randn(B, U, T, dim, device="cuda", requires_grad=True)
    codes, compat = torch.randn(U, dim, device="cuda"), torch.rand(B, U, T, device="cuda")
    learned = torch.randn(U, H, T, T, device="cuda", requires_grad=True)
    fused_kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    low = dtype != torch.float32
    tol = 3e-2 if low else 1e-4
    for bias in (None, learned):
        # the default (no switch set) on CUDA: fused
        with sdpa_kernel(fused_kernels), torch.autocast("cuda", dtype, enabled=low):
            out = attn(x, codes, compat, bias)
            out.float().square().mean().backward()
            if bias is None:  # (q, k, v of head width 8 ceil((dh + 1) / 8) may be larger)
                assert not _saved_weights(attn, x, codes, compat)
        assert torch.isfinite(x.grad).all()
        if bias is not None:
            assert torch.isfinite(bias.grad).all()
        attn.fused = False
        with torch.autocast("cuda", dtype, enabled=low):
            torch.testing.assert_close(out, attn(x, codes, compat, bias), atol=tol, rtol=tol)


def test_modattn_auto_takes_eq7_under_torch_compile(monkeypatch):
    """Under torch.compile ``fused=None`` takes NI eq. 7 as written (Inductor fuses it), even
    where the fused path was measured faster."""
    from modnets.nn import autotune

    monkeypatch.setattr(autotune, "choose", lambda key, timing, paths, default: "fused")
    B, U, H, T = 2, 3, 2, 70
    attn = modnets.ModAttn(8, 4, num_heads=H)
    x, codes, compat = torch.randn(B, U, T, 8), torch.randn(U, 4), torch.rand(B, U, T)
    assert _largest_saved(attn, x, codes, compat) < B * U * H * T * T
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _largest_saved(attn, x, codes, compat) >= B * U * H * T * T


def test_modattn_rejects_bad_fused():
    with pytest.raises(TypeError, match="fused"):
        modnets.ModAttn(8, 4, num_heads=2, fused="yes")


def test_modattn_rows_sum_to_one_or_zero_and_renormalise_not_resoftmax():
    attn = modnets.ModAttn(16, 8, num_heads=2)
    x, codes, compat = streams()
    compat[:, 1, 2] = 0.0  # function 1 may not read token 2
    w = attn.attention_weights(x, codes, compat)
    rows = w.sum(-1)
    assert torch.all(rows[:, 1, :, 2] == 0)  # masked query: all-zero row
    assert torch.all(w[:, 1, :, :, 2] == 0)  # ... and nobody reads the masked key
    # Rows sum to S / (eps + S) with S = sum_j W~_ij: 1 up to eps wherever the query is matched.
    live = (compat >= 0.05)[:, :, None, :].expand_as(rows)
    torch.testing.assert_close(rows[live], torch.ones(int(live.sum())), atol=1e-3, rtol=0)
    assert (rows <= 1).all()
    # (a second softmax instead of the division would give weight to the masked key)


# ---------------------------------------------------------------- LOC (NI eqs. 9-10)


def loc_loop_reference(loc, x, codes, compat):
    out = torch.zeros_like(x)
    for u in range(x.shape[1]):
        xu, cu, Cu = x[:, u : u + 1], codes[u : u + 1], compat[:, u : u + 1]
        a = xu + Cu[..., None] * loc.attn(loc.norm_attn(xu), cu, Cu)
        out[:, u : u + 1] = a + Cu[..., None] * loc.mlp(loc.norm_mlp(a), cu[:, None])
    return out


def test_loc_vectorised_equals_per_function_loop():
    loc = modnets.LOC(16, 8, num_heads=2, mlp_hidden=24)
    x, codes, compat = streams()
    torch.testing.assert_close(loc(x, codes, compat), loc_loop_reference(loc, x, codes, compat))


@pytest.mark.parametrize("fused", [False, True])
def test_loc_keeps_each_functions_rows_together_in_memory(fused):
    # the streams leave a LOC function-major, (U, B, T, d) in memory, so the next LOC's products
    # read each function's rows as one block, without a copy; per_function, which takes that
    # layout, computes forward's numbers
    torch.manual_seed(0)
    locs = [modnets.LOC(16, 8, num_heads=2, mlp_hidden=24).double() for _ in range(2)]
    x, codes, compat = (t.double() for t in streams())
    y = x[:, :1].expand_as(x)  # the first LOC's input: one tokens tensor broadcast to every stream
    with use_fused_attn(fused):
        for loc in locs:
            y = loc(y, codes, compat)
            assert y.transpose(0, 1).is_contiguous()
        loc = locs[0]
        xu, Cu = x.transpose(0, 1), compat.transpose(0, 1)
        want = loc.attn(x, codes, compat).transpose(0, 1)
        torch.testing.assert_close(loc.attn.per_function(xu, codes, Cu), want, rtol=0, atol=1e-12)
        want = loc.mlp(x, codes[:, None]).transpose(0, 1)
        torch.testing.assert_close(loc.mlp.per_function(xu, codes), want, rtol=0, atol=1e-12)


def test_per_function_refuses_streams_in_the_wrong_order_naming_the_argument():
    loc = modnets.LOC(16, 8, num_heads=2, mlp_hidden=24)
    x, codes, compat = streams()  # (B, U, T, d) with B = 2, U = 3: not function-major
    xu, Cu = x.transpose(0, 1), compat.transpose(0, 1)
    with pytest.raises(ValueError, match="codes must have shape \\(2, 8\\)"):
        loc.mlp.per_function(x, codes)
    with pytest.raises(ValueError, match="^x must have shape \\(functions, \\.\\.\\., 16\\)"):
        loc.mlp.per_function(xu[..., :8], codes)
    with pytest.raises(TypeError, match="codes must be a torch.Tensor"):
        loc.mlp.per_function(xu, codes.tolist())
    with pytest.raises(ValueError, match="^C must have shape \\(3, 2, 5\\)"):
        loc.attn.per_function(xu, codes, compat)
    with pytest.raises(ValueError, match="^codes must have shape \\(2, 8\\)"):
        loc.attn.per_function(x, codes, Cu.transpose(0, 1))
    with pytest.raises(ValueError, match="^x must have shape \\(functions, batch, tokens, 16\\)"):
        loc.attn.per_function(xu[0], codes, Cu)


def test_loc_is_identity_where_compatibility_is_zero():
    loc = modnets.LOC(16, 8, num_heads=2)
    x, codes, compat = streams()
    compat[:, :, 3] = 0.0
    compat[1, 2, 0] = 0.0
    y = loc(x, codes, compat)
    torch.testing.assert_close(y[:, :, 3], x[:, :, 3], rtol=0, atol=0)
    torch.testing.assert_close(y[1, 2, 0], x[1, 2, 0], rtol=0, atol=0)
    assert not torch.allclose(y[:, :, 1], x[:, :, 1])


# ---------------------------------------------------------------- interpreter, script, model


@pytest.mark.parametrize("residual", ["delta", "literal"])
def test_interpreter_leaves_unmatched_tokens_unchanged(residual):
    interp = modnets.Interpreter(16, 8, num_locs=2, num_heads=2, residual=residual)
    x = torch.randn(2, 5, 16)
    _, codes, compat = streams()
    compat[:, :, 4] = 0.0
    y = interp(x, codes, compat)
    torch.testing.assert_close(y[:, 4], x[:, 4], rtol=0, atol=0)
    assert not torch.allclose(y[:, 0], x[:, 0])


def test_interpreter_residual_forms():
    """'delta' pools the streams' updates; 'literal' is NI eq. 11 as printed and adds x once more."""
    torch.manual_seed(1)
    interp = modnets.Interpreter(16, 8, num_locs=1, num_heads=2)
    x = torch.randn(2, 5, 16)
    _, codes, compat = streams()
    y_delta = interp(x, codes, compat)
    interp.residual = "literal"
    y_literal = interp(x, codes, compat)
    torch.testing.assert_close(y_literal - y_delta, compat.sum(1)[..., None] * x)


def test_script_leaves_a_token_far_from_every_signature_unchanged():
    cfg = tiny_config(num_scripts=1, num_iterations=3, truncation=1.0)
    script = modnets.Script(cfg)
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        t0 = script.iteration.type_inference(x)[0, 2]  # the type of token 2 of sample 0
        script.signature_chunks[0].copy_((-t0).expand(3, -1))  # every signature antipodal to it
    y, C, _ = script(x, return_routing=True)
    assert torch.all(C[0, :, :, 2] == 0)
    torch.testing.assert_close(y[0, 2], x[0, 2], rtol=0, atol=0)
    assert not torch.allclose(y[0, 0], x[0, 0])


def test_parameter_count_depends_on_functions_only_through_signatures_and_codes():
    def count(U):
        torch.manual_seed(0)
        return sum(
            p.numel() for p in modnets.NeuralInterpreter(tiny_config(num_functions=U)).parameters()
        )

    cfg = tiny_config()
    per_function = cfg.num_scripts * (cfg.type_dim + cfg.code_dim)
    assert count(7) - count(3) == 4 * per_function
    assert count(20) - count(3) == 17 * per_function


def test_add_functions_keeps_outputs_while_new_functions_are_masked():
    torch.manual_seed(0)
    model = modnets.NeuralInterpreter(tiny_config()).eval()
    x = torch.randn(4, 5)
    before = model(x)
    model.add_functions(2, freeze_existing=True, active=False)
    assert model.scripts[0].num_functions == 5
    torch.testing.assert_close(model(x), before)  # buffer mask: new functions off
    on = torch.ones(5, dtype=torch.bool)
    assert not torch.allclose(model(x, function_mask=on), before)
    script = model.scripts[0]
    assert [p.requires_grad for p in script.code_chunks] == [False, True]
    assert all(not p.requires_grad for p in script.signature_chunks)  # signatures fixed by default


def test_dropping_functions_equals_masking_them():
    torch.manual_seed(0)
    model = modnets.NeuralInterpreter(tiny_config(num_functions=4)).eval()
    x = torch.randn(3, 5)
    mask = torch.tensor([True, False, True, False])
    masked = model(x, function_mask=mask)
    model.remove_functions([1, 3])
    assert model.scripts[1].num_functions == 2
    torch.testing.assert_close(model(x), masked)
    with pytest.raises(ValueError, match="indices"):
        model.remove_functions([5])
    with pytest.raises(ValueError, match="every function"):
        model.remove_functions([0, 1])


def test_anytime_inference_and_routing_introspection():
    model = modnets.NeuralInterpreter(tiny_config()).eval()
    x = torch.randn(3, 5)
    default = model(x)
    out = model(x, return_routing=True)
    torch.testing.assert_close(out.logits, default)  # introspection does not change outputs
    T = 5 + 2  # elements + CLS tokens
    assert [c.shape for c in out.compatibilities] == [(3, 2, 3, T)] * 2
    assert [t.shape for t in out.types] == [(3, 2, T, 4)] * 2
    assert not torch.allclose(model(x, num_iterations=1), default)
    zero = model(x, num_iterations=0, return_routing=True)
    assert zero.compatibilities[0].shape == (3, 0, 3, T)
    torch.testing.assert_close(model(x, num_iterations=[2, 2]), default)
    with pytest.raises(ValueError, match="num_iterations"):
        model(x, num_iterations=-1)


def test_image_model_shapes_and_vit_baseline():
    cfg = modnets.NIConfig(
        dim=24,
        type_dim=4,
        num_functions=2,
        num_iterations=2,
        num_heads=3,
        image_size=8,
        patch_size=4,
        in_channels=1,
        num_cls=3,
        num_outputs=10,
    )
    x = torch.randn(2, 1, 8, 8)
    for kind in modnets.models.MODELS:
        model = modnets.build_model(kind, cfg)
        assert model(x).shape == (2, 3, 10)
    assert modnets.ViT(cfg).depth == 2
    with pytest.raises(ValueError, match="images must have shape"):
        modnets.NeuralInterpreter(cfg)(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="kind"):
        modnets.build_model("mlp", cfg)


def test_gradcheck_tiny_model_float64():
    torch.manual_seed(0)
    cfg = tiny_config(
        dim=8,
        code_dim=4,
        num_heads=2,
        num_scripts=1,
        num_locs=1,
        num_cls=1,
        num_elements=3,
        truncation=2.0,
    )
    model = modnets.NeuralInterpreter(cfg).double()
    x = torch.rand(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: model(v), (x,), atol=1e-5)


def test_finite_gradients_reach_every_trainable_parameter():
    model = modnets.NeuralInterpreter(tiny_config(learn_signatures=True))
    loss = model(torch.randn(4, 5)).pow(2).mean()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name


def test_seeded_runs_are_reproducible():
    def run():
        modnets.seed_everything(7)
        model = modnets.NeuralInterpreter(tiny_config())
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.randn(8, 5), torch.randn(8, 2, 3)
        for _ in range(3):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        return loss.item(), model(x).detach()

    (l1, o1), (l2, o2) = run(), run()
    assert l1 == l2 and torch.equal(o1, o2)


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_heads", 5),  # does not divide dim
        ("truncation", 0.0),
        ("truncation", 2.01),
        ("num_functions", 0),
        ("num_iterations", 0),
        ("sigma", -1.0),
        ("residual", "gated"),
        ("input_kind", "text"),
        ("patch_size", 5),
        ("type_dim", 1),
    ],
)
def test_bad_configs_raise_value_error_naming_the_field(field, value):
    kw = {"input_kind": "image"} if field == "patch_size" else {}
    with pytest.raises(ValueError, match=field):
        tiny_config(**{**kw, field: value})


def test_config_replace_and_type_checks():
    cfg = tiny_config()
    assert cfg.replace(num_functions=9).num_functions == 9
    with pytest.raises(ValueError, match="unknown"):
        cfg.replace(nonsense=1)
    with pytest.raises(TypeError, match="NIConfig"):
        modnets.NeuralInterpreter({"dim": 16})
    with pytest.raises(ValueError, match="function_mask"):
        modnets.NeuralInterpreter(cfg)(torch.randn(2, 5), function_mask=torch.ones(4, dtype=bool))


@pytest.mark.parametrize("kind", ["ni", "vit"])
def test_reset_cls_tokens_keeps_shared_head_and_body(kind):
    cfg = tiny_config(num_cls=4, num_outputs=1, shared_head=True)
    model = modnets.build_model(kind, cfg)
    head_before = model.heads
    model.reset_cls_tokens(6)
    assert model.config.num_cls == 6 and model.heads is head_before
    assert model(torch.randn(3, 5)).shape == (3, 6, 1)
    model.reset_cls_tokens(2, num_outputs=4)
    assert model.heads is not head_before and model(torch.randn(3, 5)).shape == (3, 2, 4)


def test_shared_head_applies_one_head_to_every_cls_token():
    model = modnets.NeuralInterpreter(tiny_config(num_cls=3, shared_head=True)).eval()
    cls_out = torch.randn(2, 3, 16)
    out = model.heads(cls_out)
    for n in range(3):
        torch.testing.assert_close(out[:, n], model.heads(cls_out[:, n : n + 1])[:, 0])


def test_routing_graph_shares_and_flows():
    from modnets.viz import routing_graph

    C = torch.zeros(2, 3, 4)
    C[0, 0] = 1.0  # step 0: every token to f0
    C[1, 2, :2] = 1.0  # step 1: half the tokens to f2
    G = routing_graph(C)
    assert G.nodes[(0, 0)]["share"] == 1.0 and G.nodes[(1, 2)]["share"] == 0.5
    assert G.edges[(0, 0), (1, 2)]["weight"] == 0.5
    assert not G.has_edge((0, 1), (1, 2))
    assert routing_graph(C, token=3).nodes[(1, 2)]["share"] == 0.0


# ----------------------------------------------------------------------------- relative positions


def test_relative_position_bias_depends_only_on_the_offset_and_spares_cls_tokens():
    from modnets.nn.relpos import RelativePosition2d

    torch.manual_seed(0)
    G, H, n_cls = 3, 2, 2
    rel = RelativePosition2d(G, H, code_dim=5)
    codes = torch.randn(4, 5)
    b = rel(codes, n_cls + G * G)  # (U, H, T, T)
    assert b.shape == (4, H, n_cls + G * G, n_cls + G * G)
    assert torch.equal(b[..., :n_cls, :], torch.zeros_like(b[..., :n_cls, :]))
    assert torch.equal(b[..., :, :n_cls], torch.zeros_like(b[..., :, :n_cls]))
    patch = b[..., n_cls:, n_cls:]
    pos = [(i // G, i % G) for i in range(G * G)]
    for i, (ri, ci) in enumerate(pos):  # equal offsets, equal bias; the formula of NI §4.2
        for j, (rj, cj) in enumerate(pos):
            expected = (rel.rows[:, rj - ri + G - 1] + rel.cols[:, cj - ci + G - 1])[None] + (
                codes @ rel.function.weight.T
            )
            torch.testing.assert_close(patch[:, :, i, j], expected)
    with pytest.raises(ValueError, match="num_tokens"):
        rel(codes, G * G - 1)


@pytest.mark.parametrize("fused", [True, False])
def test_modattn_bias_enters_the_logits_before_the_softmax(fused):
    torch.manual_seed(1)
    B, U, T, d, H = 2, 3, 6, 8, 2
    attn = modnets.ModAttn(d, 4, num_heads=H, fused=fused)
    x, codes = torch.randn(B, U, T, d), torch.randn(U, 4)
    compat = torch.rand(B, U, T)
    compat[0, 1, 2] = 0.0
    bias = torch.randn(U, H, T, T, requires_grad=True)
    w = attn.attention_weights(x, codes, compat, bias)  # the readable NI eq. 7, logits + bias
    c = codes[:, None, :]
    v = attn.value(x, c).unflatten(-1, (H, d // H))
    expected = attn.out(torch.einsum("buhij,bujhc->buihc", w, v).flatten(-2), c)
    out = attn(x, codes, compat, bias)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    out.square().sum().backward()
    assert bias.grad is not None and bias.grad.abs().sum() > 0 and bias.grad.isfinite().all()
    with pytest.raises(ValueError, match="bias"):
        attn(x, codes, compat, bias[:, :, :-1])


def test_relative_positions_are_the_nis_only_source_of_position():
    torch.manual_seed(0)
    cfg = modnets.NIConfig(
        dim=16,
        type_dim=4,
        num_functions=3,
        num_iterations=2,
        num_heads=2,
        image_size=8,
        patch_size=4,
        in_channels=1,
        num_cls=1,
        num_outputs=3,
        positional="relative",
    )
    model = modnets.NeuralInterpreter(cfg).eval()
    assert model.tokenizer.pos is None  # no absolute positions
    x = torch.randn(2, 1, 8, 8)
    swapped = x.clone()  # the four 4x4 patches, top-left and bottom-right exchanged
    swapped[..., :4, :4], swapped[..., 4:, 4:] = x[..., 4:, 4:], x[..., :4, :4]
    with torch.no_grad():
        assert not torch.allclose(model(x), model(swapped), atol=1e-4)  # positions matter
        for loc in model.scripts[0].iteration.interpreter.locs:  # no bias: a set of patches
            for p in loc.relpos.parameters():
                p.zero_()
        torch.testing.assert_close(model(x), model(swapped), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="positional"):
        modnets.NIConfig(positional="rotary")
    with pytest.raises(ValueError, match="input_kind='image'"):
        modnets.NIConfig(input_kind="vector", positional="relative")


def test_model_composes_its_scripts_and_a_script_repeats_one_function_iteration():
    """NI eq. 1: the model is ``Script_ns o ... o Script_1`` on ``[CLS; tokens]``, read out by the
    heads; NI eq. 14: a script is ``n_i`` applications of one function iteration, all with the
    script's own signatures and codes (the iterations share every parameter)."""
    torch.manual_seed(0)
    model = modnets.NeuralInterpreter(tiny_config(num_iterations=3)).eval()
    x = torch.randn(4, 5)
    with torch.no_grad():
        h = model.cls(model.tokenizer(x))
        for script in model.scripts:
            for _ in range(3):
                h, _, _ = script.iteration(h, script.signatures, script.codes, None)
        by_hand = model.heads(h[:, :2])
        torch.testing.assert_close(model(x), by_hand, rtol=0, atol=0)
        assert not torch.allclose(model(x, num_iterations=2), by_hand)  # the check can fail


def test_the_config_follows_added_and_removed_functions_so_a_fresh_model_loads_the_weights():
    cfg = dict(num_iterations=1, num_heads=2, image_size=8, patch_size=4, num_outputs=3)
    cfg = modnets.NIConfig(dim=16, type_dim=4, num_functions=3, **cfg)
    torch.manual_seed(0)
    model = modnets.NeuralInterpreter(cfg).eval()
    x = torch.randn(2, 3, 8, 8)
    model.add_functions(2, freeze_existing=True, active=False)  # a second chunk of functions
    model.remove_functions([1])
    assert model.config.num_functions == model.scripts[0].num_functions == 4
    again = modnets.NeuralInterpreter(model.config).eval()
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)
    assert again.scripts[0].function_mask.tolist() == [True, True, False, False]


def test_functions_added_after_a_dtype_change_take_the_model_s_dtype():
    cfg = dict(num_iterations=1, num_heads=2, image_size=8, patch_size=4, num_outputs=3)
    cfg = modnets.NIConfig(dim=16, type_dim=4, num_functions=2, **cfg)
    model = modnets.NeuralInterpreter(cfg).double()
    model.add_functions(2)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model(torch.randn(2, 3, 8, 8, dtype=torch.float64)).dtype == torch.float64


def test_the_fused_switch_sets_every_modattn_unless_built_with_its_own():
    """``modnets.nn.config`` is the one switch; a ModAttn's own ``fused`` argument wins over it,
    the attribute is read-only, and the switch is restored after a ``with`` block."""
    x, codes, compat = _zeroed_streams()
    follows = modnets.ModAttn(8, 4, num_heads=2).double()
    own = modnets.ModAttn(8, 4, num_heads=2, fused=False).double()
    own.load_state_dict(follows.state_dict())
    with use_fused_attn(True):
        assert not _saved_weights(follows, x, codes, compat)
        assert _saved_weights(own, x, codes, compat)  # built with fused=False: eq. 7 as written
    with use_fused_attn(False):
        assert _saved_weights(follows, x, codes, compat)
    assert modnets.nn.config.fused_attn() is None
    with pytest.raises(AttributeError):
        follows.fused = True
    for bad in (1, "yes"):
        with pytest.raises(TypeError, match="fused"):
            set_fused_attn(bad)
