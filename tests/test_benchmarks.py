"""The benchmark suite measures what it says: per-call times, the experiments' shapes, and a
transformer that does the NI's attention and MLP work. (No speed is asserted here: speed is
measured in ``bench/``, as ratios in one run.)"""

import dataclasses
import json
import math
import time
from pathlib import Path

import pytest
import torch

from modnets import benchmarks as b
from modnets.models.ni import NeuralInterpreter
from modnets.nn import ModAttn
from modnets.nn.config import fused_attn, use_fused_attn


def test_median_time_is_per_call():
    # blocked_autorange times blocks of many calls; the result must be one call's time
    t = b.median_time(lambda: time.sleep(0.002), repeats=3, warmup=1, min_run_time=0.05)
    assert 0.0019 <= t < 0.02


def test_equivalent_transformer_does_the_ni_matmul_work():
    # same tokens, width, heads, MLP and iterations x LOCs layers: the NI adds only its
    # tokeniser, type inference and heads (12-17 % at cpu; more at smoke's tiny widths)
    cfg = b.BenchConfig(experiments="cpu")
    for c, batch, make_input in b.experiment_ni(cfg).values():
        ni = NeuralInterpreter(c)
        tf = b.ni._PreLNTransformer(c, c.num_iterations * c.num_locs * c.num_scripts)
        streams = torch.randn(batch * c.num_functions, b.ni.ni_tokens(c), c.dim)
        x = make_input(batch, "cpu")
        ratio = b.count_flops(lambda: ni(x)) / b.count_flops(lambda: tf(streams))  # noqa: B023
        assert 1.0 <= ratio <= 1.25


def test_mixing_arithmetic_is_the_mixing_s_products():
    # ni_fused's lower bound for the mixing does every product of NI eq. 7's mixing, forward and
    # backward, once per ModAttn of the step: the FLOPs of a ModAttn step minus those of the same
    # step with the mixing skipped (the projections kept), up to the fused path's extra channel
    # (the D of [C v, C]: (dh + 1) / dh), times the ModAttns of an NI step
    c, batch, _ = b.experiment_ni(b.BenchConfig(experiments="smoke"))["digits"]
    T, U = b.ni.ni_tokens(c), c.num_functions
    attn = ModAttn(c.dim, c.code_dim, num_heads=c.num_heads, fused=False)
    x = torch.randn(batch, U, T, c.dim, requires_grad=True)
    codes, compat = torch.randn(U, c.code_dim), torch.rand(batch, U, T)

    def step(forward):
        return lambda: forward(x, codes, compat).square().sum().backward()

    eq7 = b.count_flops(step(attn)) - b.count_flops(step(b.ni._without_mixing(attn)))
    calls = c.num_iterations * c.num_locs * c.num_scripts
    bare = b.count_flops(b.ni._mixing_arithmetic(c, batch, "cpu")) / calls
    dh = c.dim // c.num_heads
    assert eq7 > 0
    assert eq7 <= bare <= eq7 * (dh + 1) / dh


def test_modulated_benchmark_covers_the_experiments_shapes():
    from modnets.experiments import digits

    shapes = {s[2] for s in b.layers._modulated_shapes(b.CONFIGS["cpu"])}
    c = digits.CONFIGS["cpu"].train.ni_config()
    tokens = (c.image_size // c.patch_size) ** 2 + c.num_cls
    assert (
        digits.CONFIGS["cpu"].train.ni_train.batch_size,
        c.num_functions,
        tokens,
        c.dim,
    ) in shapes


def test_under_runs_a_step_on_the_path_it_names_and_restores_the_switch():
    ni = NeuralInterpreter(b.experiment_ni(b.BenchConfig(experiments="smoke"))["digits"][0])
    attns = [m for m in ni.modules() if isinstance(m, ModAttn)]
    assert attns and all(m.fused is None for m in attns)  # every ModAttn follows the switch
    seen = []
    for path in (False, True):
        b.under(path, lambda: seen.append(fused_attn()))()
    assert seen == [False, True] and fused_attn() is None


@pytest.mark.long
def test_thread_policy_is_set_before_torch_loads():
    import os
    import subprocess
    import sys

    from modnets import threads

    code = "import modnets, os; print(os.environ['GOMP_SPINCOUNT'], modnets.threads.effective)"
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [threads.GOMP_SPINCOUNT, "True"]
    # a value the user set is kept; torch imported first: the policy is not in effect
    code = (
        "import torch, modnets, os; print(os.environ['GOMP_SPINCOUNT'], modnets.threads.effective)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "GOMP_SPINCOUNT": "7"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["7", "False"]


def test_bf16_precision_times_under_autocast_and_float32_does_not():
    seen = []

    def probe():
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))

    for precision, expected in (("bfloat16", (True, torch.bfloat16)), ("float32", (False,))):
        cfg = b.BenchConfig(repeats=1, warmup=0, min_run_time=0.0, precision=precision)
        seen.clear()
        b.best_time(cfg, probe, "cpu")
        assert seen and all(call[: len(expected)] == expected for call in seen)
    assert not torch.is_autocast_enabled("cpu")  # and off again afterwards


