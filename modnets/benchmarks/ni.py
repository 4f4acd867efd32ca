"""Benchmarks of whole Neural Interpreter steps: the fused attention path, its memory, and an NI
against a transformer doing the same attention and MLP work."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

from modnets.benchmarks.core import (
    BenchConfig,
    PerFunction,
    as_trained,
    autocast_for,
    compiled_side,
    held_on,
    interleaved_times,
    make_result,
    or_nan,
    train_step,
)
from modnets.benchmarks.profiling import operator_classes
from modnets.models.ni import NeuralInterpreter, NIConfig
from modnets.nn.config import use_fused_attn
from modnets.nn.modattn import ModAttn
from modnets.profiles import select
from modnets.timing import saved_bytes


def experiment_ni(cfg: BenchConfig) -> dict[str, tuple[NIConfig, int, Callable]]:
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


def ni_tokens(c: NIConfig) -> int:
    n = (c.image_size // c.patch_size) ** 2 if c.input_kind == "image" else c.num_elements
    return n + c.num_cls


def under(fused: bool | None, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn``, run with every ModAttn built without its own ``fused`` on that path
    (:func:`modnets.nn.config.use_fused_attn`)."""

    def run():
        with use_fused_attn(fused):
            return fn()

    return run


def bench_modattn_tokens(cfg: BenchConfig, device) -> dict:
    """ModAttn forward + backward, fused (``F.scaled_dot_product_attention``) vs NI eq. 7 with its
    ``(B, U, H, T, T)`` weights in memory, as ``T`` grows at a fixed ``B U T`` (d 64, 4 heads,
    U = 5), without and with a learned ``(U, H, T, T)`` bias (chapter 6's relative positions,
    which on a CPU send the fused path to torch's math kernel): where the fused path starts to
    win on this machine, and what ``fused=None`` (the path measured at each shape,
    :meth:`ModAttn.takes_fused`) costs against the faster of the two. Timed on streams stored
    function-major, ``(U, B, T, d)``, as the LOC keeps them and the measurement times them: the
    two paths' costs depend on the layout they read."""
    U, d, H = 5, 64 if cfg.experiments != "smoke" else 16, 4
    reference = ModAttn(d, d, num_heads=H, fused=False).to(device)
    fused = ModAttn(d, d, num_heads=H, fused=True).to(device)
    fused.load_state_dict(reference.state_dict())
    auto = ModAttn(d, d, num_heads=H).to(device)
    auto.load_state_dict(reference.state_dict())
    rows = []
    for learned in (False, True):
        for T in cfg.modattn_tokens:
            B = max(1, cfg.modattn_rows // (U * T))
            x = torch.randn(U, B, T, d, device=device, requires_grad=True)
            codes, C = torch.randn(U, d, device=device), torch.rand(U, B, T, device=device)
            bias = torch.randn(U, H, T, T, device=device, requires_grad=True) if learned else None
            paths = (PerFunction(reference), PerFunction(fused))
            sides = dict(zip((False, True), compiled_side(cfg, *paths), strict=True))
            times = interleaved_times(
                cfg,
                {
                    side: lambda f=f: f(x, codes, C, bias).float().square().mean().backward()
                    for side, f in sides.items()
                },
                device,
            )
            with use_fused_attn(None):
                takes = auto.takes_fused(x, codes, C, bias)
            chosen = times[True] if takes else times[False]
            rows.append(
                {
                    "bias": "learned" if learned else "none",
                    "tokens": T,
                    "batch": B,
                    "reference_ms": 1e3 * times[False],
                    "fused_ms": 1e3 * times[True],
                    "speedup": times[False] / times[True],
                    "auto_path": "fused" if takes else "eq7",
                    # what fused=None costs against the faster of the two
                    "auto_vs_best": chosen / min(times.values()),
                }
            )
    wins = {
        b: [r["tokens"] for r in rows if r["bias"] == b and r["speedup"] >= 1.0]
        for b in ("none", "learned")
    }
    worst = max(r["auto_vs_best"] for r in rows)
    note = "fused faster from T = " + ", ".join(
        f"{min(w) if w else '-'} ({'no bias' if b == 'none' else 'a learned bias'})"
        for b, w in wins.items()
    )
    return make_result(
        "ModAttn fused vs NI eq. 7 reference (fwd+bwd)",
        rows,
        worst,
        "fused=None (the path measured at each shape) within 1.1x of the faster path",
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
    T, dh = ni_tokens(c), c.dim // c.num_heads
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
    configs = experiment_ni(cfg)
    d_cfg, d_batch, d_input = configs["digits"]
    if d_cfg.patch_size != 4:  # (the gpu profile's digits NI already has them)
        configs["digits, 4x4 patches"] = (d_cfg.replace(patch_size=4), d_batch, d_input)
    for name, (c, batch, make_input) in configs.items():
        torch.manual_seed(0)
        model = NeuralInterpreter(c).to(device)
        x = make_input(batch, device)
        # one copy of the model per side (the same weights), so that the sides can interleave
        sides = {side: copy.deepcopy(model) for side in ("reference", "fused", "ceiling")}
        if cfg.compile:  # (the ceiling swaps forward methods, which compiled code would miss)
            del sides["ceiling"]
        else:
            for m in sides["ceiling"].modules():
                if isinstance(m, ModAttn):
                    m.forward = _without_mixing(m)
        error = {}
        steps = {
            side: under(side != "reference", train_step(compiled_side(cfg, m), x))
            for side, m in sides.items()
        }
        if "ceiling" in sides:
            steps["arithmetic"] = _mixing_arithmetic(c, batch, device)
        times = interleaved_times(cfg, steps, device, error)
        row = {
            "config": name,
            "tokens": ni_tokens(c),
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
    return make_result(
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
    and on CUDA the step's peak allocation above what the model and its input hold; and what
    ``fused=None`` keeps, which must be what the path it takes keeps (the target: memory
    follows the choice). Which path keeps less depends on the tokens: at a handful the fused
    path's padded copies outweigh the weights it does not keep."""
    c, batch, make_input = experiment_ni(cfg)["digits"]
    torch.manual_seed(0)
    model = NeuralInterpreter(c).to(device)
    x = make_input(batch, device)
    params = list(model.parameters())
    rows = []
    for fused in (False, True):
        with use_fused_attn(fused), autocast_for(cfg, device):
            saved = saved_bytes(lambda: model(x), exclude=[x, *params])
        row = {
            "path": "fused" if fused else "NI eq. 7 reference",
            "tokens": ni_tokens(c),
            "batch": batch,
            "saved_MiB": saved / 2**20,
        }
        if device.type == "cuda":
            step = under(fused, train_step(compiled_side(cfg, model), x))

            def peak(step=step) -> float:
                with autocast_for(cfg, device):
                    step()  # warm-up (and compilation)
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    step()
                    torch.cuda.synchronize()
                return (torch.cuda.max_memory_allocated() - base) / 2**20

            row["peak_MiB"] = or_nan(cfg, peak, row)
        rows.append(row)
    # fused=None: the path measured at this shape (in another process), nothing kept beside it
    with use_fused_attn(None), autocast_for(cfg, device):
        auto = saved_bytes(lambda: model(x), exclude=[x, *params]) / 2**20
    follows = min(abs(auto - r["saved_MiB"]) for r in rows) <= 1e-3 * auto
    chosen = min(rows, key=lambda r: abs(auto - r["saved_MiB"]))["path"]
    rows.append({"path": "fused=None", "tokens": ni_tokens(c), "batch": batch, "saved_MiB": auto})
    key = "peak_MiB" if device.type == "cuda" else "saved_MiB"
    ratio = rows[0][key] / rows[1][key]
    return make_result(
        f"NI training memory at the digits configuration ({key})",
        rows,
        ratio,
        "fused=None keeps what the path it takes keeps",
        follows,
        f"activations kept: NI eq. 7 {rows[0]['saved_MiB']:.0f}, fused "
        f"{rows[1]['saved_MiB']:.0f}, fused=None {auto:.0f} MiB (as {chosen})",
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
    width, ``iterations x LOCs`` layers (target <= 1.25x at the experiments' configurations, as
    the experiments train them: :func:`as_trained`)."""
    rows = []
    for way, how in as_trained(cfg, device).items():
        for name, (c, batch, make_input) in experiment_ni(cfg).items():
            torch.manual_seed(0)
            ni = NeuralInterpreter(c).to(device)
            layers = c.num_iterations * c.num_locs * c.num_scripts
            tf = _PreLNTransformer(c, layers).to(device)
            streams = torch.randn(batch * c.num_functions, ni_tokens(c), c.dim, device=device)
            ni, tf = compiled_side(how, ni, tf)
            times = interleaved_times(
                how,
                {"ni": train_step(ni, make_input(batch, device)), "tf": train_step(tf, streams)},
                device,
            )
            rows.append(
                {
                    "step": way,
                    "config": name,
                    "batch_x_functions": batch * c.num_functions,
                    "tokens": ni_tokens(c),
                    "layers": layers,
                    "ni_ms": 1e3 * times["ni"],
                    "transformer_ms": 1e3 * times["tf"],
                    "ratio": times["ni"] / times["tf"],
                }
            )
    worst, way, note = held_on(rows, "ratio")
    return make_result(
        "NI vs its equivalent transformer (training step)",
        rows,
        worst,
        f"<= 1.25x, {way}",
        worst <= 1.25,
        note,
    )


def bench_ni_profile(cfg: BenchConfig, device) -> dict:
    """Where an NI training step's time goes beside its same-work transformer's
    (:func:`bench_ni_vs_transformer`), by operator class (:func:`operator_classes`), at each
    experiment configuration; and the ratio of the time outside matrix products, which is what a
    machine with much faster GEMMs is left with. A diagnostic: no target."""
    rows, notes = [], []
    for name, (c, batch, make_input) in experiment_ni(cfg).items():
        torch.manual_seed(0)
        ni = NeuralInterpreter(c).to(device)
        tf = _PreLNTransformer(c, c.num_iterations * c.num_locs * c.num_scripts).to(device)
        streams = torch.randn(batch * c.num_functions, ni_tokens(c), c.dim, device=device)
        ni, tf = compiled_side(cfg, ni, tf)
        with autocast_for(cfg, device):
            sides = {
                "ni": operator_classes(train_step(ni, make_input(batch, device))),
                "tf": operator_classes(train_step(tf, streams)),
            }
        for cls in sides["ni"]:
            rows.append(
                {"config": name, "class": cls, "ni_ms": sides["ni"][cls], "tf_ms": sides["tf"][cls]}
            )
        total = {k: sum(v.values()) for k, v in sides.items()}
        rest = {k: total[k] - v["matrix products"] for k, v in sides.items()}
        notes.append(
            f"{name}: NI / transformer {total['ni'] / total['tf']:.2f} profiled, outside matrix "
            f"products {rest['ni'] / rest['tf']:.2f}"
        )
    return make_result(
        "NI vs its equivalent transformer, time by operator class (profiled training step)",
        rows,
        None,
        "a diagnostic (no target)",
        None,
        "; ".join(notes),
    )
