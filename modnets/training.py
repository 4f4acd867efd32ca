"""Small training utilities shared by the experiments (device-agnostic)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor, nn

from modnets.utils import atomic_file

__all__ = [
    "warmup_cosine",
    "minibatches",
    "amp_dtype",
    "autocast",
    "trainable_parameters",
    "r2_score",
    "save_checkpoint",
    "checkpoint_dir",
    "compiler_available",
    "maybe_compile",
    "weight_decay_groups",
    "ResumableLoop",
    "CheckpointError",
    "load_train_state",
    "TrainConfig",
    "optimizer_for",
    "fit",
]


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, floor: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the base learning rate, then cosine decay to ``floor`` times it."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    warmup_steps = min(max(0, warmup_steps), total_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def minibatches(
    n: int, batch_size: int, generator: torch.Generator, drop_last: bool = True
) -> Iterator[Tensor]:
    """Indices of one shuffled epoch over ``n`` samples, ``batch_size`` at a time."""
    perm = torch.randperm(n, generator=generator)
    end = n - n % batch_size if drop_last else n
    for start in range(0, end, batch_size):
        yield perm[start : start + batch_size]


def amp_dtype(device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype of mixed precision on ``device``: bfloat16 on a CUDA GPU with native
    bf16 (Ampere and later: A100, H100, L4), float16 on one without (Colab's default T4, V100),
    where :func:`fit` adds a gradient scaler; None elsewhere (a CPU trains in float32). Emulated
    bf16 does not count: on a T4 it runs at a fraction of fp16's speed."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return (
        torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    )


def autocast(device: torch.device | str):
    """Autocast to :func:`amp_dtype` on CUDA; a no-op context elsewhere."""
    device = torch.device(device)
    dtype = amp_dtype(device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def trainable_parameters(module: nn.Module) -> int:
    """Number of scalar parameters with ``requires_grad``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def r2_score(pred: Tensor, target: Tensor) -> Tensor:
    """Coefficient of determination per output column: ``1 - SS_res / SS_tot``.

    Shapes: ``(n, k)`` -> ``(k,)`` (or ``(n,)`` -> scalar). Matches
    ``sklearn.metrics.r2_score(target, pred, multioutput="raw_values")``.
    """
    if pred.shape != target.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} differ")
    pred, target = pred.double(), target.double()
    ss_res = ((target - pred) ** 2).sum(0)
    ss_tot = ((target - target.mean(0)) ** 2).sum(0)
    return 1 - ss_res / ss_tot


