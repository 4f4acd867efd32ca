"""The training loop every experiment uses: :func:`fit`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from modnets.training.checkpoints import ResumableLoop, check_writable
from modnets.training.optim import TrainConfig, optimizer_for, warmup_cosine
from modnets.training.runtime import amp_dtype, autocast, maybe_compile


class _Best:
    """The best epoch so far (metric and weights), checkpointed with the training state so that a
    resumed run still restores the best epoch's weights at the end."""

    def __init__(self):
        self.value, self.epoch, self.weights = -math.inf, 0, None

    def update(self, value: float, epoch: int, model: nn.Module) -> None:
        if value > self.value:
            self.value, self.epoch = value, epoch
            self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def state_dict(self) -> dict:
        return {"value": self.value, "epoch": self.epoch, "weights": self.weights}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.epoch, self.weights = state["value"], state["epoch"], state["weights"]


class _LogBuffer:
    """The logged values summed since the last point of the curve (saved with the training state,
    so that a resumed run logs the same curve as an uninterrupted one)."""

    def __init__(self):
        self.sums: dict[str, Tensor] = {}
        self.count = 0
        self.losses: list[Tensor] = []  # each step's loss since the point before, to name a bad one

    def add(self, logs: dict[str, Tensor]) -> None:
        for k, v in logs.items():  # summed on the device: no sync per step
            v = v.detach().float()
            self.sums[k] = self.sums[k] + v if k in self.sums else v
        self.losses.append(logs["loss"].detach().float())
        self.count += 1

    def reset(self) -> None:
        self.sums, self.count, self.losses = {}, 0, self.losses[-1:]

    def non_finite(self, step: int) -> str:
        """Which of the steps up to ``step`` (the last added) first had a non-finite loss, and
        the last finite loss before it."""
        losses = torch.stack(self.losses).tolist()
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        if bad is None:  # another process's loss (distributed training)
            return f"the loss became non-finite on another process by step {step}"
        at = step - (len(losses) - 1 - bad)
        before = (
            f"last finite loss: {losses[bad - 1]:.6g} at step {at - 1}"
            if bad
            else "no finite loss seen"
        )
        return f"the loss became {losses[bad]} at step {at} ({before})"

    def state_dict(self) -> dict:
        return {"sums": {k: v.cpu() for k, v in self.sums.items()}, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.sums, self.count = dict(state["sums"]), state["count"]


def _as_logs(out) -> dict[str, Tensor]:
    if isinstance(out, Tensor):
        return {"loss": out}
    if isinstance(out, dict) and isinstance(out.get("loss"), Tensor):
        return out
    raise TypeError(
        "a training step must return the loss tensor or a dict of scalar tensors with a 'loss' "
        f"entry (the one minimised), got {type(out).__name__}"
    )


def fit(
    model: nn.Module,
    step: Callable,
    config: TrainConfig,
    *,
    n: int | None = None,
    batches: Callable[[int], Sequence] | None = None,
    evaluate: Callable[[nn.Module], dict] | None = None,
    param_groups: list[dict] | None = None,
    desc: str = "training",
    show_progress: bool = True,
    state_path: str | os.PathLike | None = None,
    resume: bool = False,
    seed: int = 0,
    state_config: dict | None = None,
    find_unused_parameters: bool = False,
) -> dict:
    """The one training loop of every experiment; returns the history.

    ``step(net, batch)`` is the experiment's own part: it computes the loss of one minibatch with
    ``net`` (the model, wrapped for DDP and compiled when asked) and returns it, or a dict of
    scalar tensors whose ``"loss"`` is minimised and all of which are logged. A batch is this
    rank's share of ``batch_size`` shuffled indices into ``n`` training samples, or, with
    ``batches(epoch)`` (a list of whatever the step takes), one item of that list, taken in a
    shuffled order (the step then shards it with :func:`modnets.distributed.shard`).

    Around the step, :func:`fit` owns: the optimiser (``param_groups`` or the trainable
    parameters; ``config.fused``: its fused kernel), the warm-up + cosine schedule, autocast,
    channels-last convolution weights while it trains (``config.channels_last``),
    ``torch.compile`` (``config.compile``, :func:`maybe_compile`), DistributedDataParallel
    under ``torchrun``, gradient clipping, the progress bar, :class:`ResumableLoop` (checkpoints at ``state_path``; ``resume`` continues),
    ``evaluate(model) -> {metric: value}`` after each epoch (kept as ``history["val_<metric>"]``)
    and the best-epoch restore. Logged values are the mean over the steps since the previous log
    point, averaged across processes.
    """
    from modnets import distributed
    from modnets.utils import progress

    _check_fit(config, n, batches, evaluate)
    if state_path is not None and distributed.is_main():
        check_writable(state_path)
    device = next(model.parameters()).device
    if config.channels_last:  # the parameters stay the same objects: only their strides change
        model.to(memory_format=torch.channels_last)
    if param_groups is None:
        param_groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    opt = optimizer_for(param_groups, config)
    per_epoch = len(batches(0)) if batches is not None else n // config.batch_size
    if per_epoch <= 0:
        raise ValueError(f"no full batch of {config.batch_size} in {n} training samples")
    total = config.epochs * per_epoch
    sched = _schedule(opt, config, total)
    params = [p for g in opt.param_groups for p in g["params"]]
    history: dict = {"step": [], "loss": [], "epoch": [], "seconds": 0.0}
    best = _Best()
    logged = _LogBuffer()
    objects = {"model": model, "optimizer": opt, "scheduler": sched, "best": best, "logged": logged}
    # float16 autocast (a GPU without bf16) needs loss scaling; its scale is training state too
    scaler = None
    if config.amp and amp_dtype(device) == torch.float16:
        scaler = objects["scaler"] = torch.amp.GradScaler(device.type)
    net = distributed.wrap_ddp(model, find_unused_parameters=find_unused_parameters)
    net = maybe_compile(net, config.compile)
    log_every = max(1, total // config.log_points)
    start = time.perf_counter()
    # the state remembers what shapes the weights: the settings, the model and the length of the
    # run (a resume under others is refused)
    keyed = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if f.metadata.get("key", True)
    }
    state_config = {
        "fit": keyed,
        "model": _model_signature(model),
        "steps": {"per_epoch": per_epoch, "total": total},
        **({} if state_config is None else {"run": state_config}),
    }
    with ResumableLoop(
        state_path,
        objects,
        history,
        state_config,
        seed,
        config.save_every,
        resume,
        enabled=distributed.is_main(),
    ) as loop:
        spent = history["seconds"]  # a resumed run adds to the time already spent
        show = show_progress and distributed.is_main()
        bar = progress(total=total, initial=loop.step, desc=desc, disable=not show)
        for epoch in loop.epochs(config.epochs):
            model.train()
            items = batches(epoch) if batches is not None else None
            source = (
                loop.minibatches(len(items), 1)
                if items is not None
                else loop.minibatches(n, config.batch_size)
            )
            for idx in source:
                batch = items[idx.item()] if items is not None else distributed.shard(idx)
                _check_batch(batch, epoch)
                opt.zero_grad(set_to_none=True)
                logged.add(_backward(step, net, batch, config, device, scaler))
                _optimiser_step(opt, sched, params, config, scaler)
                done = loop.step + 1
                if done % log_every == 0 or done == total:
                    _log(history, logged, done)
                history["seconds"] = spent + time.perf_counter() - start
                loop.step_done()
                bar.update(1)
            history["epoch"].append(epoch + 1)
            if evaluate is not None:
                _evaluate(model, evaluate, config, history, best, epoch, bar)
            history["seconds"] = spent + time.perf_counter() - start
            loop.epoch_done()
        bar.close()
    if config.best is not None and best.weights is not None:
        model.load_state_dict(best.weights)
    if config.channels_last:  # the default layout again: a model computes as its checkpoint does
        model.to(memory_format=torch.contiguous_format)
    return history


def _model_signature(model: nn.Module) -> dict:
    """What a resumed state must be loaded into: the model's class, its configuration (a
    dataclass ``config``, where it has one) and its parameters' shapes."""
    config = getattr(model, "config", None)
    out = {"class": type(model).__qualname__}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        out["config"] = json.loads(json.dumps(dataclasses.asdict(config), default=repr))
    out["parameters"] = {k: list(p.shape) for k, p in model.named_parameters()}
    return out


def _check_fit(config: TrainConfig, n, batches, evaluate) -> None:
    """The arguments of :func:`fit` that cannot go together, refused before any work."""
    if (n is None) == (batches is None):
        raise ValueError("give exactly one of n (number of training samples) and batches")
    if config.best is not None and evaluate is None:
        raise ValueError(f"TrainConfig.best={config.best!r} needs an evaluate function")
    if config.accumulate > 1 and batches is not None:
        raise ValueError("TrainConfig.accumulate > 1 needs index batches (n), not batches()")


def _check_batch(batch, epoch: int) -> None:
    """An empty batch (or an empty tensor in one) would give a NaN loss that reads as a too high
    learning rate: named here instead."""
    parts = batch if isinstance(batch, list | tuple) else [batch]
    if any(isinstance(t, Tensor) and t.dim() > 0 and len(t) == 0 for t in parts):
        raise ValueError(
            f"an empty batch in epoch {epoch + 1}: batches() gave one with no samples, or "
            "batch_size is smaller than the number of processes"
        )


def _schedule(opt: torch.optim.Optimizer, config: TrainConfig, total: int):
    """The learning-rate schedule over ``total`` steps: warm-up + cosine, or constant."""
    if config.schedule != "cosine":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    floor = config.min_lr / config.lr
    return warmup_cosine(opt, total, int(config.warmup_fraction * total), floor)


def _backward(step: Callable, net, batch, config: TrainConfig, device, scaler) -> dict:
    """The gradients of one batch, or of its micro-batches (gradient accumulation): each loss
    weighted by its share of the batch, so that the summed gradient is the whole batch's.
    Returns the batch's logged values (detached)."""
    parts = [batch] if config.accumulate == 1 else list(batch.chunk(config.accumulate))
    logs = {}
    for part in parts:
        with autocast(device) if config.amp else contextlib.nullcontext():
            part_logs = _as_logs(step(net, part))
        weight = len(part) / len(batch) if len(parts) > 1 else 1.0
        loss = part_logs["loss"] * weight
        (loss if scaler is None else scaler.scale(loss)).backward()
        for k, v in part_logs.items():
            v = v.detach() * weight
            logs[k] = logs[k] + v if k in logs else v
    return logs


def _optimiser_step(opt, sched, params: list, config: TrainConfig, scaler) -> None:
    """Clip (where asked), step the optimiser and the schedule; under float16 the backward was
    scaled: clip the true gradient, and skip a step with infinite gradients."""
    if scaler is not None:
        scaler.unscale_(opt)
    if config.clip_grad_norm is not None:
        nn.utils.clip_grad_norm_(params, config.clip_grad_norm)
    if scaler is None:
        opt.step()
        sched.step()
        return
    scaler.step(opt)
    scaler.update()
    with warnings.catch_warnings():  # a step the scaler skipped still counts for the schedule
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step")
        sched.step()


def _log(history: dict, logged: _LogBuffer, done: int) -> None:
    """Append the means since the last log point (averaged across processes) to ``history``;
    stop before a broken step is saved."""
    from modnets import distributed

    means = {
        k: distributed.all_reduce_sum(v.item() / logged.count) / distributed.world_size()
        for k, v in logged.sums.items()
    }
    if not math.isfinite(means["loss"]):
        raise FloatingPointError(
            f"{logged.non_finite(done)}; lower TrainConfig.lr or set clip_grad_norm"
        )
    history["step"].append(done)
    for k, mean in means.items():
        history.setdefault(k, []).append(mean)
    logged.reset()


def _evaluate(model, evaluate: Callable, config: TrainConfig, history, best, epoch, bar) -> None:
    """``evaluate(model)`` after an epoch: kept as ``history["val_<metric>"]``, the best epoch
    remembered (``config.best``), shown on the progress bar."""
    metrics = evaluate(model)
    for k, v in metrics.items():
        history.setdefault(f"val_{k}", []).append(v)
    if config.best is not None:
        if config.best not in metrics:
            raise ValueError(
                f"TrainConfig.best={config.best!r} must be a key of what evaluate returns, got "
                f"{sorted(metrics)}"
            )
        best.update(float(metrics[config.best]), epoch + 1, model)
        history["best_epoch"] = best.epoch
    shown = {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)}
    bar.set_postfix(shown, refresh=False)
