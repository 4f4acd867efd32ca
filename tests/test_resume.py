"""Resumable training: Ctrl-C saves at a step boundary, --resume ends bit for bit where an
uninterrupted run ends (CPU), and a truncated or foreign checkpoint gives a clear error."""

import dataclasses
import signal
import sys
from pathlib import Path

import pytest
import torch

from modnets.experiments import tiny_imagenet as ti
from modnets.experiments.core.harness import Stage
from modnets.training import CheckpointError, load_train_state, save_checkpoint
from modnets.utils import seed_everything

sys.path.insert(0, str(Path(__file__).parent))
from test_tiny_imagenet_data import make_tree  # noqa: E402

SMOKE = ti.CONFIGS["smoke"].train
# augmentation on: its RNG state must survive the interruption too
CONFIG = dataclasses.replace(
    SMOKE,
    classes=3,
    max_train_per_class=5,  # the fake tree: 5, 4 and 4 images (all of them)
    max_val_per_class=None,
    augment="smoke",
    nac_train=dataclasses.replace(SMOKE.nac_train, epochs=3, batch_size=4, lr=1e-2),
)  # 13 training images: 3 steps per epoch, 9 in all
SEED = 0


@pytest.fixture
def data(tmp_path, monkeypatch):
    make_tree(tmp_path / "data")
    monkeypatch.setenv("MODNETS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MODNETS_CACHE", str(tmp_path / "cache"))
    return ti.load_data(CONFIG)


def fresh_model():
    seed_everything(SEED)
    return ti.build_model("nac", CONFIG)


def train(model, data, **kwargs):
    return ti.train(
        model, data, CONFIG, CONFIG.nac_train, Stage(seed=SEED, show_progress=False, **kwargs)
    )


def interrupt_at(model, step):
    """Press Ctrl-C (a real SIGINT) during the forward pass of the given step."""
    calls = {"n": 0}
    forward = model.forward

    def wrapped(*args, **kwargs):
        if model.training:
            calls["n"] += 1
            if calls["n"] == step:
                signal.raise_signal(signal.SIGINT)
        return forward(*args, **kwargs)

    model.forward = wrapped


def test_interrupted_and_resumed_equals_uninterrupted(data, tmp_path):
    straight = fresh_model()
    h_straight = train(straight, data)

    state = tmp_path / "state.pt"
    first = fresh_model()
    interrupt_at(first, 5)  # mid-epoch 2 (steps 4-6)
    with pytest.raises(KeyboardInterrupt, match="after step 5"):
        train(first, data, state_path=state)
    saved = load_train_state(state)
    assert saved["step"] == 5 and saved["epoch"] == 1 and saved["batch_in_epoch"] == 2

    second = fresh_model()
    torch.manual_seed(12345)  # the resumed process starts from unrelated RNG states
    h_resumed = train(second, data, state_path=state, resume=True)
    for k, v in straight.state_dict().items():
        assert torch.equal(v, second.state_dict()[k]), k  # bitwise
    h_straight.pop("seconds"), h_resumed.pop("seconds")  # wall time differs, nothing else
    assert h_resumed == h_straight
    assert len(h_straight["step"]) == 9 and len(h_straight["val_top1"]) == 3
    assert not torch.equal(
        straight.state_dict()["generator.codes"], fresh_model().state_dict()["generator.codes"]
    )  # training moved it


def test_truncated_or_foreign_checkpoint_is_reported(tmp_path):
    good = tmp_path / "good.pt"
    save_checkpoint({"weights": torch.zeros(1000)}, good)
    with pytest.raises(CheckpointError, match="not a modnets training checkpoint"):
        load_train_state(good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="truncated.pt is not a readable checkpoint"):
        load_train_state(truncated)
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files
