"""The benchmark suite: every speed and memory claim of the book, measured as ratios in one run.

Each benchmark times both sides in the same process (warm-up, then the median of repeats) and
returns rows plus the ratio that matters, with the target it is held to. Absolute times depend on
the machine; the ratios are what carry over. Run ``python -m bench`` (or ``make bench``); chapter 12
runs the same functions and plots them.

Sizes follow the active profile (:mod:`modnets.profiles`): ``smoke`` proves the code path in
seconds, ``cpu`` fits ~10 minutes on two cores, ``gpu`` uses the papers' sizes.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from modnets.baselines import PerceiverIO, ViT
from modnets.nac import NACConfig, NeuralAttentiveCircuit
from modnets.ni import NeuralInterpreter, NIConfig
from modnets.nn.loc import LOC
from modnets.nn.modulated import ModFC, ModLin
from modnets.nn.read_in import ReadIn
from modnets.profiles import get_profile, select

__all__ = [
    "BenchConfig",
    "CONFIGS",
    "median_time",
    "saved_bytes",
    "fit_exponent",
    "bench_modulated",
    "bench_ni_vectorised",
    "bench_nac_vs_pio",
    "bench_read_in_memory",
    "bench_token_scaling",
    "bench_dropping",
    "bench_flop_utilisation",
    "bench_many_modules",
    "BENCHMARKS",
    "run_all",
]


@dataclass(frozen=True)
class BenchConfig:
    repeats: int = 5
    warmup: int = 2
    batch: int = 16
    # 2. NI vectorised vs loop
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
    # 7. many modules
    many_modules: int = 1024
    many_batch: int = 8


TABLE4 = dict(dim=384, num_layers=8, num_processors=320, num_readouts=64, num_heads=6,
              ffn_hidden=1536, sig_dim=64, code_dim=384)  # fmt: skip
SMALL = dict(dim=32, num_layers=2, num_processors=16, num_readouts=4, num_heads=2,
             ffn_hidden=64, sig_dim=8, code_dim=16)  # fmt: skip
MID = dict(dim=192, num_layers=4, num_processors=160, num_readouts=16, num_heads=6,
           ffn_hidden=768, sig_dim=32, code_dim=192)  # fmt: skip

CONFIGS = {
    "smoke": BenchConfig(repeats=1, warmup=1, batch=2, ni_functions=(1, 2, 4), ni_dim=16,
                         ni_tokens=9, nac=SMALL, readin_units=16, readin_tokens=8, readin_dim=16,
                         readin_batch=2, tokens=(16, 32, 64), scaling_dim=16, drop_batch=2,
                         matmul_size=128, many_modules=64, many_batch=2),
    "cpu": BenchConfig(nac=MID, tokens=(64, 256, 1024, 4096)),
    "gpu": BenchConfig(repeats=20, warmup=5, batch=64, nac=TABLE4, readin_batch=64,
                       drop_batch=64, matmul_size=8192, many_batch=8),
}  # fmt: skip


# ----------------------------------------------------------------------------- measuring


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 2,
                device: torch.device | str = "cpu") -> float:  # fmt: skip
    """Median wall time of ``fn()`` in seconds after ``warmup`` calls."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def saved_bytes(fn: Callable[[], Tensor]) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of ``fn()`` (activation memory;
    counted the same way on every device)."""
    total = 0
    seen: set[int] = set()

    def pack(t: Tensor):
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


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


def _count_flops(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _result(name: str, rows: list[dict], ratio: float | None, target: str, met: bool | None,
            note: str = "") -> dict:  # fmt: skip
    return {"name": name, "rows": rows, "ratio": ratio, "target": target, "met": met, "note": note}


# ----------------------------------------------------------------------------- 1. modulated layers


def bench_modulated(cfg: BenchConfig, device) -> dict:
    """ModLin / ModFC vs ``nn.Linear``, forward + backward (target: overhead <= 1.3x)."""
    B = cfg.batch
    shapes = [("NI streams (B,U,T,d)", (B, 5, cfg.ni_tokens, cfg.ni_dim), (5, 1)),
              ("NAC modules (B,U,d)", (B, 64, cfg.ni_dim), (64,)),
              ("NAC wide (B,U,d)", (B, 64, 4 * cfg.ni_dim), (64,))]  # fmt: skip
    rows, worst = [], 0.0
    for label, shape, code_lead in shapes:
        d = shape[-1]
        x = torch.randn(*shape, device=device, requires_grad=True)
        codes = torch.randn(*code_lead, d, device=device)
        layers = {"nn.Linear": nn.Linear(d, d), "ModLin": ModLin(d, d, d), "ModFC": ModFC(d, d, d)}
        times = {}
        for name, layer in layers.items():
            layer.to(device)
            call = (lambda layer=layer: layer(x)) if name == "nn.Linear" else (
                lambda layer=layer: layer(x, codes))  # fmt: skip
            times[name] = median_time(lambda call=call: call().square().mean().backward(),
                                      cfg.repeats, cfg.warmup, device)  # fmt: skip
        for name, t in times.items():
            ratio = t / times["nn.Linear"]
            if name != "nn.Linear":
                worst = max(worst, ratio)
            rows.append({"shape": label, "layer": name, "ms": 1e3 * t, "vs_linear": ratio})
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
    """NI's LOC over all function streams at once vs a per-function loop; time vs ``U``."""
    d, T, B = cfg.ni_dim, cfg.ni_tokens, cfg.batch
    loc = LOC(d, d, num_heads=4 if d % 4 == 0 else 1).to(device)
    rows = []
    for U in cfg.ni_functions:
        x = torch.randn(B, U, T, d, device=device)
        codes, compat = torch.randn(U, d, device=device), torch.rand(B, U, T, device=device)
        with torch.inference_mode():
            vec = median_time(lambda: loc(x, codes, compat), cfg.repeats, cfg.warmup, device)
            loop = median_time(lambda: _loc_loop(loc, x, codes, compat), cfg.repeats, cfg.warmup,
                               device)  # fmt: skip
        rows.append({"functions": U, "vectorised_ms": 1e3 * vec, "loop_ms": 1e3 * loop,
                     "speedup": loop / vec})  # fmt: skip
    slope = fit_exponent([r["functions"] for r in rows], [r["vectorised_ms"] for r in rows])
    speedup = rows[-1]["speedup"]
    return _result("NI: vectorised function streams vs loop", rows, speedup,
                   "vectorised faster than the loop; time ~ U^1", speedup >= 1.0,
                   f"time ~ U^{slope:.2f} (fitted)")  # fmt: skip


