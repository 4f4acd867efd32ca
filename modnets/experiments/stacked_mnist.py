"""NFM §4.2 / Table 5: stacked-MNIST generalisation to unseen numbers of digits, CNN vs NFM(CNN).

Train App. C's CNN and the same CNN with NFM (K = 2 passes, top-k = 5, 4 heads,
d_k = d_v = 16) on 64x64 canvases holding 1 or 3 MNIST digits (16x16, random positions), as a
multi-label classifier (which of the ten digits are present); test on canvases with 1 to 5
digits. Training canvases come from MNIST's train split (minus images held out for the
validation canvases), test canvases from its test split. As in App. C, each minibatch holds
canvases of one digit count, the CNN has no batch norm, and the reported model is the one from
the epoch with the best validation accuracy. Accuracy is exact match: all ten labels right.

The NFM(CNN) starts as an exact copy of the CNN (same seed, NFM added with ``gamma = 0``), so
the two differ only by what NFM learns.

Run ``python -m modnets.experiments.stacked_mnist --profile cpu --out results.json``. Trained
models are checkpointed under :func:`modnets.training.checkpoint_dir`, keyed by their
configuration, so the analysis re-runs without retraining; an interrupted training (Ctrl-C)
continues with ``--resume``.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets import distributed
from modnets.data.digits import load_mnist
from modnets.data.stacked_mnist import StackedMNIST, make_canvases
from modnets.experiments.cli import experiment_main
from modnets.nfm import ConvNet
from modnets.profiles import get_profile, select
from modnets.training import (
    ResumableLoop,
    autocast,
    checkpoint_dir,
    maybe_compile,
    minibatches,
    save_checkpoint,
)
from modnets.utils import default_device, progress, seed_everything

__all__ = [
    "StackedMNISTConfig",
    "CONFIGS",
    "PAPER",
    "MODELS",
    "load_data",
    "build_model",
    "train",
    "evaluate",
    "read_matrix",
    "trained_model",
    "run",
    "format_summary",
]

#: NFM Table 5 (test accuracy %, mean and std): trained on (1, 3) or (1, 5) digits per canvas.
PAPER = {
    "trained (1, 3)": {
        "CNN": {1: (99.27, 0.05), 2: (76.7, 1.34), 3: (87.83, 0.02), 4: (62.57, 0.04),
                5: (24.27, 1.02)},
        "NFM(CNN)": {1: (99.23, 0.03), 2: (88.36, 0.85), 3: (87.78, 0.46), 4: (66.12, 1.86),
                     5: (29.48, 3.12)},
    },
    "trained (1, 5)": {
        "CNN": {1: (99.22, 0.09), 2: (74.69, 2.88), 3: (57.11, 3.57), 4: (75.90, 2.48),
                5: (68.87, 4.25)},
        "NFM(CNN)": {1: (99.16, 0.04), 2: (84.01, 6.06), 3: (66.58, 5.24), 4: (79.04, 2.37),
                     5: (71.76, 2.79)},
    },
}  # fmt: skip

MODELS = {"cnn": "CNN", "nfm": "NFM(CNN)"}


@dataclass(frozen=True)
class StackedMNISTConfig:
    """Sizes of one run. ``gpu`` follows App. C (width 32 -> 512 channels, Adam 1e-3, 300 epochs;
    the number of canvases and the batch size are not given: 30k canvases per digit count, batch
    64); the others shrink data, width and epochs to fit their budgets. App. C does not say how
    the final 4x4 map becomes ten outputs; ``pool="max"`` (global max pooling, then a linear
    layer: "is this digit anywhere?") learns much sooner than flattening, which is available as
    ``pool="flatten"``."""

    train_counts: tuple[int, ...] = (1, 3)
    test_counts: tuple[int, ...] = (1, 2, 3, 4, 5)
    train_per_count: int = 30_000
    val_per_count: int = 2_000
    test_per_count: int = 5_000
    val_images: int = 5_000  # MNIST train images kept apart for the validation canvases
    epochs: int = 300
    batch_size: int = 64
    lr: float = 1e-3
    width: int = 32
    block: str = "plain"
    pool: str = "max"
    passes: int = 2
    top_k: int = 5
    num_heads: int = 4
    key_dim: int = 16
    value_dim: int = 16
    placement: str = "after"
    share_blocks: bool = False
    eval_batch: int = 256
    read_canvases: int = 512  # test canvases per count for the read heatmaps
    seed: int = 0

    def nfm(self) -> dict:
        """:class:`modnets.nfm.NFMNetwork` arguments."""
        return dict(passes=self.passes, top_k=self.top_k, num_heads=self.num_heads,
                    key_dim=self.key_dim, value_dim=self.value_dim, placement=self.placement,
                    share_blocks=self.share_blocks)  # fmt: skip

    def key(self, kind: str) -> str:
        """A short hash of everything that determines a trained model (for checkpoints)."""
        skip = ("test_", "eval_batch", "read_canvases")
        relevant = {k: v for k, v in asdict(self).items() if not k.startswith(skip)}
        blob = json.dumps({"model": kind, **relevant}, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:10]


CONFIGS = {
    "smoke": StackedMNISTConfig(
        train_per_count=48, val_per_count=16, test_per_count=16, val_images=500, epochs=1,
        batch_size=16, width=4, eval_batch=64, read_canvases=16,
    ),
    # About 8 minutes on two idle CPU cores for both models (20 timed training steps of each,
    # extrapolated; the NFM model costs about 6x the CNN there: two passes plus eight attention
    # reads, the largest at 32x32 positions). A quarter of App. C's width, 7.5k canvases per
    # training count, 4 epochs instead of 300, and batches of 16: the plain CNN without batch
    # norm needs many steps before it starts to learn, so small batches help more than width.
    "cpu": StackedMNISTConfig(
        train_per_count=7_500, val_per_count=500, test_per_count=1_000, epochs=4, batch_size=16,
        width=8, read_canvases=256,
    ),
    "gpu": StackedMNISTConfig(),
}  # fmt: skip


# ----------------------------------------------------------------------------- data


def load_data(config: StackedMNISTConfig, root=None, verify: bool = True) -> dict:
    """``{"train" | "val" | "test": {count: StackedMNIST}}``: training and validation canvases
    from disjoint parts of MNIST's train split (``val_images`` held out), test canvases from its
    test split. Seeded: the same config gives the same canvases."""
    x_tr, y_tr = load_mnist("train", root=root, verify=verify)
    x_te, y_te = load_mnist("test", root=root, verify=verify)
    perm = np.random.default_rng(config.seed).permutation(len(x_tr))
    val_idx, tr_idx = perm[: config.val_images], perm[config.val_images :]
    out = {"train": {}, "val": {}, "test": {}}
    for split, x, y, counts, n, offset in (
        ("train", x_tr[tr_idx], y_tr[tr_idx], config.train_counts, config.train_per_count, 0),
        ("val", x_tr[val_idx], y_tr[val_idx], config.train_counts, config.val_per_count, 100),
        ("test", x_te, y_te, config.test_counts, config.test_per_count, 200),
    ):
        for c in counts:
            out[split][c] = make_canvases(x, y, n, c, seed=1000 * config.seed + offset + c)
    return out


#: Pixel mean and std of the training canvases (half 1-digit, half 3-digit) on a 0..1 scale.
PIXEL_MEAN, PIXEL_STD = 0.017, 0.12


def _inputs(images: Tensor, device) -> Tensor:
    """uint8 canvases -> standardised floats (a plain ReLU CNN without batch norm starts to learn
    much sooner on standardised inputs than on the mostly-zero 0..1 canvases)."""
    return (images.to(device).float() / 255.0 - PIXEL_MEAN) / PIXEL_STD


# ----------------------------------------------------------------------------- models and training


def build_model(kind: str, config: StackedMNISTConfig) -> ConvNet:
    """``"cnn"`` (App. C's CNN) or ``"nfm"``: the same CNN (same seed, same initial weights) with
    NFM added around its stages, ``gamma = 0``."""
    if kind not in MODELS:
        raise ValueError(f"kind must be one of {tuple(MODELS)}, got {kind!r}")
    seed_everything(config.seed)
    cnn = ConvNet(
        in_channels=1, num_outputs=10, width=config.width, block=config.block, pool=config.pool
    )
    return cnn if kind == "cnn" else cnn.with_nfm(**config.nfm())


def _batches(data: dict[int, StackedMNIST], batch_size: int, g: torch.Generator) -> list:
    """One epoch's minibatches ``(count, indices)``, each of a single digit count (App. C): every
    count's canvases shuffled by ``g`` and cut into batches. The order in which the batches are
    taken is drawn separately (by the training loop)."""
    return [(c, idx) for c, ds in data.items() for idx in minibatches(len(ds), batch_size, g)]


class _Best:
    """The best epoch so far (validation accuracy and weights), saved with the training state so
    that a resumed run still restores the best epoch's weights at the end."""

    def __init__(self):
        self.acc, self.epoch, self.weights = -1.0, 0, None

    def update(self, acc: float, epoch: int, model: nn.Module) -> None:
        if acc > self.acc:
            self.acc, self.epoch = acc, epoch
            self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def state_dict(self) -> dict:
        return {"acc": self.acc, "epoch": self.epoch, "weights": self.weights}

    def load_state_dict(self, state: dict) -> None:
        self.acc, self.epoch, self.weights = state["acc"], state["epoch"], state["weights"]


@torch.no_grad()
def predict(model: nn.Module, data: StackedMNIST, batch_size: int = 256) -> Tensor:
    """Logits ``(N, 10)`` in evaluation mode."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(data), batch_size):
        with autocast(device):
            out.append(model(_inputs(data.images[i : i + batch_size], device)).float().cpu())
    return torch.cat(out) if out else torch.zeros(0, 10)


def evaluate(model: nn.Module, data: StackedMNIST, batch_size: int = 256) -> dict[str, float]:
    """``exact``: the fraction of canvases with all ten labels right (Table 5's accuracy);
    ``label``: the fraction of right binary decisions."""
    right = (predict(model, data, batch_size) > 0) == (data.targets > 0.5)
    return {"exact": right.all(1).float().mean().item(), "label": right.float().mean().item()}


def _val_accuracy(model, data: dict[int, StackedMNIST], batch_size: int) -> float:
    return float(np.mean([evaluate(model, ds, batch_size)["exact"] for ds in data.values()]))


def train(model: nn.Module, data: dict, config: StackedMNISTConfig, desc: str = "training",
          show_progress: bool = True, state_path: str | Path | None = None, resume: bool = False,
          save_every: int = 200) -> dict:  # fmt: skip
    """Adam at ``lr`` (App. C), binary cross-entropy over the ten labels; after each epoch the
    validation accuracy, and at the end the weights of the best epoch are restored (App. C).

    With ``state_path``, the full training state (model, optimiser, best epoch so far, RNGs, the
    position in the epoch) is saved there every ``save_every`` steps, at the end and on Ctrl-C;
    ``resume`` continues from it (see :class:`modnets.training.ResumableLoop`).
    """
    device = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    per_epoch = sum(len(ds) // config.batch_size for ds in data["train"].values())
    steps = config.epochs * per_epoch
    history = {"step": [], "loss": [], "epoch": [], "val_acc": [], "best_epoch": 0,
               "seconds": 0.0}  # fmt: skip
    best = _Best()
    net = maybe_compile(distributed.wrap(model, find_unused_parameters=True))  # DDP (torchrun)
    objects = {"model": model, "optimizer": opt, "best": best}
    start = time.perf_counter()
    with ResumableLoop(state_path, objects, history, asdict(config), config.seed, save_every,
                       resume, enabled=distributed.is_main()) as loop:  # fmt: skip
        seconds = history["seconds"]  # a resumed run adds to the time already spent
        bar = progress(total=steps, initial=loop.step, desc=desc,
                       disable=not (show_progress and distributed.is_main()))  # fmt: skip
        for epoch in loop.epochs(config.epochs):
            model.train()
            # each count's shuffle is a function of the epoch alone; the loop's generator draws
            # the order of the batches and skips those a resumed run already took
            g = torch.Generator().manual_seed(1_000_003 * config.seed + epoch)
            batches = _batches(data["train"], config.batch_size, g)
            for b in loop.minibatches(len(batches), 1):
                c, idx = batches[b.item()]
                idx = distributed.shard(idx)  # this rank's share of the global batch
                ds = data["train"][c]
                x, y = _inputs(ds.images[idx], device), ds.targets[idx].to(device)
                with autocast(device):
                    logits = net(x)
                loss = F.binary_cross_entropy_with_logits(logits.float(), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step = loop.step + 1
                if step % max(1, steps // 100) == 0 or step == steps:
                    history["step"].append(step)
                    history["loss"].append(loss.item())
                history["seconds"] = seconds + time.perf_counter() - start
                loop.step_done()
                bar.update(1)
            acc = _val_accuracy(model, data["val"], config.eval_batch)
            history["epoch"].append(epoch + 1)
            history["val_acc"].append(acc)
            best.update(acc, epoch + 1, model)
            history["best_epoch"] = best.epoch
            history["seconds"] = seconds + time.perf_counter() - start
            bar.set_postfix(val_acc=f"{acc:.3f}", refresh=False)
            loop.epoch_done()
        bar.close()
    if best.weights is not None:
        model.load_state_dict(best.weights)
    return history


@torch.no_grad()
def read_matrix(model: ConvNet, data: StackedMNIST, n: int = 512, batch_size: int = 128) -> list:
    """Which earlier states each NFM read attends to: ``(K N, 1 + K N)`` mean weights (column 0:
    the default slot), averaged over the first ``n`` canvases (see :class:`modnets.nfm.NFMOutput`)."""
    model.eval()
    device = next(model.parameters()).device
    total, count = None, 0
    for i in range(0, min(n, len(data)), batch_size):
        x = _inputs(data.images[i : min(i + batch_size, n)], device)
        reads = model(x, return_details=True)[1].reads.cpu() * len(x)
        total = reads if total is None else total + reads
        count += len(x)
    return (total / max(count, 1)).tolist()


def trained_model(kind: str, config: StackedMNISTConfig, data: dict, device, show_progress: bool = True,
                  cache: bool = True, resume: bool = False) -> tuple[ConvNet, dict]:  # fmt: skip
    """Train ``kind`` ("cnn" or "nfm"), or load it from a checkpoint of the same configuration.
    ``resume`` continues an interrupted training from its state file."""
    path = checkpoint_dir() / f"stacked_mnist_{kind}_{config.key(kind)}.pt"
    model = build_model(kind, config).to(device)
    if cache and path.exists():
        state = torch.load(path, map_location=device, weights_only=False)
        try:
            model.load_state_dict(state["model"])
            return model, state["history"]
        except RuntimeError as err:  # written by another version of the model: train afresh
            warnings.warn(f"checkpoint {path} does not fit this model ({str(err)[:200]}); "
                          "retraining", stacklevel=2)  # fmt: skip
            model = build_model(kind, config).to(device)
    seed_everything(config.seed)
    state_path = path.with_suffix(".train.pt") if cache else None
    history = train(model, data, config, f"training {MODELS[kind]}", show_progress, state_path,
                    resume)  # fmt: skip
    if cache and distributed.is_main():
        save_checkpoint(
            {"model": model.state_dict(), "history": history, "config": asdict(config)}, path
        )
    distributed.barrier()
    return model, history


# ----------------------------------------------------------------------------- the experiment


def run(config: StackedMNISTConfig | None = None, profile: str | None = None, show_progress: bool = True,
        keep_models: bool = False, cache: bool = True, root=None, verify: bool = True,
        resume: bool = False) -> dict:  # fmt: skip
    """Train (or load) both models and evaluate them on every digit count; a JSON-serialisable
    dict (plus the models and data with ``keep_models``). ``resume`` continues an interrupted
    training."""
    profile = get_profile(profile)
    config = select(CONFIGS, profile) if config is None else config
    device = distributed.local_device() if distributed.is_distributed() else default_device()
    start = time.perf_counter()
    data = load_data(config, root, verify)
    results: dict = {"profile": profile, "device": str(device), "config": asdict(config),
                     "paper": PAPER, "models": {}}  # fmt: skip
    trained = {}
    for kind, name in MODELS.items():
        t0 = time.perf_counter()
        model, history = trained_model(kind, config, data, device, show_progress, cache, resume)
        trained[name] = model
        entry = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "history": history,
            "train_or_load_seconds": time.perf_counter() - t0,
            "test": {c: evaluate(model, ds, config.eval_batch) for c, ds in data["test"].items()},
        }
        if kind == "nfm":
            nfm = model.nfm
            entry["reads"] = {c: read_matrix(model, ds, config.read_canvases, config.eval_batch)
                              for c, ds in data["test"].items()}  # fmt: skip
            entry["gamma"] = [[nfm.attn(k, i).gamma.item() for i in range(nfm.num_blocks)]
                              for k in range(nfm.passes)]  # fmt: skip
        results["models"][name] = entry
    results["seconds"] = time.perf_counter() - start
    if keep_models:
        results["trained"] = trained
        results["data"] = data
    return results


def format_summary(results: dict) -> str:
    """Table 5 beside ours: exact-match test accuracy (%) per number of digits."""
    cfg = results["config"]
    train_counts = tuple(cfg["train_counts"])
    paper = results["paper"].get(f"trained {train_counts}", {})
    lines = [f"profile: {results['profile']}  ({results['seconds']:.0f} s), trained on "
             f"{train_counts} digits, width {cfg['width']}, {cfg['epochs']} epochs"]  # fmt: skip
    names = list(results["models"])
    head = f"{'digits':>7} " + " ".join(f"{n:>10} {'(paper)':>8}" for n in names)
    lines.append(head)
    for c in cfg["test_counts"]:
        cells = []
        for n in names:
            test = results["models"][n]["test"]
            acc = test.get(c, test.get(str(c)))["exact"]
            p = paper.get(n, {}).get(c, paper.get(n, {}).get(str(c)))
            cells.append(f"{100 * acc:>10.1f} {p[0] if p else '-':>8}")
        mark = "*" if c in train_counts else " "
        lines.append(f"{c:>6}{mark} " + " ".join(cells))
    lines.append("(* trained on this count)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    experiment_main(run, format_summary, __doc__, argv, exclude=("trained", "data"))


if __name__ == "__main__":
    main()
