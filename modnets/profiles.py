"""Run profiles: one notebook, three scales.

``MODNETS_PROFILE`` picks how big an experiment runs:

* ``smoke`` -- seconds per notebook; CI runs every notebook this way (nbval) to prove the code path.
* ``cpu``   -- real, reduced-scale results in minutes on two CPU cores; the rendered book shows these.
* ``gpu``   -- the papers' settings.

Without the variable, the profile is ``gpu`` when CUDA is available and ``cpu`` otherwise.
Each experiment keeps its sizes in a dataclass with one instance per profile and picks the active
one with :func:`select`::

    @dataclass(frozen=True)
    class BoolConfig:
        steps: int
        batch_size: int

    CONFIGS = {"smoke": BoolConfig(20, 16), "cpu": BoolConfig(3000, 64), "gpu": BoolConfig(50000, 256)}
    cfg = select(CONFIGS)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TypeVar

import torch

__all__ = ["PROFILES", "ENV_VAR", "get_profile", "select"]

PROFILES: tuple[str, ...] = ("smoke", "cpu", "gpu")
ENV_VAR = "MODNETS_PROFILE"

T = TypeVar("T")


def _check(profile: str, source: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"{source}={profile!r} is not a profile; valid profiles are {PROFILES}")
    return profile


def get_profile(profile: str | None = None) -> str:
    """The active profile: ``profile`` if given, else ``$MODNETS_PROFILE``, else by hardware."""
    if profile is not None:
        return _check(profile, "profile")
    env = os.environ.get(ENV_VAR, "").strip().lower()
    if env:
        return _check(env, ENV_VAR)
    return "gpu" if torch.cuda.is_available() else "cpu"


def select(table: Mapping[str, T], profile: str | None = None) -> T:
    """Pick the entry of ``table`` (keyed by profile name) for the active profile."""
    missing = [p for p in PROFILES if p not in table]
    if missing:
        raise ValueError(
            f"table must have an entry for every profile {PROFILES}; missing {missing}"
        )
    return table[get_profile(profile)]
