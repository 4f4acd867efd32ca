"""The public NAC code's Tiny-ImageNet choices beside modnets' defaults, same seeds: how much of
the NAC's gap to Perceiver IO each group of differences explains.

The public Tiny-ImageNet run truncates the kernel and never samples it, learns one bandwidth per
kernel and leaves the read-out untruncated (:data:`modnets.models.nac.KERNEL_REGIMES`); modnets' default
also samples, shares one bandwidth and truncates the read-out. Its prior loss is a mean over all
pairs, summed over the kernels (``NACConfig.prior_loss="public"``). Everything else is chapter 10's
configuration at the profile, so the default's NACs are the chapter's checkpoints. The other
groups (:func:`variants`): signatures pre-fitted to a Watts-Strogatz graph; the read-in's heads
and LayerScale; the public run's GELU FFN of 4/3 the width; the read-out's DropPath, the seeder's
noise on its states and the senders' own LayerNorm; and all of them with the kernel and decayed
codes. Perceiver IO trains beside them under the same recipe. Per seed: top-1, the drop curve
(modules dropped least connected first, NAC App. F) and the learned circuit (mean off-diagonal
``P``, bandwidth); then each variant's paired difference from the default, and from Perceiver
IO, with its 95 % t-interval. The results are a record for book/fidelity.md, not a claim::

    python -m modnets.experiments.fidelity --profile cpu [--only VARIANT ...]

writes ``bench/recorded/fidelity_tiny_imagenet_<profile>.json``.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import replace
from pathlib import Path

from scipy import stats

from modnets import diagnostics, parallel
from modnets.experiments import tiny_imagenet as ti
from modnets.experiments.core import harness
from modnets.experiments.core.claims import mde
from modnets.experiments.core.cli import record_arguments, save_record
from modnets.experiments.core.options import RunOptions
from modnets.models.nac import KERNEL_REGIMES
from modnets.profiles import get_profile, select
from modnets.utils import default_device

#: What each variant changes in chapter 10's NAC: nothing (modnets' default); the public Tiny-ImageNet
#: run's kernel; that kernel with the public run's prior loss too (a mean over all U² pairs, summed
#: over the kernels, weight 1: at the cpu profile's two kernels about twice the default's strength).
VARIANTS = {
    "modnets": {},
    "public-tiny": KERNEL_REGIMES["public-tiny"],
    "public-tiny, public prior": {**KERNEL_REGIMES["public-tiny"], "prior_loss": "public"},
}
#: The public run's read-out and norms: DropPath on its branches, the seeder's noise on its
#: states, the senders' own LayerNorm
READ_OUT = {"read_out_drop_path": True, "read_out_state_noise": True, "share_layernorm": False}


def variants(config: ti.TinyImageNetConfig) -> dict[str, dict]:
    """:data:`VARIANTS` and one per group of the public Tiny-ImageNet run's choices, sized for
    ``config``'s NAC (the read-in's heads as the propagators', the FFN at 4/3 of the width, as
    the public run's 512 of 384), then all of them together."""
    nac = config.train.nac_config()
    groups = {
        "signatures": {"signature_prefit": "watts_strogatz"},
        "read-in": {"read_in_heads": nac.num_heads, "read_in_layer_scale": 0.1},
        "FFN": {"activation": "gelu", "ffn_hidden": round(4 / 3 * nac.dim)},
        "read-out and norms": READ_OUT,
    }
    everything = {**KERNEL_REGIMES["public-tiny"], "decay_codes": True}
    for group in groups.values():
        everything |= group
    return {**VARIANTS, **groups, "public, all": everything}


DEFAULT = "modnets"
PRIOR = "scale_free"
KEYS = ("top1", "lost_at80", "mean_offdiagonal_P")


def variant_config(config: ti.TinyImageNetConfig, variant: str) -> ti.TinyImageNetConfig:
    """``config`` with its NAC changed as :func:`variants` ``[variant]`` says."""
    known = variants(config)
    if variant not in known:
        raise ValueError(f"variant must be one of {list(known)}, got {variant!r}")
    nac = {**config.train.nac, **known[variant]}
    return replace(config, train=replace(config.train, nac=nac), priors=(PRIOR,))


