"""NAC §4.1 experiment plumbing on a fake Tiny-ImageNet tree: train, checkpoint, prune, measure,
claims, the command line and the gpu dry run."""

import dataclasses
import importlib
import json

import numpy as np
import pytest
import torch
from smoke_checks import check_smoke_results, on_fake_data
from test_tiny_imagenet_data import make_tree

from modnets.data.tiny_imagenet import normalize
from modnets.experiments import tiny_imagenet as ti
from modnets.experiments.core import harness
from modnets.experiments.core.cli import experiment_main
from modnets.experiments.core.discovery import rules_of
from modnets.experiments.core.harness import SCHEMA
from modnets.models.nac import NeuralAttentiveCircuit
from modnets.pruning import pruned

SMOKE = ti.CONFIGS["smoke"]
TRAIN = dataclasses.replace(
    SMOKE.train,
    classes=3,
    max_train_per_class=5,
    max_val_per_class=None,
    nac_train=dataclasses.replace(SMOKE.train.nac_train, batch_size=4),
    pio_train=dataclasses.replace(SMOKE.train.pio_train, batch_size=4),
)
TINY = dataclasses.replace(
    SMOKE, train=TRAIN, drop_fractions=(0.0, 0.5, 0.9), edge_fractions=(0.0, 1.0)
)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MODNETS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path / "ckpt"))
    make_tree(tmp_path / "data")
    return tmp_path


@pytest.mark.long
def test_run_trains_checkpoints_and_reloads(env):
    first = ti.run(TINY, profile="smoke", show_progress=False)
    assert tuple(first) == SCHEMA and first["seeds"] == [0, 1]
    assert set(first["models"]) == {"Perceiver IO", "NAC (scale_free)"}
    nac = first["models"]["NAC (scale_free)"]
    assert [r["seed"] for r in nac["per_seed"]] == [0, 1]
    run0 = nac["per_seed"][0]
    # 10 processor modules in smoke, 2 of them read-in modules that are never dropped; fractions
    # are of the 8 mediators; 0.8 is always measured (the claims need it)
    assert [d["modules"] for d in run0["drop"]] == [10, 6, 4, 3]
    # the random order also to 1 (all mediators but one: the modules' mechanism check)
    assert [d["fraction"] for d in run0["drop_random"]] == [0.0, 0.5, 0.8, 0.9, 1.0]
    assert [d["modules"] for d in run0["drop_random"]] == [10, 6, 4, 3, 3]
    assert len(run0["drop_random"][1]["draws"]) == TINY.random_draws
    assert [d["fraction"] for d in run0["edges"]] == [0.0, 0.9, 1.0]
    gflops = [s["gflops"] for s in run0["speed"]]
    assert gflops[0] > gflops[1] > gflops[2] > gflops[3] > 0  # compute really shrinks
    assert run0["lost_at80"] == pytest.approx(run0["top1"] - run0["top1_at80"])
    assert nac["top1"]["n"] == 2 and nac["speedup_at80"]["n"] == 2
    assert {"loss", "ce", "graph", "val_top1", "epoch", "step"} <= set(run0["history"])
    assert "graph" not in first["models"]["Perceiver IO"]["per_seed"][0]["history"]
    diag = first["diagnostics"]["NAC (scale_free)"]
    assert [d["seed"] for d in diag] == [0, 1]
    assert (
        len(diag[0]["links_trained"]["q"]) == 8 and len(diag[0]["links_init"]["q"]) == 8
    )  # mediators
    assert [c["id"] for c in first["claims"]] == list(rules_of("tiny_imagenet"))
    assert {"mean_offdiagonal_P", "q_cv", "prior_density", "q_prior_spearman", "bandwidth"} <= set(
        diag[0]["links_trained"]
    )
    assert len(list((env / "ckpt").glob("tiny_imagenet-*[0-9a-f].pt"))) == 4  # 2 models x 2 seeds
    assert not list((env / "ckpt").glob("*.train.pt"))  # finished models replace their states
    json.dumps(first)  # plain JSON
    again = ti.run(TINY, profile="smoke", show_progress=False)  # loads the checkpoints
    again_nac = again["models"]["NAC (scale_free)"]
    assert per_seed_top1(again_nac) == per_seed_top1(nac)
    assert [r["history"] for r in again_nac["per_seed"]] == [r["history"] for r in nac["per_seed"]]
    # the seeds really differ
    assert nac["per_seed"][0]["history"]["loss"] != nac["per_seed"][1]["history"]["loss"]


