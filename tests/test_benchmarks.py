"""The benchmark suite measures what it says: per-call times, the experiments' shapes, and a
transformer that does the NI's attention and MLP work. (No speed is asserted here: speed is
measured in ``bench/``, as ratios in one run.)"""

import time

import torch

from modnets import benchmarks as b
from modnets.ni import NeuralInterpreter
from modnets.nn import ModAttn


def test_median_time_is_per_call():
    # blocked_autorange times blocks of many calls; the result must be one call's time
    t = b.median_time(lambda: time.sleep(0.002), repeats=3, warmup=1, min_run_time=0.05)
    assert 0.0019 <= t < 0.02


def test_equivalent_transformer_does_the_ni_matmul_work():
    # same tokens, width, heads, MLP and iterations x LOCs layers: the NI adds only its
    # tokeniser, type inference and heads (12-17 % at cpu; more at smoke's tiny widths)
    cfg = b.BenchConfig(experiments="cpu")
    for c, batch, make_input in b._experiment_ni(cfg).values():
        ni = NeuralInterpreter(c)
        tf = b._PreLNTransformer(c, c.num_iterations * c.num_locs * c.num_scripts)
        streams = torch.randn(batch * c.num_functions, b._tokens(c), c.dim)
        x = make_input(batch, "cpu")
        ratio = b._count_flops(lambda: ni(x)) / b._count_flops(lambda: tf(streams))  # noqa: B023
        assert 1.0 <= ratio <= 1.25


def test_modulated_benchmark_covers_the_experiments_shapes():
    from modnets.experiments import digits

    shapes = {s[2] for s in b._modulated_shapes(b.CONFIGS["cpu"])}
    c = digits.CONFIGS["cpu"].train.ni_config()
    tokens = (c.image_size // c.patch_size) ** 2 + c.num_cls
    assert (
        digits.CONFIGS["cpu"].train.ni_train.batch_size,
        c.num_functions,
        tokens,
        c.dim,
    ) in shapes


def test_set_fused_reaches_every_modattn():
    ni = NeuralInterpreter(b._experiment_ni(b.BenchConfig(experiments="smoke"))["digits"][0])
    attns = [m for m in ni.modules() if isinstance(m, ModAttn)]
    assert attns and all(m.fused is None for m in attns)
    b.set_fused(ni, False)
    assert all(m.fused is False for m in attns)


def test_thread_policy_is_set_before_torch_loads():
    import os
    import subprocess
    import sys

    from modnets import threads

    code = "import modnets, os; print(os.environ['GOMP_SPINCOUNT'], modnets.threads.effective)"
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()  # fmt: skip
    assert out == [threads.GOMP_SPINCOUNT, "True"]
    # a value the user set is kept; torch imported first: the policy is not in effect
    code = (
        "import torch, modnets, os; print(os.environ['GOMP_SPINCOUNT'], modnets.threads.effective)"
    )
    out = subprocess.run([sys.executable, "-c", code], env={**env, "GOMP_SPINCOUNT": "7"},
                         capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert out == ["7", "False"]
