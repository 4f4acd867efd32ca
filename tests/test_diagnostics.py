"""Routing diagnostics on hand-made compatibilities, where every number is known."""

import math

import pytest
import torch

from modnets import diagnostics as dg
from modnets.models.ni import NeuralInterpreter, NIConfig


def compat_from(assign, U=6, iterations=1, batch=2):
    """``(iterations, batch, U, T)`` with ``C[u, t] = w`` for every ``(u, t, w)`` in ``assign``."""
    T = 1 + max(t for _, t, _ in assign)
    C = torch.zeros(iterations, batch, U, T)
    for u, t, w in assign:
        C[:, :, u, t] = w
    return C


def test_collapsed_routing_two_functions_for_every_token():
    C = compat_from([(u, t, 0.5) for t in range(8) for u in (0, 1)])
    r = dg.routing(C)
    assert r["functions_per_token"] == [2.0] and r["unmatched"] == [0.0]
    assert r["share"][0] == pytest.approx([0.5, 0.5, 0, 0, 0, 0])
    assert r["functions_used"] == [2]
    assert r["routing_entropy"][0] == pytest.approx(math.log(2) / math.log(6))
    assert r["regime"] == "collapsed"


def test_uniform_routing_every_function_alike():
    C = compat_from([(u, t, 0.3) for t in range(8) for u in range(6)])
    r = dg.routing(C)
    assert r["functions_per_token"] == [6.0] and r["functions_used"] == [6]
    assert r["routing_entropy"][0] == pytest.approx(1.0)
    assert r["regime"] == "uniform"


def test_modular_routing_one_function_per_token_all_functions_used():
    C = compat_from([(t % 6, t, 1.0) for t in range(12)])
    r = dg.routing(C)
    assert r["functions_per_token"] == [1.0] and r["functions_used"] == [6]
    assert r["routing_entropy"][0] == pytest.approx(0.0, abs=1e-6)
    assert r["share"][0] == pytest.approx([1 / 6] * 6)
    assert r["regime"] == "modular"


def test_unmatched_tokens_are_counted_and_left_out_of_the_entropy():
    C = compat_from([(u, t, 0.3) for t in range(3) for u in range(6)] + [(0, 3, 0.0)])
    r = dg.routing(C)
    assert r["unmatched"] == [0.25]
    assert r["routing_entropy"][0] == pytest.approx(1.0)


def test_token_slice_leaves_out_cls_tokens():
    # token 0 (a CLS token) reaches every function; the variable tokens only functions 0 and 1
    C = compat_from([(u, 0, 1.0) for u in range(6)] + [(u, t, 0.5) for t in (1, 2) for u in (0, 1)])
    assert dg.routing(C)["regime"] != "collapsed"
    assert dg.routing(C, tokens=slice(1, None))["regime"] == "collapsed"


def test_regime_holds_only_when_every_iteration_agrees():
    C = compat_from([(u, t, 0.5) for t in range(6) for u in (0, 1)], iterations=2)
    C[1] = compat_from([(t % 6, t, 1.0) for t in range(6)])[0]
    r = dg.routing(C)
    assert r["functions_used"] == [2, 6] and r["regime"] == "modular"


def test_regime_line_names_the_seeds_and_warns():
    line = dg.regime_line(
        [
            {"seed": 0, "regime": "collapsed"},
            {"seed": 1, "regime": "modular"},
            {"seed": 2, "regime": "collapsed"},
        ]
    )
    assert "collapsed (seeds 0, 2)" in line and "modular (seed 1)" in line and "weak" in line
    assert "weak" not in dg.regime_line([{"seed": 0, "regime": "modular"}])


def test_routing_rejects_bad_shape():
    with pytest.raises(ValueError, match="compat"):
        dg.routing(torch.zeros(2, 6, 5))


def test_routing_shift_is_the_total_variation_between_two_routings():
    a = torch.zeros(2, 1, 3, 4)
    a[:, :, 0] = 1.0  # every token on function 0
    b = a.clone()
    assert dg.routing_shift(a, b) == [0.0, 0.0]
    b[1] = 0.0
    b[1, :, 1] = 1.0  # iteration 2: every token moved to function 1
    b[0, :, :, :2] = 0.5  # iteration 1: half of two tokens' weight moved
    b[0, :, 2, :2] = 0.0
    b[0, :, 1, :2] = 0.5
    assert dg.routing_shift(a, b) == pytest.approx([0.25, 1.0])
    with pytest.raises(ValueError, match="shapes"):
        dg.routing_shift(a, b[:, :, :2])


def test_ni_routing_shift_is_zero_for_a_copy_and_ignores_cls_tokens():
    torch.manual_seed(0)
    cfg = NIConfig(
        dim=16,
        type_dim=4,
        num_functions=3,
        num_iterations=2,
        num_heads=2,
        input_kind="vector",
        num_elements=5,
        num_cls=4,
        num_outputs=1,
        truncation=1.6,
    )
    model = NeuralInterpreter(cfg)
    x = torch.rand(8, 5)
    copy = NeuralInterpreter(cfg)
    copy.load_state_dict(model.state_dict())
    copy.reset_cls_tokens(2)  # other CLS tokens: the elements' first-iteration routing is unchanged
    shift = dg.ni_routing_shift(model, copy, x)
    assert shift[0] == pytest.approx(0.0, abs=1e-6) and len(shift) == 2
    with torch.no_grad():
        copy.scripts[0].signature_chunks[0].mul_(-1.0)  # other signatures: the routing moves
    assert min(dg.ni_routing_shift(model, copy, x)) > 0.05


