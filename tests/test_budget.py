"""The GPU budget of each configuration: what is counted, how it scales to the
configured batch, when a step needs gradient accumulation, and the table in book/engineering.md."""

import dataclasses
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from modnets.experiments import get, list_experiments
from modnets.experiments import tiny_imagenet as ti
from modnets.experiments.core import budget, harness

ROOT = Path(__file__).resolve().parents[1]


def _toy(samples: int) -> harness.DryRun:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 1))
    x = torch.randn(samples, 10)
    return harness.DryRun(
        "toy", model, lambda m: m(x).square().mean(), samples=samples, batch_size=64, steps=1000
    )


def test_activations_and_flops_are_counted_per_example_and_scale_with_the_batch():
    act4, flops4 = budget._measure(_toy(4))
    act8, flops8 = budget._measure(_toy(8))
    # forward 2 B (10*20 + 20*1); backward: both grads of layer 2, only the weight's of layer 1
    assert flops4 == 2 * 4 * (200 + 20) + 2 * 4 * (20 + 20) + 2 * 4 * 200
    assert flops8 == 2 * flops4
    # what backward keeps (input, pre-activation or mask, hidden, output) grows with the batch;
    # the parameters are not activations
    assert act8 == pytest.approx(2 * act4, rel=0.05) and 0 < act4 < 4 * 4 * (10 + 20 + 20 + 1) * 2


class _Fixed(nn.Module):
    """A per-example linear layer plus a step cost that does not grow with the batch (as a NAC's
    circuit: a product of a module-by-module matrix)."""

    def __init__(self):
        super().__init__()
        self.layer, self.sig = nn.Linear(10, 20), nn.Parameter(torch.randn(64, 32))

    def forward(self, x):
        circuit = torch.tanh(self.sig @ self.sig.T).mean()
        return self.layer(x).relu().mean(-1) * circuit


def test_a_step_cost_that_does_not_grow_with_the_batch_is_not_scaled():
    torch.manual_seed(0)
    model, x = _Fixed(), torch.randn(64, 10)

    def loss_on(m, n):
        return m(x[:n]).square().mean()

    def part(samples, **kw):
        return harness.DryRun("m", model, lambda m: loss_on(m, samples), samples, 64, 1, **kw)

    exact_act, exact_flops = budget._measure(part(64))  # the whole batch, measured
    (fitted,) = budget._estimates("x", lambda c: [part(4, loss_on=loss_on)], None)
    (scaled,) = budget._estimates("x", lambda c: [part(4)], None)
    assert fitted.peak_bytes() - fitted.static_bytes == pytest.approx(exact_act, rel=1e-6)
    assert fitted.flops_per_step == pytest.approx(exact_flops, rel=1e-6)
    assert fitted.fixed_activation_bytes > 0 and fitted.activation_bytes > 0
    # scaled alone, the fixed part would count 16 times at batch 64
    assert scaled.peak_bytes() > fitted.peak_bytes() and scaled.flops_per_step > exact_flops


def test_accumulation_is_the_smallest_divisor_of_the_batch_that_fits():
    t4, a100 = budget.GPUS[0], budget.GPUS[1]
    gib = 2**30
    e = budget.Estimate(
        "x",
        "m",
        parameters=10_000_000,
        batch_size=64,
        steps=10_000,
        activation_bytes=100 * gib,
        flops_per_step=1e12,
    )
    assert e.static_bytes == 10_000_000 * 18
    assert e.accumulation(t4) == 8  # 100 / 8 = 12.5 GiB + 0.17 fits 13.5; 100 / 4 does not
    assert e.accumulation(a100) == 4  # 25 GiB + 0.17 fits 36
    too_big = budget.Estimate("x", "m", 10**9, 64, 1, 1.0, 1.0)  # 18 GB of weights and state
    assert too_big.accumulation(t4) is None and too_big.accumulation(a100) == 1
    # hours: 10,000 steps of 1 TFLOP at 30 % of 65 TFLOP/s
    assert e.hours(t4) == pytest.approx(10_000 * 1e12 / (0.3 * 65e12) / 3600)
    tiny = budget.Estimate("x", "m", 10, 8, 3600, 1.0, 1.0)  # launch-bound: the step floor
    assert tiny.hours(t4) == pytest.approx(3600 * budget.MIN_STEP_SECONDS / 3600)
    assert "x8 accumulation" in budget.table([e]) and "| x | m |" in budget.table([e], True)


def test_the_engineering_notes_show_every_gpu_model_with_its_parameters():
    text = (ROOT / "book" / "engineering.md").read_text()
    rows = {
        (m[0], m[1]): m[2]
        for m in re.findall(r"^\| (\w+) \| ([^|]+?) \| ([\d,]+) \|", text, flags=re.M)
    }
    for name in list_experiments():
        experiment = get(name)
        for part in experiment.dry_run(experiment.configs["gpu"]):
            count = sum(p.numel() for p in part.model.parameters())
            assert rows.get((name, part.name)) == f"{count:,}", (name, part.name)
            assert part.batch_size > 0 and part.steps > 0


@pytest.mark.long
def test_a_gpu_too_small_for_the_batch_gets_accumulation_before_training():
    """Tiny-ImageNet at the papers' batch (1024) does not fit a T4: the run says so before
    training and accumulates instead; a big enough GPU, or a CPU, leaves the config alone."""
    config = dataclasses.replace(ti.CONFIGS["gpu"], priors=("scale_free",))
    with pytest.warns(UserWarning) as said:
        small = ti.fit_to_gpu(config, "cuda", memory_bytes=15 * 2**30)
    said = sorted(str(w.message) for w in said)
    assert len(said) == 2 and "NAC (scale_free)" in said[0] and "Perceiver IO" in said[1]
    assert "16 micro-batches of 64" in said[0] and "8 micro-batches of 128" in said[1]
    assert small.train.pio_train.accumulate == 8 and small.train.nac_train.accumulate == 16
    assert small.train.nac_train.batch_size == 1024  # the same steps
    # the same checkpoints: accumulation is not part of what the key hashes
    assert harness.checkpoint_key("m", small.train, 0, "d", "c") == harness.checkpoint_key(
        "m", config.train, 0, "d", "c"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ti.fit_to_gpu(config, "cuda", memory_bytes=2**40) == config
        assert ti.fit_to_gpu(config, "cpu") == config
    with pytest.raises(MemoryError, match="do not fit"):
        ti.fit_to_gpu(config, "cuda", memory_bytes=2**28)
