"""Stacked MNIST (NFM §4.2, App. C): the canvases, and the experiment's plumbing on fake MNIST."""

import dataclasses
import importlib
import json
import signal

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from smoke_checks import check_smoke_results, on_fake_data
from test_digits_data import fake_mnist

from modnets.data import digits as digits_data
from modnets.data.stacked_mnist import (
    downsample,
    grid_positions,
    make_canvases,
    sample_positions,
)
from modnets.experiments import stacked_mnist as sm
from modnets.experiments.core import harness
from modnets.experiments.core.cli import experiment_main
from modnets.experiments.core.discovery import rules_of
from modnets.experiments.core.harness import Stage
from modnets.experiments.core.results import load_results, save_results
from modnets.training import group_batches

# the module, not the function the package names after it
sm_run = importlib.import_module("modnets.experiments.stacked_mnist.run")


def digit_images(n=40):
    """Image i is a 28x28 block of value 10 + i (never 0), label i % 10: each pixel tells its
    source image."""
    images = (10 + np.arange(n, dtype=np.uint8))[:, None, None] * np.ones((1, 28, 28), np.uint8)
    images[:, :3] = 0  # a blank band, so downsampling has something to keep or drop
    return images, np.arange(n) % 10


def test_downsample_is_nearest_neighbour():
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    small = downsample(images)
    assert small.shape == (5, 16, 16) and small.dtype == np.uint8
    ref = F.interpolate(torch.from_numpy(images)[:, None].float(), size=(16, 16), mode="nearest")
    assert np.array_equal(small, ref[:, 0].numpy().astype(np.uint8))
    assert set(np.unique(small)) <= set(np.unique(images))  # picks pixels, never blends
    with pytest.raises(ValueError, match="images"):
        downsample(images[0])


@pytest.mark.parametrize("n", [1, 3, 5])
def test_canvases_hold_n_distinct_visible_digits(n):
    images, labels = digit_images()
    data = make_canvases(images, labels, 64, n, seed=n)
    assert data.images.shape == (64, 1, 64, 64) and data.images.dtype == torch.uint8
    assert data.digits.shape == (64, n) and data.positions.shape == (64, n, 2)
    assert (data.targets.sum(1) == n).all()  # distinct classes: exactly n labels
    small = downsample(images)
    for canvas, digits, pos, target in zip(
        data.images[:, 0], data.digits, data.positions, data.targets, strict=True
    ):
        assert torch.equal(target.nonzero().flatten().sort().values, digits.sort().values)
        covered = torch.zeros(64, 64, dtype=torch.bool)
        for d, (r, c) in zip(digits.tolist(), pos.tolist(), strict=True):
            box = canvas[r : r + 16, c : c + 16]
            assert not covered[r : r + 16, c : c + 16].any()  # boxes do not overlap
            covered[r : r + 16, c : c + 16] = True
            sources = (box[box > 0].unique() - 10).tolist()
            assert len(sources) == 1 and labels[sources[0]] == d  # one image, of that class
            assert np.array_equal(box.numpy(), small[sources[0]])  # pasted whole, unchanged
        assert (canvas[~covered] == 0).all()


def test_canvases_are_seeded_and_positions_cover_the_canvas():
    images, labels = digit_images()
    a, b = make_canvases(images, labels, 8, 3, seed=1), make_canvases(images, labels, 8, 3, seed=1)
    assert torch.equal(a.images, b.images)
    assert not torch.equal(a.images, make_canvases(images, labels, 8, 3, seed=2).images)
    pos = sample_positions(2000, 1, np.random.default_rng(0))
    assert pos.min() == 0 and pos.max() == 48  # every top-left corner of a 16px box
    five = sample_positions(500, 5, np.random.default_rng(0))
    gap = np.abs(five[:, :, None] - five[:, None])
    assert ((gap >= 16).any(-1) | np.eye(5, dtype=bool)).all()