def test_compile_wraps_every_timed_model_only_when_asked():
    lin, attn = torch.nn.Linear(4, 4), ModAttn(8, 4, num_heads=2)
    assert b.compiled_side(b.BenchConfig(), lin, attn) == (lin, attn)
    compiled = b.compiled_side(b.BenchConfig(compile=True), lin, attn)
    assert all(isinstance(m, torch._dynamo.eval_frame.OptimizedModule) for m in compiled)
    assert [m._orig_mod for m in compiled] == [lin, attn]


def test_run_all_variants_check_their_arguments_and_run_the_variant_benchmarks():
    with pytest.raises(ValueError, match="precision must be one of"):
        b.run_all("smoke", only=["ni_memory"], precision="fp8", show=None)
    with pytest.raises(ValueError, match="take no precision or compile"):
        b.run_all("smoke", only=["dropping"], precision="bfloat16", show=None)
    with pytest.raises(TypeError, match="compile must be True or False"):
        b.run_all("smoke", only=["ni_memory"], compile="yes", show=None)
    out = b.run_all("smoke", only=["ni_memory"], precision="bfloat16", show=None)
    assert (out["precision"], out["compile"]) == ("bfloat16", False)
    assert set(b.VARIANT_BENCHMARKS) <= set(b.BENCHMARKS)
    table = b.compare({"float32": out["results"], "bfloat16": out["results"]})
    assert table.splitlines()[1].split()[0] == "ni_memory"


def test_ni_memory_reports_what_autograd_keeps_on_each_path():
    # the benchmark's rows are the bytes autograd keeps for NI eq. 7 and for the fused path,
    # counted independently here (the two differ: the reference keeps the attention weights)
    cfg = b.BenchConfig(experiments="smoke")
    res = b.bench_ni_memory(cfg, torch.device("cpu"))
    c, batch, make_input = b.experiment_ni(cfg)["digits"]
    torch.manual_seed(0)
    model = NeuralInterpreter(c)
    x = make_input(batch, "cpu")
    expected = []
    for fused in (False, True):
        with use_fused_attn(fused):
            expected.append(b.saved_bytes(lambda: model(x), exclude=[x, *model.parameters()]))
    got = [row["saved_MiB"] * 2**20 for row in res["rows"]]
    assert got[:2] == pytest.approx(expected, rel=1e-9)
    assert expected[0] != expected[1]
    assert res["ratio"] == got[0] / got[1]
    # fused=None keeps what one of the two keeps, the one it takes (the check can fail: a third
    # amount, e.g. copies kept for both paths, misses both)
    follows = any(got[2] == pytest.approx(e, rel=1e-9) for e in expected)
    assert follows
    assert res["met"] is follows  # met: memory follows the choice, whichever path keeps less


def test_times_interleave_the_sides_and_keep_each_sides_fastest_round(monkeypatch):
    calls, seconds = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}

    def fake_time(cfg, fn, device):
        name = fn()
        calls.append(name)
        return next(seconds[name])

    monkeypatch.setattr(b.core, "best_time", fake_time)
    sides = {"a": lambda: "a", "b": lambda: "b"}
    assert b.interleaved_times(b.BenchConfig(rounds=3), sides, "cpu") == {"a": 1.0, "b": 4.0}
    assert calls == ["a", "b"] * 3  # round by round, not one side after the other

    def fails():
        raise RuntimeError("Inductor could not compile this")

    seconds["a"] = iter([2.0, 1.0])
    row, calls[:] = {}, []
    got = b.interleaved_times(
        b.BenchConfig(rounds=2, compile=True), {"a": sides["a"], "bad": fails}, "cpu", row
    )
    assert got["a"] == 1.0 and got["bad"] != got["bad"]  # NaN, and not retried
    assert calls == ["a", "a"] and "Inductor could not compile" in row["error"]
    with pytest.raises(RuntimeError):  # eager failures are bugs, not NaN
        b.interleaved_times(b.BenchConfig(rounds=1), {"bad": fails}, "cpu")