def save_checkpoint(obj: object, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file in the same folder, then rename: never half-written."""
    path = Path(path)
    with atomic_file(path) as tmp:
        torch.save(obj, tmp)
    return path


def checkpoint_dir() -> Path:
    """``$MODNETS_CHECKPOINTS``, else ``~/.cache/modnets/checkpoints`` (the data root may be read-only)."""
    env = os.environ.get("MODNETS_CHECKPOINTS", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "modnets" / "checkpoints"


def compiler_available(device: torch.device | str) -> bool:
    """Whether ``torch.compile``'s default backend (Inductor) can build kernels on ``device``: a
    C++ compiler for the CPU, Triton for CUDA."""
    if torch.device(device).type == "cuda":
        import importlib.util

        return importlib.util.find_spec("triton") is not None
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception:  # no g++/clang++ on the PATH
        return False
    return True


def maybe_compile(module: nn.Module, enabled: bool = False) -> nn.Module:
    """``torch.compile(module)`` when ``enabled`` and the device has a compiler, else the module
    itself (with a one-line notice when compiling was asked for). ``MODNETS_COMPILE=1`` / ``=0``
    overrides ``enabled`` everywhere. Compiled code is cached per architecture: a second model of
    the same configuration (the next seed) reuses it; changing which parameters train compiles
    again."""
    env = os.environ.get("MODNETS_COMPILE", "").strip().lower()
    if env in ("1", "true", "yes", "0", "false", "no"):
        enabled = env in ("1", "true", "yes")
    if not enabled:
        return module
    device = next(module.parameters()).device
    if not compiler_available(device):
        warnings.warn(
            f"torch.compile needs a compiler on {device.type}: training eagerly", stacklevel=2
        )
        return module
    return torch.compile(module)


class CheckpointError(ValueError):
    """A checkpoint file is truncated, corrupted, or was written by something else."""


CHECKPOINT_FORMAT = "modnets-train-state-v1"


def _rng_state() -> dict:
    import random

    import numpy as np

    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": np.random.get_state()}  # noqa: NPY002  # fmt: skip
    if torch.cuda.is_available():  # this rank's device only (rank 0 writes the checkpoint)
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002 (seed_everything seeds the legacy state)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"], device=torch.cuda.current_device())


def load_train_state(path: str | os.PathLike, map_location=None) -> dict:
    """Read a training checkpoint written by :class:`ResumableLoop`; a truncated or foreign file
    raises :class:`CheckpointError` naming the path."""
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:  # truncated zip, not a torch file, unpickling failure
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({type(err).__name__}: {err}); delete it to "
            "start afresh"
        ) from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} is not a modnets training checkpoint (expected format {CHECKPOINT_FORMAT!r}); "
            "delete it or point --resume elsewhere"
        )
    return state


def _differences(saved, now, where: str = "") -> list[str]:
    """``"name: saved -> now"`` for every leaf where two nested dicts differ."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out = []
        for k in dict.fromkeys([*saved, *now]):
            name = f"{where}.{k}" if where else str(k)
            out += _differences(saved.get(k, "(absent)"), now.get(k, "(absent)"), name)
        return out
    return [] if saved == now else [f"{where or 'config'}: {saved!r} -> {now!r}"]


class ResumableLoop:
    """Epochs of shuffled minibatches that can stop at any step and resume bit for bit.

    It owns the minibatch order (``torch.Generator`` seeded with ``seed``), and a checkpoint holds
    everything the rest of training depends on: the ``objects`` (model, optimiser, scheduler: any
    ``state_dict`` holders), the step, the generator state at the start of the current epoch, the
    global RNG states (augmentation, Concrete sampling), ``history`` and ``config``. Checkpoints are
    written atomically every ``save_every`` steps, at the end of the ``with`` block, and when
    training is interrupted (Ctrl-C saves, then lets ``KeyboardInterrupt`` through).

    Usage::

        with ResumableLoop(path, {"model": m, "opt": opt, "sched": sched}, history, config,
                           seed, resume=True) as loop:
            for epoch in loop.epochs(num_epochs):
                for idx in loop.minibatches(n, batch_size):
                    ...one optimisation step on idx...
                    loop.step_done()
                ...evaluate...
                loop.epoch_done()
    """

    def __init__(self, path: str | os.PathLike | None, objects: dict, history: dict,
                 config: dict | None = None, seed: int = 0, save_every: int = 0,
                 resume: bool = False, enabled: bool = True):  # fmt: skip
        self.path = None if path is None else Path(path)
        self.objects, self.history, self.config = objects, history, config
        self.seed, self.save_every, self.enabled = seed, save_every, enabled
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self._epoch_gen_state = None
        self.resumed = False
        if resume and self.path is not None and self.path.exists():
            self._load()
        elif self.path is not None and self.path.exists() and enabled:
            warnings.warn(
                f"{self.path} holds an interrupted training; starting again from step 0 "
                "(resume=True, or --resume, continues it instead)",
                stacklevel=3,
            )

    def _load(self) -> None:
        state = load_train_state(self.path, map_location="cpu")  # load_state_dict moves it
        saved = state.get("config")
        if self.config is not None and saved is not None and saved != self.config:
            changed = "; ".join(_differences(saved, self.config))
            raise CheckpointError(
                f"{self.path} was written under other settings ({changed}): resume with the "
                "saved ones, or delete it (or drop --resume) to start again"
            )
        for name, obj in self.objects.items():
            obj.load_state_dict(state["objects"][name])
        self.history.clear()
        self.history.update(state["history"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.batch_in_epoch = state["batch_in_epoch"]
        self._epoch_gen_state = state["epoch_generator"]
        _set_rng_state(state["rng"])
        self.resumed = True

    def save(self) -> None:
        if self.path is None or not self.enabled:
            return
        save_checkpoint(
            {
                "format": CHECKPOINT_FORMAT,
                "config": self.config,
                "objects": {k: v.state_dict() for k, v in self.objects.items()},
                "history": self.history,
                "step": self.step,
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "epoch_generator": self._epoch_gen_state,
                "rng": _rng_state(),
            },
            self.path,
        )

    def __enter__(self) -> ResumableLoop:
        # Ctrl-C finishes the current step, saves, then raises KeyboardInterrupt (a second Ctrl-C
        # stops at once, keeping the last periodic checkpoint: a half-done step is never saved)
        self._interrupted, self._old_handler = False, None
        if threading.current_thread() is threading.main_thread():

            def handler(signum, frame):
                if self._interrupted:
                    raise KeyboardInterrupt
                self._interrupted = True

            self._old_handler = signal.signal(signal.SIGINT, handler)
            # torchrun forwards Ctrl-C to its workers as SIGTERM: treat it the same way
            self._old_term = signal.signal(signal.SIGTERM, handler)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._old_handler is not None:
            signal.signal(signal.SIGINT, self._old_handler)
            signal.signal(signal.SIGTERM, self._old_term)
        if exc_type is None:
            self.save()
            if getattr(self, "_interrupted", False):  # Ctrl-C after the last step: still a stop
                where = f" (state in {self.path})" if self.path else ""
                raise KeyboardInterrupt(f"interrupted after the last step, {self.step}{where}")
        return False

    def epochs(self, epochs: int):
        """Yield the epochs still to run (all of them, or the rest after a resume)."""
        self._g = torch.Generator().manual_seed(self.seed)
        if self._epoch_gen_state is not None:
            self._g.set_state(self._epoch_gen_state)
        for epoch in range(self.epoch, epochs):
            self.epoch = epoch
            self._epoch_gen_state = self._g.get_state()
            yield epoch

    def minibatches(self, n: int, batch_size: int, drop_last: bool = True):
        """This epoch's shuffled minibatches, skipping those a resumed run already took."""
        skip = self.batch_in_epoch
        for b, idx in enumerate(minibatches(n, batch_size, self._g, drop_last)):
            if b >= skip:
                yield idx

    def step_done(self) -> None:
        """Call after each optimisation step (counts it and saves on schedule)."""
        self.step += 1
        self.batch_in_epoch += 1
        if getattr(self, "_interrupted", False):
            self.save()
            where = f"; resume with --resume (state in {self.path})" if self.path else ""
            raise KeyboardInterrupt(f"interrupted after step {self.step}{where}")
        if self.save_every and self.step % self.save_every == 0:
            self.save()

    def epoch_done(self) -> None:
        """Call at the end of each epoch (after its evaluation)."""
        self.epoch += 1
        self.batch_in_epoch = 0
        self._epoch_gen_state = self._g.get_state()
        if self.save_every:
            self.save()


def weight_decay_groups(
    module: nn.Module, weight_decay: float, exempt: Iterable[str] = ()
) -> list[dict]:
    """AdamW parameter groups: weight decay except on parameters with ``dim <= 1`` and those whose
    own name (the last part of the dotted name) is in ``exempt`` (codes, signatures, latents)."""
    exempt = set(exempt)
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if p.requires_grad:
            free = name.rsplit(".", 1)[-1] in exempt
            (no_decay if p.dim() <= 1 or free else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


# ----------------------------------------------------------------------------- the training skeleton

OPTIMIZERS = ("adamw", "adam")
SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class TrainConfig:
    """How a model is optimised; everything :func:`fit` needs besides the model and the step.

    ``clip_grad_norm`` (None: no clipping) and ``amp`` (autocast on CUDA to :func:`amp_dtype`:
    bf16, or fp16 with loss scaling on a GPU without bf16) are explicit per
    experiment. ``best`` names a validation metric (a key of what ``evaluate`` returns); when set,
    the weights of the epoch where it was highest are restored at the end (NFM App. C).
    """

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    warmup_fraction: float = 0.0
    schedule: str = "cosine"
    min_lr: float = 0.0  # the cosine schedule's floor (absolute)
    clip_grad_norm: float | None = None
    amp: bool = True
    best: str | None = None
    log_points: int = 100  # points of the logged loss curve (each the mean since the last)
    # steps between training-state checkpoints (not in the checkpoint key: no effect on weights)
    save_every: int = field(default=500, metadata={"key": False})
    # gradient accumulation: each batch in this many micro-batches, one optimiser step (for a
    # GPU too small for the batch; not in the checkpoint key: the same step up to rounding)
    accumulate: int = field(default=1, metadata={"key": False})
    # the speed switches (not in the checkpoint key: the same step up to rounding):
    # torch.compile the model the step runs (its warm-up pays off over thousands of steps) ...
    compile: bool = field(default=False, metadata={"key": False})
    # ... and the optimiser's fused kernel (one pass over every parameter instead of one per tensor)
    fused: bool = field(default=False, metadata={"key": False})

    def __post_init__(self):
        for name in ("epochs", "batch_size", "log_points", "accumulate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {v!r}")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"TrainConfig.lr must be positive and finite, got {self.lr!r}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(
                f"TrainConfig.min_lr (the schedule's floor) must be in [0, lr={self.lr}], "
                f"got {self.min_lr!r}"
            )
        if not 0 <= self.weight_decay < math.inf:
            raise ValueError(
                f"TrainConfig.weight_decay must be non-negative and finite, got {self.weight_decay!r}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"TrainConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"TrainConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}"
            )
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(
                f"TrainConfig.warmup_fraction must be in [0, 1), got {self.warmup_fraction!r}"
            )
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ValueError(
                f"TrainConfig.clip_grad_norm must be positive or None, got {self.clip_grad_norm!r}"
            )
        for name in ("amp", "compile", "fused"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"TrainConfig.{name} must be True or False, got {getattr(self, name)!r}"
                )
        if self.batch_size % self.accumulate:
            raise ValueError(
                f"TrainConfig.accumulate={self.accumulate} must divide batch_size={self.batch_size}"
            )


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


def optimizer_for(param_groups: list[dict], config: TrainConfig) -> torch.optim.Optimizer:
    """``config``'s optimiser over ``param_groups``, each at ``config.weight_decay`` unless it
    sets its own, with the fused kernel when ``config.fused``."""
    groups = [{"weight_decay": config.weight_decay, **g} for g in param_groups]
    opt_class = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return opt_class(groups, lr=config.lr, fused=config.fused or None)


def fit(model: nn.Module, step: Callable, config: TrainConfig, *, n: int | None = None,
        batches: Callable[[int], Sequence] | None = None, evaluate: Callable[[nn.Module], dict] | None = None,
        param_groups: list[dict] | None = None, desc: str = "training", show_progress: bool = True,
        state_path: str | os.PathLike | None = None, resume: bool = False, seed: int = 0,
        state_config: dict | None = None, find_unused_parameters: bool = False) -> dict:  # fmt: skip
    """The one training loop of every experiment; returns the history.

    ``step(net, batch)`` is the experiment's own part: it computes the loss of one minibatch with
    ``net`` (the model, wrapped for DDP and compiled when asked) and returns it, or a dict of
    scalar tensors whose ``"loss"`` is minimised and all of which are logged. A batch is this
    rank's share of ``batch_size`` shuffled indices into ``n`` training samples, or, with
    ``batches(epoch)`` (a list of whatever the step takes), one item of that list, taken in a
    shuffled order (the step then shards it with :func:`modnets.distributed.shard`).

    Around the step, :func:`fit` owns: the optimiser (``param_groups`` or the trainable
    parameters; ``config.fused``: its fused kernel), the warm-up + cosine schedule, autocast,
    ``torch.compile`` (``config.compile``, :func:`maybe_compile`), DistributedDataParallel
    under ``torchrun``, gradient clipping, the progress bar, :class:`ResumableLoop` (checkpoints at ``state_path``; ``resume`` continues),
    ``evaluate(model) -> {metric: value}`` after each epoch (kept as ``history["val_<metric>"]``)
    and the best-epoch restore. Logged values are the mean over the steps since the previous log
    point, averaged across processes.
    """
    from modnets import distributed
    from modnets.utils import progress

    if (n is None) == (batches is None):
        raise ValueError("give exactly one of n (number of training samples) and batches")
    if config.best is not None and evaluate is None:
        raise ValueError(f"TrainConfig.best={config.best!r} needs an evaluate function")
    if config.accumulate > 1 and batches is not None:
        raise ValueError("TrainConfig.accumulate > 1 needs index batches (n), not batches()")
    device = next(model.parameters()).device
    if param_groups is None:
        param_groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    opt = optimizer_for(param_groups, config)
    per_epoch = len(batches(0)) if batches is not None else n // config.batch_size
    if per_epoch <= 0:
        raise ValueError(f"no full batch of {config.batch_size} in {n} training samples")
    total = config.epochs * per_epoch
    floor = config.min_lr / config.lr
    sched = (warmup_cosine(opt, total, int(config.warmup_fraction * total), floor)
             if config.schedule == "cosine" else torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))  # fmt: skip
    params = [p for g in opt.param_groups for p in g["params"]]
    history: dict = {"step": [], "loss": [], "epoch": [], "seconds": 0.0}
    best = _Best()
    logged = _LogBuffer()
    objects = {"model": model, "optimizer": opt, "scheduler": sched, "best": best, "logged": logged}
    # float16 autocast (a GPU without bf16) needs loss scaling; its scale is training state too
    scaler = None
    if config.amp and amp_dtype(device) == torch.float16:
        scaler = objects["scaler"] = torch.amp.GradScaler(device.type)
    net = distributed.wrap(model, find_unused_parameters=find_unused_parameters)
    net = maybe_compile(net, config.compile)
    log_every = max(1, total // config.log_points)
    start = time.perf_counter()
    # the state remembers the settings that shape the weights: a resume under others is refused
    keyed = {f.name: getattr(config, f.name) for f in fields(config) if f.metadata.get("key", True)}
    state_config = {"fit": keyed, **({} if state_config is None else {"run": state_config})}
    with ResumableLoop(state_path, objects, history, state_config, seed, config.save_every,
                       resume, enabled=distributed.is_main()) as loop:  # fmt: skip
        spent = history["seconds"]  # a resumed run adds to the time already spent
        bar = progress(total=total, initial=loop.step, desc=desc,
                       disable=not (show_progress and distributed.is_main()))  # fmt: skip
        for epoch in loop.epochs(config.epochs):
            model.train()
            items = batches(epoch) if batches is not None else None
            source = loop.minibatches(len(items), 1) if items is not None else \
                loop.minibatches(n, config.batch_size)  # fmt: skip
            for idx in source:
                batch = items[idx.item()] if items is not None else distributed.shard(idx)
                opt.zero_grad(set_to_none=True)
                # one batch, or its micro-batches (gradient accumulation): each loss weighted by
                # its share of the batch, so the summed gradient is the whole batch's
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
                if scaler is None:
                    if config.clip_grad_norm is not None:
                        nn.utils.clip_grad_norm_(params, config.clip_grad_norm)
                    opt.step()
                else:  # float16: the backward was scaled; clip the true gradient, skip infs
                    scaler.unscale_(opt)
                    if config.clip_grad_norm is not None:
                        nn.utils.clip_grad_norm_(params, config.clip_grad_norm)
                    scaler.step(opt)
                    scaler.update()
                if scaler is None:
                    sched.step()
                else:  # a step the scaler skipped (inf gradient) still counts for the schedule
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step")
                        sched.step()
                logged.add(logs)
                done = loop.step + 1
                if done % log_every == 0 or done == total:
                    means = {
                        k: distributed.all_reduce_sum(v.item() / logged.count)
                        / distributed.world_size()
                        for k, v in logged.sums.items()
                    }
                    if not math.isfinite(means["loss"]):  # stop before a broken step is saved
                        raise FloatingPointError(
                            f"{logged.non_finite(done)}; lower TrainConfig.lr or set clip_grad_norm"
                        )
                    history["step"].append(done)
                    for k, mean in means.items():
                        history.setdefault(k, []).append(mean)
                    logged.reset()
                history["seconds"] = spent + time.perf_counter() - start
                loop.step_done()
                bar.update(1)
            history["epoch"].append(epoch + 1)
            if evaluate is not None:
                metrics = evaluate(model)
                for k, v in metrics.items():
                    history.setdefault(f"val_{k}", []).append(v)
                if config.best is not None:
                    best.update(float(metrics[config.best]), epoch + 1, model)
                    history["best_epoch"] = best.epoch
                bar.set_postfix({k: round(v, 4) for k, v in metrics.items()
                                 if isinstance(v, float)}, refresh=False)  # fmt: skip
            history["seconds"] = spent + time.perf_counter() - start
            loop.epoch_done()
        bar.close()
    if config.best is not None and best.weights is not None:
        model.load_state_dict(best.weights)
    return history
