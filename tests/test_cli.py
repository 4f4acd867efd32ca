"""The experiments' command line: where it writes is checked before it trains, and Ctrl-C
always stops with a message saying what was saved."""

import dataclasses
import functools
import importlib
import json
import os
import random
import runpy
import signal
import sys
import time

import pytest
import torch
from smoke_checks import DATA, check_smoke_results, missing_data, without_times
from torch import nn

from modnets import parallel
from modnets.experiments import get
from modnets.experiments.core.cli import experiment_main
from modnets.training import TrainConfig, fit


def _never(config, context):
    raise AssertionError("the run started")


def _measuring(measure):
    """The fuzzy-Boolean experiment, measuring with ``measure``."""
    return dataclasses.replace(get("fuzzy_boolean"), measure=measure)


@pytest.mark.parametrize("where", ["out", "checkpoints"])
def test_an_unwritable_output_or_checkpoint_folder_stops_the_cli_before_it_trains(
    tmp_path, monkeypatch, capsys, where
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    argv = ["--out", str(blocker / "results.json")] if where == "out" else []
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(blocker / "ckpt" if where != "out" else tmp_path))
    with pytest.raises(SystemExit) as stop:
        experiment_main(_measuring(_never), argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert ("--out" if where == "out" else "MODNETS_CHECKPOINTS") in err and str(blocker) in err


def test_ctrl_c_outside_a_training_step_names_what_happened(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path))

    def interrupted(config, context):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        experiment_main(_measuring(interrupted), ["--profile", "smoke"])
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


@pytest.fixture
def one_thread():
    """Torch on one thread here, as in the process the test starts: the runs compared then
    round alike."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _command_line(name: str, argv: list[str], environ: dict, err_path) -> None:
    """``python -m modnets.experiments.<name> argv`` in a process forked from the library's fork
    server (torch already loaded), with the caller's environment and one thread; its stderr goes
    to ``err_path`` (where multiprocessing writes a message the run exits with, as Python does)."""
    os.environ.clear()
    os.environ.update(environ)
    torch.set_num_threads(1)
    sys.argv = [name, *argv]  # runpy puts the module's path first
    sys.stderr = open(err_path, "w")  # until the process ends, which flushes it
    runpy.run_module(f"modnets.experiments.{name}", run_name="__main__", alter_sys=True)


@pytest.mark.parametrize("name", sorted(DATA))
@pytest.mark.long
@pytest.mark.usefixtures("one_thread")
def test_ctrl_c_at_a_random_moment_then_resume_gives_the_uninterrupted_results(
    name, tmp_path, monkeypatch
):
    """A real SIGINT to the command line somewhere in a smoke run of each experiment (a sweep, a
    training, an evaluation or a checkpoint write), then ``--resume``: the same results as a run
    never interrupted. The interrupted run is a process of its own (its ``__main__`` run as
    ``python -m`` runs it, in a fork of a process that has loaded torch, which a fresh
    interpreter would spend seconds on); the uninterrupted run and the resumed one run the same
    command line in this process (no start-up of their own to pay). The uninterrupted run's
    results are the smoke results every experiment's command line writes (``smoke_checks``)."""
    missing = missing_data(name)
    if missing:
        pytest.skip(f"the {name} data is not here: {missing}")
    experiment = importlib.import_module(f"modnets.experiments.{name}").EXPERIMENT
    main = functools.partial(experiment_main, experiment)
    args = ["--profile", "smoke", "--quiet", "--out"]
    monkeypatch.setenv("MODNETS_COMPILE", "0")
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path / "a"))
    begun = time.perf_counter()
    main([*args, str(tmp_path / "whole.json")])
    work = time.perf_counter() - begun
    check_smoke_results(name, json.loads((tmp_path / "whole.json").read_text()), tmp_path)
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path / "b"))
    out, err = tmp_path / "interrupted.json", tmp_path / "stderr.txt"
    proc = parallel._context().Process(
        target=_command_line, args=(name, [*args, str(out)], dict(os.environ), err)
    )
    proc.start()
    try:
        # Past start-up (the command line has checked that it can write its checkpoint folder,
        # which it creates, just before the run begins), before the end: the run here took
        # `work` with the data caches it filled, which that process reads too.
        while not (tmp_path / "b").exists():
            assert proc.is_alive(), "the interrupted run ended before it began"
            time.sleep(0.02)
        time.sleep(random.Random(0).uniform(0.15, 0.45) * work)
        assert proc.is_alive(), "the run ended before the signal: the test's timing is off"
        os.kill(proc.pid, signal.SIGINT)
        proc.join(timeout=300)
        assert not proc.is_alive(), "the run did not stop within 300 s of Ctrl-C"
    finally:  # a failed test leaves no process for pytest to wait on
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert proc.exitcode not in (0, None) and not out.exists(), "the run was not stopped"
    assert "--resume" in err.read_text()
    main([*args, str(out), "--resume"])
    results = [json.loads(p.read_text()) for p in (tmp_path / "whole.json", out)]
    assert without_times(results[0]) == without_times(results[1])
