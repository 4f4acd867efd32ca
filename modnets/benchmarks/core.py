"""How every benchmark measures: the sizes per profile, interleaved timing of the sides of a ratio,
FLOP counting, and the result a benchmark returns."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from modnets.timing import median_time
from modnets.utils import wrap


@dataclass(frozen=True)
class BenchConfig:
    repeats: int = 5  # at least this many timed blocks (see median_time)
    rounds: int = (
        3  # the sides of a ratio are timed in this many interleaved rounds (interleaved_times)
    )
    warmup: int = 2
    min_run_time: float = 0.3  # seconds of timing per measurement (torch.utils.benchmark)
    batch: int = 16
    experiments: str = "cpu"  # the profile whose experiment configurations are benchmarked
    # 2. NI vectorised vs loop; fused ModAttn
    modattn_tokens: tuple[int, ...] = (9, 18, 32, 64, 128, 256)
    modattn_rows: int = 5760  # B * U * T, the same at every T (the cpu digits step's)
    ni_functions: tuple[int, ...] = (1, 2, 4, 8, 16)
    ni_dim: int = 96
    ni_tokens: int = 65
    # 3. NAC vs PIO (Table 4 sizes by default)
    nac: dict | None = None
    readin_units: int = 320
    readin_tokens: int = 64
    readin_dim: int = 384
    readin_batch: int = 8
    # 4. token scaling
    tokens: tuple[int, ...] = (64, 256, 1024, 4096)
    scaling_dim: int = 64
    # 5. dropping
    drop_fractions: tuple[float, ...] = (0.0, 0.5, 0.8, 0.9)
    drop_batch: int = 16
    # 6. FLOP utilisation
    matmul_size: int = 1024
    # 2e. thread policy: GOMP_SPINCOUNT values timed besides the policy's (300000: libgomp's)
    spin_counts: tuple[str, ...] = ("300000", "10000", "2000", "1000", "300", "0")
    # 7. many modules
    many_modules: int = 1024
    many_batch: int = 8
    # the GPU variants (python -m bench --precision bfloat16 --compile): every timed call of the
    # VARIANT_BENCHMARKS under bf16 autocast, and every timed model torch.compile'd
    precision: str = "float32"
    compile: bool = False
    # the targets that depend on the matmul rate are held on the steps as the experiments train
    # them: compiled, where a compiler is (eager is timed beside them, as a diagnostic)
    compile_as_trained: bool = True


TABLE4 = dict(
    dim=384,
    num_layers=8,
    num_processors=320,
    num_readouts=64,
    num_heads=6,
    ffn_hidden=1536,
    sig_dim=64,
    code_dim=384,
)

SMALL = dict(
    dim=32,
    num_layers=2,
    num_processors=16,
    num_readouts=4,
    num_heads=2,
    ffn_hidden=64,
    sig_dim=8,
    code_dim=16,
)

MID = dict(
    dim=192,
    num_layers=4,
    num_processors=160,
    num_readouts=16,
    num_heads=6,
    ffn_hidden=768,
    sig_dim=32,
    code_dim=192,
)

CONFIGS = {
    "smoke": BenchConfig(
        repeats=1,
        rounds=1,
        warmup=1,
        min_run_time=0.0,
        experiments="smoke",
        modattn_tokens=(9, 32),
        modattn_rows=576,
        # the policy's spin count alone: libgomp's default beside a busy core is the slowest
        # case there is and proves no other code path
        spin_counts=(),
        batch=2,
        ni_functions=(1, 2, 4),
        ni_dim=16,
        ni_tokens=9,
        nac=SMALL,
        readin_units=16,
        readin_tokens=8,
        readin_dim=16,
        readin_batch=2,
        tokens=(16, 32, 64),
        scaling_dim=16,
        drop_batch=2,
        matmul_size=128,
        many_modules=64,
        many_batch=2,
        # compiling takes minutes; smoke proves the code path eager
        compile_as_trained=False,
    ),
    "cpu": BenchConfig(nac=MID, tokens=(64, 256, 1024, 4096)),
    "gpu": BenchConfig(
        repeats=10,
        warmup=3,
        min_run_time=0.5,
        experiments="gpu",
        batch=64,
        nac=TABLE4,
        readin_batch=64,
        drop_batch=64,
        matmul_size=8192,
        many_batch=8,
    ),
}


#: glibc's ``mallopt`` parameters (``malloc.h``), with what :func:`keep_freed_memory` sets and
#: the environment variable glibc reads each from as a process starts: freed memory returns to
#: the OS only past 1 GiB at the heap's top, and blocks up to 32 MiB (the most glibc allows)
#: come from the heap, not from a fresh ``mmap`` each.
_MALLOPT = {-1: (1 << 30, "MALLOC_TRIM_THRESHOLD_"), -3: (1 << 25, "MALLOC_MMAP_THRESHOLD_")}


def keep_freed_memory() -> bool:
    """Have glibc keep the memory this process frees for its next allocations, and the processes
    it starts too (the measurement behind ``ModAttn(fused=None)`` runs in one); whether it
    applied here (glibc only). A timing should see the kernels, not the allocator: a process
    that frees all it allocated each call otherwise hands every freed block of more than a few
    MiB back to the OS and faults its pages in again on the next call, which made the same
    attention (NI eq. 7, 64 tokens) take 18 ms in one process and 27-31 ms in a fresh one. For the
    benchmarks only: the experiments leave the allocator alone (where a tensor is placed may
    round a last bit otherwise)."""
    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    for value, variable in _MALLOPT.values():
        os.environ.setdefault(variable, str(value))
    return all(mallopt(param, value) == 1 for param, (value, _) in _MALLOPT.items())


def fit_exponent(xs, ys) -> float:
    """Slope of ``log y`` against ``log x`` (least squares): ``y ~ x^slope``."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def train_step(model: nn.Module, x: Tensor) -> Callable[[], None]:
    def step():
        model.zero_grad(set_to_none=True)
        out = model(x)
        out = out if isinstance(out, Tensor) else out.logits
        out.float().square().mean().backward()

    return step


