"""Measuring a callable: its time per call and the activation memory autograd keeps for it.

Shared by the benchmark suite (:mod:`modnets.benchmarks`), the experiments (the Tiny-ImageNet
speed-up of dropped modules) and the GPU budget (:mod:`modnets.experiments.core.budget`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

import torch
from torch import Tensor
from torch.utils import benchmark

__all__ = ["median_time", "saved_bytes"]


def median_time(
    fn: Callable[[], object],
    repeats: int = 5,
    warmup: int = 2,
    device: torch.device | str = "cpu",
    min_run_time: float = 0.2,
) -> float:
    """Median time of one call of ``fn()`` in seconds, measured by ``torch.utils.benchmark``.

    After ``warmup`` calls, :meth:`~torch.utils.benchmark.Timer.blocked_autorange` times blocks
    of calls (block size chosen so that the timer's own overhead does not count) for at least
    ``min_run_time`` seconds, and at least ``repeats`` blocks; the median is over blocks. The
    timer runs at torch's current thread count and synchronises CUDA. ``device`` is accepted
    for the callers' sake: the synchronisation does not need it."""
    del device
    for _ in range(warmup):
        fn()
    timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=min_run_time)
    times = list(m.times)
    while len(times) < repeats:
        times.extend(timer.timeit(m.number_per_run).times)
    return statistics.median(times)


def saved_bytes(fn: Callable[[], object], exclude: Iterable[Tensor] = ()) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of ``fn()`` (activation memory;
    counted the same way on every device), each storage once; storages of ``exclude`` (e.g. a
    model's parameters) are not counted."""
    total = 0
    seen: set[int] = {t.untyped_storage().data_ptr() for t in exclude}

    def pack(t: Tensor):
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total
