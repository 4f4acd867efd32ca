"""The suite: every benchmark by name, and :func:`run_all`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from modnets.benchmarks.circuits import (
    bench_dropping,
    bench_flop_utilisation,
    bench_many_modules,
    bench_nac_vs_pio,
    bench_token_scaling,
)
from modnets.benchmarks.core import (
    CONFIGS,
    PRECISIONS,
    format_result,
    keep_freed_memory,
    matmul_rate,
)
from modnets.benchmarks.gemm import bench_gemm_bound
from modnets.benchmarks.layers import bench_modulated, bench_ni_vectorised, bench_read_in_memory
from modnets.benchmarks.ni import (
    bench_modattn_tokens,
    bench_ni_fused,
    bench_ni_memory,
    bench_ni_profile,
    bench_ni_vs_transformer,
)
from modnets.benchmarks.steps import (
    bench_seed_workers,
    bench_thread_policy,
    bench_train_steps,
)
from modnets.profiles import get_profile, select

BENCHMARKS = {
    "modulated": bench_modulated,
    "ni_vectorised": bench_ni_vectorised,
    "modattn_tokens": bench_modattn_tokens,
    "ni_fused": bench_ni_fused,
    "ni_vs_transformer": bench_ni_vs_transformer,
    "ni_memory": bench_ni_memory,
    "ni_profile": bench_ni_profile,
    "thread_policy": bench_thread_policy,
    "nac_vs_pio": bench_nac_vs_pio,
    "read_in_memory": bench_read_in_memory,
    "token_scaling": bench_token_scaling,
    "dropping": bench_dropping,
    "flop_utilisation": bench_flop_utilisation,
    "many_modules": bench_many_modules,
    "train_steps": bench_train_steps,
    "gemm_bound": bench_gemm_bound,
    "seed_workers": bench_seed_workers,
}

#: Where each benchmark's target should hold. "anywhere": both sides are bound by the same
#: resources, so the ratio travels. "the matmul rate": one side spends more of its time outside
#: matrix products than the other, so a machine with faster GEMMs moves the eager ratio (chapter
#: 12 says how far, from the time by operator class); the target is held on the step as the
#: experiments train it, compiled, which fuses that work (``as_trained``; eager is timed beside
#: it). "this machine's ceiling": measured against the machine's own matrix-product rate.
HOLDS = {
    "modulated": "the matmul rate",
    "ni_vectorised": "anywhere",
    "modattn_tokens": "anywhere",
    "ni_fused": "the matmul rate",
    "ni_vs_transformer": "the matmul rate",
    "ni_memory": "anywhere",
    "ni_profile": "anywhere",
    "thread_policy": "anywhere",
    "nac_vs_pio": "anywhere",
    "read_in_memory": "anywhere",
    "token_scaling": "anywhere",
    "dropping": "anywhere",
    "flop_utilisation": "this machine's ceiling",
    "many_modules": "anywhere",
    "train_steps": "this machine's ceiling",
    "gemm_bound": "this machine's ceiling",
    "seed_workers": "anywhere",
}

#: The benchmarks that take ``precision`` and ``compile`` (the ratios to measure on a GPU).
VARIANT_BENCHMARKS = (
    "modulated",
    "ni_vectorised",
    "modattn_tokens",
    "ni_fused",
    "ni_vs_transformer",
    "ni_memory",
    "nac_vs_pio",
    "flop_utilisation",
)


def benchmark_fingerprint(name: str) -> str:
    """A hash of the code benchmark ``name`` times: its module with every ``modnets`` module that
    imports, transitively (:func:`~modnets.experiments.core.fingerprints.code_fingerprint`); for
    a benchmark defined outside ``modnets``, its function and the helpers it names. A recorded
    row whose fingerprint differs was timed on other code: it is recorded again."""
    from modnets.experiments.core.fingerprints import code_fingerprint

    if name not in BENCHMARKS:
        raise ValueError(f"name must be one of {list(BENCHMARKS)}, got {name!r}")
    fn = BENCHMARKS[name]
    return code_fingerprint(fn.__module__ if fn.__module__.startswith("modnets.") else fn)


def run_all(
    profile: str | None = None,
    only: list[str] | None = None,
    device=None,
    show: Callable[[str], None] | None = print,
    precision: str = "float32",
    compile: bool = False,
) -> dict:
    """Run the suite (or ``only`` some benchmarks) at ``profile``; returns a JSON-able dict.
    ``precision="bfloat16"`` (bf16 autocast) and ``compile=True`` (``torch.compile``) apply to
    :data:`VARIANT_BENCHMARKS`, which are then the default selection."""
    profile = get_profile(profile)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False, got {compile!r}")
    cfg = replace(select(CONFIGS, profile), precision=precision, compile=compile)
    variant = precision != "float32" or compile
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    names = only or list(VARIANT_BENCHMARKS if variant else BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"only must name benchmarks in {list(BENCHMARKS)}, got {unknown}")
    fixed = [n for n in names if variant and n not in VARIANT_BENCHMARKS]
    if fixed:
        raise ValueError(
            f"only: {fixed} take no precision or compile; those that do are "
            f"{list(VARIANT_BENCHMARKS)}"
        )
    keep_freed_memory()  # time kernels, not the allocator's page faults
    torch.manual_seed(0)
    out = {
        "profile": profile,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "precision": precision,
        "compile": compile,
        "results": {},
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    # the matrix-product rate and instruction set every ratio below was measured at
    out["matmul_gflops"] = matmul_rate(cfg, device) / 1e9
    out["gemm_isa"] = os.environ.get("ONEDNN_MAX_CPU_ISA", "default")
    for name in names:
        t0 = time.perf_counter()
        res = BENCHMARKS[name](cfg, device)
        res["seconds"] = time.perf_counter() - t0
        res["code_fingerprint"] = benchmark_fingerprint(name)
        out["results"][name] = res
        if show is not None:
            show(format_result(res))
    return out
