"""Checkpoints and resumable training state: where they live, what they hold (weights, optimiser,
scheduler, random generators, the loop's position), and the loop that saves them."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from modnets.training.runtime import minibatches
from modnets.utils import atomic_file


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


class CheckpointError(ValueError):
    """A checkpoint file is truncated, corrupted, or was written by something else."""


def check_writable(path: str | os.PathLike) -> Path:
    """``path`` when a file can be written there (its folder made if missing); else an
    ``OSError`` naming it, before any work that would end in writing it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent):
            pass
    except OSError as err:
        raise OSError(
            err.errno, f"cannot write the training state to {path}: {err.strerror}"
        ) from None
    return path


def storable(value):
    """``value`` with NumPy scalars as Python numbers and NumPy arrays as tensors, so that the
    state loads with ``weights_only=True`` (an ``evaluate`` may return ``np.float64``)."""
    import numpy as np

    if isinstance(value, dict):
        return {k: storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(storable(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return value


def non_finite(state, where: str = "") -> str | None:
    """The name of the first floating-point tensor in a nested ``state`` (dicts, lists, tensors)
    that holds a NaN or an infinity, or None."""
    if torch.is_tensor(state):
        return where if state.is_floating_point() and not torch.isfinite(state).all() else None
    if isinstance(state, dict | list | tuple):
        for k, v in state.items() if isinstance(state, dict) else enumerate(state):
            found = non_finite(v, f"{where}.{k}" if where else str(k))
            if found is not None:
                return found
    return None


CHECKPOINT_FORMAT = "modnets-train-state-v1"


def _rng_state() -> dict:
    import random

    import numpy as np

    # NumPy's state as a tensor and plain numbers: a state file is read with weights_only=True
    name, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002 (the global one)
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (str(name), torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
    }
    if torch.cuda.is_available():  # this rank's device only (rank 0 writes the checkpoint)
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    keys = keys.numpy().astype(np.uint32)
    np.random.set_state((name, keys, pos, has_gauss, gauss))  # noqa: NPY002 (seed_everything seeds it)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"], device=torch.cuda.current_device())


def load_train_state(path: str | os.PathLike, map_location=None) -> dict:
    """Read a training checkpoint written by :class:`ResumableLoop`; a truncated or foreign file
    raises :class:`CheckpointError` naming the path."""
    path = Path(path)
    try:
        # tensors and plain values only: unpickling anything else could run the file's code
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # truncated zip, not a torch file, an object that is not allowed
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({type(err).__name__}): it is damaged, or "
            "holds objects other than tensors and plain values, which modnets does not unpickle; "
            "delete it to start afresh"
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

    def __init__(
        self,
        path: str | os.PathLike | None,
        objects: dict,
        history: dict,
        config: dict | None = None,
        seed: int = 0,
        save_every: int = 0,
        resume: bool = False,
        enabled: bool = True,
    ):
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
        """Write the state, unless a tensor of it is not finite (a NaN in the weights, the
        optimiser or the logged loss): then ``FloatingPointError``, the last good state kept."""
        if self.path is None or not self.enabled:
            return
        objects = {k: v.state_dict() for k, v in self.objects.items()}
        bad = non_finite(objects)
        if bad is not None:
            raise FloatingPointError(
                f"{bad} is not finite at step {self.step}: not saved, {self.path} keeps the last "
                "finite state; lower TrainConfig.lr or set clip_grad_norm"
            )
        save_checkpoint(
            {
                "format": CHECKPOINT_FORMAT,
                "config": storable(self.config),
                "objects": objects,
                "history": storable(self.history),
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

            # torchrun forwards Ctrl-C to its workers as SIGTERM: treat it the same way; a
            # signal the process was started ignoring (`nohup cmd &`) stays ignored
            self._old_handler = {
                sig: signal.signal(sig, handler)
                for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) is not signal.SIG_IGN
            }
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for sig, old in (self._old_handler or {}).items():
            signal.signal(sig, old)
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
            where = (
                f"; resume=True (--resume on the command line) goes on from {self.path}"
                if self.path
                else ""
            )
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
