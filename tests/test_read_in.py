"""NAC eqs. 4-5: the factorised read-in equals the naive one and never builds (B, U, N, d)."""

import pytest
import torch

from modnets.nn.read_in import ReadIn


def randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module


@pytest.mark.parametrize(
    "heads,per_sample_states,per_sample_codes",
    [(1, False, False), (4, False, False), (2, True, False), (2, True, True)],
)
def test_factorised_equals_naive(heads, per_sample_states, per_sample_codes):
    torch.manual_seed(0)
    read_in = randomize(ReadIn(dim=16, input_dim=12, code_dim=6, num_heads=heads))
    x = torch.randn(3, 9, 12)
    codes = torch.randn(3, 5, 6) if per_sample_codes else torch.randn(5, 6)
    states = torch.randn(3, 5, 16) if per_sample_states else torch.randn(5, 16)
    out = read_in(x, states, codes)
    assert out.shape == (3, 5, 16)
    torch.testing.assert_close(out, read_in.naive_forward(x, states, codes), rtol=1e-4, atol=1e-5)


def test_each_module_reads_through_its_own_code():
    read_in = ReadIn(dim=8, input_dim=8, code_dim=4)
    x, states = torch.randn(2, 6, 8), torch.randn(3, 8)
    codes = torch.randn(1, 4).expand(3, -1).clone()
    same = read_in(x, states.expand(3, -1)[:1].expand(3, -1), codes)
    torch.testing.assert_close(same[:, 0], same[:, 1])  # same state and code: same reading
    codes[1] += 1.0
    assert not torch.allclose(read_in(x, states[:1].expand(3, -1), codes)[:, 1], same[:, 1])


def test_gradcheck_float64():
    read_in = randomize(ReadIn(dim=4, input_dim=3, code_dim=2, num_heads=2)).double()
    x = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    states = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    codes = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(read_in, (x, states, codes))


def test_bad_heads():
    with pytest.raises(ValueError, match="num_heads"):
        ReadIn(dim=10, input_dim=4, code_dim=2, num_heads=3)


def test_bad_inputs_name_the_argument():
    read_in = ReadIn(dim=8, input_dim=6, code_dim=4)
    with pytest.raises(ValueError, match="inputs"):
        read_in(torch.randn(2, 5, 7), torch.randn(3, 8), torch.randn(3, 4))
    with pytest.raises(ValueError, match="states"):
        read_in(torch.randn(2, 5, 6), torch.randn(4, 8), torch.randn(3, 4))
