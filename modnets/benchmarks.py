"""The benchmark suite: every speed and memory claim of the book, measured as ratios in one run.

Each benchmark times both sides in the same process (warm-up, then the median of repeats) and
returns rows plus the ratio that matters, with the target it is held to. Absolute times depend on
the machine; the ratios are what carry over. Run ``python -m bench`` (or ``make bench``); chapter 12
runs the same functions and plots them.

Sizes follow the active profile (:mod:`modnets.profiles`): ``smoke`` proves the code path in
seconds, ``cpu`` fits ~10 minutes on two cores, ``gpu`` uses the papers' sizes.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from modnets.baselines import PerceiverIO, ViT
from modnets.nac import NACConfig, NeuralAttentiveCircuit
from modnets.ni import NeuralInterpreter, NIConfig
from modnets.nn.loc import LOC
from modnets.nn.modattn import FUSED_MIN_TOKENS, ModAttn
from modnets.nn.modulated import ModFC, ModLin
from modnets.nn.read_in import ReadIn
from modnets.profiles import get_profile, select
from modnets.threads import GOMP_SPINCOUNT
from modnets.timing import median_time, saved_bytes
from modnets.training import TrainConfig, autocast, maybe_compile, optimizer_for
from modnets.utils import wrap

__all__ = [
    "BenchConfig",
    "CONFIGS",
    "median_time",
    "saved_bytes",
    "fit_exponent",
    "bench_modulated",
    "bench_ni_vectorised",
    "bench_modattn_tokens",
    "bench_ni_fused",
    "bench_ni_vs_transformer",
    "set_fused",
    "bench_ni_memory",
    "bench_thread_policy",
    "bench_seed_workers",
    "bench_nac_vs_pio",
    "bench_read_in_memory",
    "bench_token_scaling",
    "bench_dropping",
    "bench_flop_utilisation",
    "bench_many_modules",
    "bench_train_steps",
    "BENCHMARKS",
    "PRECISIONS",
    "VARIANT_BENCHMARKS",
    "run_all",
    "compare",
    "format_result",
]


@dataclass(frozen=True)
class BenchConfig:
    repeats: int = 5  # at least this many timed blocks (see median_time)
    rounds: int = 3  # the sides of a ratio are timed in this many interleaved rounds (_times)
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
        spin_counts=("300000",),
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


# ----------------------------------------------------------------------------- measuring


def fit_exponent(xs, ys) -> float:
    """Slope of ``log y`` against ``log x`` (least squares): ``y ~ x^slope``."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def _train_step(model: nn.Module, x: Tensor) -> Callable[[], None]:
    def step():
        model.zero_grad(set_to_none=True)
        out = model(x)
        out = out if isinstance(out, Tensor) else out.logits
        out.float().square().mean().backward()

    return step


#: ``BenchConfig.precision``: float32, or bfloat16 autocast (as the experiments train on a GPU).
PRECISIONS = ("float32", "bfloat16")


def _autocast(cfg: BenchConfig, device):
    if cfg.precision == "bfloat16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()


def _time(cfg: BenchConfig, fn: Callable[[], object], device) -> float:
    """:func:`median_time` of ``fn`` at ``cfg``'s repeats and precision."""

    def call():
        with _autocast(cfg, device):
            return fn()

    return median_time(call, cfg.repeats, cfg.warmup, device, cfg.min_run_time)


def _compiled(cfg: BenchConfig, *models):
    """``models``, each through ``torch.compile`` when ``cfg.compile``. Dynamo's caches are
    cleared first, so every row of a benchmark compiles its own models (and never meets the
    recompile limit, past which dynamo silently runs eager code)."""
    if cfg.compile:
        torch._dynamo.reset()
        models = tuple(torch.compile(m) for m in models)
    return models if len(models) > 1 else models[0]


def _or_nan(cfg: BenchConfig, measure: Callable[[], float], row: dict) -> float:
    """``measure()``, or NaN (the error noted in ``row``) where compiling fails: on an H100 with
    torch 2.11, Inductor failed to compile the fused ModAttn at the gpu digits configuration."""
    try:
        return measure()
    except Exception as e:
        if not cfg.compile:
            raise
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"
        return math.nan


def _times(
    cfg: BenchConfig, calls: dict[str, Callable[[], object]], device, row: dict | None = None
) -> dict[str, float]:
    """The time of each call for a ratio: ``cfg.rounds`` rounds, each timing every call in turn
    (:func:`_time`), and each call's fastest round. On a shared machine a burst of load then
    slows one round of every side instead of one side: on two cores the same ModLin-vs-Linear
    ratio read 1.32, 1.52 and 1.88 in three runs timed one side after the other. A call that
    fails to compile is NaN from then on (:func:`_or_nan`, the error in ``row``)."""
    best = dict.fromkeys(calls, math.inf)
    for _ in range(cfg.rounds):
        for name, fn in calls.items():
            if not math.isnan(best[name]):
                t = _or_nan(cfg, lambda fn=fn: _time(cfg, fn, device), {} if row is None else row)
                best[name] = t if math.isnan(t) else min(best[name], t)
    return best


