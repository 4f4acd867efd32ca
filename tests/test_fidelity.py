"""The switches of book/fidelity.md: each selects the public code's (or the paper's) behaviour
instead of modnets' default, and each test pins both behaviours."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from test_nac import tiny

from modnets.experiments.tiny_imagenet import graph_penalty
from modnets.graphs import GraphPriorRegularizer, graphon, hungarian_permutation
from modnets.models import nac
from modnets.models.nac import KERNEL_REGIMES, NACConfig, NeuralAttentiveCircuit
from modnets.models.ni import RESIDUALS, Interpreter
from modnets.nn import ModFC
from modnets.nn.skmdpa import SKMDPA


def config(**kw) -> NACConfig:
    """test_nac's small circuit with no noise but NAC eq. 2's sample."""
    return tiny(**{"code_noise": 0.0, "state_noise": False, "drop_path": 0.0, **kw})


def circuit(**kw) -> NeuralAttentiveCircuit:
    torch.manual_seed(0)
    return NeuralAttentiveCircuit(config(**kw))


def test_an_unsampled_kernel_is_p_itself_in_training():
    P = torch.rand(5, 5) * 0.9 + 0.05
    sampled = SKMDPA(sample=True).train().kernel(P)
    assert not torch.allclose(sampled, P) and ((sampled > 0) & (sampled < 1)).all()
    assert torch.equal(SKMDPA(sample=False).train().kernel(P), P)
    x = torch.randn(4, 5, 6)
    for sample in (True, False):  # NAC eq. 2's sample is the circuit's only noise left here
        model = circuit(sample_kernel=sample).train()
        torch.manual_seed(1)
        first = model(x)
        assert torch.equal(first, model(x)) is not sample


def test_per_kernel_bandwidths_give_each_propagator_and_the_read_out_its_own():
    shared, per_kernel = circuit(), circuit(bandwidths="per_kernel")
    assert len(shared.kernel_bandwidths()) == 1
    assert shared.read_out.attn.attention.bandwidth is shared.bandwidth
    eps = per_kernel.kernel_bandwidths()
    assert len(eps) == 2 and per_kernel.read_out.attn.attention.bandwidth is not eps[0]
    with torch.no_grad():
        eps[1].fill_(0.5)
    P0, P1 = (per_kernel.link_probabilities(kernel=k) for k in (0, 1))
    assert not torch.allclose(P0, P1)
    torch.testing.assert_close(per_kernel.link_probabilities(), (P0 + P1) / 2)
    # the prior: the mean over kernels of NAC eq. 6, or the public code's sum of its own loss
    eq6 = [per_kernel.graph_prior(per_kernel.mediator_links(kernel=k)) for k in (0, 1)]
    torch.testing.assert_close(per_kernel.graph_loss(), (eq6[0] + eq6[1]) / 2)
    public = circuit(bandwidths="per_kernel", prior_loss="public")
    with torch.no_grad():
        public.kernel_bandwidths()[1].fill_(0.5)
    means = [public.graph_prior(public.mediator_links(kernel=k)) for k in (0, 1)]
    torch.testing.assert_close(public.graph_loss(), means[0] + means[1])
    torch.testing.assert_close(graph_penalty(public), public.graph_loss())  # already a mean
    U = per_kernel.config.num_processors
    torch.testing.assert_close(graph_penalty(per_kernel), per_kernel.graph_loss() / (U * (U - 1)))


def test_graph_loss_owns_its_scaling_so_every_experiment_adds_the_same_penalty():
    """``graph_loss(reduction="mean")`` is NAC eq. 6 over the ``U (U - 1)`` ordered pairs, the
    public loss as it is (already a mean); Tiny-ImageNet's and the side-by-side task's losses add
    exactly that, so a ``prior_loss="public"`` circuit is scaled alike in both."""
    from modnets.experiments import side_by_side as sbs

    y = torch.rand(2, 10).round()
    for prior_loss in ("eq6", "public"):
        model = circuit(prior_loss=prior_loss)
        U = model.config.num_processors
        pairs = 1 if prior_loss == "public" else U * (U - 1)
        mean = model.graph_loss(reduction="mean")
        torch.testing.assert_close(mean, model.graph_loss() / pairs, rtol=0, atol=0)
        torch.testing.assert_close(graph_penalty(model), mean, rtol=0, atol=0)
    with pytest.raises(ValueError, match="reduction must be one of"):
        model.graph_loss(reduction="none")
    train = sbs.CONFIGS["smoke"].train
    side = sbs.build_model("nac", train, seed=0)
    public = dataclasses.replace(side.config, prior_loss="public")
    side = NeuralAttentiveCircuit(public, side.tokenizer).eval()  # side by side, public loss
    canvases = torch.rand(2, 1, train.canvas, train.canvas)
    bce = F.binary_cross_entropy_with_logits(sbs.logits(side, canvases), y)
    torch.testing.assert_close(sbs.loss(side, canvases, y), bce + side.graph_loss())


def test_an_untruncated_read_out_links_every_pair():
    for truncated in (True, False):
        model = circuit(read_out_truncation=truncated).eval()
        design = model.design()
        attention = model.read_out.attn.attention
        log_k = attention.log_kernel(design.out_signatures, design.signatures)
        assert bool(torch.isneginf(log_k).any()) is truncated  # some pairs lie beyond 0.9
        assert model.propagators[0].attn.attention.truncation == 0.9


@pytest.mark.parametrize("residual", [True, False])
def test_the_read_out_with_and_without_its_residual_and_norm(residual):
    model = circuit(read_out_residual=residual).eval()
    ro, design = model.read_out, model.design()
    states = torch.randn(3, 8, 16)
    y = design.out_states.expand(3, -1, -1)
    msg = ro.attn(
        ro.norm_q(y),
        design.out_codes,
        design.out_signatures,
        ro.norm_kv(states),
        design.codes,
        design.signatures,
    )
    y = y + ro.scale_attn(msg) if residual else ro.scale_attn(msg)
    y = y + ro.scale_ffn(ro.ffn(ro.norm_ffn(y), design.out_codes))
    if residual:
        y = F.layer_norm(y, (16,), ro.norm_out.weight, ro.norm_out.bias)
    w = torch.softmax(ro.confidence(y).squeeze(-1), -1)
    expected = torch.einsum("bo,boc->bc", w, ro.head(y))
    with torch.no_grad():
        torch.testing.assert_close(ro(states, design)[0], expected)


def test_the_public_modfc_has_no_one_plus_alpha():
    torch.manual_seed(0)
    x, c = torch.randn(5, 4), torch.randn(5, 3)
    for alpha in (0.1, None):
        m = ModFC(4, 2, 3, alpha=alpha)
        ln = m.normalized_modulation(c)
        scale = ln if alpha is None else 1 + m.alpha * ln
        torch.testing.assert_close(m(x, c), F.linear(x * scale, m.weight, m.bias))
    model = circuit(modfc="public")
    modfcs = [m for m in model.modules() if isinstance(m, ModFC)]
    assert modfcs and all(m.alpha is None for m in modfcs)
    assert not any(name.endswith("alpha") for name, _ in model.named_parameters())
    circuit(modfc="public", learn_alpha=False)  # nothing to freeze


def test_linear_initial_states_are_the_public_seeder():
    codes = torch.randn(8, 8)
    model = circuit(initial_states="linear")
    to_state = model.generator.to_state
    expected = F.linear(F.layer_norm(codes, (8,)), to_state.net.weight, to_state.net.bias)
    torch.testing.assert_close(to_state(codes), expected)
    mlp = circuit().generator.to_state
    assert isinstance(mlp.net, torch.nn.Sequential) and len(mlp.net) == 3  # NAC §2.2's MLP


def test_the_public_prior_loss_counts_the_diagonal_and_averages():
    prior = graphon("planted_partition", 8)
    P = prior.clone().fill_diagonal_(1.0)
    prior = prior.clone().fill_diagonal_(0.0)
    eq6 = GraphPriorRegularizer(prior)(P)
    public = GraphPriorRegularizer(prior, reduction="public")(P)
    assert eq6.item() == pytest.approx(0.0, abs=1e-6)  # NAC eq. 6 leaves out i = j
    assert public.item() == pytest.approx(8 / 64)  # F.mse_loss: 8 ones on the diagonal, over 64


def test_eq9_matching_is_one_assignment_and_depends_on_the_numbering():
    torch.manual_seed(0)
    s = F.normalize(torch.randn(12, 4), dim=1)
    P = torch.exp(-(1 - s @ s.T)).masked_fill(1 - s @ s.T > 0.9, 0.0)
    prior = graphon("scale_free", 12)
    eq9, search = GraphPriorRegularizer(prior, matching="eq9"), GraphPriorRegularizer(prior)
    sigma = hungarian_permutation(P, prior)
    expected = ((P - prior[sigma][:, sigma]) ** 2).sum() - (
        (P - prior[sigma][:, sigma]) ** 2
    ).diagonal().sum()
    torch.testing.assert_close(eq9(P), expected)
    losses = {"eq9": set(), "search": set()}
    for seed in range(5):
        perm = torch.randperm(12, generator=torch.Generator().manual_seed(seed))
        Pr = P[perm][:, perm]
        losses["eq9"].add(round(eq9(Pr).item(), 6))
        losses["search"].add(round(search(Pr).item(), 6))
    assert len(losses["search"]) == 1 and len(losses["eq9"]) > 1
    with pytest.raises(ValueError, match="matching"):
        GraphPriorRegularizer(prior, matching="hungarian")


@pytest.mark.parametrize("name", sorted(KERNEL_REGIMES))
def test_each_kernel_regime_builds_the_kernel_it_names(name):
    model = circuit(**KERNEL_REGIMES[name])
    c = model.config
    attention = model.propagators[0].attn.attention
    assert attention.truncation == c.truncation and attention.sample is c.sample_kernel
    if name == "public-tiny":
        assert c.truncation == 0.9 and not c.sample_kernel
        assert model.read_out.attn.attention.truncation is None
        assert len(model.kernel_bandwidths()) == c.num_layers
    if name == "public-imagenet":
        assert c.truncation is None and c.sample_kernel
        assert not model.bandwidth.requires_grad
    if name == "modnets":
        assert c == dataclasses.replace(config())


def test_the_new_switches_reject_what_they_do_not_know():
    for field, value in [
        ("bandwidths", "each"),
        ("modfc", "tiny"),
        ("prior_loss", "mse"),
        ("prior_matching", "greedy"),
        ("initial_states", "mlp"),
    ]:
        with pytest.raises(ValueError, match=field):
            config(**{field: value})
    with pytest.raises(TypeError, match="sample_kernel"):
        config(sample_kernel="no")


@pytest.mark.parametrize("residual", RESIDUALS)
def test_the_interpreter_pools_its_streams_as_each_residual_says(residual):
    torch.manual_seed(0)
    interp = Interpreter(8, 4, num_locs=1, num_heads=2, residual=residual).eval()
    x, codes = torch.randn(2, 5, 8), torch.randn(3, 4)
    compat = torch.rand(2, 3, 5)
    compat[:, :, 0] = 0  # token 0: no function matches it
    streams = interp.locs[0](x[:, None].expand(2, 3, 5, 8), codes, compat)
    pooled = (compat[..., None] * streams).sum(1)
    gate = compat.mean(1)[..., None]
    expected = {
        "literal": x + pooled,  # NI eq. 11 as printed
        "delta": x + (compat[..., None] * (streams - x[:, None])).sum(1),
        "gating": (1 - gate) * x + gate * pooled,  # public default
        "none": pooled,  # public digits preset
    }[residual]
    out = interp(x, codes, compat)
    torch.testing.assert_close(out, expected)
    unmatched = torch.zeros_like(x[:, 0]) if residual == "none" else x[:, 0]
    torch.testing.assert_close(out[:, 0], unmatched)


def test_the_public_tiny_kernel_and_prior_are_measured_beside_the_default_on_the_same_seeds(
    tmp_path, monkeypatch
):
    from test_tiny_imagenet_data import make_tree

    from modnets.experiments import fidelity
    from modnets.experiments import tiny_imagenet as ti

    for name, folder in (("CACHE", "cache"), ("DATA", "data"), ("CHECKPOINTS", "ckpt")):
        monkeypatch.setenv(f"MODNETS_{name}", str(tmp_path / folder))
    make_tree(tmp_path / "data")
    smoke = ti.CONFIGS["smoke"]
    nac_train = dataclasses.replace(smoke.train.nac_train, batch_size=4)
    pio_train = dataclasses.replace(smoke.train.pio_train, batch_size=4)
    train = dataclasses.replace(
        smoke.train,
        classes=3,
        max_train_per_class=5,
        max_val_per_class=None,
        nac_train=nac_train,
        pio_train=pio_train,
    )
    config = dataclasses.replace(smoke, train=train)
    kernels = ("public-tiny", "public-tiny, public prior")
    result = fidelity.compare("smoke", config, 1, False, only=kernels)
    assert list(result["variants"]) == list(fidelity.VARIANTS)
    default, public, prior = result["variants"].values()
    assert [r["seed"] for r in default["per_seed"]] == [r["seed"] for r in public["per_seed"]]
    assert public["nac"]["sample_kernel"] is False and "sample_kernel" not in default["nac"]
    assert prior["nac"]["prior_loss"] == "public" and "prior_loss" not in public["nac"]
    curve = public["per_seed"][0]["drop_curve"]
    assert curve[0]["fraction"] == 0.0 and curve[0]["top1"] == public["per_seed"][0]["top1"]
    d = result["minus_default"]["public-tiny"]["top1"]
    top1 = [
        b["top1"] - a["top1"] for a, b in zip(default["per_seed"], public["per_seed"], strict=True)
    ]
    assert d["mean"] == pytest.approx(sum(top1) / len(top1)) and d["low"] <= d["mean"] <= d["high"]
    with pytest.raises(ValueError, match="variant"):
        fidelity.variant_config(smoke, "public")
    # each variant against Perceiver IO, trained beside them under the same recipe
    gap = result["minus_pio"]["public-tiny"]
    pio = [r["top1"] for r in result["pio"]]
    own = [r["top1"] for r in public["per_seed"]]
    diffs = [a - b for a, b in zip(own, pio, strict=True)]
    assert gap["mean"] == pytest.approx(sum(diffs) / len(diffs))
    # the groups of the public run's choices, and all of them with the kernel
    groups = fidelity.variants(smoke)
    everything = groups["public, all"]
    for name in ("signatures", "read-in", "FFN", "read-out and norms", "public-tiny"):
        assert groups[name].items() <= everything.items(), name
    assert everything["decay_codes"] and groups["read-in"]["read_in_heads"] == 2  # smoke's heads
    for name in groups:
        fidelity.variant_config(smoke, name).train.nac_config()  # each builds a valid NAC
    with pytest.raises(ValueError, match="selection seeds"):
        fidelity.compare("smoke", dataclasses.replace(config, selection_seeds=(7,)), seeds=(7,))
    with pytest.raises(ValueError, match="only"):
        fidelity.compare("smoke", config, only=("everything",))


def test_the_graph_weight_scales_the_prior_term_of_the_loss():
    from modnets.experiments import tiny_imagenet as ti

    model = circuit().train()
    x, soft = torch.randn(4, 5, 6), torch.full((4, 3), 1 / 3)
    for weight in (0.0, 2.0):
        torch.manual_seed(0)
        out = ti.loss(model, model, x, soft, weight)
        torch.testing.assert_close(out["loss"], out["ce"] + weight * out["graph"])
    assert out["graph"] > 0


def test_state_and_code_noise_act_in_training_only():
    x = torch.randn(4, 5, 6)
    for name, on in (("state_noise", True), ("code_noise", 0.5)):
        quiet = circuit(sample_kernel=False)
        noisy = circuit(sample_kernel=False, **{name: on})
        noisy.load_state_dict(quiet.state_dict(), strict=name != "state_noise")
        with torch.no_grad():
            torch.testing.assert_close(noisy.eval()(x), quiet.eval()(x))  # evaluation: none
            noisy.train()
            torch.manual_seed(1)
            first = noisy(x)
            assert not torch.allclose(first, noisy(x)), name  # a fresh draw per forward pass
    # code noise acts on the receiving modules' codes only, never in the read-in
    model = circuit(code_noise=0.5).train()
    design = model.design()
    with torch.no_grad():
        read = model.read_in(x, design.states, design.codes)
        torch.testing.assert_close(model.read_in(x, design.states, design.codes), read)


def test_learn_alpha_false_freezes_every_modfc_alpha():
    for learn in (True, False):
        alphas = [m.alpha for m in circuit(learn_alpha=learn).modules() if isinstance(m, ModFC)]
        assert alphas and all(a.requires_grad is learn for a in alphas)


def test_a_read_out_that_skips_the_read_in_modules_reads_the_mediators_alone():
    x = torch.randn(2, 5, 6)
    for reads in (True, False):
        model = circuit(num_read_in=2, read_out_from_read_in=reads).eval()
        with torch.no_grad():
            out = model(x, return_details=True)
            design, R = model.design(), 2
            states = model.read_in(x, design.states[:R], design.codes[:R])
            med = design.states[R:].expand(2, -1, -1)
            for layer in model.propagators:
                senders = (states, design.codes[:R], design.signatures[:R])
                med = layer(med, design.codes[R:], design.signatures[R:], senders=senders)
            if reads:  # the read-out attends to all 8 processor modules
                logits, _ = model.read_out(torch.cat([states, med], 1), design)
            else:  # to the 6 mediators only
                logits, _ = model.read_out(med, nac.mediators_only(design, R))
        torch.testing.assert_close(out.logits, logits)
        assert out.design.codes.shape[-2] == (8 if reads else 6)


def test_the_nac_straight_through_reaches_truncated_pairs_only_when_on():
    for on in (True, False):
        model = circuit(straight_through=on)
        P = model.mediator_links()
        truncated = P.detach() == 0
        assert truncated.any()
        (P * truncated).sum().backward()  # a loss that only truncated pairs take part in
        grad = model.generator.signatures.grad
        assert (grad is not None and bool(grad.abs().sum() > 0)) is on


def test_the_prior_and_its_parameters_are_the_graphon_asked_for():
    params = {"num_cliques": 2, "p_in": 0.8, "p_ring": 0.1}
    model = circuit(prior="ring_of_cliques", prior_params=params)
    torch.testing.assert_close(model.graph_prior.prior, graphon("ring_of_cliques", 8, **params))
    assert circuit(prior=None).graph_prior is None
    assert circuit(prior=None).graph_loss().item() == 0.0


def test_the_ni_bandwidth_starts_at_sigma():
    from modnets.nn.type_matching import TypeMatching

    for sigma in (1.0, 0.7):
        tm = TypeMatching(truncation=2.0, sigma=sigma)
        types, sigs = (
            F.normalize(torch.randn(1, 3, 4), dim=-1),
            F.normalize(torch.randn(2, 4), dim=-1),
        )
        d = 1 - types @ sigs.T  # (1, 3, 2)
        C = tm(types, sigs)  # normalised over functions: exp(-d / sigma) / sum_u
        expected = torch.softmax(-d / sigma, dim=-1).transpose(1, 2)
        torch.testing.assert_close(C, expected, rtol=1e-4, atol=1e-5)


def test_the_stacked_mnist_nfm_keeps_exactly_k_and_reads_with_its_own_projections():
    from modnets.experiments import stacked_mnist as sm
    from modnets.models.nfm import NFMAttention

    train = sm.CONFIGS["smoke"].train
    model = sm.build_model("nfm", train, seed=0)
    attentions = [m for m in model.modules() if isinstance(m, NFMAttention)]
    assert attentions and all(a.topk_mode == train.topk_mode == "exact" for a in attentions)
    writer = sm.build_model("nfm", dataclasses.replace(train, projections="writer"), seed=0)
    assert sum(p.numel() for p in writer.parameters()) < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("placement", ["before", "after"])
def test_where_an_nfm_module_reads_decides_how_the_read_enters(placement):
    from modnets.models.nfm import NFMNetwork

    class Double(torch.nn.Module):
        def forward(self, h):
            return 2 * h

    net = NFMNetwork([Double()], (3, 3), passes=1, placement=placement)
    net.attn(0, 0).forward = lambda h, memory=(), return_weights=False: h + 1  # a read R = 1
    x = torch.randn(2, 3, 4)
    # before: h(1) = f(h(0) + R) (Algorithm 1); after: h(1) = f(h(0)) + R (NFM App. B)
    expected = 2 * (x + 1) if placement == "before" else 2 * x + 1
    torch.testing.assert_close(net(x), expected)


# ----------------------------------------------------------- switches to the public Tiny-ImageNet run


def _public_hinge_fit(target: torch.Tensor, sig_dim: int, truncation: float) -> torch.Tensor:
    """The public code's ``preset_graph_signatures`` loop with the hinge loss, as written there
    (``nc/seeding.py``): orthogonal start, 1,000 Adam steps at 1e-3."""
    learned = torch.nn.init.orthogonal_(torch.empty(target.shape[0], sig_dim)).requires_grad_()
    optim = torch.optim.Adam([learned], lr=0.001)
    for _ in range(1000):
        s = F.normalize(learned, p=2, dim=-1)
        distances = 1.0 - torch.einsum("uc,vc->uv", s, s)
        loss = torch.where(
            target == 1,
            torch.maximum(torch.ones_like(distances).mul_(truncation), distances),
            torch.maximum(torch.ones_like(distances).mul_(-truncation), -distances),
        ).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    return learned.data


def test_prefitted_signatures_are_the_public_fit_and_wire_the_mediators_as_the_graph():
    from modnets.graphs import prefit_signatures, signature_graph
    from modnets.nn.skmdpa import link_probabilities

    graph = signature_graph("watts_strogatz", 40, seed=3)
    assert graph.sum(0).eq(4).float().mean() > 0.3  # k = round(0.1 * 40) = 4 before rewiring
    # in float64: 1,000 steps of a hinge amplify float32's rounding differences to ~0.03
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        ours = prefit_signatures(graph, 8, 0.9)
        torch.manual_seed(0)
        public = _public_hinge_fit(graph.double(), 8, 0.9)
    finally:
        torch.set_default_dtype(torch.float32)
    torch.testing.assert_close(ours, public, rtol=0, atol=1e-7)
    # in a circuit: only the mediators' signatures change, and the truncated kernel is the graph
    plain = circuit(num_processors=24, num_read_in=4, sig_dim=8)
    fitted = circuit(num_processors=24, num_read_in=4, sig_dim=8, signature_prefit="watts_strogatz")
    a, b = plain.generator, fitted.generator
    for name in ("codes", "out_codes", "out_signatures"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name))
    torch.testing.assert_close(a.signatures[:4], b.signatures[:4])  # the read-in modules'
    med = b.signatures[4:].detach()
    linked = link_probabilities(med, med, 1.0, truncation=0.9) > 0
    linked.fill_diagonal_(False)
    random = link_probabilities(a.signatures[4:], a.signatures[4:], 1.0, truncation=0.9) > 0
    assert linked.float().mean() < 0.25 < random.float().mean()  # k / (U - 1) = 2 / 19
    with pytest.raises(ValueError, match="signature_prefit"):
        config(signature_prefit="grid")
    with pytest.raises(ValueError, match="signature_prefit"):
        config(signature_prefit="watts_strogatz", truncation=None)


def test_read_in_layer_scale_scales_both_branches_as_the_public_read_in():
    from modnets.nn.read_in import ReadIn

    torch.manual_seed(0)
    scaled, plain = ReadIn(16, 6, 8, layer_scale=0.1), ReadIn(16, 6, 8)
    assert not any("scale" in n for n, _ in plain.named_parameters())
    plain.load_state_dict(scaled.state_dict(), strict=False)
    x, states, codes = torch.randn(2, 5, 6), torch.randn(3, 16), torch.randn(3, 8)
    torch.testing.assert_close(scaled.scale_attn.gamma, torch.ones(16))
    torch.testing.assert_close(scaled.scale_ffn.gamma, torch.full((16,), 0.1))
    with torch.no_grad():
        scaled.scale_attn.gamma.fill_(0.5)
        q = plain.query(plain.norm_states(states.expand(2, -1, -1)), codes)
        y = states + 0.5 * plain.out(plain.attend(plain.norm_inputs(x), q, codes), codes)
        expected = y + 0.1 * plain.ffn(plain.norm_ffn(y), codes)
        torch.testing.assert_close(scaled(x, states, codes), expected)
    assert circuit(read_in_layer_scale=0.1).read_in.scale_ffn.gamma is not None


def test_read_out_drop_path_drops_its_branches_in_training_only_when_on():
    x = torch.randn(6, 5, 6)
    for on in (False, True):
        model = circuit(drop_path=0.5, read_out_drop_path=on, sample_kernel=False, num_layers=1)
        assert model.read_out.drop_path == (0.5 if on else 0.0)
        model.propagators[0].drop_path = 0.0  # the read-out's DropPath alone
        with torch.no_grad():
            model.train()
            torch.manual_seed(1)
            first = model(x)
            assert torch.allclose(first, model(x)) is not on
            torch.testing.assert_close(model.eval()(x), model(x))


def test_the_seeder_noises_the_read_out_states_only_when_asked_and_in_training():
    x = torch.randn(4, 5, 6)
    for on in (False, True):
        model = circuit(state_noise=True, read_out_state_noise=on).train()
        mu = model.design().out_states
        out = model(x, return_details=True)
        assert (out.design.out_states.shape != mu.shape) is on
        if on:
            assert not torch.allclose(out.design.out_states, mu.expand(4, -1, -1))
        torch.testing.assert_close(model.eval()(x, return_details=True).design.out_states, mu)
    with pytest.raises(ValueError, match="read_out_state_noise"):
        config(read_out_state_noise=True)  # config() turns state_noise off


def test_gumbel_pooling_is_the_public_output_pooling_with_its_noise_in_evaluation():
    x = torch.randn(4, 5, 6)
    model = circuit(read_out_pooling="gumbel", sample_kernel=False).eval()
    plain = circuit(sample_kernel=False).eval()
    with torch.no_grad():
        out = plain(x, return_details=True)
        ro = plain.read_out
        states = []
        ro.head.register_forward_hook(lambda m, i, o: states.append(i[0]))
        plain(x)
        scores = ro.confidence(states[0]).squeeze(-1)
        torch.manual_seed(2)
        public = F.gumbel_softmax(scores, tau=1.0, hard=False, dim=-1)
        torch.manual_seed(2)
        got = model(x, return_details=True)
        torch.testing.assert_close(got.confidences, public)
        torch.testing.assert_close(out.confidences, torch.softmax(scores, -1))
        assert not torch.allclose(model(x), model(x))  # noise in evaluation too
        torch.testing.assert_close(plain(x), plain(x))
    with pytest.raises(ValueError, match="read_out_pooling"):
        config(read_out_pooling="max")


def test_decay_codes_puts_the_codes_under_weight_decay():
    for on in (False, True):
        model = circuit(decay_codes=on)
        decayed = {
            id(p) for g in model.parameter_groups(0.05) if g["weight_decay"] for p in g["params"]
        }
        codes = (model.generator.codes, model.generator.out_codes)
        assert all((id(p) in decayed) is on for p in codes)
        assert id(model.generator.signatures) not in decayed  # App. C and the public filter


def test_ni_without_query_and_key_biases_keeps_its_value_bias_and_both_paths_agree():
    from modnets.models.ni import NeuralInterpreter, NIConfig

    cfg = dict(dim=16, type_dim=4, num_functions=3, num_iterations=1, num_heads=2)
    cfg |= dict(image_size=8, patch_size=4, in_channels=1, num_outputs=3)
    torch.manual_seed(0)
    model = NeuralInterpreter(NIConfig(**cfg, qk_bias=False)).eval()
    attn = model.scripts[0].iteration.interpreter.locs[0].attn
    assert attn.query.bias is None and attn.key.bias is None and attn.value.bias is not None
    default = NeuralInterpreter(NIConfig(**cfg)).scripts[0].iteration.interpreter.locs[0].attn
    assert default.query.bias is not None and default.key.bias is not None
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        attn._fused = True
        fused = model(x)
        attn._fused = False
        torch.testing.assert_close(fused, model(x))


def test_cls_tokens_are_drawn_at_the_standard_deviation_asked_for():
    from modnets.models.ni import NeuralInterpreter, NIConfig
    from modnets.nn.tokens import ClassTokens

    for std in (0.02, 1.0):
        torch.manual_seed(0)
        tokens = ClassTokens(2, 512, std=std).tokens
        torch.manual_seed(0)
        torch.testing.assert_close(tokens, torch.randn(2, 512) * std)
        assert 0.9 * std < tokens.std() < 1.1 * std
    with pytest.raises(ValueError, match="cls_std"):
        NIConfig(cls_std=0.0)
    with pytest.raises(TypeError, match="qk_bias"):
        NIConfig(qk_bias=0)
    assert NeuralInterpreter(NIConfig(cls_std=1.0)).cls.tokens.std() > 0.5


def test_the_page_shows_the_committed_fidelity_record():
    """book/fidelity.md's measured tables are what modnets.experiments.fidelity.tables makes of
    the committed record: the page cannot keep numbers the record no longer holds."""
    import json
    from pathlib import Path

    from modnets.experiments.fidelity import tables

    root = Path(__file__).parents[1]
    record = json.loads((root / "bench/recorded/fidelity_tiny_imagenet_cpu.json").read_text())
    page = (root / "book/fidelity.md").read_text()
    block = page.split("<!-- the record's tables")[1].split("<!-- end of the record's tables")[0]
    shown = [line for line in block.splitlines() if line.startswith("|")]
    assert shown == [line for line in tables(record).splitlines() if line.startswith("|")]


def test_the_fidelity_command_writes_what_it_ran(monkeypatch, tmp_path):
    """``python -m modnets.experiments.fidelity --only ...`` passes the variants on and writes
    the comparison, which is a record of its own and not an experiment's results."""
    from modnets.experiments import fidelity

    seen = {}

    def compare(profile, workers=None, only=None):
        seen["only"] = only
        row = {"mean": 0.01, "low": -0.01, "high": 0.03, "n": 2}
        return {"minus_pio": {"modnets": row}, "minus_default": {}, "variants": {}}

    monkeypatch.setattr(fidelity, "compare", compare)
    monkeypatch.setattr(fidelity, "tables", lambda result: "")
    out = tmp_path / "fidelity.json"
    fidelity.main(["--profile", "smoke", "--only", "public, all", "--out", str(out)])
    assert seen["only"] == ["public, all"]
    assert json.loads(out.read_text())["minus_pio"]["modnets"]["n"] == 2


