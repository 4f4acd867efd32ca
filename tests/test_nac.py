"""Neural Attentive Circuits (NAC §2, App. B.2, App. F): the assembled model's properties."""

import dataclasses

import pytest
import torch

from modnets import NACConfig, NeuralAttentiveCircuit, PerceiverIO
from modnets.baselines import nac_from_perceiver_io, perceiver_io_config
from modnets.nac import Propagator
from modnets.utils import count_parameters


def tiny(**kw) -> NACConfig:
    base = dict(input_dim=6, num_outputs=3, dim=16, num_layers=2, num_processors=8,
                num_readouts=3, num_heads=2, ffn_hidden=24, sig_dim=4, code_dim=8)  # fmt: skip
    base.update(kw)
    return NACConfig(**base)


def test_output_shape_and_finite_gradients():
    torch.manual_seed(0)
    model = NeuralAttentiveCircuit(tiny(activation="gelu"))
    x = torch.randn(4, 5, 6)
    out = model(x, return_details=True)
    assert out.logits.shape == (4, 3) and out.confidences.shape == (4, 3)
    torch.testing.assert_close(out.confidences.sum(-1), torch.ones(4))
    (out.logits.square().mean() + model.graph_loss()).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.generator.signatures.grad.abs().sum() > 0  # the graph is learned


def test_parameters_grow_only_by_signatures_and_codes():
    """ModFC/ModFFN weights are shared: a processor module costs d_sig + d_code parameters."""
    n = [count_parameters(NeuralAttentiveCircuit(tiny(num_processors=U))) for U in (8, 16, 64)]
    per_module = 4 + 8
    assert n[1] - n[0] == 8 * per_module and n[2] - n[1] == 48 * per_module


def test_evaluation_deterministic_training_seeded():
    model = NeuralAttentiveCircuit(tiny())
    x = torch.randn(2, 5, 6)
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    model.train()
    torch.manual_seed(1)
    a = model(x)
    torch.manual_seed(1)
    b = model(x)
    torch.manual_seed(2)
    c = model(x)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)  # Concrete kernels differ with the seed


def test_blocked_link_carries_no_message():
    """K_ij ~ 0 => perturbing module j leaves module i unchanged after a propagator (eq. 3)."""
    torch.manual_seed(0)
    cfg = tiny(eval_kernel="threshold", bandwidth=0.1)
    layer = Propagator(cfg).eval()
    sigs = torch.eye(8, 4).repeat(2, 1)[:8]  # modules 0 and 4 share a signature, 1 and 5, ...
    sigs[4:] = torch.eye(4)  # rows 4..7 equal rows 0..3: pairs (0,4), (1,5), ...
    codes, states = torch.randn(8, 8), torch.randn(1, 8, 16)
    out = layer(states, codes, sigs)
    moved = states.clone()
    moved[0, 1] += 3.0 * torch.randn(16)  # module 1 talks only to itself and module 5
    out2 = layer(moved, codes, sigs)
    changed = (out2 - out).abs().amax(-1)[0] > 1e-6
    assert changed.tolist() == [False, True, False, False, False, True, False, False]


def test_drop_modules_shrinks_and_equals_masking():
    torch.manual_seed(0)
    model = NeuralAttentiveCircuit(tiny(num_processors=12)).eval()
    x = torch.randn(3, 5, 6)
    q = model.module_importance()
    order = model.drop_order()
    assert (q[order[:-1]] <= q[order[1:]]).all()  # least connected first (App. F, eq. 10)
    for n in (0, 4, 11):
        small = model.drop_modules(n)
        assert small.config.num_processors == 12 - n
        assert small.generator.codes.shape == (12 - n, 8)
        assert small.generator.signatures.shape == (12 - n, 4)
        kept = model.keep_mask(n)
        assert set(torch.nonzero(~kept).squeeze(-1).tolist()) == set(order[:n].tolist())
        torch.testing.assert_close(small(x), model(x, processor_mask=kept), rtol=1e-5, atol=1e-5)
    assert model.generator.codes.shape == (12, 8)  # the original is untouched
    with pytest.raises(ValueError, match="n must be"):
        model.drop_modules(12)


def test_dropping_modules_changes_outputs():
    """A test that cannot fail is a defect: masking must matter at all."""
    torch.manual_seed(0)
    model = NeuralAttentiveCircuit(tiny(num_processors=12)).eval()
    x = torch.randn(3, 5, 6)
    assert not torch.allclose(model(x), model.drop_modules(6)(x))


def test_edge_elimination():
    torch.manual_seed(0)
    model = NeuralAttentiveCircuit(tiny(num_processors=10)).eval()
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(model.eliminate_edges(0.0)(x), model(x))
    pruned = model.eliminate_edges(0.4)
    m = pruned.edge_mask
    assert torch.equal(m, m.T) and m.diagonal().all()
    assert (~m).sum().item() == 2 * round(0.4 * 45)
    P = model.link_probabilities().detach()
    assert P[~m].max() <= P[m & ~torch.eye(10, dtype=torch.bool)].min()  # the smallest go first
    assert not torch.allclose(pruned(x), model(x))
    assert model.edge_mask is None
    # dropping modules after eliminating edges keeps the surviving edges
    small = pruned.drop_modules(3)
    keep = torch.nonzero(pruned.keep_mask(3)).squeeze(-1)
    assert torch.equal(small.edge_mask, m[keep][:, keep])