def test_the_grid_layout_puts_each_digit_in_a_cell_of_its_own_uniformly():
    images, labels = digit_images()
    data = make_canvases(images, labels, 400, 3, seed=0, canvas_size=32, layout="grid")
    pos = data.positions.numpy()
    assert set(np.unique(pos)) == {0, 16}  # corners of the four 16px cells, never between
    cells = pos[..., 0] // 16 * 2 + pos[..., 1] // 16
    assert all(len(set(row)) == 3 for row in cells.tolist())  # distinct cells
    assert np.bincount(cells.ravel(), minlength=4).min() > 250  # each of 4 cells ~300 times
    assert (data.targets.sum(1) == 3).all()
    with pytest.raises(ValueError, match="multiple of digit_size"):
        grid_positions(1, 1, np.random.default_rng(0), 30, 16)
    with pytest.raises(ValueError, match="4 cells"):
        make_canvases(images, labels, 2, 5, canvas_size=32, layout="grid")


def test_bad_arguments():
    images, labels = digit_images()
    with pytest.raises(ValueError, match="layout"):
        make_canvases(images, labels, 4, 2, layout="spiral")
    with pytest.raises(ValueError, match="num_digits"):
        make_canvases(images, labels, 4, 11)
    with pytest.raises(ValueError, match="every class"):
        make_canvases(images[labels < 9], labels[labels < 9], 4, 2)
    with pytest.raises(ValueError, match="labels"):
        make_canvases(images, labels[:-1], 4, 2)


# ----------------------------------------------------------------------------- the experiment

SMOKE = sm.CONFIGS["smoke"]
TINY = dataclasses.replace(
    SMOKE,
    train=dataclasses.replace(
        SMOKE.train,
        train_per_count=16,
        val_per_count=8,
        val_images=100,
        width=2,
        optim=dataclasses.replace(SMOKE.train.optim, epochs=2, batch_size=8),
        finetune_epochs=0,
    ),
    test_per_count=8,
    read_canvases=8,
    probe_canvases=4,
    dip_pools=(),
)
# the cpu profile's protocol (the CNN first, then both models from it), the max head beside
TINY_FT = dataclasses.replace(
    TINY, train=dataclasses.replace(TINY.train, finetune_epochs=1), dip_pools=("max",)
)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path / "ckpt"))
    fake_mnist(tmp_path / "data", n=300, prefix="train")
    fake_mnist(tmp_path / "data", n=100, prefix="t10k")
    return tmp_path


def test_data_splits(env):
    data = sm.load_data(TINY, verify=False)
    assert set(data["train"]) == set(data["val"]) == {1, 3}
    assert set(data["test"]) == {1, 2, 3, 4, 5}
    assert len(data["train"][3]) == 16 and len(data["val"][1]) == 8
    assert data["test"][5].num_digits == 5
    again = sm.load_data(TINY, verify=False)
    assert torch.equal(again["train"][1].images, data["train"][1].images)
    assert torch.equal(
        sm.training_data(TINY.train, verify=False)["val"][3].images, data["val"][3].images
    )


def test_batches_hold_one_digit_count():
    images, labels = digit_images()
    data = {1: make_canvases(images, labels, 20, 1), 3: make_canvases(images, labels, 12, 3)}
    seen = {1: [], 3: []}
    for c, idx in group_batches(data, 4, torch.Generator().manual_seed(0)):
        seen[c] += idx.tolist()
    assert sorted(seen[1]) == list(range(20)) and sorted(seen[3]) == list(range(12))


def test_nfm_model_starts_as_the_cnn():
    cnn = sm.build_model("cnn", TINY.train, seed=0).eval()
    nfm = sm.build_model("nfm", TINY.train, seed=0).eval()
    x = torch.randn(3, 1, 64, 64)
    torch.testing.assert_close(nfm(x), cnn(x))
    assert nfm.nfm.passes == 2 and nfm.nfm.attn(0, 0).top_k == 5
    assert nfm.nfm.attn(1, 3).num_heads == 4 and nfm.nfm.attn(1, 3).key_dim == 16
    with pytest.raises(ValueError, match="kind"):
        sm.build_model("vit", TINY.train)