# ----------------------------------------------------------------------------- 3. NAC vs PIO


def _nac_config(cfg: BenchConfig, **kw) -> NACConfig:
    base = dict(input_dim=cfg.readin_dim if cfg.nac is TABLE4 else 64, num_outputs=200,
                prior=None, **(cfg.nac or MID))  # fmt: skip
    base.update(kw)
    return NACConfig(**base)


def bench_nac_vs_pio(cfg: BenchConfig, device) -> dict:
    """A NAC vs a Perceiver IO with as many latents as processor modules and the same width,
    forward + backward (target <= 1.5x)."""
    c = _nac_config(cfg)
    x = torch.randn(cfg.batch, 64, c.input_dim, device=device)
    nac, pio = NeuralAttentiveCircuit(c).to(device), PerceiverIO(c).to(device)
    t_nac = median_time(_train_step(nac, x), cfg.repeats, cfg.warmup, device)
    t_pio = median_time(_train_step(pio, x), cfg.repeats, cfg.warmup, device)
    rows = [{"model": "NAC", "ms": 1e3 * t_nac, "parameters": sum(p.numel() for p in nac.parameters())},
            {"model": "Perceiver IO", "ms": 1e3 * t_pio,
             "parameters": sum(p.numel() for p in pio.parameters())}]  # fmt: skip
    ratio = t_nac / t_pio
    return _result(f"NAC vs Perceiver IO (U={c.num_processors}, d={c.dim}, L={c.num_layers})",
                   rows, ratio, "<= 1.5x", ratio <= 1.5)  # fmt: skip


