"""NAC §4.1 experiment plumbing on a fake Tiny-ImageNet tree: train, checkpoint, prune, measure."""

import dataclasses
import json

import pytest
import torch
from test_tiny_imagenet_data import make_tree

from modnets.experiments import tiny_imagenet as ti
from modnets.nac import NeuralAttentiveCircuit

TINY = dataclasses.replace(
    ti.CONFIGS["smoke"], classes=3, max_train_per_class=None, max_val_per_class=None,
    batch_size=4, drop_fractions=(0.0, 0.5, 0.9), edge_fractions=(0.0, 1.0),
)  # fmt: skip


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MODNETS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path / "ckpt"))
    make_tree(tmp_path / "data")
    return tmp_path


def test_run_trains_checkpoints_and_reloads(env):
    first = ti.run(TINY, profile="smoke", show_progress=False)
    assert set(first["models"]) == {"Perceiver IO", "NAC (scale_free)"}
    nac = first["models"]["NAC (scale_free)"]
    assert [d["modules"] for d in nac["drop"]] == [10, 5, 1]  # 10 processor modules in smoke
    assert [d["fraction"] for d in nac["edges"]] == [0.0, 1.0]
    gflops = [s["gflops"] for s in nac["speed"]]
    assert gflops[0] > gflops[1] > gflops[2] > 0  # compute really shrinks
    assert len(list((env / "ckpt").glob("tiny_imagenet_*[0-9a-f].pt"))) == 2  # models
    assert len(list((env / "ckpt").glob("tiny_imagenet_*.train.pt"))) == 2  # resumable states
    json.dumps({k: v for k, v in first.items()})  # JSON-serialisable
    again = ti.run(TINY, profile="smoke", show_progress=False)  # loads the checkpoints
    assert again["models"]["NAC (scale_free)"]["top1"] == nac["top1"]
    assert again["models"]["NAC (scale_free)"]["history"] == nac["history"]


def test_pruned_drops_least_connected_first():
    torch.manual_seed(0)
    model = ti.build_model("nac", TINY)
    assert isinstance(model, NeuralAttentiveCircuit)
    small = ti.pruned(model, 0.5)
    q = model.module_importance()
    kept = torch.nonzero(model.keep_mask(5)).squeeze(-1)
    assert small.config.num_processors == 5
    assert q[kept].min() >= q[~model.keep_mask(5)].max()  # the 5 dropped are the least connected
    torch.testing.assert_close(small.generator.codes, model.generator.codes[kept])
    pio = ti.build_model("pio", TINY)
    assert ti.pruned(pio, 0.9).latents.shape[0] == 1


def test_tokenizer_shapes_and_errors():
    from modnets.nn import ConvTokenizer

    tok = ConvTokenizer(hidden_channels=8, out_channels=12, pos_dim=4)
    out = tok(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 64, 16)
    torch.testing.assert_close(out[0, :, 12:], out[1, :, 12:])  # positions are concatenated
    with pytest.raises(ValueError, match="images"):
        tok(torch.randn(2, 3, 32, 32))
    with pytest.raises(ValueError, match="kind"):
        ti.build_model("vit", TINY)
