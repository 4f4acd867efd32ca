"""Neural Attentive Circuits (NAC §2, App. B.2, App. F): the assembled model's properties."""

import dataclasses
import math

import pytest
import torch

from modnets import NACConfig, NeuralAttentiveCircuit, PerceiverIO
from modnets.models.nac import Propagator, nac_from_perceiver_io, perceiver_io_config
from modnets.utils import count_parameters


def tiny(**kw) -> NACConfig:
    base = dict(
        input_dim=6,
        num_outputs=3,
        dim=16,
        num_layers=2,
        num_processors=8,
        num_readouts=3,
        num_heads=2,
        ffn_hidden=24,
        sig_dim=4,
        code_dim=8,
    )
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
    """K_ij ~ 0 => perturbing module j leaves module i unchanged after a propagator (NAC eq. 3)."""
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
    assert (q[order[:-1]] <= q[order[1:]]).all()  # least connected first (App. F, NAC eq. 10)
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


@pytest.mark.parametrize("order", ["least", "most", "random"])
def test_module_roles_mediators_only_dropping(order):
    """Read-in modules (public code: input latents) read the input and send; mediators receive.
    Dropping mediators only leaves every read-in module intact, and the smaller copy computes
    what masking computes; the graph prior sees the mediators only."""
    torch.manual_seed(0)
    model = NeuralAttentiveCircuit(tiny(num_processors=12, num_read_in=3)).eval()
    assert model.graph_prior.prior.shape == (9, 9)
    assert model.mediator_links().shape == (9, 9)
    x = torch.randn(3, 5, 6)
    drop = model.drop_order(order, seed=1)
    assert sorted(drop.tolist()) == list(range(3, 12))  # only mediators are droppable
    q = model.module_importance()
    if order != "random":
        sign = 1 if order == "least" else -1
        assert (sign * q[drop[:-1]] <= sign * q[drop[1:]]).all()
    for n in (0, 5, 8):
        small = model.drop_modules(n, order, seed=1)
        assert small.config.num_read_in == 3 and small.config.num_processors == 12 - n
        torch.testing.assert_close(small.generator.codes[:3], model.generator.codes[:3])
        kept = model.keep_mask(n, order, seed=1)
        assert kept[:3].all() and (~kept).sum() == n
        torch.testing.assert_close(small(x), model(x, processor_mask=kept), rtol=1e-5, atol=1e-5)
    # any processor: the read-in modules may go too, but never all of them
    any_order = model.drop_order("least", among="processors")
    assert len(any_order) == 11 and set(range(3, 12)) <= set(any_order.tolist())
    small = model.drop_modules(6, among="processors")
    kept = model.keep_mask(6, among="processors")
    assert small.config.num_read_in == int(kept[:3].sum())
    torch.testing.assert_close(small(x), model(x, processor_mask=kept), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="read-in"):
        model(x, processor_mask=torch.tensor([False] * 3 + [True] * 9))
    # a mediator's message matters: dropping mediators changes the output
    assert not torch.allclose(model.drop_modules(5, order)(x), model(x))


def test_read_in_modules_alone_read_the_input():
    """With read-in modules, a mediator's initial state does not see the tokens; a read-in
    module's final state depends on nothing but the tokens (it only sends)."""
    torch.manual_seed(0)
    model = NeuralAttentiveCircuit(tiny(num_processors=8, num_read_in=2)).eval()
    assert count_parameters(model) > 0
    with torch.no_grad():
        model.generator.codes[2:] += 1.0  # mediators' codes move; read-in modules' do not
    x = torch.randn(2, 5, 6)
    states = {}
    hook = model.read_out.register_forward_hook(
        lambda m, args, out: states.setdefault("proc", args[0].detach().clone())
    )
    model(x)
    before = states.pop("proc")
    with torch.no_grad():
        for layer in model.propagators:  # change every propagator: read-in states must not move
            for p in layer.parameters():
                p.add_(0.1)
    model(x)
    hook.remove()
    after = states.pop("proc")
    torch.testing.assert_close(after[:, :2], before[:, :2])
    assert not torch.allclose(after[:, 2:], before[:, 2:])


