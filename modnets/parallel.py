"""Independent trainings side by side: one process per core on a CPU.

The experiments train many small models that do not depend on each other (one per seed, prior
or head). On a CPU, one such training step uses two threads poorly: two single-threaded
processes, each training its own model, get through more steps per second than one process
with both threads (chapter 12, ``seed_workers``). :func:`map_tasks` runs a list of such tasks
that way and returns their results in order; :func:`default_workers` says how many processes a
machine gets.

A task runs with ``cpu_count // workers`` threads, and 1 and 2 threads round differently, so a
model trained in a worker equals the one trained in the main process only up to rounding -- as
with the fused optimiser, the checkpoint key does not include it. With one worker (a GPU, or
``MODNETS_SEED_WORKERS=1``) every task runs in this process, as before.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

import torch

from modnets.utils import progress

__all__ = ["default_workers", "keep_workers", "map_tasks"]

#: Inside :func:`keep_workers`: whether a block is open, and the pool it keeps (with its size
#: and its stop event) between calls of :func:`map_tasks`.
_keeping = False
_kept: tuple[int, ProcessPoolExecutor, object] | None = None


def default_workers(device: torch.device | str | None = None) -> int:
    """Processes for independent trainings: ``MODNETS_SEED_WORKERS`` where set, else one per
    CPU core on a CPU and 1 on an accelerator (whose one device the tasks would share)."""
    value = os.environ.get("MODNETS_SEED_WORKERS")
    if value is not None:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"MODNETS_SEED_WORKERS must be a positive integer, got {value!r}")
        return int(value)
    if device is not None and torch.device(device).type != "cpu":
        return 1
    return os.cpu_count() or 1


#: In a worker: whether a task is running (Ctrl-C stops it), its parent process, whether the
#: process that started the pool has ended, and the pool's stop event (set on Ctrl-C).
_busy = False
_parent = None
_main_gone = False
_stop = None


def _init_worker(threads: int, environ: dict[str, str], stop=None) -> None:
    global _parent, _stop
    _stop = stop
    # the caller's environment as it is now (MODNETS_CHECKPOINTS, ...), for what reads it at a
    # call; what torch read as it loaded (OMP_*, GOMP_SPINCOUNT) is the fork server's
    os.environ.clear()
    os.environ.update(environ)
    torch.set_num_threads(threads)
    _parent = os.getppid()
    # the process that started the pool gone (a killed kernel): stop as on Ctrl-C
    main = multiprocessing.parent_process()
    threading.Thread(target=_stop_when_gone, args=(main.sentinel,), daemon=True).start()
    if hasattr(os, "setpgrp"):  # a terminal's Ctrl-C reaches the main process only: it forwards one
        os.setpgrp()
    signal.signal(signal.SIGINT, _interrupt_task)


def _stop_when_gone(sentinel) -> None:
    """Wait until the process that started the pool ends (``sentinel``, the end of a pipe it
    holds, is ready then), then stop this worker as a training stops on SIGTERM (it saves its
    resumable state). A worker forked by the fork server is that server's child, and the server
    lives on while its workers do: the watch is on the starting process itself."""
    global _main_gone
    multiprocessing.connection.wait([sentinel])
    _main_gone = True
    os.kill(os.getpid(), signal.SIGTERM)


def _interrupt_task(signum, frame) -> None:
    # Raised outside a task, KeyboardInterrupt could leave the pool's queues locked (a worker
    # sending its result back, or waiting for the next task) and the pool's shutdown waiting on
    # them forever: there the worker keeps waiting, and stops when the pool does.
    if _busy:
        raise KeyboardInterrupt


def _run_task(fn: Callable, task):
    """``fn(task)`` in a worker, where Ctrl-C stops it (a training saves its state first); a
    task that reaches a worker after the pool was stopped does not start."""
    global _busy
    # the pool hands a worker one call more than it runs, and that call cannot be cancelled
    if _stop is not None and _stop.is_set():
        raise KeyboardInterrupt
    _busy = True
    try:
        return fn(task)
    finally:
        _busy = False
        # orphaned: nobody will read the result (the parent check is for spawned workers, whose
        # parent is the starting process; it may end before the watch has run)
        if _main_gone or os.getppid() != _parent:
            os._exit(1)


@contextlib.contextmanager
def keep_workers():
    """Within the block, :func:`map_tasks` keeps its worker processes for its next call with as
    many workers, so that a run training its models in rounds (each round going on from the
    last) starts them once, not once a round: a worker's start imports the task's modules (and,
    off Linux, torch), a second or more of a core each time. They stop when the block ends."""
    global _keeping
    if _keeping:  # an outer block keeps them already
        yield
        return
    _keeping = True
    try:
        yield
    finally:
        _keeping = False
        _drop_kept()


def map_tasks(
    fn: Callable,
    tasks: Sequence,
    workers: int | None = None,
    desc: str | None = None,
    show_progress: bool = True,
) -> list:
    """``[fn(task) for task in tasks]``, on a CPU in ``workers`` processes of ``cpu_count //
    workers`` threads each (started fresh for the call, or once for a :func:`keep_workers`
    block, so ``fn`` and the tasks must pickle: a module-level function, a
    ``functools.partial`` of one). Ctrl-C reaches every worker (a training saves its
    resumable state) before it is raised here, and no task starts after it."""
    global _kept
    if workers is None:
        workers = default_workers()
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    workers = min(workers, len(tasks))
    bar = progress(total=len(tasks), desc=desc, disable=not show_progress)
    if workers <= 1:
        out = []
        for task in tasks:
            out.append(fn(task))
            bar.update(1)
        bar.close()
        return out
    threads = max(1, (os.cpu_count() or 1) // workers)
    kept = _kept_pool(workers)
    if kept is None:
        context = _context()
        stop = context.Event()
        pool = ProcessPoolExecutor(
            workers,
            context,
            initializer=_init_worker,
            initargs=(threads, dict(os.environ), stop),
        )
        if _keeping:
            _kept = (workers, pool, stop)
    else:
        pool, stop = kept
    futures = {pool.submit(_run_task, fn, task): i for i, task in enumerate(tasks)}
    results: list = [None] * len(tasks)
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                results[futures[future]] = future.result()
                bar.update(1)
    except BrokenProcessPool as err:
        _kept = None
        pool.shutdown(wait=True, cancel_futures=True)
        raise RuntimeError(
            "a worker process died before its task ended; where a script calls this with "
            "several workers, its top level must sit under `if __name__ == '__main__':` "
            "(each worker imports the script), or pass workers=1"
        ) from err
    except BaseException:
        stop.set()  # first: a task already handed to a worker must not start
        for future in pending:
            future.cancel()
        for process in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(ProcessLookupError):  # a training in flight saves its state
                os.kill(process.pid, signal.SIGINT)
        _kept = None  # a failed or interrupted call's workers are not kept
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        bar.close()
    if not _keeping:
        pool.shutdown()
    return results


def _context() -> multiprocessing.context.BaseContext:
    """Where workers come from: on Linux, forks of a server process that has imported torch and
    its compiler's front end (which every torch optimiser loads) once, so a worker starts in a
    fraction of a second, not the seconds of a fresh interpreter's imports; elsewhere fresh
    interpreters. Neither copies the thread pools of a process that has run torch, as a plain
    fork of this process would. Each worker imports the library itself, so an edited module (a
    notebook's autoreload) reaches the workers as it would fresh interpreters."""
    if sys.platform != "linux":  # macOS forks badly once system frameworks are loaded
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch._dynamo"])
    return context


def _kept_pool(workers: int) -> tuple[ProcessPoolExecutor, object] | None:
    """The kept pool and its stop event, where it has ``workers`` processes and none died while
    it waited; any other is shut down (idle, its workers would only hold memory)."""
    if _kept is not None:
        size, pool, stop = _kept
        if size == workers and not getattr(pool, "_broken", False):
            return pool, stop
        _drop_kept()
    return None


def _drop_kept() -> None:
    global _kept
    if _kept is not None:
        _kept[1].shutdown()
        _kept = None