def test_train_steps_covers_every_experiments_models_and_has_nothing_to_compare_at_smoke():
    cfg = b.CONFIGS["smoke"]
    res = b.bench_train_steps(cfg, torch.device("cpu"))
    assert [r["model"] for r in res["rows"]] == list(b.steps._experiment_models(cfg))
    assert {
        "NI (fuzzy Booleans)",
        "NI (digits)",
        "ViT (digits)",
        "NAC (Tiny-ImageNet)",
        "Perceiver IO (Tiny-ImageNet)",
        "CNN (stacked MNIST)",
        "NFM (stacked MNIST)",
    } == {r["model"] for r in res["rows"]}
    # smoke trains every model plainly: both sides are the same step, no verdict
    assert not any(r["compile"] or r["fused"] for r in res["rows"])
    assert res["met"] is None and res["ratio"] is None


def test_train_steps_times_the_step_its_config_switches_on(monkeypatch):
    from modnets.training import TrainConfig

    real_compile, compiled = torch.compile, []

    def aot_eager(module):
        compiled.append(module)
        return real_compile(module, backend="aot_eager")

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    config = TrainConfig(epochs=1, batch_size=8, lr=1e-3, amp=False, compile=True, fused=True)
    monkeypatch.setattr(torch, "compile", aot_eager)
    monkeypatch.delenv("MODNETS_COMPILE", raising=False)
    monkeypatch.setattr(
        b.steps,
        "_experiment_models",
        lambda cfg: {"MLP": (lambda: model, torch.randn(8, 32), config)},
    )
    res = b.bench_train_steps(b.CONFIGS["smoke"], torch.device("cpu"))
    (row,) = res["rows"]
    assert len(compiled) == 1  # the as-run side only; the plain side stays eager
    assert row["compile"] and row["fused"] and row["workers"] == 1  # smoke: one process
    assert row["speedup"] == pytest.approx(row["eager_ms"] / row["as_run_ms"])
    assert 0 < row["mfu"] and row["warmup_s"] >= 0
    assert res["met"] == (row["speedup"] >= 1.4)  # no NI here: the speed-up alone decides


class _SeedWorker:
    """A stand-in for one ``_as_run_child`` process: its steps take 16 ms as run and 20 ms
    plain, and it answers one ``@@`` line per model and one per ``go``."""

    launched: list = []

    def __init__(self, args, **kwargs):
        self.code = args[-1]
        _SeedWorker.launched.append(self)
        self.stdin = self
        self.stdout = self._lines()
        self.returncode = None
        self.gos = 0

    def _lines(self):
        yield "a line of the child's own\n"
        yield '@@ {"model": "MLP", "first_two_s": 1.0}\n'
        while True:
            yield '@@ {"as_run_ms": 16.0, "plain_ms": 20.0}\n'

    def write(self, text):
        self.gos += text == "go\n"

    def flush(self):
        pass

    def kill(self):
        self.returncode = -9

    def wait(self):
        return self.returncode


