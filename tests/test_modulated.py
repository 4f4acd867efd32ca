"""Chapter 1: modulated linear layers against their equations (NI eqs. 4-5, NAC eq. 1)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import modnets
from modnets.nn import modffn_parameter_count
from modnets.nn.modulated import _row_blocks


def layer_norm_ref(v, eps=1e-5):
    mu = v.mean(-1, keepdim=True)
    var = v.var(-1, keepdim=True, unbiased=False)
    return (v - mu) / torch.sqrt(var + eps)


def modlin_ref(layer, x, c):
    """NI eq. 4 for one input vector and one code, written out."""
    m = layer_norm_ref(layer.code_weight @ c)
    return layer.weight @ (x * m) + layer.bias


def modfc_ref(layer, x, c):
    """NAC eq. 1 for one input vector and one code."""
    m = layer_norm_ref(layer.code_weight @ c)
    return layer.weight @ (x * (1 + layer.alpha * m)) + layer.bias


def randomize_bias(layer):
    with torch.no_grad():
        layer.bias.normal_()
    return layer


@pytest.mark.parametrize("cls,ref", [(modnets.ModLin, modlin_ref), (modnets.ModFC, modfc_ref)])
def test_equation_against_direct_reference(cls, ref):
    layer = randomize_bias(cls(6, 5, 3))
    x, c = torch.randn(6), torch.randn(3)
    torch.testing.assert_close(layer(x, c), ref(layer, x, c))


def test_parameter_names_and_shapes():
    layer = modnets.ModFC(7, 4, 3)
    assert layer.weight.shape == (4, 7)
    assert layer.bias.shape == (4,)
    assert layer.code_weight.shape == (7, 3)
    assert layer.alpha.shape == () and layer.alpha.item() == pytest.approx(0.1)
    assert modnets.ModFC(7, 4, 3, alpha=0.5).alpha.item() == pytest.approx(0.5)
    assert not hasattr(modnets.ModLin(7, 4, 3), "alpha")


def test_modfc_alpha_zero_is_linear():
    layer = randomize_bias(modnets.ModFC(8, 5, 4, alpha=0.0))
    lin = nn.Linear(8, 5)
    lin.load_state_dict({"weight": layer.weight.data, "bias": layer.bias.data})
    x, codes = torch.randn(3, 6, 8), torch.randn(6, 4)
    torch.testing.assert_close(layer(x, codes), lin(x).detach())
    # ...and the converse: alpha != 0 really conditions on the code.
    with torch.no_grad():
        layer.alpha.fill_(0.5)
    assert not torch.allclose(layer(x, codes), lin(x))


def test_code_changes_the_function():
    layer = modnets.ModLin(8, 5, 4)
    x = torch.randn(8)
    assert not torch.allclose(layer(x, torch.randn(4)), layer(x, torch.randn(4)))


@pytest.mark.parametrize("cls", [modnets.ModLin, modnets.ModFC])
@pytest.mark.parametrize("per_sample", [False, True])
def test_batched_codes_equal_loop(cls, per_sample):
    layer = randomize_bias(cls(6, 5, 3))
    B, U = 4, 7
    x = torch.randn(B, U, 6)
    codes = torch.randn(B, U, 3) if per_sample else torch.randn(U, 3)
    out = layer(x, codes)
    assert out.shape == (B, U, 5)
    for b in range(B):
        for u in range(U):
            c = codes[b, u] if per_sample else codes[u]
            ref = modlin_ref if cls is modnets.ModLin else modfc_ref
            torch.testing.assert_close(out[b, u], ref(layer, x[b, u], c))


@pytest.mark.parametrize("cls", [modnets.ModLin, modnets.ModFC])
@pytest.mark.parametrize("function_major", [False, True])
def test_function_streams_layout(cls, function_major):
    """NI's (batch, functions, tokens, dim) streams take codes as (U, 1, d_code). They run as one
    matmul per function with W diag(m_u) (the branch taken when there are more rows than weights),
    which must equal the plain form W (x * m) + b one function at a time, stored either way."""
    layer = randomize_bias_all(cls(6, 5, 3))
    x, codes = torch.randn(2, 5, 9, 6), torch.randn(5, 3)
    if function_major:  # (U, B, T, d) in memory, as the streams after a transpose
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # 5 functions on 2 threads: each function's rows in 2 blocks
    try:
        assert _row_blocks(5, 2 * 9, x.device) == 2
        out = layer(x, codes[:, None, :])
    finally:
        torch.set_num_threads(threads)
    for u in range(5):
        torch.testing.assert_close(out[:, u], layer(x[:, u], codes[u]))
    # and its gradients, in float64, for x, the codes and every parameter
    layer = layer.double()
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]

    def f(x, c, *params):
        return torch.func.functional_call(layer, dict(zip(names, params, strict=True)), (x, c))

    x = x.double().requires_grad_()
    c = codes[:, None, :].double().requires_grad_()
    assert torch.autograd.gradcheck(f, (x, c, *params))


@pytest.mark.parametrize(
    "module",
    [
        lambda: modnets.ModLin(4, 3, 2),
        lambda: modnets.ModFC(4, 3, 2),
        lambda: modnets.ModMLP(4, 3, 2, hidden_features=5, num_layers=3),
        lambda: modnets.ModFFN(4, 3, 2, hidden_features=5, activation="geglu"),
    ],
)
def test_gradcheck_float64(module):
    layer = randomize_bias_all(module().double())
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    c = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x, c))


def test_row_blocks_share_the_threads_evenly():
    threads = torch.get_num_threads()
    cpu = torch.device("cpu")
    try:
        torch.set_num_threads(2)
        assert _row_blocks(5, 18, cpu) == 2  # 10 products, 5 per thread
        assert _row_blocks(4, 18, cpu) == 1  # already even
        assert _row_blocks(5, 9, cpu) == 1  # 2 does not divide 9 rows
        torch.set_num_threads(3)
        assert _row_blocks(5, 18, cpu) == 3
        assert _row_blocks(5, 18, torch.device("meta")) == 1  # only the CPU's bmm splits so
    finally:
        torch.set_num_threads(threads)


def randomize_bias_all(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    return module


def test_modmlp_is_composition_of_modlins():
    mlp = randomize_bias_all(modnets.ModMLP(6, 4, 3, hidden_features=8, num_layers=3))
    assert len(mlp.layers) == 3
    x, c = torch.randn(6), torch.randn(3)
    h = modlin_ref(mlp.layers[0], x, c)
    h = modlin_ref(mlp.layers[1], F.gelu(h), c)
    h = modlin_ref(mlp.layers[2], F.gelu(h), c)
    torch.testing.assert_close(mlp(x, c), h)
    single = modnets.ModMLP(6, 4, 3, num_layers=1)
    torch.testing.assert_close(single(x, c), single.layers[0](x, c))


@pytest.mark.parametrize("activation", ["gelu", "geglu"])
def test_modffn_against_reference(activation):
    ffn = randomize_bias_all(modnets.ModFFN(6, 4, 3, hidden_features=5, activation=activation))
    x, c = torch.randn(6), torch.randn(3)
    h = modfc_ref(ffn.fc1, x, c)
    if activation == "geglu":
        assert h.shape == (10,)
        h = h[:5] * F.gelu(h[5:])
    else:
        h = F.gelu(h)
    torch.testing.assert_close(ffn(x, c), modfc_ref(ffn.fc2, h, c))


@pytest.mark.parametrize("d_in,d_h,d_c", [(16, 16, 16), (16, 64, 8), (12, 48, 12)])
def test_nac_appendix_b1_parameter_formula(d_in, d_h, d_c):
    L = 3

    def build(U):
        model = nn.Module()
        model.ffns = nn.ModuleList(
            modnets.ModFFN(d_in, d_in, d_c, hidden_features=d_h, activation="gelu")
            for _ in range(L)
        )
        model.codes = nn.Parameter(torch.randn(U, d_c))
        return model

    counts = {U: sum(p.numel() for p in build(U).parameters()) for U in (1, 10, 100)}
    for U, n in counts.items():
        formula = modffn_parameter_count(L, d_in, d_h, d_c, U)
        assert n == formula["exact"]
        # App. B.1 drops biases and alpha, and counts the first conditioning matrix as d_c x d_h.
        extras = L * (d_h + d_in + 2) + L * d_c * (d_in - d_h)
        assert n == formula["paper"] + extras
    # The only thing that grows with the number of modules is one code per module.
    assert counts[100] - counts[10] == 90 * d_c
    # The paper's own example: 1.89e7 + 384 U.
    assert modffn_parameter_count(8, 384, 1536, 384, 0)["paper"] == pytest.approx(1.89e7, rel=2e-3)


@pytest.mark.parametrize("cls", [modnets.ModLin, modnets.ModFC])
def test_wrong_widths_raise_value_error_naming_argument(cls):
    layer = cls(6, 5, 3)
    with pytest.raises(ValueError, match=r"x has 7 features.*in_features=6"):
        layer(torch.randn(2, 7), torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"code has 4 features.*code_features=3"):
        layer(torch.randn(2, 6), torch.randn(2, 4))
    with pytest.raises(ValueError, match="do not broadcast"):
        layer(torch.randn(2, 5, 6), torch.randn(4, 3))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        layer([1.0] * 6, torch.randn(3))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="in_features"):
        modnets.ModLin(0, 5, 3)
    with pytest.raises(TypeError, match="code_features"):
        modnets.ModLin(4, 5, 3.0)
    with pytest.raises(ValueError, match="activation must be one of"):
        modnets.ModFFN(4, 4, 2, activation="relu")
    with pytest.raises(ValueError, match="num_layers"):
        modnets.ModMLP(4, 4, 2, num_layers=0)
    with pytest.raises(TypeError, match="alpha"):
        modnets.ModFC(4, 4, 2, alpha="0.1")


def test_finite_gradients_and_seeded_determinism():
    def run(seed):
        torch.manual_seed(seed)
        ffn = modnets.ModFFN(8, 8, 4, activation="geglu")
        x, c = torch.randn(3, 5, 8), torch.randn(5, 4)
        loss = ffn(x, c).pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in ffn.parameters()]

    (l1, g1), (l2, g2) = run(3), run(3)
    assert torch.equal(l1, l2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in g1)
