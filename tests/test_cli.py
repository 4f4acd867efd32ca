"""The experiments' command line: where it writes is checked before it trains, and Ctrl-C
always stops with a message saying what was saved."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from modnets.experiments.core.cli import experiment_main
from modnets.training import TrainConfig, fit


def _never(**kwargs):
    raise AssertionError("the run started")


@pytest.mark.parametrize("where", ["out", "checkpoints"])
def test_an_unwritable_output_or_checkpoint_folder_stops_the_cli_before_it_trains(
    tmp_path, monkeypatch, capsys, where
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    argv = ["--out", str(blocker / "results.json")] if where == "out" else []
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(blocker / "ckpt" if where != "out" else tmp_path))
    with pytest.raises(SystemExit) as stop:
        experiment_main(_never, str, "doc", argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert ("--out" if where == "out" else "MODNETS_CHECKPOINTS") in err and str(blocker) in err


def test_ctrl_c_outside_a_training_step_names_what_happened(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path))

    def interrupted(**kwargs):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        experiment_main(interrupted, str, "doc", [])
    assert "interrupted outside a training step" in str(stop.value.code)


def test_ctrl_c_during_the_last_evaluation_is_not_swallowed(tmp_path):
    model, state = nn.Linear(2, 1), tmp_path / "state.pt"
    cfg = TrainConfig(epochs=1, batch_size=2, lr=1e-3, amp=False)

    def evaluate(net):  # a real SIGINT after the last training step
        os.kill(os.getpid(), signal.SIGINT)
        return {"acc": 0.5}

    def step(net, idx):
        return net(torch.ones(len(idx), 2)).sum()

    with pytest.raises(KeyboardInterrupt, match="after the last step, 2"):
        fit(model, step, cfg, n=4, evaluate=evaluate, show_progress=False, state_path=state)
    assert torch.load(state, weights_only=False)["step"] == 2  # saved: --resume ends at once
    hist = fit(
        model,
        step,
        cfg,
        n=4,
        evaluate=lambda net: {"acc": 0.5},
        show_progress=False,
        state_path=state,
        resume=True,
    )
    assert hist["step"] == [1, 2] and hist["epoch"] == [1]  # nothing trained again


def test_a_run_started_with_ctrl_c_ignored_keeps_it_ignored(tmp_path):
    """`nohup cmd &` starts a process with SIGINT ignored: training must not turn it back on."""
    model, cfg = nn.Linear(2, 1), TrainConfig(epochs=1, batch_size=2, lr=1e-3, amp=False)

    def step(net, idx):
        os.kill(os.getpid(), signal.SIGINT)
        return net(torch.ones(len(idx), 2)).sum()

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        hist = fit(model, step, cfg, n=4, show_progress=False, state_path=tmp_path / "s.pt")
        assert hist["step"] == [1, 2] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


#: Results measured with a clock (what differs between two runs of the same work): keys, and
#: claims about speed.
TIMED_KEYS = ("seconds", "samples_per_s", "speedup", "_ms", "per_s", "vs_cnn")
TIMED_CLAIMS = ("throughput", "speedup")


def _without_times(obj):
    """Results with every timing left out."""
    if isinstance(obj, dict):
        if any(t in str(obj.get("id", "")) for t in TIMED_CLAIMS):
            return None
        return {k: _without_times(v) for k, v in obj.items() if not any(t in k for t in TIMED_KEYS)}
    if isinstance(obj, list):
        return [_without_times(v) for v in obj]
    return obj


#: What each experiment's smoke run reads below the data root (fuzzy Booleans: nothing).
DATA = {
    "fuzzy_boolean": (),
    "digits": ("MNIST/raw", "KMNIST/raw", "MNIST-M/mnist_m"),
    "tiny_imagenet": ("TinyImageNet/tiny-imagenet-200",),
    "stacked_mnist": ("MNIST/raw",),
    "side_by_side": ("MNIST/raw", "KMNIST/raw"),
}


@pytest.mark.parametrize("name", sorted(DATA))
@pytest.mark.long
def test_ctrl_c_at_a_random_moment_then_resume_gives_the_uninterrupted_results(name, tmp_path):
    """A real SIGINT to the command line somewhere in a smoke run of each experiment (a sweep, a
    training, an evaluation or a checkpoint write), then ``--resume``: the same results as a run
    never interrupted."""
    from modnets.data import data_root

    missing = [d for d in DATA[name] if not (data_root() / d).exists()]
    if missing:
        pytest.skip(f"the {name} data is not here: {missing}")
    cmd = [sys.executable, "-m", f"modnets.experiments.{name}", "--profile", "smoke"]
    cmd += ["--quiet", "--out"]

    def env(name):
        return {**os.environ, "MODNETS_CHECKPOINTS": str(tmp_path / name), "MODNETS_COMPILE": "0"}

    def started(proc, name):
        """Wait until the run is past start-up: the command line has checked that it can write
        its checkpoint folder, which it creates, just before the run begins."""
        while not (tmp_path / name).exists():
            assert proc.poll() is None, f"the {name!r} run ended before it began"
            time.sleep(0.02)
        return time.perf_counter()

    whole = subprocess.Popen([*cmd, str(tmp_path / "whole.json")], env=env("a"))
    begun = started(whole, "a")
    assert whole.wait(timeout=300) == 0
    work = time.perf_counter() - begun  # the run itself, without start-up
    out = tmp_path / "interrupted.json"
    proc = subprocess.Popen([*cmd, str(out)], env=env("b"), stderr=subprocess.PIPE, text=True)
    # past start-up, before the end (the first run also filled the data caches this one reads)
    started(proc, "b")
    time.sleep(random.Random(0).uniform(0.15, 0.45) * work)
    assert proc.poll() is None, "the run ended before the signal: the test's timing is off"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and not out.exists(), "the run was not stopped"
    assert "--resume" in err
    subprocess.run([*cmd, str(out), "--resume"], env=env("b"), check=True, timeout=300)
    results = [json.loads(p.read_text()) for p in (tmp_path / "whole.json", out)]
    assert _without_times(results[0]) == _without_times(results[1])