def test_train_steps_as_run_in_the_experiments_seed_workers(monkeypatch):
    from modnets.training import TrainConfig

    monkeypatch.setattr(b.steps.os, "cpu_count", lambda: 4)
    monkeypatch.setenv("MODNETS_SEED_WORKERS", "2")  # two processes of two threads
    monkeypatch.setattr(b.steps.subprocess, "Popen", _SeedWorker)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    config = TrainConfig(epochs=1, batch_size=8, lr=1e-3, amp=False, compile=True, fused=True)
    # an experiment with one claim seed (stacked MNIST here): too few for two workers, it trains
    # in this process
    _one_seed_at_cpu(monkeypatch)
    lone = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(32, 1))
    plain = TrainConfig(epochs=1, batch_size=8, lr=1e-3, amp=False)
    monkeypatch.setattr(
        b.steps,
        "_experiment_models",
        lambda cfg: {
            "MLP": (lambda: model, torch.randn(8, 32), config),
            "CNN (stacked MNIST)": (lambda: lone, torch.randn(8, 32), plain),
        },
    )
    _SeedWorker.launched = []
    cpu = dataclasses.replace(b.CONFIGS["smoke"], experiments="cpu", rounds=2)
    row, alone = b.bench_train_steps(cpu, torch.device("cpu"))["rows"]
    assert len(_SeedWorker.launched) == 2
    # threads, rounds, and the models the workers time
    assert all(w.code.endswith(", 2, 2, ['MLP'])") for w in _SeedWorker.launched)
    assert alone["model"] == "CNN (stacked MNIST)" and alone["workers"] == 1
    assert "worker_ms" not in alone and alone["speedup"] > 0
    assert all(w.gos == 2 and w.returncode == -9 for w in _SeedWorker.launched)
    # two workers at 16 ms a step each: 8 ms a step together
    assert row["workers"] == 2 and row["worker_ms"] == pytest.approx(16.0)
    assert row["as_run_ms"] == pytest.approx(8.0)
    assert row["speedup"] == pytest.approx(row["eager_ms"] / 8.0)
    assert row["speedup_workers_only"] == pytest.approx(row["eager_ms"] / 10.0)
    assert row["warmup_s"] == pytest.approx(1.0 - 2 * 0.016)
    # each worker's own step saves twice the time a step of the pair does (here the tiny
    # plain step is faster than the stand-in's 8 ms: the warm-up never pays)
    saved = 2 * (row["eager_ms"] - 8.0) / 1e3
    expected = math.ceil(row["warmup_s"] / saved) if saved > 0 else None
    assert row["break_even_steps"] == expected


def _one_seed_at_cpu(monkeypatch) -> None:
    """Stacked MNIST configured with one seed at ``cpu``."""
    from modnets.experiments import stacked_mnist

    one = dataclasses.replace(stacked_mnist.CONFIGS["cpu"], seeds=(0,))
    monkeypatch.setitem(stacked_mnist.CONFIGS, "cpu", one)


def test_an_experiment_with_fewer_claim_seeds_than_workers_trains_in_one_process(monkeypatch):
    # stacked MNIST with one seed at cpu; every experiment has two seeds at smoke
    _one_seed_at_cpu(monkeypatch)
    for profile, expected in (
        ("cpu", {"CNN (stacked MNIST)", "NFM (stacked MNIST)"}),
        ("smoke", set()),
    ):
        cfg = b.CONFIGS[profile]
        assert b.steps._trained_alone(cfg, 2, b.steps._experiment_models(cfg)) == expected


@pytest.mark.long
def test_the_seed_worker_child_times_each_model_once_per_go(monkeypatch, capsys):
    import io

    # the protocol, on two models (every model's two steps: the train_steps test at smoke)
    every = b.steps._experiment_models
    monkeypatch.setattr(
        b.steps, "_experiment_models", lambda cfg: dict(list(every(cfg).items())[:2])
    )
    threads = torch.get_num_threads()
    monkeypatch.setattr(b.steps.sys, "stdin", io.StringIO("go\n" * 2))
    try:
        b.steps._as_run_child("smoke", 0.01, 1, 1)
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(x[3:]) for x in capsys.readouterr().out.splitlines() if x[:3] == "@@ "]
    models = list(b.steps._experiment_models(b.CONFIGS["smoke"]))
    assert len(models) == 2
    assert [x["model"] for x in lines[::2]] == models  # ready, then one timing per go
    assert all(x["as_run_ms"] > 0 and x["plain_ms"] > 0 for x in lines[1::2])


def test_seed_workers_compares_one_process_with_one_single_threaded_process_per_core(monkeypatch):
    cores = 2
    monkeypatch.setattr(b.steps.os, "cpu_count", lambda: cores)
    launched = []

    class Child:  # a process whose steps take 10 ms at 2 threads and 16 ms at 1
        def __init__(self, args, **kwargs):
            self.threads = int(args[-1].rsplit(", ", 1)[1].rstrip(")"))
            launched.append(self.threads)
            self.returncode = 0

        def communicate(self):
            ms = 10.0 if self.threads == 2 else 16.0
            return json.dumps({"NI (digits)": ms}), None

    monkeypatch.setattr(b.steps.subprocess, "Popen", Child)
    cpu = dataclasses.replace(b.CONFIGS["smoke"], experiments="cpu")
    assert b.bench_seed_workers(b.CONFIGS["smoke"], torch.device("cpu"))["rows"] == []
    res = b.bench_seed_workers(cpu, torch.device("cpu"))
    assert launched == [2, 1, 1]  # one process of two threads, then two of one, at once
    (row,) = res["rows"]
    assert row["gain"] == pytest.approx(2 * 10 / 16) and res["met"] is True
    monkeypatch.setattr(b.steps.os, "cpu_count", lambda: 1)
    assert b.bench_seed_workers(cpu, torch.device("cpu"))["met"] is None
    monkeypatch.undo()  # real processes again (a ModAttn's timing runs in one)
    times = b.steps._workers_child("smoke", 0.01, 1)  # what each child runs, at smoke
    assert (
        set(times) == set(b.steps._experiment_models(b.CONFIGS["smoke"]))
        and min(times.values()) > 0
    )