@pytest.mark.long
def test_models_are_read_where_they_trained(env, monkeypatch):
    """With two workers, each model is trained and read (its drop and edge curves, its circuit's
    diagnostics) in its worker; this process only times the throughput. The readings are the ones
    this process takes itself from the same checkpoints."""
    here = ti.run(TINY, profile="smoke", show_progress=False, workers=1)
    run_module = importlib.import_module("modnets.experiments.tiny_imagenet.run")

    def not_here(*args):
        raise AssertionError("read in this process")

    monkeypatch.setattr(run_module, "readings", not_here)
    there = ti.run(TINY, profile="smoke", show_progress=False, workers=2)
    for name, entry in here["models"].items():
        for a, b in zip(entry["per_seed"], there["models"][name]["per_seed"], strict=True):
            keys = {"top1", "top5", "drop", "drop_random", "drop_most", "edges"} & set(a)
            assert len(keys) == (6 if entry["kind"] == "nac" else 3)
            assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    diag = there["diagnostics"]["NAC (scale_free)"]
    assert [d["seed"] for d in diag] == [0, 1]
    for d, e in zip(diag, here["diagnostics"]["NAC (scale_free)"], strict=True):
        for links in ("links_init", "links_trained"):  # the initial model of the right seed
            assert d[links]["q"] == pytest.approx(e[links]["q"])


def per_seed_top1(entry):
    return [r["top1"] for r in entry["per_seed"]]


def test_checkpoint_that_does_not_fit_is_retrained_with_a_warning(env, monkeypatch):
    calls = []
    train = ti.train

    def counting(*args, **kwargs):
        calls.append(1)
        return train(*args, **kwargs)

    monkeypatch.setattr(ti.models, "train", counting)
    data = ti.load_data(TRAIN)
    model, history = ti.trained_model("nac", TINY, 0, data, device="cpu", show_progress=False)
    assert len(calls) == 1
    (path,) = (env / "ckpt").glob("tiny_imagenet-nac-scale_free_*.pt")
    ti.trained_model("nac", TINY, 0, data, device="cpu", show_progress=False)  # loads: no training
    assert len(calls) == 1
    # a checkpoint of another model (other shapes)
    torch.save(
        {
            "format": harness.CHECKPOINT_FORMAT,
            "model": {"tokenizer.pos": torch.zeros(3)},
            "history": {},
        },
        path,
    )
    with pytest.warns(UserWarning, match="retraining"):
        again, h = ti.trained_model("nac", TINY, 0, data, device="cpu", show_progress=False)
    assert len(calls) == 2 and h["step"] == history["step"]
    for k, v in model.state_dict().items():  # same seed, same training: the same weights
        torch.testing.assert_close(again.state_dict()[k], v)
    path.write_bytes(b"not a checkpoint")  # garbage
    with pytest.warns(UserWarning, match="retraining"):
        ti.trained_model("nac", TINY, 0, data, device="cpu", show_progress=False)
    assert len(calls) == 3
    ti.trained_model("nac", TINY, 0, data, device="cpu", show_progress=False)  # rewritten: loads
    assert len(calls) == 3


def fake_results(
    nac: dict, pio: dict, mean_p: float = 0.2, priors: tuple[str, ...] = ("scale_free",)
) -> dict:
    """Made-up results: ``{key: [value per seed]}`` for the NAC and Perceiver IO; their drop
    curves at 0 %, 80 % and 90 % from ``top1``, ``top1_at80`` and ``top1_at90`` at the GFLOPs of
    ``gflops`` (full, 80 %, 90 %); the mechanism checks' points from ``top1_no_edges`` (every
    edge removed) and ``top1_one_module`` (all modules but one; both default to chance). One NAC
    per prior of ``priors``, all alike."""

    def runs(values):
        n = len(next(iter(values.values())))
        out = []
        for s in range(n):
            r = {"seed": s, **{k: v[s] for k, v in values.items() if k != "gflops"}}
            accs = (r["top1"], r["top1_at80"], r.pop("top1_at90", r["top1_at80"]))
            r["drop"] = [
                {"fraction": f, "top1": a} for f, a in zip((0.0, 0.8, 0.9), accs, strict=True)
            ]
            r["speed"] = [
                {"fraction": f, "gflops": g, "samples_per_s": 1.0}
                for f, g in zip((0.0, 0.8, 0.9), values["gflops"], strict=True)
            ]
            r["history"] = {"val_top1": [r["top1"] - 0.005, r["top1"]]}  # converged
            r["edges"] = [{"fraction": 1.0, "top1": r.pop("top1_no_edges", 0.05)}]
            r["drop_random"] = [{"fraction": 1.0, "top1": r.pop("top1_one_module", 0.05)}]
            out.append(r)
        return out

    diag = [{"links_trained": {"mean_offdiagonal_P": mean_p}} for _ in nac["top1"]]
    nacs = [f"NAC ({p})" for p in priors]
    return {
        "config": {"train": {"classes": 20}},
        "models": {
            "Perceiver IO": {"per_seed": runs(pio)},
            **{k: {"per_seed": runs(nac)} for k in nacs},
        },
        "diagnostics": dict.fromkeys(nacs, diag),
    }


