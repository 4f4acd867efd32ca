"""Small helpers shared by the library and the notebooks."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import random
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "seed_everything",
    "default_device",
    "count_parameters",
    "progress",
    "check_input",
    "atomic_file",
]


@contextlib.contextmanager
def atomic_file(path):
    """A temporary path beside ``path`` to write to, renamed to ``path`` when the block ends:
    the file is never half-written, and it gets the permissions of a new file under the user's
    umask (``mkstemp``'s own are owner-only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def positive_int(value: object, name: str) -> int:
    """``value`` when it is a positive ``int`` (not a bool): the one check of sizes and counts
    across the library, a ``TypeError`` or ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes in on ``device_type`` inside an autocast region, else None."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no device type and means CUDA
        enabled = device_type == "cuda" and torch.is_autocast_enabled()
    return torch.get_autocast_dtype(device_type) if enabled else None


def check_input(x, model: torch.nn.Module, name: str = "x") -> torch.Tensor:
    """``x`` when it is a floating-point tensor of ``model``'s dtype (or, inside autocast, of the
    autocast dtype); otherwise a ``TypeError`` naming what it is and how to convert it (a model's
    forward calls this first)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor, got {type(x).__name__} "
            "(torch.as_tensor converts a NumPy array)"
        )
    if not x.is_floating_point():
        raise TypeError(f"{name} must be floating-point, got dtype {x.dtype}: pass {name}.float()")
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    # inside autocast a module is handed activations of the autocast dtype: those are expected
    if weight is not None and x.dtype not in (weight.dtype, _autocast_dtype(x.device.type)):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the model's weights are {weight.dtype}: pass "
            f"{name}.to({weight.dtype}) or convert the model with .to({x.dtype})"
        )
    return x


def replace_fields(config, overrides: dict):
    """``config`` (a dataclass) with ``overrides``, checked by the config's own validation; a
    name that is not one of its fields is refused, naming the fields that are."""
    known = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(
            f"unknown {type(config).__name__} fields {unknown}; the fields are {sorted(known)}"
        )
    return dataclasses.replace(config, **overrides)


def seed_everything(seed: int = 0, deterministic: bool = False) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (CPU and CUDA); return a seeded ``torch.Generator``.

    ``deterministic=True`` also asks PyTorch for deterministic kernels (slower on GPU).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 -- seeds the legacy global generator users call
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    return torch.Generator().manual_seed(seed)


def default_device() -> torch.device:
    """CUDA when available, then Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def count_parameters(module: torch.nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def _in_notebook_with_widgets() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    in_kernel = shell is not None and "IPKernelApp" in getattr(shell, "config", {})
    return in_kernel and importlib.util.find_spec("ipywidgets") is not None


def progress(iterable=None, *, total: int | None = None, desc: str | None = None, **kwargs):
    """A tqdm progress bar that reads well wherever the code runs.

    In a live notebook with ipywidgets (Colab, JupyterLab) it is a widget. Elsewhere (a terminal, a
    notebook executed for the book) it is a text bar on stdout that refreshes at most every
    ``mininterval`` seconds (default 10), so an executed notebook keeps a short log, not hundreds
    of lines. ``MODNETS_PROGRESS=0`` (``make book`` sets it) turns every bar off: a rendered page
    shows results, not the log of the run that computed them.
    """
    if os.environ.get("MODNETS_PROGRESS", "1") == "0":
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, disable=True)
    if _in_notebook_with_widgets():
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, **kwargs)
    from tqdm import tqdm

    kwargs.setdefault("mininterval", 10.0)
    kwargs.setdefault("file", sys.stdout)
    kwargs.setdefault("dynamic_ncols", False)
    return tqdm(iterable, total=total, desc=desc, **kwargs)


#: Characters of a printed line the book's content column shows (book/_static/modnets.css).
TEXT_WIDTH = 88


def wrap(text: str, width: int = TEXT_WIDTH) -> str:
    """``text`` with every line longer than ``width`` broken at spaces, continued with its own
    indentation plus four spaces: what the library prints fits the book's column and a terminal.
    Lines that fit are left as they are (tables keep their columns)."""
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.append(
            textwrap.fill(
                line.strip(),
                width,
                initial_indent=indent,
                subsequent_indent=indent + "    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)


def show(obj: object, width: int = TEXT_WIDTH) -> None:
    """Print ``repr(obj)`` (a configuration, say) wrapped to ``width`` at its spaces."""
    print(wrap(repr(obj), width))