def _count_flops(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _result(
    name: str, rows: list[dict], ratio: float | None, target: str, met: bool | None, note: str = ""
) -> dict:
    return {"name": name, "rows": rows, "ratio": ratio, "target": target, "met": met, "note": note}


# ----------------------------------------------------------------------------- 1. modulated layers


def _modulated_shapes(cfg: BenchConfig) -> list[tuple[str, str, tuple, tuple, int, int]]:
    """``(label, layer, x shape, code shape, d_out, d_code)``: a generic NI stream and NAC module
    layout, then every ModLin / ModFC shape the experiments at ``cfg.experiments`` train."""
    from modnets.experiments import tiny_imagenet

    B, d = cfg.batch, cfg.ni_dim
    shapes = [
        ("NI streams (generic)", "ModLin", (B, 5, cfg.ni_tokens, d), (5, 1, d), d, d),
        ("NAC modules (generic)", "ModFC", (B, 64, d), (64, d), d, d),
        ("NAC wide (generic)", "ModFC", (B, 64, 4 * d), (64, 4 * d), 4 * d, 4 * d),
    ]
    for name, (c, batch, _) in _experiment_ni(cfg).items():
        x, code = (batch, c.num_functions, _tokens(c)), (c.num_functions, 1, c.code_dim)
        shapes.append((f"NI {name}: attention", "ModLin", (*x, c.dim), code, c.dim, c.code_dim))
        if c.mlp_hidden != c.dim:
            shapes.append(
                (f"NI {name}: MLP in", "ModLin", (*x, c.dim), code, c.mlp_hidden, c.code_dim)
            )
    t = select(tiny_imagenet.CONFIGS, cfg.experiments).train
    n = t.nac_config("scale_free")
    lead = (t.nac_train.batch_size, n.num_processors)
    code = (n.num_processors, n.code_dim)
    shapes.append(
        ("NAC Tiny-ImageNet: attention", "ModFC", (*lead, n.dim), code, n.dim, n.code_dim)
    )
    shapes.append(
        ("NAC Tiny-ImageNet: FFN in", "ModFC", (*lead, n.dim), code, n.ffn_hidden, n.code_dim)
    )
    return shapes


def bench_modulated(cfg: BenchConfig, device) -> dict:
    """ModLin / ModFC vs ``nn.Linear`` of the same shape, forward + backward (target: overhead
    <= 1.3x on every shape, the experiments' included)."""
    rows, worst = [], 0.0
    for label, kind, shape, code_shape, d_out, d_code in _modulated_shapes(cfg):
        d = shape[-1]
        x = torch.randn(*shape, device=device, requires_grad=True)
        codes = torch.randn(*code_shape, device=device)
        layer = (ModLin if kind == "ModLin" else ModFC)(d, d_out, d_code).to(device)
        layer, linear = _compiled(cfg, layer, nn.Linear(d, d_out).to(device))
        calls = {"nn.Linear": lambda: linear(x), kind: lambda: layer(x, codes)}
        times = _times(
            cfg,
            {
                name: lambda call=call: call().float().square().mean().backward()
                for name, call in calls.items()
            },
            device,
        )
        ratio = times[kind] / times["nn.Linear"]
        worst = max(worst, ratio)
        rows.append(
            {
                "shape": label,
                "layer": kind,
                "x": "x".join(map(str, shape)),
                "d_out": d_out,
                "linear_ms": 1e3 * times["nn.Linear"],
                "modulated_ms": 1e3 * times[kind],
                "vs_linear": ratio,
            }
        )
    return _result("ModLin/ModFC vs nn.Linear (fwd+bwd)", rows, worst, "<= 1.3x", worst <= 1.3)


# ----------------------------------------------------------------------------- 2. NI vectorised


def _loc_loop(loc: LOC, x, codes, compat):
    """One function at a time: what the vectorised LOC replaces."""
    outs = []
    for u in range(x.shape[1]):
        xu, cu, Cu = x[:, u : u + 1], codes[u : u + 1], compat[:, u : u + 1]
        a = xu + Cu[..., None] * loc.attn(loc.norm_attn(xu), cu, Cu)
        outs.append(a + Cu[..., None] * loc.mlp(loc.norm_mlp(a), cu[:, None]))
    return torch.cat(outs, dim=1)


def bench_ni_vectorised(cfg: BenchConfig, device) -> dict:
    """NI's LOC over all function streams at once vs a per-function loop, forward + backward;
    time vs ``U`` (target: the vectorised LOC at least as fast at every ``U``)."""
    d, T, B = cfg.ni_dim, cfg.ni_tokens, cfg.batch
    loc = LOC(d, d, num_heads=4 if d % 4 == 0 else 1).to(device)
    rows = []
    for U in cfg.ni_functions:
        x = torch.randn(B, U, T, d, device=device, requires_grad=True)
        codes, compat = torch.randn(U, d, device=device), torch.rand(B, U, T, device=device)
        fns = _compiled(cfg, loc, partial(_loc_loop, loc))
        times = _times(
            cfg,
            {
                name: lambda f=f: f(x, codes, compat).float().square().mean().backward()
                for name, f in zip(("vectorised", "loop"), fns, strict=True)
            },
            device,
        )
        rows.append(
            {
                "functions": U,
                "vectorised_ms": 1e3 * times["vectorised"],
                "loop_ms": 1e3 * times["loop"],
                "speedup": times["loop"] / times["vectorised"],
            }
        )
    slope = fit_exponent([r["functions"] for r in rows], [r["vectorised_ms"] for r in rows])
    worst = min(r["speedup"] for r in rows)
    return _result(
        "NI: vectorised function streams vs loop (fwd+bwd)",
        rows,
        worst,
        ">= 1.0x at every U",
        worst >= 1.0,
        f"time ~ U^{slope:.2f} (fitted)",
    )


def _experiment_ni(cfg: BenchConfig) -> dict[str, tuple[NIConfig, int, Callable]]:
    """The NI configurations of the experiments at ``cfg.experiments``: ``name -> (config, batch,
    make_input(batch, device))``."""
    from modnets.experiments import digits, fuzzy_boolean

    d = select(digits.CONFIGS, cfg.experiments).train
    f = select(fuzzy_boolean.CONFIGS, cfg.experiments).train
    d_cfg, f_cfg = d.ni_config(), f.model_config()

    def image(b: int, dev, c: NIConfig = d_cfg) -> Tensor:
        return torch.randn(b, c.in_channels, c.image_size, c.image_size, device=dev)

    def vector(b: int, dev, c: NIConfig = f_cfg) -> Tensor:
        return torch.randn(b, c.num_elements, c.element_features, device=dev)

    return {
        "digits": (d_cfg, d.ni_train.batch_size, image),
        "fuzzy": (f_cfg, f.pretrain.batch_size, vector),
    }


def _tokens(c: NIConfig) -> int:
    n = (c.image_size // c.patch_size) ** 2 if c.input_kind == "image" else c.num_elements
    return n + c.num_cls


def set_fused(model: nn.Module, fused: bool | None) -> nn.Module:
    """Set ``fused`` on every :class:`~modnets.nn.modattn.ModAttn` of ``model``."""
    for m in model.modules():
        if isinstance(m, ModAttn):
            m.fused = fused
    return model


def bench_modattn_tokens(cfg: BenchConfig, device) -> dict:
    """ModAttn forward + backward, fused (``F.scaled_dot_product_attention``) vs NI eq. 7 with its
    ``(B, U, H, T, T)`` weights in memory, as ``T`` grows at a fixed ``B U T`` (d 64, 4 heads,
    U = 5), without and with a learned ``(U, H, T, T)`` bias (chapter 6's relative positions,
    which on a CPU send the fused path to torch's math kernel): where the fused path starts to
    win sets ``FUSED_MIN_TOKENS``."""
    U, d, H = 5, 64 if cfg.experiments != "smoke" else 16, 4
    reference = ModAttn(d, d, num_heads=H, fused=False).to(device)
    fused = copy.deepcopy(reference)
    fused.fused = True
    rows = []
    for learned in (False, True):
        for T in cfg.modattn_tokens:
            B = max(1, cfg.modattn_rows // (U * T))
            x = torch.randn(B, U, T, d, device=device, requires_grad=True)
            codes, compat = torch.randn(U, d, device=device), torch.rand(B, U, T, device=device)
            bias = torch.randn(U, H, T, T, device=device, requires_grad=True) if learned else None
            sides = dict(zip((False, True), _compiled(cfg, reference, fused), strict=True))
            times = _times(
                cfg,
                {
                    side: lambda f=f: f(x, codes, compat, bias).float().square().mean().backward()
                    for side, f in sides.items()
                },
                device,
            )
            rows.append(
                {
                    "bias": "learned" if learned else "none",
                    "tokens": T,
                    "batch": B,
                    "reference_ms": 1e3 * times[False],
                    "fused_ms": 1e3 * times[True],
                    "speedup": times[False] / times[True],
                }
            )
    auto = 1 if device.type == "cuda" else FUSED_MIN_TOKENS
    for r in rows:  # what fused=None costs against the faster of the two
        chosen = r["fused_ms"] if r["tokens"] >= auto else r["reference_ms"]
        r["auto_vs_best"] = chosen / min(r["fused_ms"], r["reference_ms"])
    wins = {
        b: [r["tokens"] for r in rows if r["bias"] == b and r["speedup"] >= 1.0]
        for b in ("none", "learned")
    }
    worst = max(r["auto_vs_best"] for r in rows)
    note = "fused faster from T = " + ", ".join(
        f"{min(w) if w else '-'} ({'no bias' if b == 'none' else 'a learned bias'})"
        for b, w in wins.items()
    )
    return _result(
        "ModAttn fused vs NI eq. 7 reference (fwd+bwd)",
        rows,
        worst,
        f"fused=None (fused from {auto} tokens) within 1.1x of the faster path",
        worst <= 1.1,
        note + " here",
    )


def _without_mixing(attn: ModAttn) -> Callable:
    """A forward pass for ``attn`` that keeps the fused path's projections (q, k and v in one
    product, and the out ModLin) and skips the token mixing (NI eq. 7; each token keeps its own
    value): what no attention kernel in the fused path can beat."""

    def forward(x, codes, compat, bias=None):
        B, U, T, d = x.shape
        q, k, v = attn.project(x, codes)  # (B, U, H, T, dh) each
        unused = 0.0 * (q.sum() + k.sum() + (0.0 if bias is None else bias.sum()))
        v = (compat[:, :, None, :, None] * v + unused).permute(1, 0, 3, 2, 4)
        return attn.out(v.reshape(U, B, T, d).movedim(0, 1), codes[:, None, :])

    return forward


def _mixing_arithmetic(c: NIConfig, batch: int, device) -> Callable[[], object]:
    """The bare arithmetic of one step's token mixing at ``c``: per ModAttn, the two products of
    the forward pass (``q k^T`` and ``S [C v, C]``), the four of the backward pass and the softmax
    forward and backward, over every function stream and head; no copies, masks or element-wise
    work. No way of writing the mixing in torch's eager ops does less."""
    T, dh = _tokens(c), c.dim // c.num_heads
    n = batch * c.num_functions * c.num_heads
    q, k = (torch.randn(n, T, dh, device=device) for _ in range(2))
    cv, dn = (torch.randn(n, T, dh + 1, device=device) for _ in range(2))
    a = torch.randn(n, T, T, device=device)
    calls = c.num_iterations * c.num_locs * c.num_scripts

    def mixing():
        for _ in range(calls):
            s = torch.softmax(torch.bmm(q, k.transpose(1, 2)) + a, -1)
            torch.bmm(s, cv)  # [N, D]
            ds = torch.bmm(dn, cv.transpose(1, 2))  # dS = d[N, D] [C v, C]^T
            torch.bmm(s.transpose(1, 2), dn)  # d[C v, C] = S^T d[N, D]
            da = torch._softmax_backward_data(ds, s, -1, s.dtype)
            torch.bmm(da, k), torch.bmm(da.transpose(1, 2), q)  # dq, dk

    return mixing


def bench_ni_fused(cfg: BenchConfig, device) -> dict:
    """An NI training step at the experiments' configurations: fused ModAttn vs the NI eq. 7
    reference path (target >= 1.3x at the digits configuration), and the digits configuration
    with 4x4 patches (the paper's; 4x the tokens). ``ceiling`` is the speed-up if the mixing
    cost nothing (the step with every ModAttn's mixing skipped, the fused path's projections
    kept): the most any kernel can give; ``mixing_ms`` is what the fused mixing takes per step
    (fused minus that step), ``mixing_arithmetic_ms`` its bare products and softmax
    (:func:`_mixing_arithmetic`), and ``mixing_budget_ms`` what the 1.3x goal would leave it."""
    rows = []
    configs = _experiment_ni(cfg)
    d_cfg, d_batch, d_input = configs["digits"]
    if d_cfg.patch_size != 4:  # (the gpu profile's digits NI already has them)
        configs["digits, 4x4 patches"] = (d_cfg.replace(patch_size=4), d_batch, d_input)
    for name, (c, batch, make_input) in configs.items():
        torch.manual_seed(0)
        model = NeuralInterpreter(c).to(device)
        x = make_input(batch, device)
        # one copy of the model per side (the same weights), so that the sides can interleave
        sides = {side: copy.deepcopy(model) for side in ("reference", "fused", "ceiling")}
        set_fused(sides["reference"], False)
        set_fused(sides["fused"], True)
        if cfg.compile:  # (the ceiling swaps forward methods, which compiled code would miss)
            del sides["ceiling"]
        else:
            for m in sides["ceiling"].modules():
                if isinstance(m, ModAttn):
                    m.forward = _without_mixing(m)
        error = {}
        steps = {side: _train_step(_compiled(cfg, m), x) for side, m in sides.items()}
        if "ceiling" in sides:
            steps["arithmetic"] = _mixing_arithmetic(c, batch, device)
        times = _times(cfg, steps, device, error)
        row = {
            "config": name,
            "tokens": _tokens(c),
            "batch": batch,
            "reference_ms": 1e3 * times["reference"],
            "fused_ms": 1e3 * times["fused"],
            "speedup": times["reference"] / times["fused"],
            **error,
        }
        if "ceiling" in times:
            floor = times["ceiling"]  # the step without the mixing
            row["ceiling"] = times["reference"] / floor
            # what the fused mixing takes per step, and what the 1.3x goal would leave it
            row["mixing_ms"] = 1e3 * (times["fused"] - floor)
            row["mixing_budget_ms"] = 1e3 * (times["reference"] / 1.3 - floor)
            row["mixing_arithmetic_ms"] = 1e3 * times["arithmetic"]
        rows.append(row)
    ratio = rows[0]["speedup"]
    first = rows[0]
    note = (
        ""
        if "ceiling" not in first
        else f"ceiling {first['ceiling']:.2f}x: the speed-up if the mixing were free; the fused "
        f"mixing takes {first['mixing_ms']:.1f} ms per step, its bare products and softmax "
        f"{first['mixing_arithmetic_ms']:.1f} ms, and 1.3x would leave it "
        f"{first['mixing_budget_ms']:.1f} ms"
    )
    return _result(
        "NI training step: fused ModAttn vs NI eq. 7 reference",
        rows,
        ratio,
        ">= 1.3x at the digits configuration",
        ratio >= 1.3,
        note,
    )


def bench_ni_memory(cfg: BenchConfig, device) -> dict:
    """The memory of one NI training step at the experiments' digits configuration, through
    NI eq. 7 as written (the ``(B, U, H, T, T)`` weights kept for backward: before the fused
    ModAttn) and fused (after): the activations autograd keeps, counted alike on every device,
    and on CUDA the step's peak allocation above what the model and its input hold."""
    c, batch, make_input = _experiment_ni(cfg)["digits"]
    torch.manual_seed(0)
    model = NeuralInterpreter(c).to(device)
    x = make_input(batch, device)
    params = list(model.parameters())
    rows = []
    for fused in (False, True):
        set_fused(model, fused)
        with _autocast(cfg, device):
            saved = saved_bytes(lambda: model(x), exclude=[x, *params])
        row = {
            "path": "fused" if fused else "NI eq. 7 reference",
            "tokens": _tokens(c),
            "batch": batch,
            "saved_MiB": saved / 2**20,
        }
        if device.type == "cuda":
            step = _train_step(_compiled(cfg, model), x)

            def peak(step=step) -> float:
                with _autocast(cfg, device):
                    step()  # warm-up (and compilation)
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    step()
                    torch.cuda.synchronize()
                return (torch.cuda.max_memory_allocated() - base) / 2**20

            row["peak_MiB"] = _or_nan(cfg, peak, row)
        rows.append(row)
    key = "peak_MiB" if device.type == "cuda" else "saved_MiB"
    ratio = rows[0][key] / rows[1][key]
    return _result(
        f"NI training memory at the digits configuration ({key})",
        rows,
        ratio,
        "fused keeps less than NI eq. 7",
        ratio > 1.0,
        f"activations kept: {rows[0]['saved_MiB']:.0f} -> {rows[1]['saved_MiB']:.0f} MiB",
    )


class _PreLNTransformer(nn.Module):
    """A plain pre-LN transformer encoder: what an NI's function streams cost without the
    modulation, the type matching and the pooling."""

    def __init__(self, c: NIConfig, layers: int):
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            c.dim,
            c.num_heads,
            c.mlp_hidden,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.encoder(x)


def bench_ni_vs_transformer(cfg: BenchConfig, device) -> dict:
    """An NI training step vs a plain pre-LN transformer doing the same attention and MLP work:
    batch ``B U`` (one sequence per function stream), the same ``T`` tokens, width, heads and MLP
    width, ``iterations x LOCs`` layers (target <= 1.25x at the experiments' configurations)."""
    rows = []
    for name, (c, batch, make_input) in _experiment_ni(cfg).items():
        torch.manual_seed(0)
        ni = NeuralInterpreter(c).to(device)
        layers = c.num_iterations * c.num_locs * c.num_scripts
        tf = _PreLNTransformer(c, layers).to(device)
        streams = torch.randn(batch * c.num_functions, _tokens(c), c.dim, device=device)
        ni, tf = _compiled(cfg, ni, tf)
        times = _times(
            cfg,
            {"ni": _train_step(ni, make_input(batch, device)), "tf": _train_step(tf, streams)},
            device,
        )
        t_ni, t_tf = times["ni"], times["tf"]
        rows.append(
            {
                "config": name,
                "batch_x_functions": batch * c.num_functions,
                "tokens": _tokens(c),
                "layers": layers,
                "ni_ms": 1e3 * t_ni,
                "transformer_ms": 1e3 * t_tf,
                "ratio": t_ni / t_tf,
            }
        )
    worst = max(r["ratio"] for r in rows)
    return _result(
        "NI vs its equivalent transformer (training step)", rows, worst, "<= 1.25x", worst <= 1.25
    )


# ----------------------------------------------------------------------------- 2e. threads


def _experiment_steps(cfg: BenchConfig) -> dict[str, Callable[[], None]]:
    """One training step of each experiment's main model at ``cfg.experiments`` (CPU)."""
    from modnets.experiments import tiny_imagenet

    steps = {}
    for name, (c, batch, make_input) in _experiment_ni(cfg).items():
        torch.manual_seed(0)
        steps[f"NI {name}"] = _train_step(NeuralInterpreter(c), make_input(batch, "cpu"))
    t = select(tiny_imagenet.CONFIGS, cfg.experiments).train
    torch.manual_seed(0)
    nac = tiny_imagenet.build_model("nac", t)
    steps["NAC Tiny-ImageNet"] = _train_step(nac, torch.randn(t.nac_train.batch_size, 3, 64, 64))
    return steps


def _thread_child(experiments: str, min_run_time: float) -> list[dict]:
    """Run in a fresh process (its libgomp reads ``GOMP_SPINCOUNT`` when torch loads): every
    experiment step at 1 and 2 threads, on a quiet machine and while a second process spins."""
    cfg = BenchConfig(experiments=experiments, min_run_time=min_run_time)
    rows = []
    for name, step in _experiment_steps(cfg).items():
        row = {"config": name}
        for busy in (False, True):
            spinner = None
            if busy:
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(0.2)
            try:
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    key = f"{'busy' if busy else 'quiet'}_{threads}t_ms"
                    row[key] = 1e3 * median_time(step, 3, 1, min_run_time=min_run_time)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
        rows.append(row)
    return rows


def bench_thread_policy(cfg: BenchConfig, device) -> dict:
    """The CPU thread policy (:mod:`modnets.threads`): each experiment's training step at 1 and
    2 threads, quiet and while a second process keeps one core busy, under each of
    ``cfg.spin_counts`` and the policy's ``GOMP_SPINCOUNT``, each in a fresh process. Target: with
    the policy and 2 threads, a busy neighbour slows a step at most 2.5x."""
    if device.type != "cpu" or (os.cpu_count() or 1) < 2:
        return _result(
            "CPU thread policy",
            [],
            None,
            "<= 2.5x slower with one core busy",
            None,
            "needs a CPU with two cores or more",
        )
    rows = []
    for spin in dict.fromkeys((*cfg.spin_counts, GOMP_SPINCOUNT)):
        env = {**os.environ, "GOMP_SPINCOUNT": spin}
        code = (
            "import json, sys; from modnets.benchmarks import _thread_child; "
            f"print(json.dumps(_thread_child({cfg.experiments!r}, {cfg.min_run_time!r})))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout
        for row in json.loads(out.strip().splitlines()[-1]):
            row = {"spin": spin, **row}
            row["best_quiet_threads"] = 1 if row["quiet_1t_ms"] < row["quiet_2t_ms"] else 2
            row["busy_slowdown_2t"] = row["busy_2t_ms"] / row["quiet_2t_ms"]
            rows.append(row)
    policy = [r for r in rows if r["spin"] == GOMP_SPINCOUNT]
    default = [r for r in rows if r["spin"] == "300000"] or policy
    worst = max(r["busy_slowdown_2t"] for r in policy)
    cost = max(r["quiet_2t_ms"] / d["quiet_2t_ms"] for r, d in zip(policy, default, strict=True))
    return _result(
        "CPU thread policy: a busy neighbour (2 threads)",
        rows,
        worst,
        "<= 2.5x slower with one core busy",
        worst <= 2.5,
        f"GOMP_SPINCOUNT={GOMP_SPINCOUNT}: quiet steps at most {cost:.2f}x the default spinning's",
    )


# ----------------------------------------------------------------------------- 3. NAC vs PIO


def _nac_config(cfg: BenchConfig, **kw) -> NACConfig:
    base = dict(
        input_dim=cfg.readin_dim if cfg.nac is TABLE4 else 64,
        num_outputs=200,
        prior=None,
        **(cfg.nac or MID),
    )
    base.update(kw)
    return NACConfig(**base)


def bench_nac_vs_pio(cfg: BenchConfig, device) -> dict:
    """A NAC vs a Perceiver IO with as many latents as processor modules and the same width,
    forward + backward (target <= 1.5x)."""
    c = _nac_config(cfg)
    x = torch.randn(cfg.batch, 64, c.input_dim, device=device)
    nac, pio = NeuralAttentiveCircuit(c).to(device), PerceiverIO(c).to(device)
    times = _times(
        cfg,
        {"nac": _train_step(_compiled(cfg, nac), x), "pio": _train_step(_compiled(cfg, pio), x)},
        device,
    )
    t_nac, t_pio = times["nac"], times["pio"]
    rows = [
        {"model": "NAC", "ms": 1e3 * t_nac, "parameters": sum(p.numel() for p in nac.parameters())},
        {
            "model": "Perceiver IO",
            "ms": 1e3 * t_pio,
            "parameters": sum(p.numel() for p in pio.parameters()),
        },
    ]
    ratio = t_nac / t_pio
    return _result(
        f"NAC vs Perceiver IO (U={c.num_processors}, d={c.dim}, L={c.num_layers})",
        rows,
        ratio,
        "<= 1.5x",
        ratio <= 1.5,
    )


def bench_read_in_memory(cfg: BenchConfig, device) -> dict:
    """Factorised vs naive read-in attention (NAC eq. 4): time and activation memory of the attention
    itself (the ModFFN after it is the same in both; target >= 10x less memory)."""
    U, N, d, B = cfg.readin_units, cfg.readin_tokens, cfg.readin_dim, cfg.readin_batch
    r = ReadIn(d, d, d).to(device)
    x = torch.randn(B, N, d, device=device)
    q = torch.randn(B, U, d, device=device, requires_grad=True)
    codes = torch.randn(U, d, device=device)
    fact = lambda: r.attend(x, q, codes).square().mean()  # noqa: E731
    naive = lambda: r.naive_attend(x, q, codes).square().mean()  # noqa: E731
    rows = []
    for name, fn in (("factorised", fact), ("naive", naive)):
        t = median_time(
            lambda fn=fn: fn().backward(), max(1, cfg.repeats // 2), 1, device, cfg.min_run_time
        )
        rows.append({"read-in": name, "ms": 1e3 * t, "saved_MiB": saved_bytes(fn) / 2**20})
    ratio = rows[1]["saved_MiB"] / rows[0]["saved_MiB"]
    return _result(
        f"read-in attention memory (U={U}, N={N}, d={d}, batch {B})",
        rows,
        ratio,
        ">= 10x less memory",
        ratio >= 10,
        f"naive/factorised time {rows[1]['ms'] / rows[0]['ms']:.2f}x",
    )


# ----------------------------------------------------------------------------- 4. token scaling


def _scaling_models(cfg: BenchConfig, n_tokens: int, device):
    d = cfg.scaling_dim
    nac_kw = dict(
        input_dim=8,
        num_outputs=10,
        dim=d,
        num_layers=2,
        num_processors=64,
        num_readouts=4,
        num_heads=4,
        ffn_hidden=2 * d,
        sig_dim=16,
        code_dim=d,
        prior=None,
    )
    ni_cfg = NIConfig(
        dim=d,
        type_dim=16,
        num_functions=4,
        num_iterations=2,
        num_heads=4,
        input_kind="vector",
        num_elements=n_tokens,
        element_features=8,
        num_outputs=10,
    )
    return {
        "NAC": NeuralAttentiveCircuit(NACConfig(**nac_kw)).to(device),
        "Perceiver IO": PerceiverIO(NACConfig(**nac_kw)).to(device),
        "NI": NeuralInterpreter(ni_cfg).to(device),
        "ViT": ViT(ni_cfg, depth=2).to(device),
    }


def _adaptive_time(fn, repeats: int, device, min_run_time: float) -> float:
    """Median of ``repeats`` timings, or a single one when a call takes over a second."""
    t = median_time(fn, 1, 1, device, min_run_time=0.0)
    return t if t > 1.0 else median_time(fn, repeats, 0, device, min_run_time)


def bench_token_scaling(cfg: BenchConfig, device) -> dict:
    """Inference time vs number of input tokens N; fitted exponents (NAC/PIO ~1, NI/ViT ~2).

    NAC and Perceiver IO go 16x further in N than NI and ViT (``tokens`` then two more
    quadruplings), since their cost only becomes linear once the read-in outweighs the fixed cost
    of the propagators."""
    linear_tokens = tuple(cfg.tokens) + (cfg.tokens[-1] * 4, cfg.tokens[-1] * 16)
    times: dict[str, dict[int, float]] = {}
    for n in linear_tokens:
        x = torch.randn(1, n, 8, device=device)
        for name, model in _scaling_models(cfg, n, device).items():
            if name in ("NI", "ViT") and n > cfg.tokens[-1]:
                continue
            model.eval()
            with torch.inference_mode():
                times.setdefault(name, {})[n] = _adaptive_time(
                    lambda m=model: m(x), cfg.repeats, device, cfg.min_run_time
                )
    rows = [
        {"tokens": n, **{f"{k}_ms": 1e3 * v[n] for k, v in times.items() if n in v}}
        for n in linear_tokens
    ]
    # exponents from the two largest sizes of each model, where the leading term dominates
    exps = {k: fit_exponent(list(v)[-2:], list(v.values())[-2:]) for k, v in times.items()}
    ok = exps["NAC"] < 1.3 and exps["Perceiver IO"] < 1.3 and exps["NI"] > 1.5 and exps["ViT"] > 1.5
    note = ", ".join(f"{k} ~ N^{e:.2f}" for k, e in exps.items())
    return {
        **_result(
            "scaling with input tokens N",
            rows,
            exps["NAC"],
            "NAC / PIO near N^1, NI / ViT near N^2",
            ok,
            note,
        ),
        "exponents": exps,
    }


# ----------------------------------------------------------------------------- 5. dropping


def bench_dropping(cfg: BenchConfig, device) -> dict:
    """Inference throughput of a NAC with 0 / 50 / 80 / 90 % of processor modules dropped
    (target >= 4x at 80 %)."""
    c = _nac_config(cfg)
    model = NeuralAttentiveCircuit(c).to(device).eval()
    x = torch.randn(cfg.drop_batch, 64, c.input_dim, device=device)
    rows = []
    for f in cfg.drop_fractions:
        small = model.drop_modules(min(c.num_processors - 1, round(f * c.num_processors)))
        with torch.inference_mode():
            t = median_time(lambda small=small: small(x), cfg.repeats, 1, device, cfg.min_run_time)
        rows.append(
            {
                "dropped": f,
                "modules": small.config.num_processors,
                "samples_per_s": cfg.drop_batch / t,
            }
        )
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["speedup"] = r["samples_per_s"] / base
    at80 = next((r["speedup"] for r in rows if abs(r["dropped"] - 0.8) < 1e-9), None)
    return _result(
        f"dropping modules (U_p={c.num_processors}, batch {cfg.drop_batch})",
        rows,
        at80,
        ">= 4x at 80 % dropped",
        None if at80 is None else at80 >= 4,
    )


# ----------------------------------------------------------------------------- 6. FLOP utilisation


def bench_flop_utilisation(cfg: BenchConfig, device) -> dict:
    """Achieved GFLOP/s of a NAC and an NI training step vs ``torch.matmul`` in the same run
    (target >= 50 %)."""
    n = cfg.matmul_size
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    t_mm = _time(cfg, lambda: a @ b, device)  # in the step's precision
    peak = 2 * n**3 / t_mm / 1e9
    c = _nac_config(cfg)
    nac = NeuralAttentiveCircuit(c).to(device)
    x_nac = torch.randn(cfg.batch, 64, c.input_dim, device=device)
    ni_cfg = NIConfig(
        dim=cfg.ni_dim,
        type_dim=16,
        num_functions=5,
        num_iterations=4,
        num_heads=4,
        image_size=32,
        patch_size=4,
        num_outputs=10,
    )
    ni = NeuralInterpreter(ni_cfg).to(device)
    x_ni = torch.randn(cfg.batch, 3, 32, 32, device=device)
    rows = [{"what": f"torch.matmul {n}x{n}", "gflop_per_s": peak, "utilisation": 1.0}]
    worst = 1.0
    for name, model, x in (("NAC training step", nac, x_nac), ("NI training step", ni, x_ni)):
        flops = _count_flops(_train_step(model, x))
        t = _time(cfg, _train_step(_compiled(cfg, model), x), device)
        rate = flops / t / 1e9
        rows.append(
            {"what": name, "gflop_per_s": rate, "utilisation": rate / peak, "gflop": flops / 1e9}
        )
        worst = min(worst, rate / peak)
    return _result("FLOP utilisation vs torch.matmul", rows, worst, ">= 50 %", worst >= 0.5)


# ----------------------------------------------------------------------------- 7. many modules


def bench_many_modules(cfg: BenchConfig, device) -> dict:
    """A NAC with ``many_modules`` processor modules: forward + backward time and memory."""
    c = _nac_config(cfg, num_processors=cfg.many_modules, num_layers=2)
    model = NeuralAttentiveCircuit(c).to(device)
    x = torch.randn(cfg.many_batch, 64, c.input_dim, device=device)
    step = _train_step(model, x)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = median_time(step, max(1, cfg.repeats // 2), 1, device, min_run_time=0.0)
    act = saved_bytes(lambda: model(x))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    row = {
        "modules": cfg.many_modules,
        "batch": cfg.many_batch,
        "fwd_bwd_s": t,
        "activation_MiB": act / 2**20,
        "parameter_MiB": params / 2**20,
    }
    if device.type == "cuda":
        row["peak_cuda_MiB"] = torch.cuda.max_memory_allocated() / 2**20
    return _result(f"{cfg.many_modules}-module NAC (d={c.dim})", [row], t, "runs", True)


# ----------------------------------------------------------------------------- 8. training steps


def _experiment_models(
    cfg: BenchConfig,
) -> dict[str, tuple[Callable[[], nn.Module], Tensor, TrainConfig]]:
    """Every model the experiments at ``cfg.experiments`` train, with one batch of its inputs
    and its training configuration: ``name -> (build(), batch, TrainConfig)``."""
    from modnets.experiments import digits, fuzzy_boolean, stacked_mnist, tiny_imagenet

    f = select(fuzzy_boolean.CONFIGS, cfg.experiments).train
    d = select(digits.CONFIGS, cfg.experiments).train
    t = select(tiny_imagenet.CONFIGS, cfg.experiments).train
    s = select(stacked_mnist.CONFIGS, cfg.experiments).train
    size = d.ni_config().image_size
    pio = partial(tiny_imagenet.build_model, "pio", t)

    def entry(build, config: TrainConfig, channels: int = 3, side: int = 64) -> tuple:
        return build, torch.randn(config.batch_size, channels, side, side), config

    vector = torch.rand(f.pretrain.batch_size, f.num_variables)
    return {
        "NI (fuzzy Booleans)": (partial(fuzzy_boolean.build_model, f), vector, f.pretrain),
        "NI (digits)": entry(partial(digits.build_ni, d), d.ni_train, side=size),
        "ViT (digits)": entry(partial(digits.build_vit, d), d.vit_train, side=size),
        "NAC (Tiny-ImageNet)": entry(partial(tiny_imagenet.build_model, "nac", t), t.nac_train),
        "Perceiver IO (Tiny-ImageNet)": entry(pio, t.pio_train),
        "CNN (stacked MNIST)": entry(partial(stacked_mnist.build_model, "cnn", s), s.optim, 1),
        "NFM (stacked MNIST)": entry(partial(stacked_mnist.build_model, "nfm", s), s.optim, 1),
    }


def _optimiser_step(model: nn.Module, x: Tensor, config: TrainConfig) -> Callable[[], None]:
    """One optimiser step as :func:`modnets.training.fit` takes it under ``config``: the model
    compiled and the optimiser fused where the config says, autocast, clipping, the update."""
    net = maybe_compile(model, config.compile)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer_for([{"params": params}], config)
    device = params[0].device

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast(device) if config.amp else nullcontext():
            out = net(x)
            loss = (out if isinstance(out, Tensor) else out.logits).float().square().mean()
        loss.backward()
        if config.clip_grad_norm is not None:
            nn.utils.clip_grad_norm_(params, config.clip_grad_norm)
        opt.step()

    return step


def bench_train_steps(cfg: BenchConfig, device) -> dict:
    """Each experiment's optimiser step as it runs (its config's compile, fused optimiser and
    autocast) against the plain eager float32 step of the same model, interleaved in this run;
    where both switches are on, the fused optimiser alone too. ``warmup_s``: the first two
    steps as run (compilation) less two steady steps, and ``break_even_steps`` the steps after
    which the warm-up has paid for itself. ``mfu``: the step's FLOPs (forward and backward,
    counted eagerly) per second as a share of the matmul rate measured here."""
    n = cfg.matmul_size
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    peak = 2 * n**3 / _time(cfg, lambda: a @ b, device)
    plain = dict(compile=False, fused=False, amp=False)
    rows = []
    for name, (build, x, config) in _experiment_models(cfg).items():
        torch.manual_seed(0)
        model = build().to(device)
        x = x.to(device)
        steps = {"eager": _optimiser_step(model, x, replace(config, **plain))}
        if config.compile and config.fused:  # the fused optimiser's share of the speed-up
            steps["fused"] = _optimiser_step(
                copy.deepcopy(model), x, replace(config, compile=False)
            )
        steps["as_run"] = as_run = _optimiser_step(copy.deepcopy(model), x, config)
        t0 = time.perf_counter()
        as_run()
        as_run()
        first_two = time.perf_counter() - t0
        flops = _count_flops(steps["eager"])
        times = _times(cfg, steps, device)
        saved = times["eager"] - times["as_run"]
        warmup = max(0.0, first_two - 2 * times["as_run"])
        row = {
            "model": name,
            "compile": config.compile,
            "fused": config.fused,
            **{f"{k}_ms": 1e3 * t for k, t in times.items()},
            "speedup": times["eager"] / times["as_run"],
            "mfu": flops / times["as_run"] / peak,
            "mfu_eager": flops / times["eager"] / peak,
            "warmup_s": warmup,
            "break_even_steps": math.ceil(warmup / saved) if saved > 0 else None,
        }
        if "fused" in times:
            row["speedup_fused_only"] = times["eager"] / times["fused"]
        rows.append(row)
        torch._dynamo.reset()  # the next model compiles afresh (never at the recompile limit)
    name = "Experiments' training steps: as run vs plain eager"
    target = ">= 1.4x for every model, NI MFU >= 40 %"
    if not any(r["compile"] or r["fused"] for r in rows):
        return _result(
            name,
            rows,
            None,
            target,
            None,
            f"every step at {cfg.experiments!r} is the plain eager one",
        )
    worst = min(r["speedup"] for r in rows)
    ni = min((r["mfu"] for r in rows if r["model"].startswith("NI")), default=math.nan)
    note = ", ".join(f"{r['model']} {r['speedup']:.2f}x" for r in rows)
    return _result(
        name,
        rows,
        worst,
        target,
        worst >= 1.4 and not ni < 0.4,
        f"{note}; NI MFU >= {ni:.0%} of matmul's {peak / 1e9:.0f} GFLOP/s",
    )


def _workers_child(experiments: str, min_run_time: float, threads: int) -> dict[str, float]:
    """Run in a fresh process: each experiment model's optimiser step (ms, as its config runs
    it but eager) at ``threads`` threads."""
    torch.set_num_threads(threads)
    cfg = BenchConfig(experiments=experiments, min_run_time=min_run_time)
    out = {}
    for name, (build, x, config) in _experiment_models(cfg).items():
        torch.manual_seed(0)
        step = _optimiser_step(build(), x, replace(config, compile=False))
        out[name] = 1e3 * median_time(step, 3, 1, min_run_time=min_run_time)
    return out


def bench_seed_workers(cfg: BenchConfig, device) -> dict:
    """Independent trainings side by side (:mod:`modnets.parallel`): each experiment model's
    step in one process with a thread per core, and in one single-threaded process per core, all
    running at once (each times the models in the same order, so their steps overlap).
    ``gain``: the steps per second of all those processes together over the one process's.
    Target: more than 1 for every model."""
    cores = os.cpu_count() or 1
    name = "seeds in worker processes"
    if device.type != "cpu" or cores < 2:
        return _result(name, [], None, "> 1x", None, "needs a CPU with two cores or more")
    if cfg.experiments == "smoke":  # (the unit tests time one smoke child)
        return _result(name, [], None, "> 1x", None, "smoke steps are too small to compare")

    def child(threads: int) -> subprocess.Popen:
        code = (
            "import json; from modnets.benchmarks import _workers_child; "
            f"print(json.dumps(_workers_child({cfg.experiments!r}, {cfg.min_run_time!r}, "
            f"{threads})))"
        )
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    def result(proc: subprocess.Popen) -> dict[str, float]:
        out, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"a benchmark process failed (exit {proc.returncode})")
        return json.loads(out.strip().splitlines()[-1])

    one = result(child(cores))
    side_by_side = [result(p) for p in [child(1) for _ in range(cores)]]
    rows = []
    for name, ms in one.items():
        each = [r[name] for r in side_by_side]
        gain = sum(ms / t for t in each)
        rows.append({"model": name, "one_process_ms": ms, "worker_ms": max(each), "gain": gain})
    worst = min(r["gain"] for r in rows)
    return _result(
        f"seeds in {cores} single-threaded processes vs one", rows, worst, "> 1x", worst > 1.0
    )


BENCHMARKS = {
    "modulated": bench_modulated,
    "ni_vectorised": bench_ni_vectorised,
    "modattn_tokens": bench_modattn_tokens,
    "ni_fused": bench_ni_fused,
    "ni_vs_transformer": bench_ni_vs_transformer,
    "ni_memory": bench_ni_memory,
    "thread_policy": bench_thread_policy,
    "nac_vs_pio": bench_nac_vs_pio,
    "read_in_memory": bench_read_in_memory,
    "token_scaling": bench_token_scaling,
    "dropping": bench_dropping,
    "flop_utilisation": bench_flop_utilisation,
    "many_modules": bench_many_modules,
    "train_steps": bench_train_steps,
    "seed_workers": bench_seed_workers,
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
    for name in names:
        t0 = time.perf_counter()
        res = BENCHMARKS[name](cfg, device)
        res["seconds"] = time.perf_counter() - t0
        out["results"][name] = res
        if show is not None:
            show(format_result(res))
    return out


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