def test_gemm_time_counts_the_matrix_products_and_nothing_else():
    from modnets.benchmarks import profiling as gemm

    a = torch.randn(64, 64)
    conv = torch.nn.Conv2d(1, 2, 3)
    _, per_op = gemm.gemm_time(lambda: (a @ a, torch.addmm(a, a, a)), steps=2)
    assert set(per_op) == {"mm", "addmm"} and all(t > 0 for t in per_op.values())
    total, per_op = gemm.gemm_time(lambda: a.sin().exp().sum(), steps=2)
    assert total == 0.0 and per_op == {}
    _, per_op = gemm.gemm_time(lambda: conv(torch.randn(1, 1, 8, 8)).sum().backward(), steps=2)
    assert set(per_op) == {"convolution", "convolution_backward"}


def test_operator_classes_put_a_step_s_time_where_its_operators_run():
    """A step of one large matrix product spends its time in the matrix-products class; one of
    element-wise operations in the element-wise class; names are classified in-place forms too
    (the check can fail: an unclassified operator lands in "other")."""
    from modnets.benchmarks.profiling import classify, operator_classes

    a, b_ = torch.randn(256, 256), torch.randn(256, 256)
    gemm = operator_classes(lambda: a @ b_)
    assert gemm["matrix products"] > 0.8 * sum(gemm.values())
    ew = operator_classes(lambda: (a * b_ + a).relu())
    assert ew["element-wise"] > 0.8 * sum(ew.values())
    assert classify("aten::mul_") == "element-wise" and classify("aten::bmm") == "matrix products"
    assert classify("aten::native_layer_norm") == "reductions and norms"
    assert classify("aten::some_new_op") == "other"


def test_every_benchmark_says_where_its_target_holds():
    assert set(b.HOLDS) == set(b.BENCHMARKS) - {"graph_prior"}
    assert set(b.HOLDS.values()) == {"anywhere", "the matmul rate", "this machine's ceiling"}


def test_the_recorded_runs_were_timed_on_the_code_as_it_is():
    """Chapter 12 reads its slowest rows from recorded runs: each row carries the fingerprint of
    the code it timed and the run its machine's capability and matrix-product rate; a row timed
    on other code fails here, naming the command that records it again."""
    from pathlib import Path

    recorded = Path(__file__).parents[1] / "bench" / "recorded"
    runs = {p: json.loads(p.read_text()) for p in sorted(recorded.glob("cpu*.json"))}
    assert runs
    for path, run in runs.items():
        assert run["capability"] and run["matmul_gflops"] > 0, path.name
    stale = [
        f"{name} in {path.name}: "
        + run.get(
            "command",
            f"python -m bench --profile cpu --only {' '.join(run['results'])} "
            f"--out bench/recorded/{path.name}",
        )
        for path, run in runs.items()
        for name, res in run["results"].items()
        if res.get("code_fingerprint") != b.benchmark_fingerprint(name)
    ]
    assert not stale, "recorded on other code; record again:\n" + "\n".join(stale)


def test_the_timings_keep_freed_memory_where_glibc_allows(monkeypatch):
    """The suite sets glibc's trim and mmap thresholds (where it is glibc), and the processes it
    starts read them from the environment; glibc refuses a value out of its range, which would
    read False here."""
    import os
    import platform

    from modnets.benchmarks.core import _MALLOPT, keep_freed_memory

    for _, variable in _MALLOPT.values():  # absent, and as they were after the test
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    glibc = platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is glibc
    assert all((variable in os.environ) is glibc for _, variable in _MALLOPT.values())