# The public arithmetic of each new switch, written out here (the public code cannot be imported
# without its training stack), against modnets' in float64: the value and the gradient of a
# random projection of it, with respect to the inputs and every parameter both depend on.


@pytest.fixture
def float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def _same_value_and_gradient(got, expected, leaves, public_leaves=None):
    """``got`` equals ``expected``, and so do their gradients with respect to ``leaves`` (or, for
    ``expected``, the matching ``public_leaves`` of a second model)."""
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    leaves = [t for t in leaves if t.requires_grad]
    public_leaves = (
        leaves if public_leaves is None else [t for t in public_leaves if t.requires_grad]
    )
    w = torch.randn_like(got)
    ours = torch.autograd.grad((got * w).sum(), leaves, allow_unused=True, retain_graph=True)
    public = torch.autograd.grad(
        (expected * w).sum(), public_leaves, allow_unused=True, retain_graph=True
    )
    assert any(g is not None and g.abs().sum() > 0 for g in ours)
    for leaf, a, b in zip(leaves, ours, public, strict=True):
        a = torch.zeros_like(leaf) if a is None else a
        b = torch.zeros_like(leaf) if b is None else b
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _inputs(*shapes):
    return [torch.randn(*s, requires_grad=True) for s in shapes]


def test_the_public_read_in_layer_scale_in_float64(float64):
    from modnets.nn.read_in import ReadIn

    torch.manual_seed(0)
    read_in = ReadIn(16, 6, 8, layer_scale=0.1)
    with torch.no_grad():
        read_in.scale_attn.gamma.uniform_(0.5, 1.5)  # learnable, as the public attention's
    x, states, codes = _inputs((2, 5, 6), (3, 16), (3, 8))
    r = read_in
    # public read-in: x + ls_attn * attention, then + ls_ffn * ModFFN(LN(.))
    q = r.query(r.norm_states(states.expand(2, -1, -1)), codes)
    y = states + r.scale_attn.gamma * r.out(r.attend(r.norm_inputs(x), q, codes), codes)
    expected = y + r.scale_ffn.gamma * r.ffn(r.norm_ffn(y), codes)
    _same_value_and_gradient(r(x, states, codes), expected, [x, states, codes, *r.parameters()])