def test_signatures_alone_can_meet_a_scale_free_prior():
    """NAC App. A with the truncated kernel and a learnable bandwidth: optimising only the
    signatures (and epsilon) on the graph loss brings the mean link probability within a factor 2
    of the prior's density, gives hubs (coefficient of variation of q_i > 0.15), and orders the
    modules like the matched prior nodes (Spearman >= 0.7). With NAC eq. 2 as printed (epsilon = 1)
    it cannot."""
    from scipy.stats import spearmanr

    from modnets.graphs import hungarian_permutation

    for truncation in (0.9, None):
        torch.manual_seed(0)
        cfg = tiny(
            num_processors=64,
            sig_dim=16,
            prior="scale_free",
            truncation=truncation,
            straight_through=True,
        )
        model = NeuralAttentiveCircuit(cfg)
        # untruncated, epsilon is kept at 1: the floor of NAC eq. 2 is exp(-(1 + 1/(U-1)) / epsilon)
        params = [model.generator.signatures] + ([model.bandwidth] if truncation else [])
        opt = torch.optim.Adam(params, lr=1e-2)
        for _ in range(600):
            opt.zero_grad()
            (model.graph_loss() / (64 * 63)).backward()
            opt.step()
        prior = model.graph_prior.prior
        off = ~torch.eye(64, dtype=torch.bool)
        with torch.no_grad():
            P = model.mediator_links()
        q = P.sum(1)
        matched = prior.sum(1)[hungarian_permutation(P, prior)]
        density, mean_p = prior[off].mean().item(), P[off].mean().item()
        if truncation is None:
            assert mean_p > math.exp(-(1 + 1 / 63)) - 1e-4  # the floor: ~14x the density
            continue
        assert density / 2 <= mean_p <= 2 * density, (mean_p, density)
        assert (q.std() / q.mean()).item() > 0.15
        assert spearmanr(q.numpy(), matched.numpy()).statistic >= 0.7


def test_dropping_modules_changes_outputs():
    """A test that cannot fail is a defect: masking must matter at all."""
    torch.manual_seed(0)
    model = NeuralAttentiveCircuit(tiny(num_processors=12)).eval()
    x = torch.randn(3, 5, 6)
    assert not torch.allclose(model(x), model.drop_modules(6)(x))


def test_edge_elimination():
    torch.manual_seed(0)
    # untruncated: with truncation the smallest 40 % of P may be exact zeros already
    model = NeuralAttentiveCircuit(tiny(num_processors=10, truncation=None)).eval()
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
    other.load_state_dict(
        {
            k: v
            for k, v in nac.state_dict().items()
            if k in other.state_dict() and other.state_dict()[k].shape == v.shape
        },
        strict=False,
    )
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
            )
        )
        .double()
        .eval()
    )
    x = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(model, (x,))


@pytest.mark.parametrize(
    "field,value",
    [
        ("dim", 0),
        ("num_heads", 5),
        ("read_in_heads", 3),
        ("activation", "relu"),
        ("kernel", "sparse"),
        ("generator", "auto"),
        ("prior", "small_world"),
        ("temperature", 0.0),
        ("bandwidth", -1.0),
        ("initial_states", "zeros"),
        ("eval_kernel", "mean"),
        ("num_processors", 2.5),
    ],
)
def test_bad_config_names_the_field(field, value):
    # a size of the wrong type is a TypeError (modnets.utils.positive_int), anything else a ValueError
    error = TypeError if isinstance(value, float) and field.startswith("num_") else ValueError
    with pytest.raises(error, match=field):
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


def test_module_importance_is_the_mediator_degree_of_nac_eq_10():
    """NAC eq. 10 (App. F): ``q_i = sum_j P_ij`` over the mediators ``j``; with ``num_read_in = 0``
    every processor module is a mediator."""
    torch.manual_seed(0)
    for R in (0, 3):
        model = NeuralAttentiveCircuit(tiny(num_processors=10, num_read_in=R)).eval()
        with torch.no_grad():
            P = model.link_probabilities()
        q = torch.stack([sum(P[i, j] for j in range(R, 10)) for i in range(10)])
        torch.testing.assert_close(model.module_importance(), q)
        if R:  # summing over every module instead would give other numbers: the check can fail
            assert not torch.allclose(model.module_importance(), P.sum(-1))
