"""How fast each experiment's training step could get without changing its shapes: the time its
matrix products take (every call that reaches BLAS / oneDNN, timed at the dispatcher) against the
plain eager step's."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modnets.benchmarks.core import BenchConfig, best_time, make_result
from modnets.benchmarks.steps import PLAIN, _experiment_models, _optimiser_step

#: The operators that run a matrix product (BLAS / oneDNN, convolutions, the fused attention
#: kernel), as the dispatcher names them: their time is what no compiler can remove from a step
#: without changing its shapes.
GEMM_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "convolution_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)


class _GemmClock(TorchDispatchMode):
    """Times every call of :data:`GEMM_OPS` that reaches the dispatcher (backward included)."""

    def __init__(self):
        super().__init__()
        self.per_op: dict[str, float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if name not in GEMM_OPS:
            return func(*args, **(kwargs or {}))
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.per_op[name] = self.per_op.get(name, 0.0) + time.perf_counter() - start
        return out


def gemm_time(step: Callable[[], None], steps: int = 3) -> tuple[float, dict[str, float]]:
    """Seconds per ``step`` spent inside :data:`GEMM_OPS` (after one warm-up step), and that
    time per operator."""
    step()
    with _GemmClock() as clock:
        for _ in range(steps):
            step()
    per_op = {k: t / steps for k, t in clock.per_op.items()}
    return sum(per_op.values()), per_op


def bench_gemm_bound(cfg: BenchConfig, device) -> dict:
    """How fast each experiment's step could get without changing its shapes: the plain eager
    step's time over the time its matrix products take (``ceiling``), each side's fastest of
    ``cfg.rounds`` interleaved rounds. A step whose ceiling is below 1.4x cannot reach the
    train-steps target by compiling, fusing or removing Python overhead: only larger matrices
    (batches, widths) would."""
    rows = []
    for name, (build, x, config) in _experiment_models(cfg).items():
        torch.manual_seed(0)
        model, x = build().to(device), x.to(device)
        step = _optimiser_step(model, x, replace(config, **PLAIN))
        eager, gemm, per_op = math.inf, math.inf, {}
        for _ in range(cfg.rounds):  # in turns, each side's fastest round
            eager = min(eager, best_time(cfg, step, device))
            total, ops = gemm_time(step)
            if total < gemm:
                gemm, per_op = total, ops
        rows.append(
            {
                "model": name,
                "eager_ms": 1e3 * eager,
                "gemm_ms": 1e3 * gemm,
                "gemm_share": gemm / eager,
                "ceiling": eager / gemm,
                **{f"{k}_ms": 1e3 * t for k, t in per_op.items()},
            }
        )
    worst = min(r["ceiling"] for r in rows)
    note = ", ".join(f"{r['model']} {r['ceiling']:.2f}x" for r in rows)
    return make_result(
        "Experiments' steps: eager over their matrix products (the ceiling)",
        rows,
        worst,
        ">= 1.4x for every model (else 1.4x needs larger matrices)",
        worst >= 1.4,
        note,
    )