def test_the_public_senders_layernorm_in_float64(float64):
    assert circuit().propagators[0].norm_senders is None
    model = circuit(share_layernorm=False, sample_kernel=False).eval()
    layer = model.propagators[0]
    with torch.no_grad():
        layer.norm_senders.weight.uniform_(0.5, 1.5)
    design = model.design()
    states, read_in, codes, sigs = _inputs((3, 8, 16), (3, 2, 16), (2, 8), (2, 4))

    def public(senders, sender_codes, sender_sigs):
        # public propagator: receivers through one LayerNorm, senders through their own
        h = layer.norm_attn(states)
        msg = layer.attn(h, design.codes, design.signatures, senders, sender_codes, sender_sigs)
        mid = states + layer.scale_attn(msg)
        return mid + layer.scale_ffn(layer.ffn(layer.norm_ffn(mid), design.codes))

    y = layer.norm_senders(states)
    got = layer(states, design.codes, design.signatures)
    expected = public(y, design.codes, design.signatures)
    _same_value_and_gradient(got, expected, [states, *model.parameters()])
    # with read-in senders, they pass through the senders' LayerNorm too
    got = layer(states, design.codes, design.signatures, senders=(read_in, codes, sigs))
    ys = torch.cat([layer.norm_senders(read_in), y], 1)
    yc, ysig = torch.cat([codes, design.codes]), torch.cat([sigs, design.signatures])
    expected = public(ys, yc, ysig)
    _same_value_and_gradient(got, expected, [states, read_in, codes, sigs, *model.parameters()])


