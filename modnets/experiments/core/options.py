"""How one run goes, the same for every experiment: one object the shared machinery hands down,
instead of the same flags threaded through every function."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modnets import distributed
from modnets.utils import default_device

__all__ = ["RunOptions", "resolved"]


@dataclass(frozen=True)
class RunOptions:
    """How one run goes (none of it changes a result).

    ``device``: where models train (``None``: CUDA when there is one; under ``torchrun`` each
    process's own). ``root``: the data folder (``None``: ``MODNETS_DATA``). ``verify``: check the
    data files' hashes (where an experiment's loader checks them). ``show_progress``: progress bars.
    ``cache``: load and save trained models (checkpoints). ``resume``: continue interrupted
    training. ``workers``: the processes independent models train in (``None``: as many as the
    machine affords)."""

    device: Any = None
    root: str | Path | None = None
    verify: bool = True
    show_progress: bool = True
    cache: bool = True
    resume: bool = False
    workers: int | None = None

    def __post_init__(self):
        for name in ("verify", "show_progress", "cache", "resume"):
            if not isinstance(getattr(self, name), bool):
                got = type(getattr(self, name)).__name__
                raise TypeError(f"RunOptions.{name} must be True or False, got {got}")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise ValueError(f"RunOptions.workers must be None or >= 1, got {self.workers!r}")

    def quiet(self) -> RunOptions:
        """These options without progress bars (a worker process's, or a step inside another's
        bar)."""
        return dataclasses.replace(self, show_progress=False)


def resolved(options: RunOptions | None, flags: dict) -> RunOptions:
    """``options`` (default :class:`RunOptions`) with the fields named in ``flags`` replaced (a
    name that is not a field is refused, naming the fields), and a device where they name none:
    each process's own under ``torchrun``, else CUDA when there is one, else the CPU."""
    options = RunOptions() if options is None else options
    if not isinstance(options, RunOptions):
        raise TypeError(f"options must be a RunOptions, got {type(options).__name__}")
    names = {f.name for f in dataclasses.fields(RunOptions)}
    unknown = sorted(set(flags) - names)
    if unknown:
        raise TypeError(f"unknown options {unknown}; the options are {sorted(names)}")
    options = dataclasses.replace(options, **flags)
    if options.device is not None:
        return options
    device = distributed.local_device() if distributed.is_distributed() else default_device()
    return dataclasses.replace(options, device=device)