#: ``BenchConfig.precision``: float32, or bfloat16 autocast (as the experiments train on a GPU).
PRECISIONS = ("float32", "bfloat16")


def autocast_for(cfg: BenchConfig, device):
    if cfg.precision == "bfloat16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()


def best_time(cfg: BenchConfig, fn: Callable[[], object], device) -> float:
    """:func:`median_time` of ``fn`` at ``cfg``'s repeats and precision."""

    def call():
        with autocast_for(cfg, device):
            return fn()

    return median_time(call, cfg.repeats, cfg.warmup, device, cfg.min_run_time)


def matmul_rate(cfg: BenchConfig, device) -> float:
    """FLOP/s of a ``cfg.matmul_size`` square ``torch.matmul`` here, in ``cfg``'s precision: the
    machine's ceiling the utilisation targets are measured against."""
    n = cfg.matmul_size
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return 2 * n**3 / best_time(cfg, lambda: a @ b, device)


def compiled_side(cfg: BenchConfig, *models):
    """``models``, each through ``torch.compile`` when ``cfg.compile``. Dynamo's caches are
    cleared first, so every row of a benchmark compiles its own models (and never meets the
    recompile limit, past which dynamo silently runs eager code)."""
    if cfg.compile:
        torch._dynamo.reset()
        models = tuple(torch.compile(m) for m in models)
    return models if len(models) > 1 else models[0]


def as_trained(cfg: BenchConfig, device) -> dict[str, BenchConfig]:
    """How to time a benchmark whose target depends on the matmul rate (``HOLDS``): ``"eager"``,
    then ``"compiled"`` (as the experiments train their steps) when ``cfg.compile_as_trained``
    and Inductor builds kernels on ``device``. The target is held on the last; with
    ``cfg.compile`` set (the ``--compile`` variant) there is one way, compiled."""
    from modnets.training import compiler_available

    if cfg.compile:
        return {"compiled": cfg}
    ways = {"eager": cfg}
    if cfg.compile_as_trained and compiler_available(device):
        ways["compiled"] = replace(cfg, compile=True)
    return ways