def test_nac_simulates_perceiver_io():
    """NAC §4.1 / App. B.2: alpha = 0, a dense kernel, free states and one read-out module make a
    NAC compute exactly what Perceiver IO computes."""
    torch.manual_seed(0)
    for activation in ("gelu", "geglu"):
        pio = PerceiverIO(tiny(activation=activation, read_in_heads=2)).eval()
        with torch.no_grad():
            for p in pio.parameters():
                p.add_(0.05 * torch.randn_like(p))  # move LayerNorms off their identity init
        nac = nac_from_perceiver_io(pio).eval()
        x = torch.randn(3, 7, 6)
        torch.testing.assert_close(nac(x), pio(x), rtol=1e-5, atol=1e-5)
        mask = torch.ones(8, dtype=torch.bool)
        mask[[1, 5]] = False
        torch.testing.assert_close(
            nac(x, processor_mask=mask), pio(x, latent_mask=mask), rtol=1e-5, atol=1e-5
        )
    cfg = perceiver_io_config(tiny())
    assert cfg.kernel == "dense" and cfg.alpha == 0.0 and cfg.num_readouts == 1
    # a NAC with the same weights but a learned kernel and alpha = 0.1 does not
    other = NeuralAttentiveCircuit(tiny(activation="geglu", read_in_heads=2)).eval()
    other.load_state_dict({k: v for k, v in nac.state_dict().items() if k in other.state_dict()
                           and other.state_dict()[k].shape == v.shape}, strict=False)  # fmt: skip
    assert not torch.allclose(other(x), pio(x), atol=1e-3)


def test_perceiver_io_drop_latents():
    torch.manual_seed(0)
    pio = PerceiverIO(tiny()).eval()
    small = pio.drop_latents(5, seed=3)
    assert small.latents.shape == (3, 16) and small.config.num_processors == 3
    x = torch.randn(2, 5, 6)
    kept = torch.zeros(8, dtype=torch.bool)
    idx = torch.randperm(8, generator=torch.Generator().manual_seed(3))[5:]
    kept[idx] = True
    torch.testing.assert_close(small(x), pio(x, latent_mask=kept), rtol=1e-5, atol=1e-5)


def test_conditional_generator_gives_per_sample_circuits():
    torch.manual_seed(0)
    model = NeuralAttentiveCircuit(tiny(generator="conditional", prior=None)).eval()
    x = torch.randn(3, 5, 6)
    out = model(x, return_details=True)
    d = out.design
    assert d.signatures.shape == (3, 8, 4) and d.codes.shape == (3, 8, 8)
    assert d.out_signatures.shape == (3, 3, 4) and d.states.shape == (3, 8, 16)
    assert not torch.allclose(d.signatures[0], d.signatures[1])  # each sample its own design
    assert model.link_probabilities(d).shape == (3, 8, 8)
    # a separate conditioning set (e.g. another modality) can drive the design
    cond = torch.randn(3, 4, 6)
    assert not torch.allclose(model(x, condition=cond), out.logits)
    with pytest.raises(ValueError, match="unconditional"):
        model.drop_modules(1)


def test_shared_layers_and_frozen_kernel():
    shared = NeuralAttentiveCircuit(tiny(share_layers=True, num_layers=4))
    separate = NeuralAttentiveCircuit(tiny(num_layers=4))
    assert count_parameters(shared) < count_parameters(separate)
    frozen = NeuralAttentiveCircuit(tiny(kernel="frozen"))
    assert not frozen.generator.signatures.requires_grad and frozen.graph_prior is None


def test_parameter_groups_exclude_codes_signatures_and_vectors():
    model = NeuralAttentiveCircuit(tiny())
    decay, no_decay = model.parameter_groups(0.05)
    ids = {id(p) for p in no_decay["params"]}
    assert id(model.generator.codes) in ids and id(model.generator.signatures) in ids
    assert all(p.dim() >= 2 for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_gradcheck_float64():
    torch.manual_seed(0)
    model = (
        NeuralAttentiveCircuit(
            tiny(
                dim=4,
                num_heads=2,
                ffn_hidden=4,
                num_processors=3,
                num_readouts=2,
                code_dim=2,
                sig_dim=2,
                num_layers=1,
                num_outputs=2,
                input_dim=3,
            )  # fmt: skip
        )
        .double()
        .eval()
    )
    x = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(model, (x,))


@pytest.mark.parametrize(
    "field,value",
    [("dim", 0), ("num_heads", 5), ("read_in_heads", 3), ("activation", "relu"),
     ("kernel", "sparse"), ("generator", "auto"), ("prior", "small_world"),
     ("temperature", 0.0), ("bandwidth", -1.0), ("initial_states", "zeros"),
     ("eval_kernel", "mean"), ("num_processors", 2.5)],
)  # fmt: skip
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        tiny(**{field: value})


def test_bad_inputs_name_the_argument():
    model = NeuralAttentiveCircuit(tiny())
    with pytest.raises(ValueError, match="input_dim=6"):
        model(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="processor_mask"):
        model(torch.randn(2, 5, 6), processor_mask=torch.ones(7, dtype=torch.bool))
    with pytest.raises(ValueError, match="processor_mask"):
        model(torch.randn(2, 5, 6), processor_mask=torch.zeros(8, dtype=torch.bool))
    with pytest.raises(TypeError, match="NACConfig"):
        NeuralAttentiveCircuit(dataclasses.asdict(tiny()))