def test_the_public_read_out_drop_path_in_float64(float64):
    model = circuit(drop_path=0.4, read_out_drop_path=True, sample_kernel=False).train()
    ro, design = model.read_out, model.design()
    (states,) = _inputs((4, 8, 16))
    torch.manual_seed(5)
    got, _ = ro(states, design)
    torch.manual_seed(5)
    keep = 1 - 0.4
    y = design.out_states.expand(4, -1, -1)
    kv = ro.norm_kv(states)
    msg = ro.attn(
        ro.norm_q(y), design.out_codes, design.out_signatures, kv, design.codes, design.signatures
    )
    # timm's DropPath, as the public read-out applies it to both branches
    y = y + ro.scale_attn(msg).div(keep) * torch.floor(keep + torch.rand(4, 1, 1))
    upd = ro.scale_ffn(ro.ffn(ro.norm_ffn(y), design.out_codes))
    y = ro.norm_out(y + upd.div(keep) * torch.floor(keep + torch.rand(4, 1, 1)))
    weights = torch.softmax(ro.confidence(y).squeeze(-1), -1)
    expected = torch.einsum("bo,boc->bc", weights, ro.head(y))
    _same_value_and_gradient(got, expected, [states, *model.parameters()])


def test_the_public_seeder_noise_on_the_read_out_states_in_float64(float64):
    model = circuit(state_noise=True, read_out_state_noise=True).train()
    design, seeder = model.design(), model.generator.to_state
    torch.manual_seed(7)
    got = seeder.seed(design.out_states, design.out_codes, 4)
    torch.manual_seed(7)
    # the public latent seeder: mu + exp(logvar / 2) * N(0, 1), one draw per example
    std = torch.exp(0.5 * seeder.log_var(seeder.norm(design.out_codes)))
    expected = design.out_states + std * torch.randn(4, *design.out_states.shape)
    _same_value_and_gradient(got, expected, list(model.parameters()))
    seeder.eval()
    assert seeder.seed(design.out_states, design.out_codes, 4) is design.out_states


