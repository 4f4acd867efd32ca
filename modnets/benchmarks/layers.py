"""Benchmarks of single layers: modulated linear layers against ``nn.Linear``, all NI function
streams at once against a loop, ModAttn's two paths by token count, and the factorised read-in's
memory."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from modnets.benchmarks.core import (
    BenchConfig,
    PerFunction,
    as_trained,
    compiled_side,
    fit_exponent,
    held_on,
    interleaved_times,
    make_result,
)
from modnets.benchmarks.ni import experiment_ni, ni_tokens
from modnets.nn.loc import LOC
from modnets.nn.modulated import ModFC, ModLin
from modnets.nn.read_in import ReadIn
from modnets.profiles import select
from modnets.timing import median_time, saved_bytes


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
    for name, (c, batch, _) in experiment_ni(cfg).items():
        x, code = (batch, c.num_functions, ni_tokens(c)), (c.num_functions, 1, c.code_dim)
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
    <= 1.3x on every shape, the experiments' included, as the experiments run them:
    :func:`as_trained`). A ModLin is timed as the NI calls it: on streams stored function-major,
    ``(U, B, T, d)``, one code per function."""
    rows = []
    for way, how in as_trained(cfg, device).items():
        for label, kind, shape, code_shape, d_out, d_code in _modulated_shapes(cfg):
            d = shape[-1]
            if kind == "ModLin":  # (B, U, T, d) -> (U, B, T, d); codes (U, 1, e) -> (U, e)
                shape, code_shape = (shape[1], shape[0], *shape[2:]), (code_shape[0], d_code)
            x = torch.randn(*shape, device=device, requires_grad=True)
            codes = torch.randn(*code_shape, device=device)
            layer = ModLin(d, d_out, d_code) if kind == "ModLin" else ModFC(d, d_out, d_code)
            layer = (PerFunction(layer) if kind == "ModLin" else layer).to(device)
            layer, linear = compiled_side(how, layer, nn.Linear(d, d_out).to(device))
            calls = {"nn.Linear": lambda: linear(x), kind: lambda: layer(x, codes)}
            times = interleaved_times(
                how,
                {
                    name: lambda call=call: call().float().square().mean().backward()
                    for name, call in calls.items()
                },
                device,
            )
            rows.append(
                {
                    "step": way,
                    "shape": label,
                    "layer": kind,
                    "x": "x".join(map(str, shape)),
                    "d_out": d_out,
                    "linear_ms": 1e3 * times["nn.Linear"],
                    "modulated_ms": 1e3 * times[kind],
                    "vs_linear": times[kind] / times["nn.Linear"],
                }
            )
    worst, way, note = held_on(rows, "vs_linear")
    return make_result(
        "ModLin/ModFC vs nn.Linear (fwd+bwd)", rows, worst, f"<= 1.3x, {way}", worst <= 1.3, note
    )


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
        fns = compiled_side(cfg, loc, partial(_loc_loop, loc))
        times = interleaved_times(
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
    return make_result(
        "NI: vectorised function streams vs loop (fwd+bwd)",
        rows,
        worst,
        ">= 1.0x at every U",
        worst >= 1.0,
        f"time ~ U^{slope:.2f} (fitted)",
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
    return make_result(
        f"read-in attention memory (U={U}, N={N}, d={d}, batch {B})",
        rows,
        ratio,
        ">= 10x less memory",
        ratio >= 10,
        f"naive/factorised time {rows[1]['ms'] / rows[0]['ms']:.2f}x",
    )
