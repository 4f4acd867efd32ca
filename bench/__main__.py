"""Run the benchmark suite and write its JSON: ``python -m bench [--profile cpu] [--only ...]``.

Every benchmark times both sides in this one process and reports the ratio against its target;
see :mod:`modnets.benchmarks`. Results go to ``_build/results/bench_<profile>.json`` unless
``--out`` says otherwise, with the machine and the date they were recorded on. At ``cpu`` the
performance chapter reads its six slowest rows from three recorded runs:
``bench/recorded/cpu.json``, which ``python -m bench --profile cpu --only thread_policy ni_fused
nac_vs_pio seed_workers --out bench/recorded/cpu.json`` writes, ``cpu_train_steps.json``
(``--only train_steps``) and ``cpu_gemm_bound.json`` (``--only gemm_bound``); it times the rest
itself, except the five targets that one run meets or misses by chance (``modulated
ni_vs_transformer modattn_tokens ni_memory flop_utilisation``): those it reads from
``cpu_targets.json`` and ``cpu_targets_slowed.json``, each five runs (``--runs 5``), the second
on one thread (``--threads 1``, half the matrix-product rate), where a target counts as met
when most runs meet it. This script adds one benchmark of its own to the suite,
``graph_prior`` (the graph-prior regulariser, NAC eq. 6).
"""

from __future__ import annotations

import modnets  # noqa: F401 (first: the CPU thread policy must be set before torch loads)

# isort: split
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from modnets.benchmarks import (
    BENCHMARKS,
    PRECISIONS,
    BenchConfig,
    compare,
    make_result,
    median_time,
    run_all,
)
from modnets.graphs import GRAPHONS, GraphPriorRegularizer, graphon, hungarian_permutation
from modnets.profiles import PROFILES, get_profile

# ----------------------------------------------------------------------------- graph prior (eq. 6)

GRAPH_PRIOR_SIZES = (320, 1024)  # NAC Fig. 7's 320 modules (the target), and a larger circuit
GRAPH_PRIOR_TARGET_MS = 50.0


@contextmanager
def _one_thread():
    """One thread for torch and, where threadpoolctl is installed, for numpy's BLAS."""
    threads = torch.get_num_threads()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # numpy may then use more than one core
        limits = nullcontext()
    else:
        limits = threadpool_limits(1)
    torch.set_num_threads(1)
    try:
        with limits:
            yield
    finally:
        torch.set_num_threads(threads)


def _signature_links(U: int, gen: torch.Generator) -> torch.Tensor:
    """``P`` of random 16-d signatures under the truncated kernel (bandwidth 1, cut at 0.9)."""
    s = F.normalize(torch.randn(U, 16, generator=gen), dim=1)
    distance = 1 - s @ s.T
    return torch.where(distance > 0.9, 0.0, torch.exp(-distance))


def _noisy_relabelled(P0: torch.Tensor, gen: torch.Generator, sigma: float = 0.05):
    """The prior plus symmetric Gaussian noise (clipped to [0, 1], diagonal 1), relabelled, and
    eq. 6 under the true relabelling."""
    noise = sigma * torch.randn(P0.shape, generator=gen).triu(1)
    P = (P0 + noise + noise.T).clamp(0, 1).fill_diagonal_(1.0)
    true = ((P - P0) ** 2).sum() - ((P - P0).diagonal() ** 2).sum()
    perm = torch.randperm(len(P0), generator=gen)
    return P[perm][:, perm], true.item()


