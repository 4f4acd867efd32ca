"""NI §4.2: multi-task digits and few-shot adaptation to K-MNIST (NI Figs. 4, 5a-c, 6, 8).

Pretrain a Neural Interpreter and a ViT on several digit datasets at once (one CLS token and head
per dataset), then probe what the NI learned:

* Fig. 5a -- finetune both on K-MNIST with 150-500 samples: does the NI adapt faster?
* Fig. 6  -- the same for an NI whose function codes and signatures are re-sampled first.
* Fig. 5b -- add functions and finetune only signatures and codes: does capacity help?
* Fig. 5c -- drop 0-4 functions at test time: does accuracy degrade gracefully?
* Fig. 8  -- run fewer or more function iterations at test time (anytime inference).
* Fig. 4  -- t-SNE of the inferred types at each function iteration.

Run ``python -m modnets.experiments.digits --profile cpu --out results.json``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets import distributed
from modnets.baselines import ViT
from modnets.data import data_root
from modnets.data.digits import load_digits
from modnets.experiments.cli import experiment_main
from modnets.experiments.results import save_results  # noqa: F401 (re-exported for the notebooks)
from modnets.ni import NeuralInterpreter, NIConfig
from modnets.profiles import get_profile, select
from modnets.training import (
    ResumableLoop,
    autocast,
    checkpoint_dir,
    maybe_compile,
    minibatches,
    save_checkpoint,
    warmup_cosine,
)
from modnets.utils import default_device, progress, seed_everything

__all__ = [
    "DigitsConfig",
    "CONFIGS",
    "DigitsData",
    "load_pretraining_data",
    "load_kmnist_data",
    "build_ni",
    "build_vit",
    "pretrain",
    "evaluate",
    "adapt",
    "drop_functions",
    "anytime",
    "inferred_types",
    "run",
]

DATASET_NAMES = {"mnist": "MNIST", "mnist_m": "MNIST-M", "svhn": "SVHN", "kmnist": "K-MNIST"}


@dataclass(frozen=True)
class DigitsConfig:
    """Sizes of one run. The gpu profile follows NI §4.2 and the public digits preset; the others
    shrink data, epochs, tokens and width to fit their budgets."""

    datasets: tuple[str, ...] = ("svhn", "mnist_m", "mnist")
    train_per_dataset: int | None = None  # cap on training images per dataset (None: all)
    val_per_dataset: int = 5000
    mnist_m_val_fraction: float = 0.2  # used when MNIST-M has only its test split
    pretrain_epochs: int = 100
    batch_size: int = 128
    lr: float = 1e-3
    vit_lr: float = 5e-4
    weight_decay: float = 0.05
    warmup_fraction: float = 0.05
    randaugment: tuple[int, int] = (2, 9)  # (n, m) of kornia's RandAugment; (0, 0) turns it off
    kmnist_pool: int = 5000  # adaptation samples are drawn from the first part of K-MNIST
    kmnist_eval: int = 5000  # evaluation on a disjoint part
    sample_counts: tuple[int, ...] = (150, 250, 350, 500)
    finetune_epochs: int = 10
    finetune_lr: float = 5e-4
    finetune_batch_size: int = 32
    adaptation_seeds: int = 3
    capacity_functions: tuple[int, ...] = (5, 6, 7, 8)
    capacity_lr: float = 3e-3
    drop_trials: int = 5
    tsne_images: int = 8
    seed: int = 0
    ni: dict = field(default_factory=dict)  # NIConfig overrides
    vit: dict = field(default_factory=dict)  # NIConfig overrides for the ViT
    vit_depth: int = 8

    def ni_config(self) -> NIConfig:
        base = dict(
            dim=192, type_dim=24, num_functions=5, num_scripts=1, num_iterations=8, num_locs=1,
            num_heads=4, truncation=1.42, image_size=32, patch_size=4, in_channels=3,
            num_cls=len(self.datasets), num_outputs=10,
        )  # fmt: skip
        return NIConfig(**{**base, **self.ni})

    def vit_config(self) -> NIConfig:
        return self.ni_config().replace(**{"mlp_hidden": 4 * self.ni_config().dim, **self.vit})

    def key(self, model: str) -> str:
        """A short hash of everything that determines a pretrained model (for checkpoints)."""
        relevant = {
            k: v
            for k, v in asdict(self).items()
            if not k.startswith(
                ("kmnist", "sample", "finetune", "adaptation", "capacity", "drop", "tsne")
            )
        }
        blob = json.dumps({"model": model, **relevant}, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:10]


CONFIGS = {
    "smoke": DigitsConfig(
        datasets=("mnist", "mnist_m"), train_per_dataset=256, val_per_dataset=128,
        pretrain_epochs=1, batch_size=64, randaugment=(1, 9), kmnist_pool=200, kmnist_eval=200,
        sample_counts=(20, 40), finetune_epochs=1, adaptation_seeds=1, capacity_functions=(3, 4),
        drop_trials=1, tsne_images=2,
        ni=dict(dim=32, type_dim=8, num_functions=3, num_iterations=2, num_heads=2, patch_size=8),
        vit=dict(dim=32, num_heads=2), vit_depth=2,
    ),
    # About 15 minutes on two CPU cores. No SVHN offline: MNIST and MNIST-M (its test split, split
    # again into train/val) only; 8x8 patches (16 tokens) instead of 4x4 (64 tokens).
    "cpu": DigitsConfig(
        datasets=("mnist", "mnist_m"), train_per_dataset=6000, val_per_dataset=1500,
        pretrain_epochs=14, batch_size=64, kmnist_pool=5000, kmnist_eval=2000,
        adaptation_seeds=2, drop_trials=4,
        ni=dict(dim=64, type_dim=16, num_functions=5, num_iterations=3, num_heads=4, patch_size=8),
        vit=dict(dim=96, num_heads=4), vit_depth=4,
    ),
    "gpu": DigitsConfig(),
}  # fmt: skip


# ----------------------------------------------------------------------------- data


@dataclass
class DigitsData:
    """Images ``(N, 3, 32, 32)`` uint8, labels ``(N,)`` and dataset ids ``(N,)`` for train and val."""

    names: tuple[str, ...]
    x_train: Tensor
    y_train: Tensor
    d_train: Tensor
    x_val: Tensor
    y_val: Tensor
    d_val: Tensor


def to_rgb32(images: np.ndarray) -> Tensor:
    """uint8 ``(N, H, W)`` or ``(N, H, W, 3)`` -> uint8 ``(N, 3, 32, 32)``: grey to three channels,
    28x28 upsampled bilinearly (NI §4.2: "upsampled to shape 32x32 (if required)")."""
    x = torch.from_numpy(np.ascontiguousarray(images))
    x = x[:, None].expand(-1, 3, -1, -1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
    if x.shape[-1] != 32:
        chunks = [
            F.interpolate(c.float(), size=(32, 32), mode="bilinear", align_corners=False)
            for c in x.split(4096)
        ]
        x = torch.cat(chunks).round().clamp(0, 255).to(torch.uint8)
    return x.contiguous()


def _subset(n: int, k: int | None, g: torch.Generator) -> Tensor:
    perm = torch.randperm(n, generator=g)
    return perm if k is None else perm[: min(k, n)]


def load_pretraining_data(config: DigitsConfig, root=None, verify: bool = True) -> DigitsData:
    """Train and validation images of each pretraining dataset.

    Where only a test split exists offline (MNIST-M in ``shared/data``), it is split again into
    train and validation with a fixed seed. MNIST validates on its test split.
    """
    g = torch.Generator().manual_seed(config.seed)
    parts = {"train": ([], [], []), "val": ([], [], [])}
    base = Path(root).expanduser() if root is not None else data_root()
    mnist_m = base / "MNIST-M" / "mnist_m"
    for d, name in enumerate(config.datasets):
        resplit = (
            name == "mnist_m"
            and not (mnist_m / "mnist_m_train_labels.txt").exists()
            and (mnist_m / "mnist_m_test_labels.txt").exists()
        )
        if resplit:  # offline copies hold only the test split
            x, y = load_digits(name, "test", root=root, verify=verify)
            perm = torch.randperm(len(x), generator=g).numpy()
            n_val = int(round(config.mnist_m_val_fraction * len(x)))
            xva, yva, xtr, ytr = x[perm[:n_val]], y[perm[:n_val]], x[perm[n_val:]], y[perm[n_val:]]
        else:
            xtr, ytr = load_digits(name, "train", root=root, verify=verify)
            xva, yva = load_digits(name, "test", root=root, verify=verify)
        for split, x, y, cap in (
            ("train", xtr, ytr, config.train_per_dataset),
            ("val", xva, yva, config.val_per_dataset),
        ):
            idx = _subset(len(x), cap, g).numpy()
            xs, ys, ds = parts[split]
            xs.append(to_rgb32(x[idx]))
            ys.append(torch.from_numpy(y[idx]))
            ds.append(torch.full((len(idx),), d, dtype=torch.long))
    cat = {s: [torch.cat(v) for v in parts[s]] for s in parts}
    return DigitsData(tuple(config.datasets), *cat["train"], *cat["val"])


def load_kmnist_data(config: DigitsConfig, root=None, verify: bool = True) -> dict[str, Tensor]:
    """K-MNIST for adaptation: a pool to draw training samples from and a disjoint evaluation set.

    Offline only the 10 000-image test split exists; its first ``kmnist_pool`` images (after a
    seeded shuffle) form the pool and the next ``kmnist_eval`` the evaluation set. Image 9677 of
    the first release is blank and dropped.
    """
    x, y = load_digits("kmnist", "test", root=root, verify=verify)
    keep = np.flatnonzero(x.reshape(len(x), -1).max(1) > 0)
    g = torch.Generator().manual_seed(config.seed + 1)
    perm = keep[torch.randperm(len(keep), generator=g).numpy()]
    pool, ev = (
        perm[: config.kmnist_pool],
        perm[config.kmnist_pool : config.kmnist_pool + config.kmnist_eval],
    )
    return {
        "x_pool": to_rgb32(x[pool]), "y_pool": torch.from_numpy(y[pool]),
        "x_eval": to_rgb32(x[ev]), "y_eval": torch.from_numpy(y[ev]),
    }  # fmt: skip


def balanced_sample(labels: Tensor, n: int, seed: int) -> Tensor:
    """``n`` indices with (as nearly as possible) equal counts per class, seeded."""
    g = torch.Generator().manual_seed(seed)
    classes = labels.unique()
    per = [torch.nonzero(labels == c).flatten() for c in classes]
    per = [p[torch.randperm(len(p), generator=g)] for p in per]
    take = [n // len(classes) + (1 if i < n % len(classes) else 0) for i in range(len(classes))]
    return torch.cat([p[:k] for p, k in zip(per, take, strict=True)])


# ----------------------------------------------------------------------------- models


def build_ni(config: DigitsConfig) -> NeuralInterpreter:
    return NeuralInterpreter(config.ni_config())


def build_vit(config: DigitsConfig) -> ViT:
    return ViT(config.vit_config(), depth=config.vit_depth)


class Preprocess(nn.Module):
    """uint8 images -> floats in [-1, 1], with RandAugment while training (kornia, batch-wise)."""

    def __init__(self, randaugment: tuple[int, int] = (0, 0)):
        super().__init__()
        n, m = randaugment
        self.augment = None
        if n > 0:
            from kornia.augmentation.auto import RandAugment

            self.augment = RandAugment(n=n, m=m)

    def forward(self, x: Tensor, train: bool = False) -> Tensor:
        x = x.float() / 255.0
        if train and self.augment is not None:
            x = self.augment(x).clamp(0, 1)
        return (x - 0.5) / 0.5


def _select_heads(logits: Tensor, dataset: Tensor) -> Tensor:
    """Logits ``(B, num_cls, 10)`` -> the head of each sample's dataset ``(B, 10)``."""
    return logits[torch.arange(len(dataset), device=logits.device), dataset]