def test_the_public_gumbel_pooling_in_float64(float64):
    model = circuit(read_out_pooling="gumbel", sample_kernel=False).eval()
    (x,) = _inputs((4, 5, 6))
    states = []
    model.read_out.head.register_forward_hook(lambda m, i, o: states.append(i[0]))
    torch.manual_seed(2)
    got = model(x, return_details=True)
    torch.manual_seed(2)
    # the public OutputLatentPooling: a Gumbel softmax of the confidences at temperature 1
    weights = F.gumbel_softmax(model.read_out.confidence(states[0]).squeeze(-1), tau=1.0, dim=-1)
    expected = torch.einsum("bo,boc->bc", weights, model.read_out.head(states[0]))
    _same_value_and_gradient(got.logits, expected, [x, *model.parameters()])


def test_the_public_query_and_key_without_bias_in_float64(float64):
    from modnets.models.ni import NeuralInterpreter, NIConfig

    cfg = dict(dim=16, type_dim=4, num_functions=3, num_iterations=1, num_heads=2)
    cfg |= dict(image_size=8, patch_size=4, in_channels=1, num_outputs=3)
    torch.manual_seed(0)
    public = NeuralInterpreter(NIConfig(**cfg, qk_bias=False)).eval()
    ours = NeuralInterpreter(NIConfig(**cfg)).eval()
    missing, _ = ours.load_state_dict(public.state_dict(), strict=False)
    assert missing and all(n.endswith(("query.bias", "key.bias")) for n in missing)
    for name, p in ours.named_parameters():
        if name in missing:  # the public projection's bias is no bias: zero and never learned
            p.data.zero_()
            p.requires_grad_(False)
    (x,) = _inputs((3, 1, 8, 8))
    _same_value_and_gradient(public(x), ours(x), [x, *public.parameters()], [x, *ours.parameters()])