def _eq9_heuristic(P: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """The regulariser this library used before: eq. 9 plus 3 re-solves."""
    sigma = hungarian_permutation(P, prior, refine_steps=3)
    residual = (P - prior[sigma][:, sigma]) ** 2
    return residual.sum() - residual.diagonal().sum()


def bench_graph_prior(cfg: BenchConfig, device) -> dict:
    """The graph-prior regulariser (NAC eq. 6): one evaluation on ONE CPU thread, for each prior,
    at U = 320 (target <= 50 ms) and U = 1,024, on ``P`` of random signatures and on a noisy,
    relabelled prior. ``accuracy`` is the loss found over the loss under the true relabelling
    (noise sigma 0.05; below 1 where the noise lets another relabelling fit better);
    ``invariance`` the relative change of the loss when the modules are relabelled. The matching
    runs on the CPU whatever the device, so this benchmark does too."""
    gen = torch.Generator().manual_seed(0)
    rows, notes = [], []

    def ms(fn) -> float:
        return 1e3 * median_time(fn, cfg.repeats, cfg.warmup)

    with _one_thread():
        for U in GRAPH_PRIOR_SIZES:
            for name in GRAPHONS:
                prior = graphon(name, U)
                t0 = time.perf_counter()
                reg = GraphPriorRegularizer(prior)
                reg.matcher()  # the prior's structure, computed once per regulariser
                setup = time.perf_counter() - t0
                P = _signature_links(U, gen)
                noisy, true = _noisy_relabelled(prior, gen)
                perm = torch.randperm(U, generator=gen)
                loss = reg(P).item()
                row = {
                    "U": U,
                    "prior": name,
                    "mode": reg.matcher().mode,
                    "signatures_ms": ms(lambda reg=reg, P=P: reg(P)),
                    "noisy_prior_ms": ms(lambda reg=reg, noisy=noisy: reg(noisy)),
                    "setup_ms": 1e3 * setup,
                    "accuracy": reg(noisy).item() / true,
                    "invariance": abs(reg(P[perm][:, perm]).item() - loss) / loss,
                }
                if U == GRAPH_PRIOR_SIZES[0]:  # the old heuristic takes seconds at U = 1,024
                    row["eq9_heuristic_ms"] = ms(lambda P=P, prior=prior: _eq9_heuristic(P, prior))
                rows.append(row)
    small = [r for r in rows if r["U"] == GRAPH_PRIOR_SIZES[0]]
    worst = max(max(r["signatures_ms"], r["noisy_prior_ms"]) for r in small)
    accuracy = [r["accuracy"] for r in rows]
    invariance = max(r["invariance"] for r in rows)
    for U in GRAPH_PRIOR_SIZES:
        at = [r for r in rows if r["U"] == U]
        notes.append(
            f"U={U}: worst {max(max(r['signatures_ms'], r['noisy_prior_ms']) for r in at):.0f} ms"
        )
    old = statistics.median(r["eq9_heuristic_ms"] for r in small)
    notes.append(
        f"accuracy {min(accuracy):.3f}-{max(accuracy):.3f}, invariance <= {invariance:.1e}"
    )
    notes.append(f"eq. 9 heuristic at U={GRAPH_PRIOR_SIZES[0]}: median {old:.0f} ms")
    met = worst <= GRAPH_PRIOR_TARGET_MS and max(accuracy) <= 1.02 and invariance <= 1e-6
    return make_result(
        f"graph-prior regulariser, 1 thread (U={GRAPH_PRIOR_SIZES})",
        rows,
        worst,
        f"<= {GRAPH_PRIOR_TARGET_MS:.0f} ms at U={GRAPH_PRIOR_SIZES[0]}, accuracy <= 1.02, "
        "invariant to 1e-6",
        met,
        "; ".join(notes),
    )


BENCHMARKS.setdefault("graph_prior", bench_graph_prior)


def _machine() -> str:
    """The CPU's model name (Linux), else what :mod:`platform` knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def combine_runs(runs: list[dict]) -> dict:
    """One record of several runs of the same benchmarks (each :func:`run_all`'s dict, in its own
    process). Each benchmark keeps the result of the run whose ratio is the median, with every
    run's ratio (``runs``) and verdict (``runs_met``); its target is met where more than half the
    runs met it, which for a threshold on the ratio is where the median ratio meets it."""
    if not runs:
        raise ValueError("runs must hold at least one run of the suite")
    names = list(runs[0]["results"])
    if any(list(run["results"]) != names for run in runs):
        raise ValueError("runs must time the same benchmarks in the same order")
    out = {k: v for k, v in runs[0].items() if k != "results"}
    out["runs"] = len(runs)
    out["matmul_gflops"] = statistics.median(run["matmul_gflops"] for run in runs)
    out["results"] = {}
    for name in names:
        each = [run["results"][name] for run in runs]
        ratios = [r["ratio"] for r in each]
        timed = sorted((i for i, r in enumerate(ratios) if r is not None), key=lambda i: ratios[i])
        median = each[timed[(len(timed) - 1) // 2]] if timed else each[0]
        verdicts = [r["met"] for r in each]
        decided = [v for v in verdicts if v is not None]
        met = None if not decided else 2 * sum(decided) > len(runs)
        out["results"][name] = median | {"runs": ratios, "runs_met": verdicts, "met": met}
    return out


def run_in_processes(args: argparse.Namespace, argv: list[str]) -> dict:
    """``args.runs`` runs of the suite as ``argv`` asks (``--runs`` and ``--out`` left out), each
    in a fresh Python process as a reader's run would be, one after the other; their records
    combined (:func:`combine_runs`)."""
    from tqdm.auto import tqdm

    child = _without(argv, {"--runs", "--out"})
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in tqdm(range(args.runs), desc="runs of the suite", unit="run"):
            out = Path(tmp) / f"run-{i}.json"
            cmd = [sys.executable, "-m", "bench", *child, "--out", str(out)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            runs.append(json.loads(out.read_text()))
    return combine_runs(runs)


def _without(argv: list[str], options: set[str]) -> list[str]:
    """``argv`` without ``options`` and the value each takes (``--runs 5``, ``--out=path``)."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif a.split("=", 1)[0] not in options:
            kept.append(a)
    return kept


#: What ``--slow-gemm`` sets: MKL's and oneDNN's matrix products limited to AVX2.
SLOW_GEMM = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def slow_gemm_choices() -> Path:
    """Where a run with ``--slow-gemm`` keeps ModAttn's measured paths: beside the machine's own
    choices (:func:`modnets.nn.autotune.cache_path`), not among them, since a crossover measured
    with the matrix products capped is not the machine's."""
    from modnets.nn.autotune import cache_path

    default = cache_path()
    return default.with_name(f"{default.stem}-slow-gemm{default.suffix}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default=None)
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float32",
        help="bfloat16: the timed calls under bf16 autocast",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the timed models")
    parser.add_argument(
        "--slow-gemm",
        action="store_true",
        help="matrix products limited to AVX2 (MKL and oneDNN): how the ratios move with the "
        "machine's matmul rate",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch's threads for the timing (fewer threads: a slower matrix-product rate)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="runs of the suite, each in a fresh process; a target is met where most runs meet it",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="print the ratios of every saved run at --profile side by side",
    )
    args = parser.parse_args(argv)
    for option in ("threads", "runs"):
        value = getattr(args, option)
        if value is not None and value < 1:
            parser.error(f"--{option} must be a positive number, got {value}")
    if args.slow_gemm and os.environ.get("ONEDNN_MAX_CPU_ISA") != SLOW_GEMM["ONEDNN_MAX_CPU_ISA"]:
        # the libraries read their instruction set once, as torch loads: start again with it set,
        # and with ModAttn(fused=None)'s choices measured and kept apart (another crossover)
        os.environ.update(SLOW_GEMM)
        os.environ.setdefault("MODNETS_AUTOTUNE", str(slow_gemm_choices()))
        os.execv(sys.executable, [sys.executable, "-m", "bench", *sys.argv[1:]])
    profile = get_profile(args.profile)
    if args.compare:
        runs = sorted((Path("_build") / "results").glob(f"bench_{profile}*.json"))
        if not runs:
            raise SystemExit(f"no saved runs at profile {profile!r}: run python -m bench first")
        variants = {}
        for path in runs:
            run = json.loads(path.read_text())
            label = run.get("precision", "float32") + (" compiled" if run.get("compile") else "")
            variants[label] = run["results"]
        print(compare(variants))
        return
    argv = sys.argv[1:] if argv is None else argv
    start = time.perf_counter()
    if args.runs > 1:
        results = run_in_processes(args, argv)
    else:
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        results = run_all(profile, args.only, precision=args.precision, compile=args.compile)
    results["seconds"] = time.perf_counter() - start
    # how the record is made again (chapter 12 and the tests name it when the code changes)
    results["command"] = " ".join(["python -m bench", *argv])
    results["machine"] = _machine()
    # the instruction set the matrix products run with: a ratio moves with it (chapter 12)
    results["capability"] = torch.backends.cpu.get_cpu_capability()
    results["recorded"] = datetime.date.today().isoformat()
    variant = "".join(
        ("_bf16" if args.precision == "bfloat16" else "", "_compile" if args.compile else "")
    )
    out = args.out or Path("_build") / "results" / f"bench_{profile}{variant}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out)
    print(f"\n{len(results['results'])} benchmarks in {results['seconds']:.0f} s; results: {out}")
    print(f"{'benchmark':<18} {'ratio':>8}  target")
    for name, r in results["results"].items():
        verdict = {True: "met", False: "MISSED", None: "n/a"}[r["met"]]
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3g}"
        each = ", ".join("-" if x is None else f"{x:.3g}" for x in r.get("runs", []))
        print(
            f"{name:<18} {ratio:>8}  {r['target']} ({verdict})" + (f" runs: {each}" if each else "")
        )


if __name__ == "__main__":
    main()
