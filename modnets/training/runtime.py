"""What a training step runs on: mixed precision, the compiler where there is one, minibatches,
and the counts and scores every experiment reports."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor, nn


def minibatches(
    n: int, batch_size: int, generator: torch.Generator, drop_last: bool = True
) -> Iterator[Tensor]:
    """Indices of one shuffled epoch over ``n`` samples, ``batch_size`` at a time."""
    perm = torch.randperm(n, generator=generator)
    end = n - n % batch_size if drop_last else n
    for start in range(0, end, batch_size):
        yield perm[start : start + batch_size]


def group_batches(groups: dict, batch_size: int, generator: torch.Generator) -> list:
    """One epoch's minibatches ``(key, indices)``, each within one group: every group (a sized
    data set, e.g. the canvases of one digit count) shuffled by ``generator`` and cut into
    batches, group after group. The order the batches are taken in is drawn by the loop."""
    return [
        (k, idx) for k, ds in groups.items() for idx in minibatches(len(ds), batch_size, generator)
    ]


def amp_dtype(device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype of mixed precision on ``device``: bfloat16 on a CUDA GPU with native
    bf16 (Ampere and later: A100, H100, L4), float16 on one without (Colab's default T4, V100),
    where :func:`fit` adds a gradient scaler; None elsewhere (a CPU trains in float32). Emulated
    bf16 does not count: on a T4 it runs at a fraction of fp16's speed."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return (
        torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    )


def autocast(device: torch.device | str):
    """Autocast to :func:`amp_dtype` on CUDA; a no-op context elsewhere."""
    device = torch.device(device)
    dtype = amp_dtype(device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def trainable_parameters(module: nn.Module) -> int:
    """Number of scalar parameters with ``requires_grad``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def r2_score(pred: Tensor, target: Tensor) -> Tensor:
    """Coefficient of determination per output column: ``1 - SS_res / SS_tot``.

    Shapes: ``(n, k)`` -> ``(k,)`` (or ``(n,)`` -> scalar). Matches
    ``sklearn.metrics.r2_score(target, pred, multioutput="raw_values")``.
    """
    if pred.shape != target.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} differ")
    pred, target = pred.double(), target.double()
    ss_res = ((target - pred) ** 2).sum(0)
    ss_tot = ((target - target.mean(0)) ** 2).sum(0)
    return 1 - ss_res / ss_tot


def compiler_available(device: torch.device | str) -> bool:
    """Whether ``torch.compile``'s default backend (Inductor) can build kernels on ``device``: a
    C++ compiler for the CPU, Triton for CUDA."""
    if torch.device(device).type == "cuda":
        import importlib.util

        return importlib.util.find_spec("triton") is not None
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception:  # no g++/clang++ on the PATH
        return False
    return True


def maybe_compile(module: nn.Module, enabled: bool = False) -> nn.Module:
    """``torch.compile(module)`` when ``enabled`` and the device has a compiler, else the module
    itself (with a one-line notice when compiling was asked for). ``MODNETS_COMPILE=1`` / ``=0``
    overrides ``enabled`` everywhere. Compiled code is cached per architecture: a second model of
    the same configuration (the next seed) reuses it; changing which parameters train compiles
    again."""
    env = os.environ.get("MODNETS_COMPILE", "").strip().lower()
    if env in ("1", "true", "yes", "0", "false", "no"):
        enabled = env in ("1", "true", "yes")
    if not enabled:
        return module
    device = next(module.parameters()).device
    if not compiler_available(device):
        warnings.warn(
            f"torch.compile needs a compiler on {device.type}: training eagerly", stacklevel=2
        )
        return module
    return torch.compile(module)


class AnyBatch(nn.Module):
    """``module`` compiled for every batch size with at most one recompilation: a batch smaller
    than ``min_batch`` is padded up to it (its first row repeated) and the padding cut from the
    output. The compiler would otherwise make a graph for batch 1, another for 2-15 and, for a
    model with convolutions, a third from 16 on (the convolution picks its kernel by batch
    size); padded, the first call's graph serves every batch up to ``min_batch``, and one more
    every batch above it. The module's outputs must be tensors (or tuples of them) whose first
    dimension is the batch; each sample's output must not depend on the others (evaluation
    mode). Attributes not its own are the module's (``compiled.config``). :func:`fit` trains at
    one batch size and compiles for it (:func:`maybe_compile`)."""

    def __init__(self, module: nn.Module, min_batch: int = 16, **compile_options):
        super().__init__()
        self.module, self.min_batch = module, min_batch
        self.compiled = torch.compile(module, **compile_options)

    def forward(self, *args, **kwargs):
        batch = next((a.shape[0] for a in args if isinstance(a, Tensor) and a.dim() > 0), None)
        if batch is None or batch == 0 or batch >= self.min_batch:
            return self.compiled(*args, **kwargs)
        pad = self.min_batch - batch

        def padded(a):
            if not (isinstance(a, Tensor) and a.dim() > 0 and a.shape[0] == batch):
                return a
            return torch.cat([a, a[:1].expand(pad, *a.shape[1:])])

        out = self.compiled(*map(padded, args), **kwargs)
        if isinstance(out, Tensor):
            return out[:batch]
        if isinstance(out, tuple) and all(isinstance(o, Tensor) for o in out):
            return tuple(o[:batch] for o in out)
        raise TypeError(f"AnyBatch needs tensor outputs, got {type(out).__name__}")

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("module"), name)
