"""Benchmarks of Neural Attentive Circuits: against a Perceiver IO, time against tokens, speed with
modules dropped, the share of its own matrix products' rate, and a circuit of 1,024 modules."""

from __future__ import annotations

import torch

from modnets.benchmarks.core import (
    MID,
    TABLE4,
    BenchConfig,
    as_trained,
    autocast_for,
    best_time,
    compiled_side,
    count_flops,
    fit_exponent,
    interleaved_times,
    make_result,
    matmul_rate,
    train_step,
)
from modnets.benchmarks.profiling import gemm_time
from modnets.models.baselines import PerceiverIO, ViT
from modnets.models.nac import NACConfig, NeuralAttentiveCircuit
from modnets.models.ni import NeuralInterpreter, NIConfig
from modnets.timing import median_time, saved_bytes


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
    times = interleaved_times(
        cfg,
        {
            "nac": train_step(compiled_side(cfg, nac), x),
            "pio": train_step(compiled_side(cfg, pio), x),
        },
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
    return make_result(
        f"NAC vs Perceiver IO (U={c.num_processors}, d={c.dim}, L={c.num_layers})",
        rows,
        ratio,
        "<= 1.5x",
        ratio <= 1.5,
    )


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
        **make_result(
            "scaling with input tokens N",
            rows,
            exps["NAC"],
            "NAC / PIO near N^1, NI / ViT near N^2",
            ok,
            note,
        ),
        "exponents": exps,
    }


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
    return make_result(
        f"dropping modules (U_p={c.num_processors}, batch {cfg.drop_batch})",
        rows,
        at80,
        ">= 4x at 80 % dropped",
        None if at80 is None else at80 >= 4,
    )


def bench_flop_utilisation(cfg: BenchConfig, device) -> dict:
    """Achieved GFLOP/s of a NAC and an NI training step against this machine's ceiling at the
    step's own shapes: the rate its matrix products reach when nothing else runs (their FLOPs
    over the time they take inside the eager step, :func:`gemm_time`). Target: >= 50 % of it,
    timed as the experiments train (:func:`as_trained`). A square ``cfg.matmul_size`` product
    is shown beside it: small and thin products run below that rate on any machine, so a share
    of it says as much about the shapes as about the step."""
    n = cfg.matmul_size
    peak = matmul_rate(cfg, device) / 1e9  # in the step's precision
    c = _nac_config(cfg)
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
    rows = [{"step": "-", "what": f"torch.matmul {n}x{n}", "gflop_per_s": peak}]
    for way, how in as_trained(cfg, device).items():
        torch.manual_seed(0)
        nac, ni = NeuralAttentiveCircuit(c).to(device), NeuralInterpreter(ni_cfg).to(device)
        x_nac = torch.randn(cfg.batch, 64, c.input_dim, device=device)
        x_ni = torch.randn(cfg.batch, 3, 32, 32, device=device)
        for name, model, x in (("NAC", nac, x_nac), ("NI", ni, x_ni)):
            flops = count_flops(train_step(model, x))
            with autocast_for(how, device):
                products, _ = gemm_time(train_step(model, x))
            t = best_time(how, train_step(compiled_side(how, model), x), device)
            rows.append(
                {
                    "step": way,
                    "what": f"{name} training step",
                    "gflop": flops / 1e9,
                    "gflop_per_s": flops / t / 1e9,
                    "of_own_products": products / t,
                    f"of_matmul_{n}": flops / t / 1e9 / peak,
                }
            )
    held = rows[-1]["step"]
    worst = min(r["of_own_products"] for r in rows if r["step"] == held)
    return make_result(
        "FLOP utilisation vs the step's own matrix products",
        rows,
        worst,
        f">= 50 %, {held}",
        worst >= 0.5,
        "; ".join(
            f"{r['step']} {r['what']}: {r['of_own_products']:.0%} of its products' rate, "
            f"{r[f'of_matmul_{n}']:.0%} of the {n}x{n} product's"
            for r in rows[1:]
        ),
    )


def bench_many_modules(cfg: BenchConfig, device) -> dict:
    """A NAC with ``many_modules`` processor modules: forward + backward time and memory."""
    c = _nac_config(cfg, num_processors=cfg.many_modules, num_layers=2)
    model = NeuralAttentiveCircuit(c).to(device)
    x = torch.randn(cfg.many_batch, 64, c.input_dim, device=device)
    step = train_step(model, x)
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
    return make_result(f"{cfg.many_modules}-module NAC (d={c.dim})", [row], t, "runs", True)
