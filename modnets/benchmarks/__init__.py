"""The benchmark suite: every speed and memory claim of the book, measured as ratios in one run.

Each benchmark times both sides in the same process (warm-up, then the median of repeats) and
returns rows plus the ratio that matters, with the target it is held to. Absolute times depend on
the machine; the ratios are what carry over. Run ``python -m bench`` (or ``make bench``); chapter 12
runs the same functions and plots them.

Sizes follow the active profile (:mod:`modnets.profiles`): ``smoke`` proves the code path in
seconds, ``cpu`` fits ~10 minutes on two cores, ``gpu`` uses the papers' sizes.

One file per family: ``core`` (timing, FLOPs, results), ``layers``, ``ni``, ``circuits``, ``steps``
(the experiments' training steps) and ``suite`` (every benchmark by name, :func:`run_all`).
"""

from modnets.benchmarks.circuits import (
    bench_dropping,
    bench_flop_utilisation,
    bench_many_modules,
    bench_nac_vs_pio,
    bench_token_scaling,
)
from modnets.benchmarks.core import (
    CONFIGS,
    MID,
    PRECISIONS,
    SMALL,
    TABLE4,
    BenchConfig,
    autocast_for,
    best_time,
    compare,
    compiled_side,
    count_flops,
    fit_exponent,
    format_result,
    interleaved_times,
    keep_freed_memory,
    make_result,
    or_nan,
    train_step,
)
from modnets.benchmarks.layers import bench_modulated, bench_ni_vectorised, bench_read_in_memory
from modnets.benchmarks.ni import (
    bench_modattn_tokens,
    bench_ni_fused,
    bench_ni_memory,
    bench_ni_vs_transformer,
    experiment_ni,
    under,
)
from modnets.benchmarks.steps import bench_seed_workers, bench_thread_policy, bench_train_steps
from modnets.benchmarks.suite import (
    BENCHMARKS,
    HOLDS,
    VARIANT_BENCHMARKS,
    benchmark_fingerprint,
    run_all,
)
from modnets.timing import median_time, saved_bytes

__all__ = [
    "median_time",
    "saved_bytes",
    "BenchConfig",
    "TABLE4",
    "SMALL",
    "MID",
    "CONFIGS",
    "fit_exponent",
    "train_step",
    "PRECISIONS",
    "autocast_for",
    "best_time",
    "compiled_side",
    "or_nan",
    "interleaved_times",
    "keep_freed_memory",
    "count_flops",
    "make_result",
    "compare",
    "format_result",
    "bench_modulated",
    "bench_ni_vectorised",
    "bench_read_in_memory",
    "experiment_ni",
    "under",
    "bench_modattn_tokens",
    "bench_ni_fused",
    "bench_ni_memory",
    "bench_ni_vs_transformer",
    "bench_nac_vs_pio",
    "bench_token_scaling",
    "bench_dropping",
    "bench_flop_utilisation",
    "bench_many_modules",
    "bench_thread_policy",
    "bench_train_steps",
    "bench_seed_workers",
    "BENCHMARKS",
    "HOLDS",
    "VARIANT_BENCHMARKS",
    "benchmark_fingerprint",
    "run_all",
]
