"""Stacked MNIST (NFM §4.2, App. C): the canvases, and the experiment's plumbing on fake MNIST."""

import dataclasses
import json
import signal

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_digits_data import fake_mnist

from modnets.data.stacked_mnist import downsample, make_canvases, sample_positions
from modnets.experiments import stacked_mnist as sm
from modnets.experiments.results import load_results, save_results


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
    for canvas, digits, pos, target in zip(data.images[:, 0], data.digits, data.positions,
                                           data.targets, strict=True):  # fmt: skip
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


def test_bad_arguments():
    images, labels = digit_images()
    with pytest.raises(ValueError, match="num_digits"):
        make_canvases(images, labels, 4, 11)
    with pytest.raises(ValueError, match="every class"):
        make_canvases(images[labels < 9], labels[labels < 9], 4, 2)
    with pytest.raises(ValueError, match="labels"):
        make_canvases(images, labels[:-1], 4, 2)


# ----------------------------------------------------------------------------- the experiment

TINY = dataclasses.replace(
    sm.CONFIGS["smoke"], train_per_count=16, val_per_count=8, test_per_count=8, val_images=100,
    batch_size=8, width=2, epochs=2, read_canvases=8,
)  # fmt: skip


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


def test_batches_hold_one_digit_count():
    images, labels = digit_images()
    data = {1: make_canvases(images, labels, 20, 1), 3: make_canvases(images, labels, 12, 3)}
    seen = {1: [], 3: []}
    for c, idx in sm._batches(data, 4, torch.Generator().manual_seed(0)):
        seen[c] += idx.tolist()
    assert sorted(seen[1]) == list(range(20)) and sorted(seen[3]) == list(range(12))


def test_nfm_model_starts_as_the_cnn():
    cnn, nfm = sm.build_model("cnn", TINY).eval(), sm.build_model("nfm", TINY).eval()
    x = torch.randn(3, 1, 64, 64)
    torch.testing.assert_close(nfm(x), cnn(x))
    assert nfm.nfm.passes == 2 and nfm.nfm.attn(0, 0).top_k == 5
    assert nfm.nfm.attn(1, 3).num_heads == 4 and nfm.nfm.attn(1, 3).key_dim == 16
    with pytest.raises(ValueError, match="kind"):
        sm.build_model("vit", TINY)


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


def test_run_trains_checkpoints_reloads_and_saves(env):
    first = sm.run(TINY, profile="smoke", show_progress=False, verify=False)
    assert set(first["models"]) == {"CNN", "NFM(CNN)"}
    nfm = first["models"]["NFM(CNN)"]
    assert set(nfm["test"]) == {1, 2, 3, 4, 5}
    assert nfm["parameters"] > first["models"]["CNN"]["parameters"]
    reads = np.array(nfm["reads"][5])
    assert reads.shape == (8, 9)  # 2 passes x 4 reads, default slot + 8 states
    np.testing.assert_allclose(reads.sum(1), 1.0, rtol=1e-5)
    assert (np.triu(reads[:, 1:]) == 0).all()  # read i sees only the states written before it
    assert len(nfm["gamma"]) == 2 and len(nfm["gamma"][0]) == 4
    assert nfm["history"]["epoch"] == [1, 2] and 1 <= nfm["history"]["best_epoch"] <= 2
    files = [p.name for p in (env / "ckpt").glob("stacked_mnist_*.pt")]
    assert sum(f.endswith(".train.pt") for f in files) == 2  # the training states
    assert sum(not f.endswith(".train.pt") for f in files) == 2  # and the two models
    again = sm.run(TINY, profile="smoke", show_progress=False, verify=False)  # from checkpoints
    assert again["models"]["NFM(CNN)"]["test"] == nfm["test"]
    assert again["models"]["CNN"]["history"] == first["models"]["CNN"]["history"]
    path = save_results(first, env / "out.json", exclude=("trained", "data"))
    loaded = load_results(path)
    assert loaded["models"]["CNN"]["test"]["1"] == first["models"]["CNN"]["test"][1]
    summary = sm.format_summary(loaded)  # works on the JSON (string keys) too
    assert "digits" in summary and "99.27" in summary
    json.dumps(sm.PAPER)


def test_interrupted_training_resumes_bit_for_bit(env, tmp_path):
    """Ctrl-C mid-epoch saves the state; --resume ends where an uninterrupted run ends, best
    epoch included (the batches of one count, in an order drawn by the resumable loop)."""
    config = dataclasses.replace(TINY, epochs=3)
    data = sm.load_data(config, verify=False)
    straight = sm.build_model("cnn", config)
    h_straight = sm.train(straight, data, config, show_progress=False)

    first = sm.build_model("cnn", config)
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
        sm.train(first, data, config, show_progress=False, state_path=state)
    torch.manual_seed(123)  # a new process: unrelated RNG state
    second = sm.build_model("cnn", config)
    h_resumed = sm.train(second, data, config, show_progress=False, state_path=state, resume=True)
    for k, v in straight.state_dict().items():
        assert torch.equal(v, second.state_dict()[k]), k
    for key in ("step", "loss", "epoch", "val_acc", "best_epoch"):
        assert h_resumed[key] == h_straight[key], key
    assert not torch.equal(straight.head.weight, sm.build_model("cnn", config).head.weight)