def held_on(rows: list[dict], key: str) -> tuple[float, str, str]:
    """The worst (largest) ``key`` over the rows timed the last way (their ``"step"``,
    :func:`as_trained`), which the target is held on; that way; and a note with every way's."""
    ways = list(dict.fromkeys(r["step"] for r in rows))
    worst = {w: max(r[key] for r in rows if r["step"] == w) for w in ways}
    note = "worst " + ", ".join(f"{w} {v:.2f}x" for w, v in worst.items())
    return worst[ways[-1]], ways[-1], note


class PerFunction(nn.Module):
    """A layer's ``per_function`` (ModLin's, ModAttn's) on streams stored function-major,
    ``(U, B, T, d)``, as the LOC calls it, as a module ``torch.compile`` can take."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, *args):
        return self.layer.per_function(*args)


def or_nan(cfg: BenchConfig, measure: Callable[[], float], row: dict) -> float:
    """``measure()``, or NaN (the error noted in ``row``) where compiling fails: on an H100 with
    torch 2.11, Inductor failed to compile the fused ModAttn at the gpu digits configuration."""
    try:
        return measure()
    except Exception as e:
        if not cfg.compile:
            raise
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"
        return math.nan


def interleaved_times(
    cfg: BenchConfig, calls: dict[str, Callable[[], object]], device, row: dict | None = None
) -> dict[str, float]:
    """The time of each call for a ratio: ``cfg.rounds`` rounds, each timing every call in turn
    (:func:`best_time`), and each call's fastest round. On a shared machine a burst of load then
    slows one round of every side instead of one side: on two cores the same ModLin-vs-Linear
    ratio read 1.32, 1.52 and 1.88 in three runs timed one side after the other. A call that
    fails to compile is NaN from then on (:func:`or_nan`, the error in ``row``)."""
    best = dict.fromkeys(calls, math.inf)
    for _ in range(cfg.rounds):
        for name, fn in calls.items():
            if not math.isnan(best[name]):
                t = or_nan(
                    cfg, lambda fn=fn: best_time(cfg, fn, device), {} if row is None else row
                )
                best[name] = t if math.isnan(t) else min(best[name], t)
    return best


def count_flops(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def make_result(
    name: str, rows: list[dict], ratio: float | None, target: str, met: bool | None, note: str = ""
) -> dict:
    return {"name": name, "rows": rows, "ratio": ratio, "target": target, "met": met, "note": note}


def compare(variants: dict[str, dict]) -> str:
    """One line per benchmark, one column per variant (``name -> run_all(...)["results"]``): the
    ratio each measured, ``*`` where it missed its target."""
    names = list(dict.fromkeys(n for results in variants.values() for n in results))
    width = max(10, *(len(v) for v in variants))
    lines = [f"{'benchmark':<18}" + "".join(f"{v:>{width + 2}}" for v in variants)]
    for name in names:
        cells = []
        for results in variants.values():
            r = results.get(name)
            ratio = None if r is None else r["ratio"]
            cell = "-" if ratio is None else f"{ratio:.3g}" + ("*" if r["met"] is False else "")
            cells.append(f"{cell:>{width + 2}}")
        lines.append(f"{name:<18}" + "".join(cells))
    return "\n".join(lines)


def format_result(res: dict) -> str:
    verdict = {True: "met", False: "MISSED", None: "n/a"}[res["met"]]
    ratio = "-" if res["ratio"] is None else f"{res['ratio']:.3g}"
    lines = [
        f"== {res['name']}: {ratio} (target {res['target']}: {verdict}) "
        f"[{res.get('seconds', 0):.1f} s]"
    ]
    if res.get("note"):
        lines.append(f"   {res['note']}")
    for row in res["rows"]:
        lines.append(
            "   "
            + "  ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
            )
        )
    return wrap("\n".join(lines))