def test_evaluate_is_exact_match():
    class Fixed(torch.nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.logits = torch.nn.Parameter(logits)

        def forward(self, x):
            return self.logits[: len(x)]

    images, labels = digit_images()
    data = make_canvases(images, labels, 4, 2, seed=0)
    logits = 2 * data.targets - 1
    logits[0, (data.targets[0] == 0).nonzero()[0]] = 1.0  # one false positive on canvas 0
    out = sm.evaluate(Fixed(logits), data)
    assert out["exact"] == 0.75 and out["label"] == pytest.approx(39 / 40)


def test_ood_dip_is_the_gap_below_the_geometric_mean_of_the_neighbours():
    assert sm.held_out(TINY) == [2, 4, 5]
    assert sm.held_out(json.loads(json.dumps(dataclasses.asdict(TINY)))) == [
        2,
        4,
        5,
    ]  # the JSON form too
    acc = {"1": 0.9, "2": 0.5, "3": 0.4, "4": 0.1, "5": 0.1}
    dips = sm.ood_dips(acc, [2, 4, 5])
    assert set(dips) == {2, 4}  # 5 has no tested neighbour 6
    assert dips[2] == pytest.approx(0.5 - 0.6) and dips[4] == pytest.approx(0.1 - 0.2)


@pytest.mark.long
def test_run_trains_in_workers_checkpoints_reloads_and_saves(env):
    """The models trained in two worker processes are the ones the run loads and reports; a
    second run (in this process) trains nothing and reports the same."""
    first = sm.run(TINY, profile="smoke", show_progress=False, verify=False, workers=2)
    assert tuple(first) == harness.SCHEMA and first["seeds"] == [0, 1]
    assert set(first["models"]) == {"CNN", "NFM(CNN)"}
    nfm, cnn = first["models"]["NFM(CNN)"], first["models"]["CNN"]
    assert [r["seed"] for r in nfm["per_seed"]] == [0, 1]
    assert set(nfm["test"]) == {"1", "2", "3", "4", "5"} and nfm["test"]["2"]["exact"]["n"] == 2
    assert nfm["parameters"] > cnn["parameters"]
    for r in nfm["per_seed"]:
        assert r["history"]["epoch"] == [1, 2] and 1 <= r["history"]["best_epoch"] <= 2
        assert len(r["history"]["val_acc"]) == 2
    diag = first["diagnostics"]["per_seed"]
    assert [d["seed"] for d in diag] == [0, 1]
    reads = np.array(diag[0]["read_matrix"]["5"])
    assert reads.shape == (8, 9)  # 2 passes x 4 reads, default slot + 8 states
    np.testing.assert_allclose(reads.sum(1), 1.0, rtol=1e-5)
    assert (np.triu(reads[:, 1:]) == 0).all()  # read i sees only the states written before it
    traced = diag[0]["nfm_reads"]["3"]
    # seven reads (the first, with an empty memory, reads nothing); candidates per position:
    # SpaceToDepth makes h1 (32x32) 4 candidates at 16x16, h1 and h2 16 + 4 at 8x8, ...
    assert traced["candidates"] == [4, 20, 84, 4, 11, 42, 169]
    assert all(0 <= w <= 1 for w in traced["default_weight"])
    assert len(diag[0]["gamma"]) == 2 and len(diag[0]["gamma"][0]) == 4
    assert set(diag[0]["ood_dip"]["CNN"]) == {"2", "4"}
    assert first["diagnostics"]["ood_dip"]["NFM(CNN)"]["4"]["n"] == 2
    assert [c["id"] for c in first["claims"]] == list(rules_of("stacked_mnist"))
    files = sorted(p.name for p in (env / "ckpt").glob("*.pt"))
    assert len(files) == 4 and not any(f.endswith(".train.pt") for f in files)  # 2 models x 2 seeds
    assert sum(f.startswith("stacked_mnist-nfm_") for f in files) == 2
    written = {p: p.stat().st_mtime_ns for p in (env / "ckpt").glob("*.pt")}
    again = sm.run(TINY, profile="smoke", show_progress=False, verify=False, workers=1)
    assert {p: p.stat().st_mtime_ns for p in (env / "ckpt").glob("*.pt")} == written
    assert again["models"]["NFM(CNN)"]["test"] == nfm["test"]
    assert again["models"]["CNN"]["per_seed"][1]["history"] == cnn["per_seed"][1]["history"]
    loaded = load_results(save_results(first, env / "out.json"))
    assert loaded["models"]["CNN"]["test"]["1"] == cnn["test"]["1"]
    summary = sm.format_summary(loaded)
    assert "digits" in summary and "99.27" in summary
    json.dumps(sm.PAPER)


def test_train_seeds_trains_every_model_the_run_then_loads(env):
    """An evidence run's whole seed set trained side by side (two workers, NFM(CNN)s first):
    every model of every seed is in its checkpoint, and the run that measures them trains
    nothing."""
    from modnets.experiments.core.options import RunOptions

    sm.train_seeds(TINY, RunOptions(show_progress=False, verify=False, workers=2))
    written = {p: p.stat().st_mtime_ns for p in (env / "ckpt").glob("*.pt")}
    assert len(written) == 4 and not any(p.name.endswith(".train.pt") for p in written)
    out = sm.run(TINY, profile="smoke", show_progress=False, verify=False, workers=1)
    assert {p: p.stat().st_mtime_ns for p in (env / "ckpt").glob("*.pt")} == written
    assert [r["seed"] for r in out["models"]["NFM(CNN)"]["per_seed"]] == [0, 1]


def test_interrupted_training_resumes_bit_for_bit(env, tmp_path):
    """Ctrl-C mid-epoch saves the state; --resume ends where an uninterrupted run ends, best
    epoch included (the batches of one count, in an order drawn by the resumable loop)."""
    # 12 steps, a point of the loss curve every 4: the interruption falls between two points
    optim = dataclasses.replace(TINY.train.optim, epochs=3, log_points=3)
    data = sm.training_data(TINY.train, verify=False)
    straight = sm.build_model("cnn", TINY.train, seed=0)
    h_straight = sm.train(straight, data, optim, Stage(seed=0, show_progress=False))

    first = sm.build_model("cnn", TINY.train, seed=0)
    calls, forward = {"n": 0}, first.forward

    def interrupting(*args, **kwargs):
        if first.training:
            calls["n"] += 1
            if calls["n"] == 6:  # mid-epoch 2 (4 batches per epoch)
                signal.raise_signal(signal.SIGINT)
        return forward(*args, **kwargs)

    first.forward = interrupting
    state = tmp_path / "state.pt"
    with pytest.raises(KeyboardInterrupt, match="after step 6"):
        sm.train(first, data, optim, Stage(seed=0, show_progress=False, state_path=state))
    torch.manual_seed(123)  # a new process: unrelated RNG state
    second = sm.build_model("cnn", TINY.train, seed=7)  # other initial weights: all are restored
    resumed = Stage(seed=0, show_progress=False, state_path=state, resume=True)
    h_resumed = sm.train(second, data, optim, resumed)
    for k, v in straight.state_dict().items():
        assert torch.equal(v, second.state_dict()[k]), k
    assert h_straight["step"] == [4, 8, 12]
    for key in ("step", "loss", "epoch", "val_acc", "best_epoch"):
        assert h_resumed[key] == h_straight[key], key
    assert not torch.equal(
        straight.head.weight, sm.build_model("cnn", TINY.train, seed=0).head.weight
    )


def test_a_checkpoint_that_does_not_fit_is_retrained(env):
    data = sm.training_data(TINY.train, verify=False)
    first, _ = sm.trained_model(
        "cnn", TINY, 0, data, device="cpu", show_progress=False, verify=False
    )
    path = next((env / "ckpt").glob("stacked_mnist-cnn_*.pt"))
    other = sm.build_model("cnn", dataclasses.replace(TINY.train, width=3)).state_dict()
    torch.save({"format": "modnets-model-v2", "model": other, "history": {}}, path)
    with pytest.warns(UserWarning, match="retraining"):
        again, history = sm.trained_model(
            "cnn", TINY, 0, data, device="cpu", show_progress=False, verify=False
        )
    assert history["epoch"] == [1, 2]  # trained again, to the same weights
    for x, y in zip(first.state_dict().values(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y)
    path.write_bytes(b"not a checkpoint")  # a truncated file is retrained too
    with pytest.warns(UserWarning, match="retraining"):
        sm.trained_model("cnn", TINY, 0, data, device="cpu", show_progress=False, verify=False)
    # a changed seed or training configuration is another checkpoint: no warning, a new file
    sm.trained_model("cnn", TINY, 1, data, device="cpu", show_progress=False, verify=False)
    assert len(list((env / "ckpt").glob("stacked_mnist-cnn_*.pt"))) == 2


def _made_up(accuracy: dict) -> dict:
    """Results with ``accuracy[name][count]`` = exact-match accuracy per seed."""
    models = {
        name: {
            "per_seed": [
                {"test": {str(c): {"exact": v[i]} for c, v in by_count.items()}} for i in range(3)
            ]
        }
        for name, by_count in accuracy.items()
    }
    return {
        "config": {"test_counts": [1, 2, 3, 4, 5], "train": {"train_counts": [1, 3]}},
        "models": models,
    }


def test_claims_compute_every_verdict_from_made_up_results():
    results = _made_up(
        {
            "CNN": {
                1: [0.99] * 3,
                2: [0.70, 0.75, 0.72],
                3: [0.88, 0.87, 0.89],
                4: [0.40, 0.42, 0.41],
                5: [0.60, 0.62, 0.61],
            },
            "NFM(CNN)": {
                1: [0.99] * 3,
                2: [0.85, 0.88, 0.86],
                3: [0.88, 0.87, 0.89],
                4: [0.30, 0.33, 0.31],
                5: [0.90, 0.91, 0.92],
            },
        }
    )
    claims = {c.id: c for c in sm.claims(results)}
    assert list(claims) == ["table5-2", "table5-4", "table5-5", "table5-interaction"]
    assert claims["table5-2"].verdict == "reproduced"
    assert claims["table5-4"].verdict == "not reproduced"
    # 5 digits has no tested neighbour (6), so no dip: the claim is tested as Table 5 states it
    assert claims["table5-5"].verdict == "reproduced" and claims["table5-5"].reason == ""
    # held-out gains (0.147, -0.097, 0.30) against none on trained counts
    inter = claims["table5-interaction"]
    np.testing.assert_allclose(
        inter.values, [(0.15 - 0.10 + 0.30) / 3, (0.13 - 0.09 + 0.29) / 3, (0.14 - 0.10 + 0.31) / 3]
    )
    assert inter.verdict == "reproduced" and inter.kind == "paper"
    assert inter.paper_effect == pytest.approx((11.66 + 3.55 + 5.21) / 300 + 0.045 / 100)
    # no dip on 2 digits (the CNN sits above its neighbours): decided all the same, no gate
    flat = _made_up(
        {
            "CNN": {1: [0.99] * 3, 2: [0.95, 0.96, 0.94], 3: [0.88] * 3},
            "NFM(CNN)": {1: [0.99] * 3, 2: [0.99, 0.985, 0.99], 3: [0.88] * 3},
        }
    )
    flat["config"]["test_counts"] = [1, 2, 3]
    c2 = sm.claims(flat)[0]
    assert c2.verdict == "reproduced"
    assert claims["table5-2"].paper.startswith("88.36 vs 76.70")
    assert claims["table5-2"].source == "NFM Table 5"
    np.testing.assert_allclose(claims["table5-4"].values, [-0.10, -0.09, -0.10])
    # a CNN that does not fit the trained counts: outside Table 5's regime, nothing decided
    weak = _made_up(
        {
            "CNN": {1: [0.5] * 3, 2: [0.2, 0.25, 0.3], 3: [0.3] * 3},
            "NFM(CNN)": {1: [0.5] * 3, 2: [0.5, 0.55, 0.6], 3: [0.3] * 3},
        }
    )
    weak["config"]["test_counts"] = [1, 2, 3]
    assert {c.verdict for c in sm.claims(weak)} == {"not testable here"}
    assert "CNN on 1 digits, worst seed 0.5" in sm.claims(weak)[0].reason


def test_the_regime_asks_both_models_to_fit_and_the_nfm_to_use_its_reads():
    fits = {1: [0.99] * 3, 2: [0.70, 0.75, 0.72], 3: [0.88, 0.87, 0.89]}
    better = {1: [0.99] * 3, 2: [0.85, 0.88, 0.86], 3: [0.88, 0.87, 0.89]}
    # an NFM(CNN) below 90 % of its own Table 5 number on 3 digits (87.78 %): nothing decided
    weak_nfm = _made_up({"CNN": fits, "NFM(CNN)": {**better, 3: [0.70] * 3}})
    weak_nfm["config"]["test_counts"] = [1, 2, 3]
    (claim, *_) = sm.claims(weak_nfm)
    assert claim.verdict == "not testable here" and "NFM(CNN) on 3 digits" in claim.reason
    # the reads switched off: a gain they carry is tested, one they do not is not testable
    for off, used in (([0.70, 0.74, 0.71], True), ([0.85, 0.88, 0.86], False)):
        results = _made_up({"CNN": fits, "NFM(CNN)": better})
        results["config"]["test_counts"] = [1, 2, 3]
        for r, v in zip(results["models"]["NFM(CNN)"]["per_seed"], off, strict=True):
            r["test_reads_off"] = {**r["test"], "2": {"exact": v}}
        (m,) = sm.regime(results)["mechanisms"]
        assert m["used"] is used and m["name"] == "the NFM's reads"
        (claim, *_) = sm.claims(results)
        assert (claim.verdict == "reproduced") is used
        if not used:
            assert "the NFM's reads unused" in claim.reason


@pytest.mark.long
@on_fake_data("stacked_mnist")
def test_command_line_writes_the_schema_at_smoke(env, monkeypatch):
    fake_mnist(
        env / "data", n=700, prefix="train"
    )  # the smoke profile holds 500 out for validation
    monkeypatch.setattr(
        digits_data, "_MNIST", dict.fromkeys(digits_data._MNIST, ())
    )  # no md5 for fakes
    out = env / "results.json"
    experiment_main(sm.EXPERIMENT, ["--profile", "smoke", "--quiet", "--out", str(out)])
    check_smoke_results("stacked_mnist", json.loads(out.read_text()), env)


def test_training_history_tracks_each_reads_gamma(env):
    data = sm.training_data(TINY.train, verify=False)
    nfm, history = sm.trained_model(
        "nfm", TINY, 0, data, device="cpu", show_progress=False, verify=False
    )
    net = nfm.nfm
    gammas = history["val_gamma"]
    assert len(gammas) == len(history["epoch"])  # one list per epoch
    assert all(len(g) == net.passes * net.num_blocks for g in gammas)  # one gamma per read
    best = gammas[history["best_epoch"] - 1]  # the model is its best validation epoch's
    assert best == net.gammas() and any(abs(v) > 0 for v in best)  # and its gates moved
    assert net.gammas()[1] == net.attn(0, 1).gamma.item()  # pass-major order
    _, cnn_history = sm.trained_model(
        "cnn", TINY, 0, data, device="cpu", show_progress=False, verify=False
    )
    assert "val_gamma" not in cnn_history


def test_convergence_gain_is_the_rise_of_the_best_over_the_last_fifth():
    assert sm.convergence_gain([0.1, 0.5, 0.6, 0.6, 0.62]) == pytest.approx(0.02)  # last 1 of 5
    assert sm.convergence_gain([0.1, 0.5, 0.7, 0.6, 0.62]) == 0.0  # the best came earlier
    ten = [0.1, 0.3, 0.5, 0.6, 0.65, 0.7, 0.7, 0.7, 0.75, 0.9]
    assert sm.convergence_gain(ten) == pytest.approx(0.2)  # last 2 of 10: 0.9 over 0.7
    assert sm.convergence_gain([0.4]) == 0.0
    with pytest.raises(ValueError, match="tail"):
        sm.convergence_gain(ten, tail=1.0)


def test_finetuning_starts_both_models_from_one_pretrained_cnn(env, monkeypatch):
    """With finetune_epochs, the CNN is trained once per seed; the CNN and NFM(CNN) then go on
    from its weights, both computing exactly the pretrained CNN's function at the start."""
    x = sm.inputs(torch.randint(0, 256, (3, 1, 64, 64), dtype=torch.uint8), "cpu")
    starts, optims, real_train = [], [], sm.train

    def recording(model, data, optim, *args, **kwargs):
        optims.append(optim)
        with torch.no_grad():
            starts.append((optim.epochs, model.nfm is not None, model.eval()(x)))
        history = real_train(model, data, optim, *args, **kwargs)
        with torch.no_grad():
            starts.append(("end", model.nfm is not None, model.eval()(x)))
        return history

    monkeypatch.setattr(sm.models, "train", recording)
    # channels-last, as at cpu: the two finetunings then differ in their optimiser's layout
    optim = dataclasses.replace(TINY_FT.train.optim, channels_last=True)
    config = dataclasses.replace(TINY_FT, train=dataclasses.replace(TINY_FT.train, optim=optim))
    data = sm.training_data(config.train, verify=False)
    nfm, hist = sm.trained_model(
        "nfm", config, 0, data, device="cpu", show_progress=False, verify=False
    )
    cnn, cnn_hist = sm.trained_model(
        "cnn", config, 0, data, device="cpu", show_progress=False, verify=False
    )
    # pretraining (2 epochs) once, then the two finetunings (1 epoch each) from its end
    assert [(e, n) for e, n, _ in starts] == [
        (2, False),
        ("end", False),
        (1, True),
        ("end", True),
        (1, False),
        ("end", False),
    ]
    t = config.train
    assert optims == [t.optim, t.finetune_optim("nfm"), t.finetune_optim("cnn")]
    assert [o.channels_last for o in optims] == [True, False, True]
    pretrained = starts[1][2]
    torch.testing.assert_close(starts[2][2], pretrained, rtol=0, atol=1e-6)  # gamma = 0
    torch.testing.assert_close(starts[4][2], pretrained, rtol=0, atol=0)
    assert not torch.allclose(starts[3][2], pretrained)  # finetuning changed NFM(CNN)
    assert hist["pretrain"] == cnn_hist["pretrain"] and len(hist["pretrain"]["val_acc"]) == 2
    assert hist["epoch"] == [1] and "val_gamma" in hist and "val_gamma" not in cnn_hist
    assert nfm.nfm.attention[0][0].source_keys is not None  # reader-side projections (§3.2.1)
    assert cnn.pool == "flatten"


def test_from_scratch_both_compile_and_only_the_cnn_goes_channels_last():
    t = sm.CONFIGS["cpu"].train
    assert t.finetune_epochs == 0  # App. C: both models from scratch
    cnn, nfm = t.scratch_optim("cnn"), t.scratch_optim("nfm")
    assert cnn.compile and nfm.compile and cnn.channels_last and not nfm.channels_last
    assert (cnn.epochs, cnn.lr) == (nfm.epochs, nfm.lr) == (t.optim.epochs, t.optim.lr)
    with pytest.raises(ValueError, match="kind must be one of"):
        t.scratch_optim("vit")


def test_finetunings_compile_nothing_and_nfm_keeps_the_default_layout():
    t = dataclasses.replace(sm.CONFIGS["cpu"].train, finetune_epochs=1)
    assert t.optim.compile and t.optim.channels_last  # a from-scratch run's many steps
    cnn, nfm = t.finetune_optim("cnn"), t.finetune_optim("nfm")
    assert (cnn.epochs, cnn.compile, cnn.channels_last) == (t.finetune_epochs, False, True)
    assert (nfm.epochs, nfm.compile, nfm.channels_last) == (t.finetune_epochs, False, False)
    assert nfm.fused and cnn.fused and cnn.lr == nfm.lr == t.optim.lr
    with pytest.raises(ValueError, match="kind must be one of"):
        t.finetune_optim("vit")


@pytest.mark.long
def test_finetuned_models_train_in_workers_after_the_cnns_they_go_on_from(env):
    """The cpu profile's protocol (the CNN first, then both models from it) in two worker
    processes, the max head trained beside for the dip; a second run trains nothing."""
    rounds = sm_run._tasks(TINY_FT)
    assert [{t[2] for t in r} for r in rounds] == [{"pretrain"}, {"nfm", "cnn"}]
    assert rounds[1][0][2] == "nfm"  # the longest first
    first = sm.run(TINY_FT, profile="smoke", show_progress=False, verify=False, workers=2)
    heads = first["diagnostics"]["per_seed"][0]["heads"]
    assert set(heads) == {"flatten", "max"}
    cnn = first["models"]["CNN"]["per_seed"][0]["test"]
    assert heads["flatten"]["test"] == {c: r["exact"] for c, r in cnn.items()}
    assert set(heads["max"]["ood_dip"]) == {"2", "4"} and set(heads["max"]["convergence"]) == {
        "pretrain",
        "finetune",
    }
    assert set(first["diagnostics"]["head_dips"]) == {"flatten", "max"}
    files = {p: p.stat().st_mtime_ns for p in (env / "ckpt").glob("*.pt")}
    # per seed: one CNN pretraining per head, the two finetuned models, the max head's CNN
    assert len(files) == 2 * 5 and sum("-finetuned_" in p.name for p in files) == 2 * 3
    again = sm.run(TINY_FT, profile="smoke", show_progress=False, verify=False, workers=1)
    assert {p: p.stat().st_mtime_ns for p in (env / "ckpt").glob("*.pt")} == files
    assert again["models"]["NFM(CNN)"]["test"] == first["models"]["NFM(CNN)"]["test"]


@pytest.mark.parametrize(
    ("seeds", "in_workers"),
    [
        # one seed: a pretraining alone, then an NFM beside a CNN: nothing is worth a worker
        ((0,), []),
        # three: two of each kind side by side, the third here -- its pretraining before the
        # round that goes on from it
        (
            (0, 1, 2),
            [
                [(0, "flatten", "pretrain"), (1, "flatten", "pretrain")],
                [(0, "flatten", "nfm"), (1, "flatten", "nfm")],
            ]
            + [[(0, "flatten", "cnn"), (1, "flatten", "cnn")]],
        ),
    ],
)
def test_workers_pair_models_of_one_kind_and_the_next_round_finds_what_it_goes_on_from(
    env, monkeypatch, seeds, in_workers
):
    config = dataclasses.replace(TINY, train=dataclasses.replace(TINY.train, finetune_epochs=1))
    config = dataclasses.replace(config, seeds=seeds)
    assert config.train.pool == "flatten"
    sent, here = [], []
    monkeypatch.setattr(sm_run, "_train_task", lambda *args: here.append(args[-1]))
    monkeypatch.setattr(
        sm_run, "pretrained_cnn", lambda c, seed, *a: here.append((seed, c.train.pool, "pretrain"))
    )
    monkeypatch.setattr(harness.parallel, "map_tasks", lambda f, tasks, *a, **k: sent.append(tasks))

    class Trained(Exception):
        pass

    def stop(*args, **kwargs):
        raise Trained

    monkeypatch.setattr(sm_run, "load_test_canvases", stop)
    with pytest.raises(Trained):
        sm.run(config, profile="smoke", show_progress=False, verify=False, workers=2)
    assert sent == in_workers
    # what no worker took, this process trains: a pretraining at once, the rest in its loop
    assert here == ([(0, "flatten", "pretrain")] if seeds == (0,) else [(2, "flatten", "pretrain")])
