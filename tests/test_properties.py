"""Numerical robustness as properties (hypothesis): no NaN or inf in forward or backward at the
extreme settings a reader will try -- tau near 0 or 2, every kernel truncated, a tiny bandwidth,
a Concrete temperature of 0.05, bf16 autocast, a batch of one, a single token."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import modnets
from modnets.nn.skmdpa import SKMDPA

FAST = settings(max_examples=12, deadline=None, derandomize=True, database=None)


def finite_forward_backward(model, x, **kw):
    out = model(x, **kw)
    out = out if isinstance(out, torch.Tensor) else out.logits
    assert torch.isfinite(out).all(), "non-finite output"
    out.float().square().mean().backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), f"non-finite gradient in {name}"
    return out


@FAST
@given(
    temperature=st.sampled_from([0.05, 0.5, 2.0]),
    bandwidth=st.sampled_from([1e-3, 0.1, 1.0, 10.0]),
    batch=st.integers(1, 3),
    tokens=st.integers(1, 4),
    eval_kernel=st.sampled_from(["probs", "threshold", "sample"]),
    train=st.booleans(),
)
def test_nac_is_finite_at_extremes(temperature, bandwidth, batch, tokens, eval_kernel, train):
    torch.manual_seed(0)
    cfg = modnets.NACConfig(
        input_dim=5,
        num_outputs=3,
        dim=8,
        num_layers=2,
        num_processors=5,
        num_readouts=2,
        num_heads=2,
        ffn_hidden=8,
        sig_dim=3,
        code_dim=4,
        temperature=temperature,
        bandwidth=bandwidth,
        eval_kernel=eval_kernel,
    )
    model = modnets.NeuralAttentiveCircuit(cfg).train(train)
    finite_forward_backward(model, torch.randn(batch, tokens, 5))
    assert torch.isfinite(model.graph_loss())


@FAST
@given(
    truncation=st.sampled_from([1e-3, 0.5, 1.42, 2.0]),
    batch=st.integers(1, 3),
    straight_through=st.booleans(),
    residual=st.sampled_from(["delta", "literal"]),
)
def test_ni_is_finite_at_extremes(truncation, batch, straight_through, residual):
    """tau -> 0 truncates every kernel (no function reads any token); tau = 2 keeps all."""
    torch.manual_seed(0)
    cfg = modnets.NIConfig(
        dim=8,
        type_dim=3,
        num_functions=2,
        num_iterations=2,
        num_heads=2,
        image_size=4,
        patch_size=4,
        num_outputs=3,
        truncation=truncation,
        straight_through=straight_through,
        residual=residual,
    )  # a 4x4 image with 4x4 patches: a single token plus the CLS token
    model = modnets.NeuralInterpreter(cfg)
    finite_forward_backward(model, torch.randn(batch, 3, 4, 4))


@FAST
@given(
    rows=st.integers(1, 4),
    masked=st.lists(st.booleans(), min_size=4, max_size=4),
    temperature=st.sampled_from([0.05, 1.0]),
)
def test_skmdpa_is_finite_whatever_is_masked(rows, masked, temperature):
    torch.manual_seed(0)
    attn = SKMDPA(num_heads=2, temperature=temperature).train()
    q = torch.randn(1, rows, 4, requires_grad=True)
    k, v = torch.randn(1, 4, 4, requires_grad=True), torch.randn(1, 4, 4, requires_grad=True)
    keys = torch.tensor(masked)
    out = attn(q, k, v, torch.randn(rows, 3), torch.randn(4, 3), key_mask=keys)
    assert torch.isfinite(out).all()
    if not keys.any():
        assert torch.equal(out, torch.zeros_like(out))  # no link at all: an empty message
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_bf16_autocast_is_finite():
    torch.manual_seed(0)
    cfg = modnets.NACConfig(
        input_dim=5,
        num_outputs=3,
        dim=8,
        num_layers=1,
        num_processors=4,
        num_readouts=2,
        num_heads=2,
        ffn_hidden=8,
        sig_dim=3,
        code_dim=4,
    )
    model = modnets.NeuralAttentiveCircuit(cfg)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = finite_forward_backward(model, torch.randn(2, 3, 5))
    assert out.dtype == torch.bfloat16
