"""How fast each experiment's training step could get without changing its shapes: the time its
matrix products take (every call that reaches BLAS / oneDNN, timed at the dispatcher) against the
plain eager step's."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from modnets.benchmarks.core import BenchConfig, best_time, make_result
from modnets.benchmarks.profiling import gemm_time
from modnets.benchmarks.steps import PLAIN, _experiment_models, _optimiser_step


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
