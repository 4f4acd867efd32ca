"""The training loop never loses or poisons saved work: a state with a non-finite value is never
written, an unwritable state path is refused before the first step, a resume into another model
or another length of run is refused, and bad settings are refused when they are made."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import modnets
from modnets.training import CheckpointError, TrainConfig, fit, load_train_state
from modnets.training.checkpoints import non_finite
from modnets.utils import seed_everything

N = 512  # 32 steps of 16 an epoch


def _task(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 4, generator=g)
    return x, x @ torch.randn(4, 1, generator=g)


def _step(x, y, nan_from: int | None = None):
    calls = {"n": 0}

    def step(net, idx):
        calls["n"] += 1
        loss = (net(x[idx]) - y[idx]).pow(2).mean()
        return loss * float("nan") if nan_from is not None and calls["n"] >= nan_from else loss

    return step


@pytest.mark.parametrize("log_points", [1, 2, 128])
@pytest.mark.parametrize("nan_from", [3, 7])
def test_no_state_with_a_non_finite_value_is_ever_written(tmp_path, log_points, nan_from):
    """A loss that turns NaN at step 3 or 7, states saved every 5 steps, the loss checked at 1,
    2 or 128 points: training stops with an error, and the state on disk (if any) is finite and
    from before the NaN."""
    x, y = _task()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    config = TrainConfig(epochs=4, batch_size=16, lr=1e-3, save_every=5, log_points=log_points)
    path = tmp_path / "state.pt"
    with pytest.raises(FloatingPointError):
        fit(model, _step(x, y, nan_from), config, n=N, show_progress=False, state_path=path)
    if path.exists():
        state = load_train_state(path)
        assert non_finite(state["objects"]) is None and state["step"] < nan_from
    assert nan_from > 5 or not path.exists()  # a NaN before the first save leaves no state


def test_an_unwritable_state_path_is_refused_before_the_first_step(tmp_path):
    x, y = _task()
    calls = []
    locked = tmp_path / "locked"
    locked.write_text("a file where the state's folder would be")  # unwritable, even for root

    def step(net, idx):
        calls.append(1)
        return (net(x[idx]) - y[idx]).pow(2).mean()

    config = TrainConfig(epochs=1, batch_size=16, lr=1e-3)
    with pytest.raises(OSError, match="cannot write the training state to .*locked"):
        fit(nn.Linear(4, 1), step, config, n=N, show_progress=False, state_path=locked / "s.pt")
    assert calls == []


def _interrupted(path, model, n=N, epochs=2):
    """Train ``model`` for 10 steps and leave its state at ``path`` as a Ctrl-C would."""
    x, y = _task()
    stop = {"n": 0}

    def step(net, idx):
        stop["n"] += 1
        if stop["n"] > 10:
            raise KeyboardInterrupt
        return (net(x[idx]) - y[idx]).pow(2).mean()

    config = TrainConfig(epochs=epochs, batch_size=16, lr=1e-3, save_every=5)
    with pytest.raises(KeyboardInterrupt):
        fit(model, step, config, n=n, show_progress=False, state_path=path)
    return path, config


def test_a_resume_into_another_model_or_run_length_is_refused(tmp_path):
    """Only the TrainConfig was compared: a resume into a model of other shapes, of another
    configuration, or with another number of samples (the schedule stretched) went on."""
    x, y = _task()
    torch.manual_seed(0)
    path, config = _interrupted(tmp_path / "linear.pt", nn.Linear(4, 1))

    def resume(model, n=N):
        step = _step(x, y)
        return fit(model, step, config, n=n, show_progress=False, state_path=path, resume=True)

    with pytest.raises(CheckpointError, match="steps.per_epoch: 32 -> 64"):
        resume(nn.Linear(4, 1), n=2 * N)
    with pytest.raises(CheckpointError, match="model.class: 'Linear' -> 'Sequential'"):
        resume(nn.Sequential(nn.Linear(4, 1)))

    class Configured(nn.Linear):  # a model with a dataclass config, as every modnets model
        def __init__(self, config):
            super().__init__(4, 1)
            self.config = config

    torch.manual_seed(0)
    first = Configured(TrainConfig(epochs=1, batch_size=1, lr=1))
    path, config = _interrupted(tmp_path / "configured.pt", first)
    with pytest.raises(CheckpointError, match="model.config.lr: 1 -> 2"):
        resume(Configured(TrainConfig(epochs=1, batch_size=1, lr=2)))
    assert resume(Configured(TrainConfig(epochs=1, batch_size=1, lr=1)))["step"][-1] == 64


@pytest.mark.parametrize(
    "fields,error,message",
    [
        ({"lr": "1e-3"}, TypeError, r"lr must be a number, got '1e-3' \(str\): pass float"),
        ({"lr": True}, TypeError, "lr must be a number, got True"),
        ({"weight_decay": "0.05"}, TypeError, "weight_decay must be a number"),
        ({"save_every": -5}, ValueError, "save_every must be >= 0"),
        ({"save_every": 2.5}, TypeError, "save_every must be an int"),
    ],
)
def test_bad_settings_are_refused_when_made(fields, error, message):
    with pytest.raises(error, match=message):
        TrainConfig(**{"epochs": 1, "batch_size": 16, "lr": 1e-3, **fields})


def test_a_best_metric_evaluate_does_not_return_is_named():
    x, y = _task()
    config = TrainConfig(epochs=1, batch_size=16, lr=1e-3, best="acc")
    with pytest.raises(
        ValueError, match=r"best='acc' must be a key of what evaluate returns.*'r2'"
    ):
        fit(
            nn.Linear(4, 1),
            _step(x, y),
            config,
            n=N,
            show_progress=False,
            evaluate=lambda m: {"r2": 0.5},
        )


class _Runs:
    """Unpickling it would run code: it writes a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


