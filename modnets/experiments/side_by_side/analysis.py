"""What is measured of each trained model besides accuracy: accuracy with modules dropped, and
the cost of a training step and of inference beside the CNN's, in one run."""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
from torch import nn

from modnets.experiments.side_by_side.config import SideBySideConfig
from modnets.experiments.side_by_side.models import dropped, loss, mean_exact
from modnets.models.nac import NeuralAttentiveCircuit


def drop_scores(model: nn.Module, iid: dict, config: SideBySideConfig, seed: int) -> dict:
    """``{fraction: exact-match on the trained counts}`` with each of ``drop_fractions`` of the
    modules dropped, the mean over ``drop_draws`` draws (one for the NAC's ranked order)."""
    out = {}
    for f in config.drop_fractions:
        draws = 1 if isinstance(model, NeuralAttentiveCircuit) else config.drop_draws
        scores = [
            mean_exact(dropped(model, f, 1000 * seed + k), iid, config.eval_batch)
            for k in range(draws)
        ]
        out[f] = float(np.mean(scores))
    return out


def costs(models: dict[str, nn.Module], config: SideBySideConfig) -> dict:
    """Per model: ``step_ms`` (one AdamW step of a ``speed_batch`` batch), ``infer_per_s``
    (images per second in evaluation), ``gflops`` (forward, per image, counted), each model
    timed in turn (``speed_calls`` calls) for ``speed_rounds`` rounds and the best round kept,
    so that a burst of load slows every model alike; ``step_vs_cnn`` and ``infer_vs_cnn``: the
    ratios to the first model's."""
    from torch.utils.flop_counter import FlopCounterMode

    b, s = config.speed_batch, config.train.canvas
    x = torch.randn(b, 1, s, s)
    y = (torch.rand(b, 10) < 0.2).float()
    calls = {}
    for name, model in models.items():
        net = copy.deepcopy(model).cpu().train()  # the trained model is left as it is
        opt = torch.optim.AdamW(net.parameters(), 1e-4)

        def step(net=net, opt=opt):
            opt.zero_grad(set_to_none=True)
            loss(net, x, y).backward()
            opt.step()

        @torch.no_grad()
        def infer(net=net):
            net.eval()
            net(x)
            net.train()

        calls[name] = (step, infer, net)
    for step, infer, _ in calls.values():  # warm-up
        step(), infer()
    best = {name: [np.inf, np.inf] for name in models}
    for _ in range(config.speed_rounds):
        for name, (step, infer, _) in calls.items():
            best[name][0] = min(best[name][0], _mean_time(step, config.speed_calls))
            best[name][1] = min(best[name][1], _mean_time(infer, config.speed_calls))
    out = {}
    for name, (_, _, net) in calls.items():
        with FlopCounterMode(display=False) as counter:  # outside no_grad: its hooks need it
            net.eval()
            net(x)
            net.train()
        out[name] = {
            "step_ms": 1e3 * best[name][0],
            "infer_per_s": b / best[name][1],
            "gflops": counter.get_total_flops() / b / 1e9,
            "parameters": sum(p.numel() for p in net.parameters()),
        }
    first = next(iter(out.values()))
    for row in out.values():
        row["step_vs_cnn"] = row["step_ms"] / first["step_ms"]
        row["infer_vs_cnn"] = row["infer_per_s"] / first["infer_per_s"]
    return out


def _mean_time(fn, calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls in a row."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls
