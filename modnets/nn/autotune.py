"""Measured choices between code paths that compute the same thing, as cuDNN's benchmark mode
and Inductor's autotuning make them: where a path is faster depends on the machine (a CPU with
twice the matrix-product rate moves every crossover), so the first call at a new shape times
each path where the code runs, and the winner is kept.

A choice is cached in memory and in a JSON file (:func:`cache_path`: ``$MODNETS_AUTOTUNE``, else
``~/.cache/modnets/autotune.json``), so later calls and later processes on the machine take it
without measuring again; :func:`reset` forgets every choice. A path other than the caller's
default must be faster by :data:`MARGIN`: two paths within timing noise keep the default, so a
choice does not flip from one run to the next.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from modnets.utils import atomic_file

__all__ = ["MARGIN", "REPEATS", "cache_path", "choice", "choose", "reset"]

#: How much faster than the default another path must be to be chosen.
MARGIN = 1.1
#: Timed calls of each path (after one warm-up call each); the fastest counts.
REPEATS = 3

_choices: dict[str, str] | None = None  # this process's, read from the file on first use


def cache_path() -> Path:
    """Where the choices are kept: ``$MODNETS_AUTOTUNE``, else ``~/.cache/modnets/autotune.json``."""
    env = os.environ.get("MODNETS_AUTOTUNE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "modnets" / "autotune.json"


def _read() -> dict[str, str]:
    try:
        content = json.loads(cache_path().read_text())
    except (OSError, ValueError):  # none yet, or not ours: measure again
        return {}
    return {k: v for k, v in content.items() if isinstance(v, str)}


def _cached() -> dict[str, str]:
    global _choices
    if _choices is None:
        _choices = _read()
    return _choices


def choice(key: str) -> str | None:
    """The path chosen for ``key``, or ``None`` where none has been measured."""
    return _cached().get(key)


def _store(key: str, name: str) -> None:
    _cached()[key] = name
    try:  # merged with what other processes wrote since this one read the file
        with atomic_file(cache_path()) as tmp:
            tmp.write_text(json.dumps({**_read(), key: name}, indent=1, sort_keys=True) + "\n")
    except OSError as err:  # a read-only home: the choice holds for this process
        warnings.warn(f"autotune: cannot write {cache_path()} ({err})", stacklevel=3)


def choose(key: str, paths: Mapping[str, Callable[[], object]], default: str) -> str:
    """The name of the path to take for ``key``: cached, or measured now.

    ``paths`` maps each name to a call that runs that path once at the shape ``key`` stands for
    (the caller makes it free of side effects); each is called once to warm up, then
    :data:`REPEATS` times in turns, and the fastest call of each counts. ``default`` is kept
    unless another path is :data:`MARGIN` times faster. Under a dispatch mode (FLOP counting,
    fake tensors) nothing is measured: a cached choice, else ``default``, not cached."""
    if default not in paths:
        raise ValueError(f"default must be one of {tuple(paths)}, got {default!r}")
    known = choice(key) or _read().get(key)  # another process may have measured it since
    if known in paths:
        _cached()[key] = known
        return known
    if is_in_torch_dispatch_mode():  # FLOP counting, fake tensors: it would time the mode
        return default
    best = dict.fromkeys(paths, float("inf"))
    for run in paths.values():  # warm-up: first-call allocations and kernel selection
        run()
    for _ in range(REPEATS):
        for name, run in paths.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    fastest = min(best, key=best.get)
    name = fastest if best[default] > MARGIN * best[fastest] else default
    _store(key, name)
    return name


def reset() -> None:
    """Forget every choice, in this process and in the file."""
    global _choices
    _choices = {}
    cache_path().unlink(missing_ok=True)