def test_a_state_whose_unpickling_would_run_code_is_refused(tmp_path):
    """Training states and experiment checkpoints are read with ``weights_only=True``: a file
    from someone else cannot run code on ``--resume`` or from the cache."""
    from modnets.training.checkpoints import CHECKPOINT_FORMAT

    marker = tmp_path / "ran.txt"
    path = tmp_path / "state.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "objects": {}, "x": _Runs(marker)}, path)
    with pytest.raises(CheckpointError, match="other than tensors and plain values"):
        load_train_state(path)
    assert not marker.exists()
    sources = Path(modnets.__file__).parent.rglob("*.py")
    unsafe = [str(p) for p in sources if "weights_only=False" in p.read_text()]
    assert unsafe == []


def test_a_resumed_state_with_numpy_values_loads_and_ends_as_an_uninterrupted_run(tmp_path):
    """An evaluate returning NumPy numbers, the global NumPy generator drawn from: the state is
    stored as tensors and plain values, loads safely, and the resumed run ends bit for bit."""
    x, y = _task()
    config = TrainConfig(epochs=3, batch_size=16, lr=1e-3, save_every=5, best="r2")

    def evaluate(m):  # a NumPy draw, as augmentation would make: its state must survive too
        return {"r2": np.float64(np.random.rand())}  # noqa: NPY002

    def run(step, path=None, resume=False):
        seed_everything(0)
        model = nn.Linear(4, 1)
        hist = fit(
            model,
            step,
            config,
            n=N,
            show_progress=False,
            evaluate=evaluate,
            state_path=path,
            resume=resume,
        )
        return model, hist

    whole, hist = run(_step(x, y))
    path = tmp_path / "state.pt"
    calls = {"n": 0}

    def stops(net, idx):
        calls["n"] += 1
        if calls["n"] == 40:
            raise KeyboardInterrupt
        return (net(x[idx]) - y[idx]).pow(2).mean()

    with pytest.raises(KeyboardInterrupt):
        run(stops, path)
    resumed, again = run(_step(x, y), path, resume=True)
    assert torch.equal(resumed.weight, whole.weight) and again["val_r2"] == hist["val_r2"]


def test_an_empty_batch_is_named_not_read_as_a_high_learning_rate():
    x, y = _task()
    config = TrainConfig(epochs=1, batch_size=16, lr=1e-3)

    def batches(epoch):
        return [torch.arange(16), torch.arange(0)]

    with pytest.raises(ValueError, match="an empty batch in epoch 1"):
        fit(nn.Linear(4, 1), _step(x, y), config, batches=batches, show_progress=False)