def test_claims_on_made_up_results_give_every_verdict():
    # each field made up on its own (they need not be consistent with each other here)
    nac = {
        "top1": [0.60, 0.61, 0.62],
        "top1_at80": [0.59, 0.60, 0.615],
        "gflops": (1.0, 0.3, 0.2),
        "relative_lost_at80": [0.01, 0.012, 0.011],
        "speedup_at80": [2.0, 2.1, 1.9],
        "relative_lost_edges90": [-0.05, 0.02, 0.09],
        "top1_at80_random": [0.30, 0.33, 0.31],
        "top1_at80_most": [0.61, 0.58, 0.62],
    }
    pio = {"top1": [0.50, 0.52, 0.51], "top1_at80": [0.40, 0.41, 0.42], "gflops": (1.0, 0.2, 0.1)}
    claims = {c.id: c for c in ti.claims(fake_results(nac, pio))}
    assert {k: c.verdict for k, c in claims.items()} == {
        "table1-nac-vs-pio": "reproduced",  # NAC above PIO at every seed
        "fig15-flops": "not testable here",  # App. F's NAC has the ring-of-cliques prior
        "fig5a-drop80": "reproduced",  # about 1 % relative loss
        "fig5a-above-pio": "reproduced",  # 80 % dropped, still ~9 points above PIO in full
        "fig10-edges": "inconclusive",  # straddles 3 %
        "fig5b-speedup": "not testable here",  # the FLOP cut at 80 % is only 3.3x
        "priors-differ": "not testable here",  # one prior
        "ours-throughput-tracks-flops": "reproduced",  # 2x of a 3.3x cut
        "ours-least-vs-random": "reproduced",  # 29 points above random at every seed
        "ours-least-vs-most": "inconclusive",  # straddles 0
        "ood-r": "not testable here",
    }
    assert "cuts the FLOPs only 3.3x" in claims["fig5b-speedup"].reason
    assert [c.kind for c in claims.values()].count("ours") == 3
    assert "ring-of-cliques" in claims["fig15-flops"].reason
    # with App. F's NAC: at 1/5 of its FLOPs (0.2) PIO, at its 80 % point, lost 0.10; the NAC,
    # at its 90 % point (top1_at80 again), 0.01
    rc = {c.id: c for c in ti.claims(fake_results(nac, pio, priors=("ring_of_cliques",)))}
    assert rc["fig15-flops"].verdict == "reproduced"
    np.testing.assert_allclose(rc["fig15-flops"].values, [0.09, 0.10, 0.085], atol=1e-12)
    # a fifth of the NAC's FLOPs out of reach (its curve stops at 1/4): no other point stands in
    short = fake_results({**nac, "gflops": (1.0, 0.3, 0.25)}, pio, priors=("ring_of_cliques",))
    out_of_reach = next(c for c in ti.claims(short) if c.id == "fig15-flops")
    assert out_of_reach.verdict == "not testable here"
    assert "at most 4.0x" in out_of_reach.reason and "out of reach" in out_of_reach.reason
    # one seed: no interval, so no verdict
    one = {k: v if k == "gflops" else v[:1] for k, v in nac.items()}
    pio1 = {k: v if k == "gflops" else v[:1] for k, v in pio.items()}
    c = {c.id: c for c in ti.claims(fake_results(one, pio1))}
    assert (
        c["table1-nac-vs-pio"].verdict == "inconclusive"
        and "one seed" in c["table1-nac-vs-pio"].reason
    )
    # the comparison is paired by seed, not by position
    pio_shuffled = fake_results(nac, pio)
    pio_shuffled["models"]["Perceiver IO"]["per_seed"].reverse()
    table1 = next(c for c in ti.claims(pio_shuffled) if c.id == "table1-nac-vs-pio")
    assert table1.values == pytest.approx([0.10, 0.09, 0.11])
    # edges that carry nothing: removing them all costs less than the seed spread, so the edge
    # claim is not testable (whatever its interval); the rest keep their verdicts
    idle = {**nac, "top1_no_edges": [0.605, 0.61, 0.615]}
    idle_claims = {c.id: c for c in ti.claims(fake_results(idle, pio))}
    assert idle_claims["fig10-edges"].verdict == "not testable here"
    assert idle_claims["fig10-edges"].reason.startswith("the NAC's edges unused")
    assert idle_claims["table1-nac-vs-pio"].verdict == "reproduced"
    # still learning (5 points in the last epoch): not trained to convergence, nothing decided
    learning = fake_results(nac, pio)
    learning["models"]["Perceiver IO"]["per_seed"][1]["history"]["val_top1"] = [0.45, 0.5]
    still = {c.id: c for c in ti.claims(learning)}
    assert still["table1-nac-vs-pio"].verdict == "not testable here"
    assert "gained in the last epoch" in still["table1-nac-vs-pio"].reason
    # a dense circuit is outside the paper's regime: nothing decided
    dense = {c.id: c for c in ti.claims(fake_results(nac, pio, mean_p=0.9))}
    assert dense["table1-nac-vs-pio"].verdict == "not testable here"
    assert "mean off-diagonal P" in dense["table1-nac-vs-pio"].reason


