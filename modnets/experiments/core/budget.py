"""What an experiment's training costs on a GPU, known before a reader spends Colab time on it.

For every model of a profile's configuration (by default ``gpu``, the papers' settings), built on
the CPU from the experiment's own :func:`dry_run`:

* **parameters**, their gradients and the optimiser's state (Adam and AdamW: two moments), and
  the half-precision copies of the weights autocast makes;
* **activation memory**: every tensor autograd keeps for the backward pass, counted once per
  storage with :func:`torch.autograd.graph.saved_tensors_hooks` while the real training loss runs
  on the dry run's small batch, then scaled to the configured batch (measured in float32: an
  upper bound, since autocast keeps many of them in 16 bits); where the dry run also gives the
  loss on fewer examples (``DryRun.loss_on``), the part that does not grow with the batch (a
  NAC's circuit) is told apart from two batch sizes and not scaled;
* **FLOPs per step**, forward and backward, counted with :class:`torch.utils.flop_counter.FlopCounterMode`
  and scaled the same way;
* on each GPU of :data:`GPUS`: whether the step fits (with :data:`HEADROOM` of the memory), the
  gradient accumulation it needs otherwise (micro-batches of ``batch / a``), and the projected
  hours of one full training at :data:`UTILISATION` of the GPU's peak half-precision throughput
  and at least :data:`MIN_STEP_SECONDS` a step: assumptions, to be replaced by measured numbers
  once a GPU has run the profile (``book/engineering.md``).

``python -m modnets.experiments.core.budget`` prints the table for every experiment (``--markdown``
for ``book/engineering.md``).
"""

from __future__ import annotations

import argparse
import json
import warnings
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from modnets.experiments.core import fingerprints, harness
from modnets.experiments.core.discovery import get, list_experiments
from modnets.timing import saved_bytes

__all__ = [
    "GPU",
    "GPUS",
    "UTILISATION",
    "MIN_STEP_SECONDS",
    "HEADROOM",
    "Estimate",
    "estimate",
    "table",
    "main",
]


@dataclass(frozen=True)
class GPU:
    """A GPU as the estimate sees it: memory, and peak dense half-precision tensor throughput
    (bf16 where ``bf16``, else fp16) from its data sheet."""

    name: str
    memory_gib: float
    tflops: float
    bf16: bool


#: Colab's default GPU and the two common datacentre ones (data-sheet peak dense fp16/bf16).
GPUS = (
    GPU("Colab T4 (15 GB)", 15.0, 65.0, bf16=False),
    GPU("A100 40 GB", 40.0, 312.0, bf16=True),
    GPU("H100 80 GB", 80.0, 989.0, bf16=True),
)
#: The share of peak throughput assumed for the projected times (small models reach less).
UTILISATION = 0.3
#: The share of a GPU's memory a training step may plan for (the rest: CUDA context, allocator).
HEADROOM = 0.9
#: The least time a training step is assumed to take on any GPU: a small model's step is bound
#: by launching its hundreds of kernels, not by arithmetic (an assumption, like UTILISATION).
MIN_STEP_SECONDS = 0.01
#: Hours of a Colab session, at most (free tier; often less).
COLAB_HOURS = 12.0


@dataclass(frozen=True)
class Estimate:
    """One model's training step at its configured batch (bytes, FLOPs) and full-run length."""

    experiment: str
    model: str
    parameters: int
    batch_size: int
    steps: int
    activation_bytes: float  # the part that grows with the batch, at batch_size
    flops_per_step: float  # forward and backward, at batch_size
    fixed_activation_bytes: float = 0.0  # the part that does not (a NAC's circuit)

    @property
    def static_bytes(self) -> float:
        """Weights, gradients, two Adam moments (float32 each) and a 16-bit weight copy."""
        return self.parameters * (4 + 4 + 8 + 2)

    def peak_bytes(self, accumulate: int = 1) -> float:
        """Memory of one step with micro-batches of ``batch_size / accumulate``."""
        return self.static_bytes + self.fixed_activation_bytes + self.activation_bytes / accumulate

    def accumulation(self, gpu: GPU) -> int | None:
        """The smallest divisor ``a`` of the batch whose micro-batches (``batch / a``) fit
        ``gpu``; None if even one example at a time does not."""
        budget = HEADROOM * gpu.memory_gib * 2**30
        for a in _divisors(self.batch_size):
            if self.peak_bytes(a) <= budget:
                return a
        return None

    def hours(self, gpu: GPU) -> float:
        """Projected hours of one full training (``steps`` steps) at :data:`UTILISATION`, each
        step taking at least :data:`MIN_STEP_SECONDS`."""
        step = max(self.flops_per_step / (UTILISATION * gpu.tflops * 1e12), MIN_STEP_SECONDS)
        return self.steps * step / 3600


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else [1]


def _measure(part: harness.DryRun, n: int | None = None) -> tuple[float, float]:
    """Bytes autograd keeps for backward (:func:`modnets.timing.saved_bytes`; the parameters
    are not activations), and FLOPs of forward + backward, on the dry run's batch
    (``part.samples`` examples; its first ``n`` with ``n``)."""
    model = part.model.train()
    with FlopCounterMode(display=False) as counter:
        saved = saved_bytes(
            lambda: part.seeded_loss(model, n).backward(), exclude=model.parameters()
        )
    model.zero_grad(set_to_none=True)
    return float(saved), float(counter.get_total_flops())


#: Estimates already measured in this process, by experiment and configuration: the dry runs
#: are deterministic, and a configuration's models are built and measured once.
_ESTIMATES: dict[str, tuple[Estimate, ...]] = {}