# ----------------------------------------------------------------------------- training


def pretrain(model: nn.Module, data: DigitsData, config: DigitsConfig, lr: float, desc: str = "pretraining",
             show_progress: bool = True, state_path: str | Path | None = None,
             resume: bool = False) -> dict:  # fmt: skip
    """Multi-task training: each sample trains the head of its dataset (NI §4.2).

    With ``state_path`` the training state is checkpointed (every 500 steps, at the end, on
    Ctrl-C) and ``resume`` continues from it (:class:`~modnets.training.ResumableLoop`)."""
    device = next(model.parameters()).device
    prep = Preprocess(config.randaugment)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=config.weight_decay)
    steps = max(1, config.pretrain_epochs * (len(data.x_train) // config.batch_size))
    sched = warmup_cosine(opt, steps, int(config.warmup_fraction * steps))
    history = {"step": [], "loss": [], "epoch": [], "val_acc": []}
    net = maybe_compile(distributed.wrap(model))  # DDP under torchrun: each rank its shard
    objects = {"model": model, "optimizer": opt, "scheduler": sched}
    with ResumableLoop(state_path, objects, history, {**asdict(config), "stage": desc},
                       config.seed, 500, resume, enabled=distributed.is_main()) as loop:  # fmt: skip
        bar = progress(total=steps, initial=loop.step, desc=desc,
                       disable=not (show_progress and distributed.is_main()))  # fmt: skip
        for _ in loop.epochs(config.pretrain_epochs):
            model.train()
            for idx in loop.minibatches(len(data.x_train), config.batch_size):
                idx = distributed.shard(idx)
                x = prep(data.x_train[idx].to(device), train=True)
                y, d = data.y_train[idx].to(device), data.d_train[idx].to(device)
                with autocast(device):
                    loss = F.cross_entropy(_select_heads(net(x), d).float(), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                step = loop.step + 1
                if step % max(1, steps // 100) == 0:
                    history["step"].append(step)
                    history["loss"].append(loss.item())
                loop.step_done()
                bar.update(1)
            acc = evaluate(model, data)
            history["epoch"].append(len(history["epoch"]) + 1)
            history["val_acc"].append(acc)
            bar.set_postfix(val_acc=" ".join(f"{v:.3f}" for v in acc.values()), refresh=False)
            loop.epoch_done()
        bar.close()
    return history


@torch.no_grad()
def predict(model: nn.Module, x: Tensor, batch_size: int = 512, **forward_kwargs) -> Tensor:
    """Logits ``(N, num_cls, num_outputs)`` for uint8 images, in evaluation mode."""
    model.eval()
    device = next(model.parameters()).device
    prep = Preprocess()
    out = []
    for i in range(0, len(x), batch_size):
        with autocast(device):
            out.append(
                model(prep(x[i : i + batch_size].to(device)), **forward_kwargs).float().cpu()
            )
    return torch.cat(out)


def evaluate(model: nn.Module, data: DigitsData, **forward_kwargs) -> dict[str, float]:
    """Validation accuracy per dataset (each read out by its own head)."""
    logits = predict(model, data.x_val, **forward_kwargs)
    pred = _select_heads(logits, data.d_val).argmax(-1)
    return {
        name: (pred[data.d_val == d] == data.y_val[data.d_val == d]).float().mean().item()
        for d, name in enumerate(data.names)
    }


def _resample_functions(model: NeuralInterpreter, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for script in model.scripts:
            for s, c in zip(script.signature_chunks, script.code_chunks, strict=True):
                s.copy_(F.normalize(torch.randn(s.shape, generator=g), dim=-1))
                c.copy_(torch.randn(c.shape, generator=g))


def prepare_adaptation(pretrained: nn.Module, config: DigitsConfig, seed: int = 0, mode: str = "all",
                       resample: bool = False, num_functions: int | None = None) -> nn.Module:  # fmt: skip
    """A copy of ``pretrained`` ready for K-MNIST: one fresh CLS token and head, and the trainable
    parameters of ``mode``.

    ``mode="all"`` trains every parameter that pretraining trained (Figs. 5a, 6): the signatures stay
    fixed, as the paper keeps them. ``mode="functions"`` grows the NI to
    ``num_functions`` functions and trains only signatures and codes, plus the new CLS token and
    head (Fig. 5b). ``resample`` re-draws all codes and signatures first (Fig. 6).
    """
    if mode not in ("all", "functions"):
        raise ValueError(f"mode must be 'all' or 'functions', got {mode!r}")
    device = next(pretrained.parameters()).device
    model = copy.deepcopy(pretrained)
    seed_everything(config.seed + 1000 + seed)
    if resample:
        _resample_functions(model, config.seed + 2000 + seed)
    model.reset_cls_tokens(1)
    model.to(device)
    if mode == "functions":
        extra = (num_functions or 0) - model.scripts[0].num_functions
        if extra > 0:
            model.add_functions(extra)
        for p in model.parameters():
            p.requires_grad_(False)
        for script in model.scripts:
            for p in [*script.signature_chunks, *script.code_chunks]:
                p.requires_grad_(True)
        for p in [*model.cls.parameters(), *model.heads.parameters()]:
            p.requires_grad_(True)
    return model


def adapt(pretrained: nn.Module, kmnist: dict, n: int, config: DigitsConfig, seed: int = 0,
          mode: str = "all", resample: bool = False, num_functions: int | None = None) -> float:  # fmt: skip
    """Finetune a copy on ``n`` class-balanced K-MNIST samples (unaugmented, NI §4.2) for
    ``finetune_epochs``; return the accuracy on the disjoint K-MNIST evaluation set.
    See :func:`prepare_adaptation` for ``mode``, ``resample`` and ``num_functions``."""
    model = prepare_adaptation(pretrained, config, seed, mode, resample, num_functions)
    device = next(model.parameters()).device
    lr = config.capacity_lr if mode == "functions" else config.finetune_lr
    idx = balanced_sample(kmnist["y_pool"], n, seed=config.seed + seed)
    x_train, y_train = kmnist["x_pool"][idx], kmnist["y_pool"][idx]
    prep = Preprocess()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=config.weight_decay)
    steps = max(1, config.finetune_epochs * -(-n // config.finetune_batch_size))
    sched = warmup_cosine(opt, steps, 0)
    g = torch.Generator().manual_seed(config.seed + seed)
    for _ in range(config.finetune_epochs):
        model.train()
        for b in minibatches(n, config.finetune_batch_size, g, drop_last=False):
            with autocast(device):
                logits = model(prep(x_train[b].to(device)))[:, 0].float()
            loss = F.cross_entropy(logits, y_train[b].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    pred = predict(model, kmnist["x_eval"])[:, 0].argmax(-1)
    return (pred == kmnist["y_eval"]).float().mean().item()


def drop_functions(
    model: NeuralInterpreter, data: DigitsData, counts, trials: int, seed: int = 0
) -> dict:
    """Accuracy per dataset with ``k`` functions masked at random at test time (Fig. 5c)."""
    g = torch.Generator().manual_seed(seed)
    U = model.scripts[0].num_functions
    out = {}
    for k in counts:
        accs = []
        for _ in range(trials if k > 0 else 1):
            mask = torch.ones(U, dtype=torch.bool)
            mask[torch.randperm(U, generator=g)[:k]] = False
            accs.append(
                evaluate(model, data, function_mask=mask.to(next(model.parameters()).device))
            )
        out[k] = {name: [a[name] for a in accs] for name in data.names}
    return out


def anytime(model: NeuralInterpreter, data: DigitsData, iterations) -> dict:
    """Accuracy per dataset when running ``n`` function iterations at test time (Fig. 8)."""
    return {n: evaluate(model, data, num_iterations=n) for n in iterations}


@torch.no_grad()
def inferred_types(model: NeuralInterpreter, images: Tensor) -> tuple[Tensor, Tensor]:
    """Types ``(n_i, N*T, d_type)`` at each iteration of the first script, and the index of the
    closest signature ``(n_i, N*T)`` (Fig. 4)."""
    model.eval()
    device = next(model.parameters()).device
    out = model(Preprocess()(images.to(device)), return_routing=True)
    types = out.types[0].float().cpu()  # (N, n_i, T, d_type)
    types = types.transpose(0, 1).flatten(1, 2)
    closest = (types @ model.scripts[0].signatures.float().cpu().T).argmax(-1)
    return types, closest


# ----------------------------------------------------------------------------- the whole run


def pretrained_model(kind: str, config: DigitsConfig, data: DigitsData, device, show_progress=True,
                     cache: bool = True, resume: bool = False) -> tuple[nn.Module, dict]:  # fmt: skip
    """Pretrain ``kind`` ("ni" or "vit"), or load it from an atomic checkpoint of the same config."""
    path = checkpoint_dir() / f"digits_{kind}_{config.key(kind)}.pt"
    seed_everything(config.seed)
    model = (build_ni if kind == "ni" else build_vit)(config).to(device)
    if cache and path.exists():
        state = torch.load(path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        return model, state["history"]
    lr = config.lr if kind == "ni" else config.vit_lr
    state = path.with_suffix(".train.pt") if cache else None
    history = pretrain(model, data, config, lr, f"pretraining {kind.upper()}", show_progress,
                       state, resume)  # fmt: skip
    if cache and distributed.is_main():
        save_checkpoint({"model": model.state_dict(), "history": history}, path)
    distributed.barrier()
    return model, history


def run(config: DigitsConfig | None = None, profile: str | None = None, show_progress: bool = True,
        keep_models: bool = False, cache: bool = True, root=None, verify: bool = True,
        resume: bool = False) -> dict:  # fmt: skip
    """Every part of the experiment; returns a JSON-serialisable dict (plus models on request).
    ``resume`` continues an interrupted pretraining from its checkpoint."""
    profile = get_profile(profile)
    config = select(CONFIGS, profile) if config is None else config
    device = distributed.local_device() if distributed.is_distributed() else default_device()
    start = time.perf_counter()
    data = load_pretraining_data(config, root, verify)
    kmnist = load_kmnist_data(config, root, verify)
    results: dict = {"profile": profile, "device": str(device), "config": asdict(config),
                     "datasets": list(data.names)}  # fmt: skip
    models = {}
    for kind in ("ni", "vit"):
        model, history = pretrained_model(kind, config, data, device, show_progress, cache,
                                          resume)  # fmt: skip
        models[kind] = model
        results[kind] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "history": history,
            "val_acc": evaluate(model, data),
        }
    ni, vit = models["ni"], models["vit"]

    adaptation = {"NI": {}, "ViT": {}, "NI (re-sampled functions)": {}}
    runs = [(n, s) for n in config.sample_counts for s in range(config.adaptation_seeds)]
    bar = progress(total=3 * len(runs), desc="K-MNIST adaptation", disable=not show_progress)
    for n, s in runs:
        for name, model, resample in (
            ("NI", ni, False),
            ("ViT", vit, False),
            ("NI (re-sampled functions)", ni, True),
        ):
            adaptation[name].setdefault(n, []).append(
                adapt(model, kmnist, n, config, s, resample=resample)
            )
            bar.update(1)
    bar.close()
    results["adaptation"] = adaptation

    n_cap = max(config.sample_counts)
    results["capacity"] = {
        u: [
            adapt(ni, kmnist, n_cap, config, s, mode="functions", num_functions=u)
            for s in range(config.adaptation_seeds)
        ]
        for u in config.capacity_functions
    }
    U = ni.scripts[0].num_functions
    results["drop"] = drop_functions(ni, data, range(0, U), config.drop_trials, config.seed)
    n_i = ni.config.num_iterations
    results["anytime"] = anytime(ni, data, range(0, 2 * n_i + 1))
    results["seconds"] = time.perf_counter() - start
    if keep_models:
        results["models"] = models
        results["data"] = data
        results["kmnist"] = kmnist
    return results


def format_summary(results: dict) -> str:
    lines = [f"profile: {results['profile']}  ({results['seconds']:.0f} s)"]
    for kind in ("ni", "vit"):
        acc = " ".join(f"{DATASET_NAMES[k]} {v:.3f}" for k, v in results[kind]["val_acc"].items())
        lines.append(
            f"{kind.upper():<4} {results[kind]['parameters']:>9,} parameters  validation: {acc}"
        )
    lines.append("K-MNIST accuracy after adaptation (mean over seeds):")
    lines.append(f"{'samples':>8} " + " ".join(f"{name:>26}" for name in results["adaptation"]))
    counts = list(next(iter(results["adaptation"].values())).keys())
    for n in counts:
        row = " ".join(
            f"{np.mean(results['adaptation'][name][n]):>26.3f}" for name in results["adaptation"]
        )
        lines.append(f"{n:>8} {row}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    experiment_main(run, format_summary, __doc__, argv)


if __name__ == "__main__":
    main()