@pytest.mark.long
@on_fake_data("tiny_imagenet")
def test_cli_at_smoke_writes_the_schema(env, monkeypatch):
    monkeypatch.setitem(ti.CONFIGS, "smoke", TINY)  # the fake tree has 3 classes
    out = env / "results.json"
    experiment_main(ti.EXPERIMENT, ["--profile", "smoke", "--quiet", "--out", str(out)])
    check_smoke_results("tiny_imagenet", json.loads(out.read_text()), env)


def test_pruned_drops_least_connected_first():
    torch.manual_seed(0)
    model = ti.build_model("nac", TRAIN)
    assert isinstance(model, NeuralAttentiveCircuit)
    R, M = model.config.num_read_in, model.config.num_mediators  # smoke: 2 read-in, 8 mediators
    small = pruned(model, 0.5)  # half of the mediators
    q = model.module_importance()
    mask = model.keep_mask(4)
    kept = torch.nonzero(mask).squeeze(-1)
    assert small.config.num_processors == R + M - 4 and mask[:R].all()
    assert q[R:][mask[R:]].min() >= q[~mask].max()  # the 4 dropped are the least connected
    torch.testing.assert_close(small.generator.codes, model.generator.codes[kept])
    pio = ti.build_model("pio", TRAIN)
    assert pruned(pio, 0.9).latents.shape[0] == 1


def test_drop_orders_and_random_draws():
    """Most-first is least-first reversed, over the same mediators; a random order's accuracy is
    the mean of its draws; fractions are of the mediators."""
    torch.manual_seed(0)
    model = ti.build_model("nac", TRAIN)
    U = model.config.num_processors
    most = model.drop_order("most")
    least = model.drop_order("least")
    assert most[0] == least[-1] and set(most.tolist()) == set(least.tolist())
    x = torch.randint(0, 256, (6, 3, 64, 64), dtype=torch.uint8)
    data = ti.Data(x, torch.zeros(6, dtype=torch.long), x, torch.arange(6) % 3, ["a", "b", "c"])
    curve = ti.drop_curve(model, data, [0.0, 0.5], 6, "random", draws=3)
    assert [len(d["draws"]) for d in curve] == [3, 3]
    assert curve[1]["top1"] == pytest.approx(sum(curve[1]["draws"]) / 3)
    M = model.config.num_mediators
    assert curve[1]["modules"] == U - round(0.5 * M)  # a fraction of the mediators