def test_a_target_is_held_on_the_way_the_experiments_train():
    """Eager, then compiled where the experiments compile (not at smoke, not without a
    compiler); the target reads the last way's rows, the note every way's."""
    from dataclasses import replace

    from modnets.benchmarks.core import as_trained, held_on
    from modnets.training import compiler_available

    cfg = b.CONFIGS["cpu"]
    assert list(as_trained(b.CONFIGS["smoke"], "cpu")) == ["eager"]
    ways = as_trained(cfg, "cpu")
    assert list(ways) == ["eager", "compiled"][: 1 + compiler_available("cpu")]
    assert ways[list(ways)[-1]].compile is compiler_available("cpu")
    assert list(as_trained(replace(cfg, compile=True), "cpu")) == ["compiled"]
    rows = [
        {"step": "eager", "r": 2.0},
        {"step": "compiled", "r": 1.1},
        {"step": "compiled", "r": 1.2},
    ]
    worst, way, note = held_on(rows, "r")
    assert (worst, way) == (1.2, "compiled") and "eager 2.00x" in note


def test_a_slow_gemm_run_keeps_its_measured_paths_apart(tmp_path, monkeypatch):
    """A crossover measured with the matrix products capped is not the machine's: ``python -m
    bench --slow-gemm`` keeps ModAttn's choices in a file beside the machine's, not in it."""
    import importlib
    from pathlib import Path

    from modnets.nn import autotune

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # the repository's bench
    main = importlib.import_module("bench.__main__")
    monkeypatch.setenv("MODNETS_AUTOTUNE", str(tmp_path / "autotune.json"))
    apart = main.slow_gemm_choices()
    assert apart != autotune.cache_path() and apart.parent == autotune.cache_path().parent


def _bench_main(monkeypatch):
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # the repository's bench
    return importlib.import_module("bench.__main__")


def _run(gflops, **ratios):
    results = {
        name: {"ratio": r, "met": None if r is None else r <= 1.25, "target": "<= 1.25x"}
        | {"rows": [{"ratio": r}]}
        for name, r in ratios.items()
    }
    return {"threads": 2, "matmul_gflops": gflops, "results": results}


def test_runs_of_the_suite_decide_a_target_by_their_majority(monkeypatch):
    """A target met in two of three runs is met, one met in one of three is missed, and each
    benchmark shows its median run's rows with every run's ratio; runs of different benchmarks
    cannot be combined."""
    main = _bench_main(monkeypatch)
    runs = [
        _run(150.0, ni=1.20, modlin=1.40, memory=None),
        _run(170.0, ni=1.40, modlin=1.10, memory=None),
        _run(160.0, ni=1.10, modlin=1.30, memory=None),
    ]
    out = main.combine_runs(runs)
    assert out["runs"] == 3 and out["matmul_gflops"] == 160.0
    ni, modlin, memory = (out["results"][k] for k in ("ni", "modlin", "memory"))
    assert (ni["met"], ni["ratio"], ni["rows"]) == (True, 1.20, [{"ratio": 1.20}])
    assert ni["runs"] == [1.20, 1.40, 1.10] and ni["runs_met"] == [True, False, True]
    assert (modlin["met"], modlin["ratio"]) == (False, 1.30)
    assert memory["met"] is None
    with pytest.raises(ValueError, match="same benchmarks"):
        main.combine_runs([runs[0], _run(150.0, ni=1.0)])
    with pytest.raises(ValueError, match="at least one"):
        main.combine_runs([])


def test_each_run_of_the_suite_is_a_fresh_process_with_the_same_arguments(monkeypatch, tmp_path):
    """``--runs 3`` starts ``python -m bench`` three times with the other arguments as given
    (``--threads`` included, ``--runs`` and ``--out`` not), and writes one combined record naming
    the command that makes it again."""
    main = _bench_main(monkeypatch)
    started = []

    def fake(cmd, check, stdout):
        started.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.write_text(json.dumps(_run(100.0 + len(started), ni=1.0 + 0.1 * len(started))))

    monkeypatch.setattr(main.subprocess, "run", fake)
    record = tmp_path / "targets.json"
    argv = ["--profile", "smoke", "--only", "ni_memory", "--runs", "3", "--threads", "1"]
    main.main([*argv, "--out", str(record)])
    assert len(started) == 3
    for cmd in started:
        assert cmd[1:3] == ["-m", "bench"] and "--runs" not in cmd
        assert cmd[3:9] == ["--profile", "smoke", "--only", "ni_memory", "--threads", "1"]
    saved = json.loads(record.read_text())
    assert saved["runs"] == 3 and saved["results"]["ni"]["ratio"] == pytest.approx(1.2)
    assert saved["command"] == " ".join(["python -m bench", *argv, "--out", str(record)])
    with pytest.raises(SystemExit):
        main.main(["--runs", "0"])