def test_function_shares_are_drawn_as_stacked_bars_of_the_shares():
    import matplotlib

    matplotlib.use("Agg")
    from modnets.viz import draw_function_shares

    entries = [
        {"seed": 0, "regime": "modular", "share": [[0.5, 0.3, 0.2], [0.6, 0.4, 0.0]]},
        {"seed": 1, "regime": "collapsed", "share": [[1.0, 0.0, 0.0], [0.9, 0.1, 0.0]]},
    ]
    ax = draw_function_shares(entries)
    bars = ax.patches
    assert len(bars) == 2 * 2 * 3  # seeds x iterations x functions
    heights = [b.get_height() for b in bars]
    assert heights == pytest.approx([v for e in entries for it in e["share"] for v in it])
    tops = [b.get_y() + b.get_height() for b in bars[2::3]]  # each bar's last segment
    assert tops == pytest.approx([1.0] * 4)  # the shares of an iteration stack to one
    assert {t.get_text() for t in ax.texts} == {"seed 0: modular", "seed 1: collapsed"}
    with pytest.raises(ValueError, match="entries"):
        draw_function_shares([])


def test_path_distances_are_zero_for_input_blind_routing_and_one_for_disjoint_paths():
    same = torch.rand(2, 1, 4, 3).expand(2, 5, 4, 3) / 4  # every sample routed alike
    assert dg.path_distances(same).abs().max() < 1e-6
    disjoint = torch.zeros(1, 2, 2, 3)
    disjoint[0, 0, 0] = 1.0  # sample 0: every element to function 0
    disjoint[0, 1, 1] = 1.0  # sample 1: every element to function 1
    assert dg.path_distances(disjoint)[0, 1] == pytest.approx(1.0)
    half = disjoint.clone()
    half[0, 1] = 0.5  # sample 1 now splits every element evenly: TV 1/2
    assert dg.path_distances(half)[0, 1] == pytest.approx(0.5)
    unmatched = disjoint.clone()
    unmatched[0, 1] = 0.0  # no function takes sample 1's elements: a route of its own
    assert dg.path_distances(unmatched)[0, 1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="batch >= 2"):
        dg.path_distances(torch.rand(1, 1, 2, 3))


def test_path_contrast_is_positive_when_routing_follows_the_label_and_negative_when_crossed():
    C = torch.zeros(1, 4, 2, 3)
    C[0, :2, 0] = 1.0  # label 0 -> function 0
    C[0, 2:, 1] = 1.0  # label 1 -> function 1
    by_label = dg.path_contrast(C, torch.tensor([0, 0, 1, 1]))
    assert by_label["path_contrast"] == pytest.approx(1.0)
    assert by_label["path_distance"] == pytest.approx(2 / 3)  # 8 of 12 ordered pairs differ
    # each label has one sample on each function: equal labels are routed apart half the
    # time more than different ones
    crossed = dg.path_contrast(C, torch.tensor([0, 1, 0, 1]))
    assert crossed["path_contrast"] == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="two labels"):
        dg.path_contrast(C, torch.zeros(4, dtype=torch.long))


def test_silhouette_matches_its_definition_point_by_point():
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(30, 4, generator=g), dim=-1)
    labels = torch.randint(0, 3, (30,), generator=g)
    labels[0] = 3  # a group of one: silhouette 0 by convention
    d = 1 - x @ x.T
    expected = []
    for i in range(30):
        own = labels == labels[i]
        if own.sum() == 1:
            expected.append(0.0)
            continue
        a = d[i, own].sum() / (own.sum() - 1)
        b = min(d[i, labels == k].mean() for k in labels.unique() if k != labels[i])
        expected.append(float((b - a) / max(a, b)))
    assert dg.silhouette(x, labels) == pytest.approx(sum(expected) / 30, abs=1e-6)
    assert dg.silhouette(x, torch.zeros(30, dtype=torch.long)) == 0.0


def test_types_on_their_signatures_are_perfectly_clustered_and_random_ones_are_not():
    g = torch.Generator().manual_seed(1)
    sig = torch.nn.functional.normalize(torch.randn(4, 8, generator=g), dim=-1)
    on = sig.repeat(10, 1)  # every type exactly at a signature
    noise = torch.nn.functional.normalize(torch.randn(40, 8, generator=g), dim=-1)
    first, last = dg.type_clustering(torch.stack([noise, on]), sig)
    assert last == pytest.approx(1.0) and first < 0.5
    with pytest.raises(ValueError, match="signatures"):
        dg.type_clustering(on[None], sig[:, :4])


def test_ni_paths_and_types_read_every_iteration_of_every_script():
    torch.manual_seed(0)
    sizes = dict(dim=16, type_dim=4, num_functions=3, num_iterations=2, num_heads=2)
    io = dict(input_kind="vector", num_elements=5, num_cls=2, num_outputs=1)
    cfg = NIConfig(**sizes, **io, num_scripts=2, truncation=1.6)
    model = NeuralInterpreter(cfg)
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    out = dg.ni_paths_and_types(model, torch.rand(6, 5), labels)
    assert len(out["type_silhouette"]) == 4 and out["path_distance"] > 0
    same = dg.ni_paths_and_types(model, torch.rand(1, 5).expand(6, 5), labels)
    assert same["path_distance"] == pytest.approx(0.0, abs=1e-6)
    assert same["path_contrast"] == pytest.approx(0.0, abs=1e-6)
