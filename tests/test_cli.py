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
import subprocess
import sys
import time

import pytest
import torch
from smoke_checks import DATA, check_smoke_results, missing_data, without_times
from torch import nn

from modnets import parallel
from modnets.experiments import get
from modnets.experiments.core.cli import experiment_main
from modnets.nn import autotune
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
    # a ModAttn's first call at a shape has its paths timed; the runs below find them cached
    measuring = []
    measure = autotune._measure

    def timed_measure(measurement):
        begun = time.perf_counter()
        try:
            return measure(measurement)
        finally:
            measuring.append(time.perf_counter() - begun)

    monkeypatch.setattr(autotune, "_measure", timed_measure)
    begun = time.perf_counter()
    main([*args, str(tmp_path / "whole.json")])
    work = time.perf_counter() - begun - sum(measuring)
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


#: A stand-in for a long run: six seeds trained ahead in two worker processes, seeds 2 to 5
#: sleeping ``TOY_SLEEP`` seconds a step; every training start is logged to ``TOY_LOG``.
SLOW_PACKAGE = '''
"""A toy experiment whose last seeds train slowly in worker processes."""

import os
import time
from dataclasses import dataclass

import torch
from torch import nn

from modnets.experiments.core import harness
from modnets.experiments.core.claims import decide_rule, holm, outside_regime
from modnets.experiments.core.experiment import Experiment, Measurement
from modnets.experiments.core.rule import Rule
from modnets.experiments.core.rules import declare
from modnets.experiments.core.stats import per_seed
from modnets.training import TrainConfig

NAME = "toy_slow"
SOURCE_PAPER = "A slow toy paper"
CHAPTER = ""
TRAIN_CODE = ()
RULES = declare("toy_slow", [
    Rule(id="toy-slow-slope", kind="ours", text="The slope is above 1", source="ours",
         paper="-", quantity="slope - 1", test=">", threshold=0.0),
])


@dataclass(frozen=True)
class SlowConfig:
    seeds: tuple = (0, 1, 2, 3, 4, 5)
    selection_seeds: tuple = ()
    epochs: int = 20


CONFIGS = {"smoke": SlowConfig(), "cpu": SlowConfig(), "gpu": SlowConfig()}


def _trained(config, options, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 1, generator=g)
    y = 2 * x

    def step(model, idx):
        if seed >= 2:
            time.sleep(float(os.environ.get("TOY_SLEEP", "0")))
        return (model(x[idx]) - y[idx]).pow(2).mean()

    def train(model, stage):
        with open(os.environ["TOY_LOG"], "a") as log:
            log.write(f"{seed}\\n")
        cfg = TrainConfig(epochs=config.epochs, batch_size=16, lr=0.1, amp=False, save_every=1)
        return stage.fit(model, step, cfg, n=64)

    build = lambda: nn.Linear(1, 1)  # noqa: E731
    return harness.load_or_train(
        "toy_slow", config, seed, build, train, code=(), data="toy", options=options
    )


def _ahead(task):
    config, options, seed = task
    _trained(config, options.quiet(), seed)


def measure(config, options):
    tasks = [(config, options, s) for s in config.seeds]
    harness.train_ahead(_ahead, tasks, options, "seeds")
    rows = [{"seed": s, "slope": _trained(config, options, s)[0].weight.item()} for s in config.seeds]
    return Measurement({"line": {"per_seed": rows}}, {}, config, ())


def summarise(config, models, diagnostics):
    return models, diagnostics


def regime(results):
    return harness.regime("none", {})


def claims(results):
    slopes = per_seed(results["models"]["line"]["per_seed"], "slope")
    return holm([outside_regime(decide_rule("toy-slow-slope", [s - 1 for s in slopes]), results["regime"])], "toy")


def format_summary(results):
    return "slopes"


def dry_run(config):
    return []


REGISTERED = {}
EXPERIMENT = Experiment.from_namespace(globals())
'''


@pytest.mark.long
def test_ctrl_c_ends_a_two_worker_run_soon_and_resume_loses_no_finished_seed(tmp_path):
    """A SIGINT to the command line while two workers train slow seeds ends the process within
    30 s (the pool hands a worker one seed more than it runs, and that seed once ran in full
    after the Ctrl-C), and ``--resume`` trains only the seeds that had not finished."""
    folder = tmp_path / "mine"
    (folder / "toy_slow").mkdir(parents=True)
    (folder / "toy_slow" / "__init__.py").write_text(SLOW_PACKAGE)
    log = tmp_path / "log.txt"
    env = {
        **os.environ,
        "MODNETS_EXPERIMENTS": str(folder),
        "MODNETS_CHECKPOINTS": str(tmp_path / "checkpoints"),
        "MODNETS_SEED_WORKERS": "2",
        "TOY_LOG": str(log),
        "TOY_SLEEP": "1",
    }
    out = tmp_path / "results.json"
    cli = [sys.executable, "-m", "modnets.experiments", "toy_slow", "--profile", "cpu"]
    cli += ["--quiet", "--out", str(out)]
    proc = subprocess.Popen(cli, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (log.exists() and {"2", "3"} <= set(log.read_text().split())):
            assert proc.poll() is None and time.time() < deadline, "the slow seeds never started"
            time.sleep(0.1)
        time.sleep(1)
        os.kill(proc.pid, signal.SIGINT)
        begun = time.time()
        _, err = proc.communicate(timeout=60)
        assert time.time() - begun < 30, "the run went on after Ctrl-C"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and not out.exists() and "--resume" in err
    resumed = subprocess.run(
        [*cli, "--resume"], env={**env, "TOY_SLEEP": "0"}, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    started = log.read_text().split()
    # 0 and 1 had finished: not again; 2 and 3 go on; 4 and 5 had not started
    assert sorted(started) == ["0", "1", "2", "2", "3", "3", "4", "5"]
    assert json.loads(out.read_text())["seeds"] == [0, 1, 2, 3, 4, 5]