def paired(a: list[float], b: list[float]) -> dict:
    """Mean of ``b - a`` over seeds with its 95 % t-interval (``nan`` bounds below two seeds)
    and the smallest difference these seeds detect (:func:`~modnets.experiments.core.claims.mde`,
    ``None`` below two seeds or without spread)."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(d)
    if len(d) < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan"), "n": len(d), "mde": None}
    sd = statistics.stdev(d)
    half = stats.t.ppf(0.975, len(d) - 1) * sd / len(d) ** 0.5
    return {
        "mean": mean,
        "low": mean - half,
        "high": mean + half,
        "n": len(d),
        "mde": mde(sd, len(d)),
    }


def _seed_row(model, data, config: ti.TinyImageNetConfig, seed: int) -> dict:
    """One trained NAC's top-1, its drop curve (least connected first, NAC App. F) and circuit."""
    fractions = sorted({0.0, *config.drop_fractions, ti.DROP_AT})
    curve = ti.drop_curve(model, data, fractions, config.eval_batch)
    top1 = {point["fraction"]: point["top1"] for point in curve}
    circuit = diagnostics.circuit(model)
    return {
        "seed": seed,
        "top1": top1[0.0],
        "lost_at80": top1[0.0] - top1[ti.DROP_AT],
        "drop_curve": [{"fraction": f, "top1": t} for f, t in top1.items()],
        "mean_offdiagonal_P": circuit["mean_offdiagonal_P"],
        "bandwidth": circuit["bandwidth"],
    }


def compare(
    profile: str | None = None,
    config: ti.TinyImageNetConfig | None = None,
    workers: int | None = None,
    show_progress: bool = True,
    seeds: tuple[int, ...] | None = None,
    only: tuple[str, ...] | None = None,
) -> dict:
    """Train (or load) the NAC of each variant (``only`` these, the default always) and
    Perceiver IO at every seed of chapter 10's ``profile`` config (or of ``config``; ``seeds``
    instead of its own); each variant's per-seed results, its paired difference from the default
    (:func:`summarise`)."""
    profile = get_profile(profile)
    base = select(ti.CONFIGS, profile) if config is None else config
    if seeds is not None:
        clash = sorted(set(seeds) & set(base.selection_seeds))
        if clash:
            raise ValueError(f"seeds {clash} are selection seeds; pick others")
        base = replace(base, seeds=tuple(seeds))
    names = list(variants(base))
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise ValueError(f"only must name variants of {names}, got {unknown}")
    names = [n for n in names if n == DEFAULT or only is None or n in only]
    device = default_device()
    data = ti.load_data(base.train)
    workers = harness.workers_for(workers, profile, device)
    options = RunOptions(device=device, show_progress=show_progress, workers=workers)
    out = {"profile": profile, "seeds": list(base.seeds), "prior": PRIOR, "variants": {}}
    with parallel.keep_workers():  # started once for all the variants
        train = functools.partial(ti.train_task, base, options)
        harness.train_ahead(train, [(s, "pio", None) for s in base.seeds], options, "Perceiver IO")
        pio = [ti.trained_model("pio", base, s, data, options)[0] for s in base.seeds]
        # the intact model's top-1, as the drop curve measures it for the NACs
        out["pio"] = [
            {"seed": s, "top1": ti.drop_curve(m, data, [0.0], base.eval_batch)[0]["top1"]}
            for s, m in zip(base.seeds, pio, strict=True)
        ]
        for variant in names:
            config = variant_config(base, variant)
            train = functools.partial(ti.train_task, config, options)
            tasks = [(seed, "nac", PRIOR) for seed in config.seeds]
            harness.train_ahead(train, tasks, options, f"NACs ({variant})")
            rows = []
            for seed in config.seeds:
                model, _ = ti.trained_model("nac", config, seed, data, options, prior=PRIOR)
                rows.append(_seed_row(model, data, config, seed))
            out["variants"][variant] = {"nac": config.train.nac, "per_seed": rows}
    return summarise(out)