def bench_read_in_memory(cfg: BenchConfig, device) -> dict:
    """Factorised vs naive read-in attention (eq. 4): time and activation memory of the attention
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
        t = median_time(lambda fn=fn: fn().backward(), max(1, cfg.repeats // 2), 1, device)
        rows.append({"read-in": name, "ms": 1e3 * t, "saved_MiB": saved_bytes(fn) / 2**20})
    ratio = rows[1]["saved_MiB"] / rows[0]["saved_MiB"]
    return _result(f"read-in attention memory (U={U}, N={N}, d={d}, batch {B})", rows, ratio,
                   ">= 10x less memory", ratio >= 10,
                   f"naive/factorised time {rows[1]['ms'] / rows[0]['ms']:.2f}x")  # fmt: skip


# ----------------------------------------------------------------------------- 4. token scaling


def _scaling_models(cfg: BenchConfig, n_tokens: int, device):
    d = cfg.scaling_dim
    nac_kw = dict(input_dim=8, num_outputs=10, dim=d, num_layers=2, num_processors=64,
                  num_readouts=4, num_heads=4, ffn_hidden=2 * d, sig_dim=16, code_dim=d,
                  prior=None)  # fmt: skip
    ni_cfg = NIConfig(dim=d, type_dim=16, num_functions=4, num_iterations=2, num_heads=4,
                      input_kind="vector", num_elements=n_tokens, element_features=8,
                      num_outputs=10)  # fmt: skip
    return {
        "NAC": NeuralAttentiveCircuit(NACConfig(**nac_kw)).to(device),
        "Perceiver IO": PerceiverIO(NACConfig(**nac_kw)).to(device),
        "NI": NeuralInterpreter(ni_cfg).to(device),
        "ViT": ViT(ni_cfg, depth=2).to(device),
    }


def _adaptive_time(fn, repeats: int, device) -> float:
    """Median of ``repeats`` timings, or a single one when a call takes over a second."""
    t = median_time(fn, 1, 1, device)
    return t if t > 1.0 else median_time(fn, repeats, 0, device)


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
                    lambda m=model: m(x), cfg.repeats, device
                )
    rows = [{"tokens": n, **{f"{k}_ms": 1e3 * v[n] for k, v in times.items() if n in v}}
            for n in linear_tokens]  # fmt: skip
    # exponents from the two largest sizes of each model, where the leading term dominates
    exps = {k: fit_exponent(list(v)[-2:], list(v.values())[-2:]) for k, v in times.items()}
    ok = (exps["NAC"] < 1.3 and exps["Perceiver IO"] < 1.3 and exps["NI"] > 1.5
          and exps["ViT"] > 1.5)  # fmt: skip
    note = ", ".join(f"{k} ~ N^{e:.2f}" for k, e in exps.items())
    return {**_result("scaling with input tokens N", rows, exps["NAC"],
                      "NAC / PIO near N^1, NI / ViT near N^2", ok, note),
            "exponents": exps}  # fmt: skip


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
            t = median_time(lambda small=small: small(x), cfg.repeats, 1, device)
        rows.append({"dropped": f, "modules": small.config.num_processors,
                     "samples_per_s": cfg.drop_batch / t})  # fmt: skip
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["speedup"] = r["samples_per_s"] / base
    at80 = next((r["speedup"] for r in rows if abs(r["dropped"] - 0.8) < 1e-9), None)
    return _result(f"dropping modules (U_p={c.num_processors}, batch {cfg.drop_batch})", rows,
                   at80, ">= 4x at 80 % dropped", None if at80 is None else at80 >= 4)  # fmt: skip


# ----------------------------------------------------------------------------- 6. FLOP utilisation


def bench_flop_utilisation(cfg: BenchConfig, device) -> dict:
    """Achieved GFLOP/s of a NAC and an NI training step vs ``torch.matmul`` in the same run
    (target >= 50 %)."""
    n = cfg.matmul_size
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    t_mm = median_time(lambda: a @ b, cfg.repeats, cfg.warmup, device)
    peak = 2 * n**3 / t_mm / 1e9
    c = _nac_config(cfg)
    nac = NeuralAttentiveCircuit(c).to(device)
    x_nac = torch.randn(cfg.batch, 64, c.input_dim, device=device)
    ni_cfg = NIConfig(dim=cfg.ni_dim, type_dim=16, num_functions=5, num_iterations=4,
                      num_heads=4, image_size=32, patch_size=4, num_outputs=10)  # fmt: skip
    ni = NeuralInterpreter(ni_cfg).to(device)
    x_ni = torch.randn(cfg.batch, 3, 32, 32, device=device)
    rows = [{"what": f"torch.matmul {n}x{n}", "gflop_per_s": peak, "utilisation": 1.0}]
    worst = 1.0
    for name, model, x in (("NAC training step", nac, x_nac), ("NI training step", ni, x_ni)):
        step = _train_step(model, x)
        flops = _count_flops(step)
        t = median_time(step, cfg.repeats, cfg.warmup, device)
        rate = flops / t / 1e9
        rows.append({"what": name, "gflop_per_s": rate, "utilisation": rate / peak,
                     "gflop": flops / 1e9})  # fmt: skip
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
    t = median_time(step, max(1, cfg.repeats // 2), 1, device)
    act = saved_bytes(lambda: model(x))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    row = {"modules": cfg.many_modules, "batch": cfg.many_batch, "fwd_bwd_s": t,
           "activation_MiB": act / 2**20, "parameter_MiB": params / 2**20}  # fmt: skip
    if device.type == "cuda":
        row["peak_cuda_MiB"] = torch.cuda.max_memory_allocated() / 2**20
    return _result(f"{cfg.many_modules}-module NAC (d={c.dim})", [row], t, "runs", True)


BENCHMARKS = {
    "modulated": bench_modulated,
    "ni_vectorised": bench_ni_vectorised,
    "nac_vs_pio": bench_nac_vs_pio,
    "read_in_memory": bench_read_in_memory,
    "token_scaling": bench_token_scaling,
    "dropping": bench_dropping,
    "flop_utilisation": bench_flop_utilisation,
    "many_modules": bench_many_modules,
}


def run_all(profile: str | None = None, only: list[str] | None = None, device=None,
            show: Callable[[str], None] | None = print) -> dict:  # fmt: skip
    """Run the suite (or ``only`` some benchmarks) at ``profile``; returns a JSON-able dict."""
    profile = get_profile(profile)
    cfg = select(CONFIGS, profile)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    names = only or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"only must name benchmarks in {list(BENCHMARKS)}, got {unknown}")
    torch.manual_seed(0)
    out = {"profile": profile, "device": str(device), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "results": {}}  # fmt: skip
    for name in names:
        t0 = time.perf_counter()
        res = BENCHMARKS[name](cfg, device)
        res["seconds"] = time.perf_counter() - t0
        out["results"][name] = res
        if show is not None:
            show(format_result(res))
    return out


def format_result(res: dict) -> str:
    verdict = {True: "met", False: "MISSED", None: "n/a"}[res["met"]]
    ratio = "-" if res["ratio"] is None else f"{res['ratio']:.3g}"
    lines = [f"== {res['name']}: {ratio} (target {res['target']}: {verdict}) "
             f"[{res.get('seconds', 0):.1f} s]"]  # fmt: skip
    if res.get("note"):
        lines.append(f"   {res['note']}")
    for row in res["rows"]:
        lines.append("   " + "  ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))  # fmt: skip
    return "\n".join(lines)