def estimate(experiment: str, profile: str = "gpu", config=None) -> list[Estimate]:
    """:class:`Estimate` of every model of ``experiment``'s ``profile`` configuration (or of
    ``config``, a configuration of that experiment)."""
    declared = get(experiment)
    config = declared.configs[profile] if config is None else config
    key = f"{experiment}:{json.dumps(fingerprints.plain(config), sort_keys=True)}"
    if key not in _ESTIMATES:
        _ESTIMATES[key] = tuple(_estimates(experiment, declared.dry_run, config))
    return list(_ESTIMATES[key])


def _estimates(experiment: str, dry_run, config) -> list[Estimate]:
    out = []
    with torch.random.fork_rng(devices=[]):  # the same weights and inputs on every estimate
        torch.manual_seed(0)
        parts = dry_run(config)
    for part in parts:
        if part.batch_size <= 0 or part.samples <= 0:
            raise ValueError(f"{experiment}.dry_run gives no batch size for {part.name!r}")
        if part.loss_on is not None and part.samples < 2:
            raise ValueError(f"{experiment} {part.name!r}: loss_on needs samples >= 2")
        act, flops = _measure(part)
        fixed_act = fixed_flops = 0.0
        if part.loss_on is not None:  # cost = fixed + n x per example, from n and n / 2 examples
            half = part.samples // 2
            act_half, flops_half = _measure(part, half)
            per_act = (act - act_half) / (part.samples - half)
            per_flops = (flops - flops_half) / (part.samples - half)
            fixed_act, fixed_flops = act - part.samples * per_act, flops - part.samples * per_flops
            act, flops = act - fixed_act, flops - fixed_flops
        scale = part.batch_size / part.samples
        out.append(
            Estimate(
                experiment=experiment,
                model=part.name,
                parameters=sum(p.numel() for p in part.model.parameters()),
                batch_size=part.batch_size,
                steps=part.steps,
                activation_bytes=act * scale,
                flops_per_step=flops * scale + fixed_flops,
                fixed_activation_bytes=fixed_act,
            )
        )
    return out


def plan(experiment: str, config, memory_bytes: float) -> dict[str, int]:
    """The gradient accumulation each model of ``config`` needs on a GPU of ``memory_bytes``
    (model name -> 1 where it fits), said before any training: a warning names each model that
    needs accumulation, and a :class:`MemoryError` one that does not fit even one example at a
    time."""
    gpu = GPU("this GPU", memory_bytes / 2**30, 1.0, bf16=True)
    out = {}
    for e in estimate(experiment, config=config):
        a = e.accumulation(gpu)
        if a is None:
            raise MemoryError(
                f"{experiment} {e.model}: its weights and optimiser state alone "
                f"({_gib(e.static_bytes)} GiB) do not fit this GPU's {gpu.memory_gib:.1f} GiB"
            )
        if a > 1:
            warnings.warn(
                f"{experiment} {e.model}: a step at batch {e.batch_size} needs about "
                f"{_gib(e.peak_bytes())} GiB, more than this GPU's {gpu.memory_gib:.1f} GiB "
                f"allow; training accumulates gradients over {a} micro-batches of "
                f"{e.batch_size // a} (the same steps, more time)",
                stacklevel=2,
            )
        out[e.model] = a
    return out


def gpu_memory(device) -> float | None:
    """Total memory of the CUDA ``device`` in bytes, None for any other device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return float(torch.cuda.get_device_properties(device).total_memory)


def _gib(b: float) -> str:
    return f"{b / 2**30:.1f}" if b >= 2**30 / 10 else f"{b / 2**30:.2f}"


def _hours(h: float) -> str:
    return f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def table(estimates: list[Estimate], markdown: bool = False) -> str:
    """One row per model: parameters, peak memory at the configured batch, GFLOPs per step, and
    per GPU the accumulation it needs (``fits``, ``xN`` or ``no``) and the projected time of one
    full training (flagged where it exceeds a Colab session)."""
    head = ["experiment", "model", "parameters", "batch", "peak GiB", "GFLOP/step"]
    for gpu in GPUS:
        head.append(f"{gpu.name}: fits / one run")
    rows = []
    for e in estimates:
        row = [
            e.experiment,
            e.model,
            f"{e.parameters:,}",
            str(e.batch_size),
            _gib(e.peak_bytes()),
            f"{e.flops_per_step / 1e9:,.1f}",
        ]
        for gpu in GPUS:
            a = e.accumulation(gpu)
            fit = "no" if a is None else ("fits" if a == 1 else f"x{a} accumulation")
            h = e.hours(gpu)
            late = (
                " (> a Colab session)" if gpu.name.startswith("Colab") and h > COLAB_HOURS else ""
            )
            row.append(f"{fit} / {_hours(h) + late if e.steps else '-'}")
        rows.append(row)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r) for r in [head, *rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="gpu")
    parser.add_argument("--markdown", action="store_true", help="a table for book/engineering.md")
    parser.add_argument("experiments", nargs="*", help="default: every experiment")
    args = parser.parse_args(argv)
    args.experiments = args.experiments or list_experiments()
    estimates = [e for name in args.experiments for e in estimate(name, args.profile)]
    print(table(estimates, markdown=args.markdown))
    if not args.markdown:
        print(
            f"\n(one full training of one model at one seed, at {UTILISATION:.0%} of each GPU's "
            "peak half-precision throughput; activations measured in float32)"
        )


if __name__ == "__main__":
    main()
