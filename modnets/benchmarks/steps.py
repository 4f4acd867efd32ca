"""Benchmarks of the experiments' own training steps: as run against plain eager, under the thread
policy with a busy neighbour, and in one single-threaded process per core."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import replace
from functools import partial

import torch
from torch import Tensor, nn

from modnets.benchmarks.core import (
    BenchConfig,
    best_time,
    count_flops,
    interleaved_times,
    make_result,
    matmul_rate,
    train_step,
)
from modnets.benchmarks.ni import experiment_ni
from modnets.models.ni import NeuralInterpreter
from modnets.profiles import select
from modnets.threads import GOMP_SPINCOUNT
from modnets.timing import median_time
from modnets.training import TrainConfig, autocast, maybe_compile, optimizer_for


def _experiment_steps(cfg: BenchConfig) -> dict[str, Callable[[], None]]:
    """One training step of each experiment's main model at ``cfg.experiments`` (CPU)."""
    from modnets.experiments import tiny_imagenet

    steps = {}
    for name, (c, batch, make_input) in experiment_ni(cfg).items():
        torch.manual_seed(0)
        steps[f"NI {name}"] = train_step(NeuralInterpreter(c), make_input(batch, "cpu"))
    t = select(tiny_imagenet.CONFIGS, cfg.experiments).train
    torch.manual_seed(0)
    nac = tiny_imagenet.build_model("nac", t)
    steps["NAC Tiny-ImageNet"] = train_step(nac, torch.randn(t.nac_train.batch_size, 3, 64, 64))
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
        return make_result(
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
            "import json, sys; from modnets.benchmarks.steps import _thread_child; "
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
    return make_result(
        "CPU thread policy: a busy neighbour (2 threads)",
        rows,
        worst,
        "<= 2.5x slower with one core busy",
        worst <= 2.5,
        f"GOMP_SPINCOUNT={GOMP_SPINCOUNT}: quiet steps at most {cost:.2f}x the default spinning's",
    )


def _experiment_models(
    cfg: BenchConfig,
) -> dict[str, tuple[Callable[[], nn.Module], Tensor, TrainConfig]]:
    """Every model the experiments at ``cfg.experiments`` train and register for the benchmarks
    (``RegisteredModel.bench``), with one batch of its inputs and its training configuration:
    ``name -> (build(), batch, TrainConfig)``."""
    from modnets.experiments import get, list_experiments

    out = {}
    for experiment in map(get, list_experiments()):
        config = select(experiment.configs, cfg.experiments)
        for model in experiment.registered.values():
            if model.bench:
                train = model.train(config)
                batch = model.example(config, train.batch_size)
                out[model.bench] = (partial(model.build, config), batch, train)
    return out


def _trained_alone(cfg: BenchConfig, workers: int, names: Iterable[str]) -> set[str]:
    """Those of ``names`` (the models of :func:`_experiment_models`) whose experiment trains its
    seeds in whole rounds of ``workers`` and has fewer claim seeds than that at
    ``cfg.experiments``: no round fills the workers, so it trains them in its main process with
    every thread (an experiment configured with one seed). Tiny-ImageNet's tasks are its seeds
    times its models, which fill the workers."""
    from modnets.experiments import digits, fuzzy_boolean, stacked_mnist

    in_rounds = {"fuzzy Booleans": fuzzy_boolean, "digits": digits, "stacked MNIST": stacked_mnist}
    short = tuple(
        f"({label})"
        for label, module in in_rounds.items()
        if len(select(module.CONFIGS, cfg.experiments).seeds) < workers
    )
    return {name for name in names if name.endswith(short)}


def _optimiser_step(model: nn.Module, x: Tensor, config: TrainConfig) -> Callable[[], None]:
    """One optimiser step as :func:`modnets.training.fit` takes it under ``config``: the weights
    channels-last, the model compiled and the optimiser fused where the config says, autocast,
    clipping, the update."""
    if config.channels_last:
        model.to(memory_format=torch.channels_last)
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


#: The switches a plain eager float32 step has off.
PLAIN = dict(compile=False, fused=False, amp=False, channels_last=False)


def _as_run_child(
    experiments: str,
    min_run_time: float,
    threads: int,
    rounds: int,
    names: list[str] | None = None,
) -> None:
    """Run in a fresh process, as one of an experiment's seed workers: for each model (of
    ``names``; all where None), build the step as its config runs it and the plain eager step,
    take the first two steps as run (compilation), say so, then for each of ``rounds`` rounds
    wait for the parent's ``go`` and time both steps. Lines for the parent start with ``@@``."""
    torch.set_num_threads(threads)
    cfg = BenchConfig(experiments=experiments, min_run_time=min_run_time)
    for name, (build, x, config) in _experiment_models(cfg).items():
        if names is not None and name not in names:
            continue
        torch.manual_seed(0)
        model = build()
        plain = _optimiser_step(model, x, replace(config, **PLAIN))
        as_run = _optimiser_step(copy.deepcopy(model), x, config)
        t0 = time.perf_counter()
        as_run()
        as_run()
        print("@@", json.dumps({"model": name, "first_two_s": time.perf_counter() - t0}))
        for _ in range(rounds):
            sys.stdin.readline()
            times = {
                "as_run_ms": 1e3 * median_time(as_run, 3, 1, min_run_time=min_run_time),
                "plain_ms": 1e3 * median_time(plain, 3, 1, min_run_time=min_run_time),
            }
            print("@@", json.dumps(times), flush=True)
        torch._dynamo.reset()


def _read(proc: subprocess.Popen) -> dict:
    """The next ``@@`` line of a child, as JSON."""
    for line in proc.stdout:
        if line.startswith("@@ "):
            return json.loads(line[3:])
    proc.wait()
    raise RuntimeError(f"a benchmark process ended before it answered (exit {proc.returncode})")


def _in_workers(cfg: BenchConfig, workers: int, eager: dict[str, Callable[[], None]]):
    """``name -> (row fields)``: each model's step as run in ``workers`` single-threaded
    processes at once, ``cfg.rounds`` rounds each interleaved with this process's plain eager
    step (``eager``, timed with every thread while the workers wait)."""
    threads = max(1, (os.cpu_count() or 1) // workers)
    code = (
        "from modnets.benchmarks.steps import _as_run_child; "
        f"_as_run_child({cfg.experiments!r}, {cfg.min_run_time!r}, {threads}, {cfg.rounds}, "
        f"{list(eager)!r})"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(workers)
    ]
    out = {}
    try:
        for name, step in eager.items():
            first_two = max(_read(p)["first_two_s"] for p in procs)
            best = {
                "eager": math.inf,
                "as_run": [math.inf] * workers,
                "plain": [math.inf] * workers,
            }
            for _ in range(cfg.rounds):
                best["eager"] = min(best["eager"], best_time(cfg, step, "cpu"))
                for p in procs:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                for i, p in enumerate(procs):
                    t = _read(p)
                    best["as_run"][i] = min(best["as_run"][i], t["as_run_ms"] / 1e3)
                    best["plain"][i] = min(best["plain"][i], t["plain_ms"] / 1e3)
            out[name] = {
                "eager_s": best["eager"],
                "as_run_s": 1 / sum(1 / t for t in best["as_run"]),  # per step, all workers
                "worker_s": max(best["as_run"]),
                "plain_workers_s": 1 / sum(1 / t for t in best["plain"]),
                "first_two_s": first_two,
            }
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return out


def bench_train_steps(cfg: BenchConfig, device) -> dict:
    """Each experiment's optimiser step as it runs against the plain eager float32 step of the same
    model in one process with every thread, interleaved in this run. As it runs: its config's
    compile, fused optimiser, channels-last weights and autocast, in the experiment's seed workers
    (:func:`modnets.experiments.core.harness.workers_for`: one single-threaded process per core
    on a CPU, all training at once; one process at ``smoke`` and on a GPU). Every worker trains
    a copy of one model, as the experiments' seeds do; an experiment with fewer seeds than workers
    trains in this process with every thread, as it does when run. ``as_run_ms`` is the
    time per step of all workers together (one over their summed steps per second), ``worker_ms``
    one worker's step; ``speedup_workers_only``: the plain steps in the same workers, the gain
    of the worker layout alone. ``warmup_s``: the first two steps as run (compilation) less two
    steady steps, and ``break_even_steps`` the steps (each worker's own) after which the warm-up
    has paid for itself. ``mfu``: the step's
    FLOPs (forward and backward, counted eagerly) per second as a share of the matmul rate
    measured here with every thread (before and after the steps, the higher)."""
    from modnets.experiments.core.harness import workers_for

    peak = matmul_rate(cfg, device)
    workers = workers_for(None, cfg.experiments, device)
    models = _experiment_models(cfg)
    alone = _trained_alone(cfg, workers, models) if workers > 1 else set()
    eager, flops, times = {}, {}, {}
    for name, (build, x, config) in models.items():
        torch.manual_seed(0)
        model = build().to(device)
        x = x.to(device)
        eager[name] = _optimiser_step(model, x, replace(config, **PLAIN))
        flops[name] = count_flops(eager[name])
        if workers > 1 and name not in alone:
            continue
        as_run = _optimiser_step(copy.deepcopy(model), x, config)
        t0 = time.perf_counter()
        as_run()
        as_run()
        first_two = time.perf_counter() - t0
        t = interleaved_times(cfg, {"eager": eager[name], "as_run": as_run}, device)
        times[name] = {"eager_s": t["eager"], "as_run_s": t["as_run"], "first_two_s": first_two}
        torch._dynamo.reset()  # the next model compiles afresh (never at the recompile limit)
    shared = {name: step for name, step in eager.items() if name not in alone}
    if workers > 1 and shared:
        times |= _in_workers(cfg, workers, shared)
    # the rate again after the steps, the higher one kept: one reading taken while the machine is
    # slow would make every MFU look higher than it is
    peak = max(peak, matmul_rate(cfg, device))
    rows = []
    for name, (_, _, config) in models.items():
        t = times[name]
        processes = 1 if name in alone else workers
        per_worker = t.get("worker_s", t["as_run_s"])
        warmup = max(0.0, t["first_two_s"] - 2 * per_worker)
        saved = (t["eager_s"] - t["as_run_s"]) * processes  # per worker, in its own steps
        row = {
            "model": name,
            "compile": config.compile,
            "fused": config.fused,
            "channels_last": config.channels_last,
            "workers": processes,
            "eager_ms": 1e3 * t["eager_s"],
            "as_run_ms": 1e3 * t["as_run_s"],
            "speedup": t["eager_s"] / t["as_run_s"],
            "mfu": flops[name] / t["as_run_s"] / peak,
            "mfu_eager": flops[name] / t["eager_s"] / peak,
            "warmup_s": warmup,
            "break_even_steps": math.ceil(warmup / saved) if saved > 0 else None,
        }
        if processes > 1:
            row["worker_ms"] = 1e3 * t["worker_s"]
            row["speedup_workers_only"] = t["eager_s"] / t["plain_workers_s"]
        rows.append(row)
    name = "Experiments' training steps: as run vs plain eager"
    target = ">= 1.4x for every model, NI MFU >= 40 %"
    if workers == 1 and not any(r["compile"] or r["fused"] or r["channels_last"] for r in rows):
        return make_result(
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
    return make_result(
        name,
        rows,
        worst,
        target,
        worst >= 1.4 and not ni < 0.4,
        f"{note}; NI MFU >= {ni:.0%} of matmul's {peak / 1e9:.0f} GFLOP/s; "
        f"as run in {workers} process{'es' if workers > 1 else ''}"
        + (f" ({', '.join(sorted(alone))}: in one)" if alone else ""),
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
        return make_result(name, [], None, "> 1x", None, "needs a CPU with two cores or more")
    if cfg.experiments == "smoke":  # (the unit tests time one smoke child)
        return make_result(name, [], None, "> 1x", None, "smoke steps are too small to compare")

    def child(threads: int) -> subprocess.Popen:
        code = (
            "import json; from modnets.benchmarks.steps import _workers_child; "
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
    return make_result(
        f"seeds in {cores} single-threaded processes vs one", rows, worst, "> 1x", worst > 1.0
    )
