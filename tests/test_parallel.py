"""Independent trainings side by side (modnets.parallel): results in order, one thread per
process on two cores, errors and Ctrl-C reach the caller, and an experiment's models trained in
workers are the ones its loop then loads."""

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from modnets import parallel
from modnets.experiments.core import harness


def _where(x):
    return x, os.getpid(), torch.get_num_threads()


def _environ(name):
    return os.environ.get(name)


def _fails(x):
    if x == 2:
        raise RuntimeError(f"task {x} failed")
    return x


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _sleeps(path):
    """Write a marker, then wait to be interrupted; the interruption is recorded as a file."""
    signal.signal(signal.SIGTERM, _interrupt)  # as a training loop does (ResumableLoop)
    path.write_text(str(os.getpid()))
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        path.with_suffix(".saved").write_text("saved")
        raise
    return path


@pytest.mark.long
def test_tasks_run_in_worker_processes_in_order_with_their_share_of_threads():
    out = parallel.map_tasks(_where, [3, 1, 2, 0], workers=2, show_progress=False)
    assert [x for x, _, _ in out] == [3, 1, 2, 0]
    pids = {pid for _, pid, _ in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert {threads for _, _, threads in out} == {max(1, (os.cpu_count() or 1) // 2)}
    assert not multiprocessing.active_children()  # stopped with the call
    with parallel.keep_workers():  # a run of several rounds starts its workers once
        first = parallel.map_tasks(_where, [1, 2, 3, 4], workers=2, show_progress=False)
        kept = {p.pid for p in multiprocessing.active_children()}
        with parallel.keep_workers():  # a block inside keeps them too, and leaves them kept
            second = parallel.map_tasks(_where, [5, 6, 7, 8], workers=2, show_progress=False)
        third = parallel.map_tasks(_where, [9, 10], workers=2, show_progress=False)
        assert {pid for _, pid, _ in first + second + third} <= kept and len(kept) == 2
        # workers of another size replace the kept ones (idle, they would only hold memory)
        parallel.map_tasks(_where, [1, 2, 3], workers=3, show_progress=False)
        now = {p.pid for p in multiprocessing.active_children()}
        assert len(now) == 3 and not now & kept
    assert not multiprocessing.active_children()  # stopped with the block
    inline = parallel.map_tasks(_where, [5, 6], workers=1, show_progress=False)
    assert [(x, pid) for x, pid, _ in inline] == [(5, os.getpid()), (6, os.getpid())]


def test_workers_see_the_environment_as_it_is_at_the_call(monkeypatch):
    # a variable set after workers first started (the fork server's environment is older)
    parallel.map_tasks(_where, [1, 2], workers=2, show_progress=False)
    monkeypatch.setenv("MODNETS_CHECKPOINTS", "/set/after/the/first/call")
    seen = parallel.map_tasks(_environ, ["MODNETS_CHECKPOINTS"] * 2, workers=2, show_progress=False)
    assert seen == ["/set/after/the/first/call"] * 2


@pytest.mark.long
def test_a_failing_task_raises_its_error_here():
    with parallel.keep_workers():
        before = parallel.map_tasks(_where, [1, 2], workers=2, show_progress=False)
        with pytest.raises(RuntimeError, match="task 2 failed"):
            parallel.map_tasks(_fails, [1, 2, 3], workers=2, show_progress=False)
        # the next call of the block does not get the workers of a call that failed
        after = parallel.map_tasks(_where, [9, 10], workers=2, show_progress=False)
        assert [x for x, _, _ in after] == [9, 10]
        assert not {pid for _, pid, _ in after} & {pid for _, pid, _ in before}


@pytest.mark.long
def test_ctrl_c_reaches_the_workers_before_it_is_raised(tmp_path):
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]

    def interrupt():  # Ctrl-C in this process once both tasks have started
        while not all(p.exists() for p in paths):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        parallel.map_tasks(_sleeps, paths, workers=2, show_progress=False)
    assert all(p.with_suffix(".saved").exists() for p in paths)  # each worker saw it


@pytest.mark.long
def test_ctrl_c_starts_no_task_after_it(tmp_path):
    """Two workers, five tasks of a minute: Ctrl-C once two run ends the call within seconds,
    the two running tasks save, and none of the others starts (the pool hands a worker one call
    more than it runs; that call must not run in full after the Ctrl-C)."""
    paths = [tmp_path / f"{k}.txt" for k in range(5)]

    def interrupt():
        while sum(p.exists() for p in paths) < 2:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        parallel.map_tasks(_sleeps, paths, workers=2, show_progress=False)
    assert time.perf_counter() - start < 30
    started = [p for p in paths if p.exists()]
    assert len(started) == 2 and all(p.with_suffix(".saved").exists() for p in started)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_the_worker_count_is_checked(monkeypatch, value):
    monkeypatch.setenv("MODNETS_SEED_WORKERS", value)
    with pytest.raises(ValueError, match="MODNETS_SEED_WORKERS"):
        parallel.default_workers()
    with pytest.raises(ValueError, match="workers"):
        parallel.map_tasks(_where, [1], workers=0)


def test_workers_one_process_at_smoke_and_on_an_accelerator(monkeypatch):
    monkeypatch.delenv("MODNETS_SEED_WORKERS", raising=False)
    assert harness.workers_for(None, "smoke", "cpu") == 1
    assert harness.workers_for(None, "cpu", "cuda") == 1
    assert harness.workers_for(None, "cpu", "cpu") == (os.cpu_count() or 1)
    assert harness.workers_for(3, "smoke", "cpu") == 3
    monkeypatch.setenv("MODNETS_SEED_WORKERS", "1")
    assert harness.workers_for(None, "cpu", "cpu") == 1


def _parent_of_a_worker(path):
    """Start a worker on a long task, then die without a word (as a killed kernel does)."""
    pool = parallel.ProcessPoolExecutor(
        1,
        parallel._context(),
        initializer=parallel._init_worker,
        initargs=(1, dict(os.environ)),
    )
    pool.submit(parallel._run_task, _sleeps, path)
    while not path.exists():
        time.sleep(0.05)
    os._exit(0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.long
def test_a_worker_whose_starting_process_dies_stops_as_on_ctrl_c(tmp_path):
    path = tmp_path / "task.txt"
    code = f"from tests.test_parallel import _parent_of_a_worker as f; from pathlib import Path; f(Path({str(path)!r}))"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    deadline = time.time() + 30
    while not path.with_suffix(".saved").exists() and time.time() < deadline:
        time.sleep(0.1)
    assert path.with_suffix(".saved").exists()  # the worker saw SIGTERM, not a minute of sleep
    stat = Path(f"/proc/{path.read_text()}/stat")
    while stat.exists() and stat.read_text().split(")")[1].split()[0] not in "ZX":
        assert time.time() < deadline, "the orphaned worker did not stop after its task"
        time.sleep(0.1)


def test_a_process_that_only_trains_does_not_load_the_statistics_libraries():
    # each seed worker imports its experiment; scipy, statsmodels and networkx cost it seconds
    # and only the main process's summaries, claims and drawings use them
    heavy = ("scipy.stats", "scipy.optimize", "statsmodels", "networkx")
    code = (
        "import sys; import modnets.experiments.stacked_mnist.run, modnets.experiments.digits, "
        "modnets.experiments.tiny_imagenet.run, modnets.experiments.fuzzy_boolean, "
        "modnets.experiments.side_by_side.run; "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