def test_a_shared_scorer_scores_the_whole_model_once(monkeypatch):
    """Every drop curve begins with nothing dropped, where each of its draws is the model itself:
    scored once per curve, and once in all when the curves share a scorer (their validation
    tokens too). The curves are those each computes alone."""
    torch.manual_seed(0)
    model = ti.build_model("nac", TRAIN)
    x = torch.randint(0, 256, (6, 3, 64, 64), dtype=torch.uint8)
    y = torch.arange(6) % 3
    data = ti.Data(x, y, x, y, ["a", "b", "c"])
    orders = ("least", "random", "most")
    alone = [ti.drop_curve(model, data, [0.0, 0.5], 4, o, draws=3) for o in orders]
    seen = []
    evaluate_tokens = ti.analysis.evaluate_tokens
    monkeypatch.setattr(
        ti.analysis, "evaluate_tokens", lambda m, *a: seen.append(m) or evaluate_tokens(m, *a)
    )
    score = ti.scorer(model, data, 4)
    shared = [ti.drop_curve(model, data, [0.0, 0.5], 4, o, draws=3, score=score) for o in orders]
    assert shared == alone
    assert [m is model for m in seen] == [True] + [False] * 5  # least 1, random 3, most 1 at 0.5
    assert alone[1][0]["draws"] == [alone[1][0]["top1"]] * 3


@pytest.mark.parametrize("kind", ["nac", "pio"])
def test_curves_on_tokens_computed_once_score_as_the_images_do(kind):
    """The drop and edge curves score every pruned model on the validation tokens computed once:
    exactly what evaluating each pruned model on the images gives, batch by batch (the last
    batch short), with the model's tokenizer in place afterwards."""
    torch.manual_seed(0)
    model = ti.build_model(kind, TRAIN)
    x = torch.randint(0, 256, (11, 3, 64, 64), dtype=torch.uint8)
    y = torch.randint(0, TRAIN.num_classes, (11,))
    data = ti.Data(x, y, x, y, [str(c) for c in range(TRAIN.num_classes)])
    fractions = [0.0, 0.5, 0.9]
    order = "least" if kind == "nac" else "random"
    curve = ti.drop_curve(model, data, fractions, 4, order, draws=2)
    for point, f in zip(curve, fractions, strict=True):
        draws = [pruned(model, f, order, s) for s in ((0,) if kind == "nac" else (0, 1))]
        expected = [ti.evaluate(m, x, y, 4) for m in draws]
        assert point["top1"] == sum(e["top1"] for e in expected) / len(expected)
        assert point["top5"] == sum(e["top5"] for e in expected) / len(expected)
    if kind == "nac":
        edges = ti.edge_curve(model, data, [0.0, 0.5], 4)
        for point in edges:
            expected = ti.evaluate(model.eliminate_edges(point["fraction"]), x, y, 4)
            assert {k: point[k] for k in ("top1", "top5")} == expected
    tokens = ti.val_tokens(model, data, 4)
    assert len(tokens) == 3 and ti.evaluate_tokens(model, tokens, y) == ti.evaluate(model, x, y, 4)
    assert model.tokenizer is not None  # skipped for that evaluation only
    # the logits themselves: a pruned model on the tokens is the pruned model on the images
    small = pruned(model, 0.5, order, 0)
    small.eval()
    with torch.no_grad():
        on_images = [small(normalize(x[i : i + 4]).float()) for i in range(0, 11, 4)]
        small.tokenizer, tokenizer = None, small.tokenizer
        on_tokens = [small(t) for t in tokens]
    assert all(torch.equal(a, b) for a, b in zip(on_images, on_tokens, strict=True))
    small.tokenizer = tokenizer
    with pytest.raises(ValueError, match="tokens"):  # a failing forward leaves the tokenizer
        ti.evaluate_tokens(small, [torch.zeros(2, 5, 7)], y[:2])
    assert small.tokenizer is tokenizer
    with pytest.raises(ValueError, match="tokens hold 8 examples and y 11"):
        ti.evaluate_tokens(small, tokens[:2], y)


def test_tokenizer_shapes_and_errors():
    from modnets.nn import ConvTokenizer

    tok = ConvTokenizer(hidden_channels=8, out_channels=12, pos_dim=4)
    out = tok(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 64, 16)
    torch.testing.assert_close(out[0, :, 12:], out[1, :, 12:])  # positions are concatenated
    with pytest.raises(ValueError, match="images"):
        tok(torch.randn(2, 3, 32, 32))
    with pytest.raises(ValueError, match="kind"):
        ti.build_model("vit", TRAIN)
