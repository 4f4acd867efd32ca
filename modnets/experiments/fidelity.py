"""The public NAC code's Tiny-ImageNet kernel beside modnets' default, on the same seeds.

The public Tiny-ImageNet run truncates the kernel and never samples it, learns one bandwidth per
kernel and leaves the read-out untruncated (:data:`modnets.models.nac.KERNEL_REGIMES`); modnets' default
also samples, shares one bandwidth and truncates the read-out. Everything else is chapter 10's
configuration at the profile, so the default's NACs are the chapter's checkpoints. Per seed: top-1,
top-1 lost with 80 % of the modules dropped least connected first (NAC App. F), and the learned
circuit (mean off-diagonal ``P``, bandwidth); then the paired difference public - default with its
95 % t-interval. The results are a record for book/fidelity.md, not a claim::

    python -m modnets.experiments.fidelity --profile cpu

writes ``bench/recorded/fidelity_tiny_imagenet_<profile>.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from dataclasses import replace
from pathlib import Path

from scipy import stats

from modnets import diagnostics
from modnets.experiments import tiny_imagenet as ti
from modnets.experiments.core import harness
from modnets.models.nac import KERNEL_REGIMES
from modnets.profiles import PROFILES, get_profile, select
from modnets.utils import atomic_file, default_device

REGIMES = ("modnets", "public-tiny")
PRIOR = "scale_free"


def regime_config(config: ti.TinyImageNetConfig, regime: str) -> ti.TinyImageNetConfig:
    """``config`` with its NAC's kernel set to ``regime`` (a key of ``KERNEL_REGIMES``)."""
    if regime not in KERNEL_REGIMES:
        raise ValueError(f"regime must be one of {list(KERNEL_REGIMES)}, got {regime!r}")
    nac = {**config.train.nac, **KERNEL_REGIMES[regime]}
    return replace(config, train=replace(config.train, nac=nac), priors=(PRIOR,))


def paired(a: list[float], b: list[float]) -> dict:
    """Mean of ``b - a`` over seeds with its 95 % t-interval (``nan`` bounds below two seeds)."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(d)
    if len(d) < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan"), "n": len(d)}
    half = stats.t.ppf(0.975, len(d) - 1) * statistics.stdev(d) / len(d) ** 0.5
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(d)}


def compare(
    profile: str | None = None,
    config: ti.TinyImageNetConfig | None = None,
    workers: int | None = None,
    show_progress: bool = True,
) -> dict:
    """Train (or load) the NAC of each regime at every seed of chapter 10's ``profile`` config
    (or of ``config``)."""
    profile = get_profile(profile)
    base = select(ti.CONFIGS, profile) if config is None else config
    device = default_device()
    data = ti.load_data(base.train)
    workers = harness.workers_for(workers, profile, device)
    out = {"profile": profile, "seeds": list(base.seeds), "prior": PRIOR, "regimes": {}}
    for regime in REGIMES:
        config = regime_config(base, regime)
        train = functools.partial(ti.train_task, config, device, False, None)
        tasks = [(seed, "nac", PRIOR) for seed in config.seeds]
        harness.train_ahead(train, tasks, workers, True, f"NACs ({regime})", show_progress)
        rows = []
        for seed in config.seeds:
            model, _ = ti.trained_model("nac", config, seed, data, device, PRIOR, show_progress)
            drop = ti.drop_curve(model, data, (0.0, ti.DROP_AT), config.eval_batch)
            circuit = diagnostics.circuit(model)
            rows.append(
                {
                    "seed": seed,
                    "top1": drop[0]["top1"],
                    "lost_at80": drop[0]["top1"] - drop[1]["top1"],
                    "mean_offdiagonal_P": circuit["mean_offdiagonal_P"],
                    "bandwidth": circuit["bandwidth"],
                }
            )
        out["regimes"][regime] = {"nac": config.train.nac, "per_seed": rows}
    a, b = (out["regimes"][r]["per_seed"] for r in REGIMES)
    keys = ("top1", "lost_at80", "mean_offdiagonal_P")
    out["public_minus_default"] = {k: paired([r[k] for r in a], [r[k] for r in b]) for k in keys}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    profile = get_profile(args.profile)
    path = args.out or Path("bench/recorded") / f"fidelity_tiny_imagenet_{profile}.json"
    result = compare(profile, workers=args.workers)
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1))
    for key, d in result["public_minus_default"].items():
        print(f"{key}: public - default {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
