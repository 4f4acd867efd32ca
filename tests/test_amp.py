"""Mixed precision as Colab's GPUs allow it: bf16 where the GPU has it natively,
float16 with loss scaling where it does not (the default Colab T4), full precision on a CPU."""

import contextlib

import pytest
import torch

from modnets import training
from modnets.experiments.core.fingerprints import checkpoint_key
from modnets.training import TrainConfig, amp_dtype, autocast, fit, load_train_state


@pytest.mark.parametrize(
    ("native_bf16", "expected"), [(True, torch.bfloat16), (False, torch.float16)]
)
def test_amp_dtype_falls_back_to_float16_without_native_bf16(monkeypatch, native_bf16, expected):
    asked = {}

    def is_bf16_supported(including_emulation=True):
        asked["emulation"] = including_emulation
        return native_bf16 if not including_emulation else True  # a T4 "supports" emulated bf16

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert amp_dtype("cuda") is expected
    assert amp_dtype(torch.device("cuda", 0)) is expected
    assert asked["emulation"] is False  # emulated bf16 is slow: it must not count
    assert amp_dtype("cpu") is None
    assert isinstance(autocast("cpu"), contextlib.nullcontext)


def _fit(tmp_path, amp: bool, name: str):
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1) + 0.1
    model = torch.nn.Linear(8, 1)
    config = TrainConfig(
        epochs=10,
        batch_size=8,
        lr=5e-2,
        optimizer="adam",
        schedule="constant",
        clip_grad_norm=1.0,
        amp=amp,
        log_points=4,
    )

    def step(net, idx):
        return torch.nn.functional.mse_loss(net(x[idx]).float(), y[idx])

    path = tmp_path / f"{name}.pt"
    history = fit(model, step, config, n=64, show_progress=False, state_path=path)
    return history, load_train_state(path)


def test_fit_scales_the_loss_under_float16(tmp_path, monkeypatch):
    """With float16 autocast, fit adds a GradScaler (checkpointed with the training state, so a
    resumed run keeps its scale) and still trains; without amp there is none."""
    for module in (training.loop, training.runtime):  # fit's scaler and the autocast
        monkeypatch.setattr(module, "amp_dtype", lambda device: torch.float16)  # as on a T4
    history, state = _fit(tmp_path, amp=True, name="fp16")
    assert all(torch.isfinite(torch.tensor(history["loss"])))
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    assert "scaler" in state["objects"] and state["objects"]["scaler"]["scale"] > 0
    _, plain = _fit(tmp_path, amp=False, name="fp32")
    assert "scaler" not in plain["objects"]


def test_gradient_accumulation_takes_the_same_steps_as_the_whole_batch():
    """A batch in micro-batches (a GPU too small for it) gives the same optimiser steps and the
    same logged loss, up to rounding; the checkpoint key does not change."""
    torch.manual_seed(0)
    x, y = torch.randn(48, 6), torch.randn(48, 2)

    def train(accumulate):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
        config = TrainConfig(
            epochs=2,
            batch_size=12,
            lr=1e-2,
            clip_grad_norm=0.5,
            accumulate=accumulate,
            log_points=8,
        )
        history = fit(
            model,
            lambda net, idx: torch.nn.functional.mse_loss(net(x[idx]), y[idx]),
            config,
            n=48,
            show_progress=False,
        )
        return model, history

    whole, h1 = train(1)
    parts, h4 = train(4)
    for a, b in zip(whole.parameters(), parts.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        torch.tensor(h1["loss"]), torch.tensor(h4["loss"]), rtol=1e-6, atol=0
    )
    assert h1["step"] == h4["step"]
    key = checkpoint_key("m", TrainConfig(1, 12, 1e-2, accumulate=4), 0, "d", "c")
    assert key == checkpoint_key("m", TrainConfig(1, 12, 1e-2), 0, "d", "c")
    with pytest.raises(ValueError, match="accumulate"):
        TrainConfig(1, 12, 1e-2, accumulate=5)
    with pytest.raises(ValueError, match="accumulate"):
        fit(
            whole,
            lambda net, b: net(x).sum(),
            TrainConfig(1, 12, 1e-2, accumulate=2),
            batches=lambda e: [0, 1],
            show_progress=False,
        )