def summarise(result: dict) -> dict:
    """``result`` with, from its per-seed rows, each variant's paired difference from the default
    (``minus_default[variant][key]``) and its top-1 minus Perceiver IO's (``minus_pio``)."""
    default = result["variants"][DEFAULT]["per_seed"]
    result["minus_default"] = {
        variant: {k: paired([r[k] for r in default], [r[k] for r in v["per_seed"]]) for k in KEYS}
        for variant, v in result["variants"].items()
        if variant != DEFAULT
    }
    pio_top1 = [r["top1"] for r in result["pio"]]
    result["minus_pio"] = {
        variant: paired(pio_top1, [r["top1"] for r in v["per_seed"]])
        for variant, v in result["variants"].items()
    }
    return result


def interval_text(d: dict, scale: float, digits: int, with_mde: bool = False) -> str:
    """``d``'s mean and 95 % interval, scaled; with its mde where asked and known."""
    mean, low, high = (f"{scale * d[k]:+.{digits}f}" for k in ("mean", "low", "high"))
    shown = f"{mean} [{low}, {high}]"
    if with_mde and d.get("mde") is not None:
        shown += f", mde {scale * d['mde']:.{digits}f}"
    return shown


#: The record's quantities as the page shows them: label, scale, decimals.
SHOWN = {
    "top1": ("top-1 (%)", 100, 1),
    "lost_at80": ("top-1 lost at 80 % dropped (points)", 100, 2),
    "mean_offdiagonal_P": ("mean off-diagonal $P$", 1, 4),
}


def tables(result: dict) -> str:
    """The record of :func:`compare` as book/fidelity.md shows it (a test keeps the page equal
    to the committed record): per variant, the mean over seeds of each quantity and its paired
    difference from the default, each with its 95 % t-interval, and its top-1 minus Perceiver
    IO's where the record has Perceiver IO (top-1 differences with the smallest difference the
    seeds detect, ``mde``); then the drop curves."""
    variants = result["variants"]
    pio = result.get("minus_pio")
    head = ["variant", *(SHOWN[k][0] for k in KEYS)]
    head += [
        f"{SHOWN[k][0].split(' (')[0]}: − default (95 % CI{', mde' if k == 'top1' else ''})"
        for k in KEYS
    ]
    if pio:
        head.append("top-1 − Perceiver IO (points, 95 % CI, mde)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, v in variants.items():
        rows = v["per_seed"]
        cells = [name]
        cells += [
            f"{SHOWN[k][1] * statistics.fmean(r[k] for r in rows):.{SHOWN[k][2]}f}" for k in KEYS
        ]
        diffs = result["minus_default"].get(name)
        cells += [
            interval_text(diffs[k], SHOWN[k][1], SHOWN[k][2], with_mde=k == "top1")
            if diffs
            else "—"
            for k in KEYS
        ]
        if pio:
            cells.append(interval_text(pio[name], 100, 1, with_mde=True))
        lines.append("| " + " | ".join(cells) + " |")
    fractions = [p["fraction"] for p in next(iter(variants.values()))["per_seed"][0]["drop_curve"]]
    lines += ["", "| dropped | " + " | ".join(f"{100 * f:.0f} %" for f in fractions) + " |"]
    lines.append("|" + "---|" * (len(fractions) + 1))
    for name, v in variants.items():
        curves = [[p["top1"] for p in r["drop_curve"]] for r in v["per_seed"]]
        means = [100 * statistics.fmean(c[i] for c in curves) for i in range(len(fractions))]
        lines.append(f"| {name} | " + " | ".join(f"{m:.1f}" for m in means) + " |")
    return "\n".join(lines)


def _only_argument(parser) -> None:
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="VARIANT",
        help="train these variants beside the default (e.g. --only 'public, all'); all by default",
    )


def main(argv: list[str] | None = None) -> None:
    args = record_arguments(__doc__, argv, extra=_only_argument)
    profile = get_profile(args.profile)
    path = args.out or Path("bench/recorded") / f"fidelity_tiny_imagenet_{profile}.json"
    result = compare(profile, workers=args.workers, only=args.only)
    save_record(result, path)
    for variant, d in result["minus_pio"].items():
        print(
            f"{variant} - Perceiver IO, top1: {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
        )
    for variant, diffs in result["minus_default"].items():
        for key, d in diffs.items():
            print(
                f"{variant} - {DEFAULT}, {key}: {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
            )
    print(tables(result))
    print(f"results: {path} (book/fidelity.md shows the tables above)")


if __name__ == "__main__":
    main()
