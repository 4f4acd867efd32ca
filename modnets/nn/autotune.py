"""Measured choices between code paths that compute the same thing, as cuDNN's benchmark mode
and Inductor's autotuning make them: where a path is faster depends on the machine (a CPU with
twice the matrix-product rate moves every crossover), so the first call at a new shape times
each path where the code runs, and the winner is kept.

The timing runs in another Python process (``python -m modnets.nn.autotune``), on inputs of the
same shape built there, with as many threads as the caller has: this process allocates no
tensor and runs no kernel for it, so a training that measures a shape on its first step goes on
exactly as one that found the choice cached (timed calls here would move later tensors to other
addresses, where a kernel may round a last bit otherwise).

A choice is cached in memory and in a JSON file (:func:`cache_path`: ``$MODNETS_AUTOTUNE``, else
``~/.cache/modnets/autotune.json``), so later calls and later processes on the machine take it
without measuring again; :func:`reset` forgets every choice. A path other than the caller's
default must be faster by :data:`MARGIN`: two paths within timing noise keep the default, so a
choice does not flip from one run to the next.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from modnets.utils import atomic_file

__all__ = [
    "MARGIN",
    "REPEATS",
    "Measurement",
    "cache_path",
    "choice",
    "choose",
    "fastest_calls",
    "reset",
]

#: How much faster than the default another path must be to be chosen.
MARGIN = 1.1
#: Timed calls of each path (after one warm-up call each); the fastest counts.
REPEATS = 3
#: Seconds a measurement may take before the default is kept without it.
TIMEOUT = 300

_choices: dict[str, str] | None = None  # this process's, read from the file on first use


@dataclass(frozen=True)
class Measurement:
    """What another process runs to time the paths: ``function`` (``"module:name"``) called with
    ``kwargs`` (JSON values) returns each path's seconds; ``threads`` is the caller's."""

    function: str
    kwargs: dict = field(default_factory=dict)
    threads: int = 1


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


def _store(key: str, name: str) -> str:
    """Keep ``name`` for ``key`` unless another process stored a choice first (seed workers
    measuring one shape at once then all take the same path); the choice kept."""
    on_file = _read()
    if on_file.get(key) is not None:
        name = on_file[key]
    else:
        try:  # merged with what other processes wrote since this one read the file
            with atomic_file(cache_path()) as tmp:
                tmp.write_text(json.dumps({**on_file, key: name}, indent=1, sort_keys=True) + "\n")
        except OSError as err:  # a read-only home: the choice holds for this process
            warnings.warn(f"autotune: cannot write {cache_path()} ({err})", stacklevel=3)
    _cached()[key] = name
    return name


def _measure(measurement: Measurement) -> dict[str, float]:
    """Each path's seconds, timed by ``python -m modnets.nn.autotune`` in another process."""
    done = subprocess.run(
        [sys.executable, "-m", "modnets.nn.autotune"],
        input=json.dumps(asdict(measurement)),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    return {name: float(s) for name, s in json.loads(done.stdout.splitlines()[-1]).items()}


def choose(key: str, measurement: Measurement, paths: tuple[str, ...], default: str) -> str:
    """The name of the path to take for ``key``: cached, or measured now in another process.

    ``measurement`` times each of ``paths`` at the shape ``key`` stands for (see
    :func:`fastest_calls`). ``default`` is kept unless another path is :data:`MARGIN` times
    faster. Under a dispatch mode (FLOP counting, fake tensors) nothing is measured, and where
    the measurement fails the default holds for this process: a cached choice, else
    ``default``, not written to the file."""
    if default not in paths:
        raise ValueError(f"default must be one of {paths}, got {default!r}")
    known = choice(key) or _read().get(key)  # another process may have measured it since
    if known in paths:
        _cached()[key] = known
        return known
    if is_in_torch_dispatch_mode():  # FLOP counting, fake tensors: not a run to time
        return default
    try:
        best = _measure(measurement)
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        why = (getattr(err, "stderr", "") or str(err)).strip().splitlines() or [repr(err)]
        warnings.warn(
            f"autotune: {key}: kept {default}, the timing failed: {why[-1]}", stacklevel=2
        )
        _cached()[key] = default
        return default
    if set(best) != set(paths):
        raise ValueError(f"the measurement timed {sorted(best)}, expected {sorted(paths)}")
    fastest = min(best, key=best.get)
    return _store(key, fastest if best[default] > MARGIN * best[fastest] else default)


def fastest_calls(paths: Mapping[str, Callable[[], object]]) -> dict[str, float]:
    """Each path called once to warm up, then :data:`REPEATS` times in turns; the fastest call's
    seconds of each (what a :class:`Measurement`'s function returns)."""
    best = dict.fromkeys(paths, float("inf"))
    for run in paths.values():  # warm-up: first-call allocations and kernel selection
        run()
    for _ in range(REPEATS):
        for name, run in paths.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def reset() -> None:
    """Forget every choice, in this process and in the file."""
    global _choices
    _choices = {}
    cache_path().unlink(missing_ok=True)


def _main() -> None:
    """The other process: a :class:`Measurement` on standard input, the seconds on the output."""
    import torch

    measurement = Measurement(**json.loads(sys.stdin.read()))
    torch.set_num_threads(measurement.threads)
    module, name = measurement.function.split(":")
    seconds = getattr(importlib.import_module(module), name)(**measurement.kwargs)
    print(json.dumps(seconds))


if __name__ == "__main__":
    _main()
