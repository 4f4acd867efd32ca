"""NAC §4.1 on Tiny-ImageNet: NAC vs Perceiver IO, then dropping modules at inference time.

* Table 1 -- train a NAC (a graph prior, scale-free by default) and a Perceiver IO with the same
  convolutional tokeniser (App. C) and budget; report top-1 / top-5 validation accuracy.
* Fig. 5a / 15 -- drop 0-90 % of the NAC's processor modules, least connected first (App. F,
  ``q_i = sum_j P_ij``), against Perceiver IO with the same fraction of latents dropped at random;
  accuracy vs modules dropped and vs GFLOPs per sample.
* Fig. 5b -- measured inference throughput (samples/s, ``torch.inference_mode``, batch 64) as
  modules are dropped: the dropped model is smaller, so compute really shrinks.
* Fig. 10 -- accuracy as the smallest link probabilities ``P_ij`` are set to 0.

Run ``python -m modnets.experiments.tiny_imagenet --profile cpu --out results.json``. Trained
models are checkpointed (atomically) under :func:`modnets.training.checkpoint_dir`, keyed by
their configuration, so the analysis re-runs without retraining.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from modnets import distributed
from modnets.baselines import PerceiverIO
from modnets.benchmarks import median_time
from modnets.data.tiny_imagenet import TinyImageNetAugment, load_tiny_imagenet, normalize
from modnets.experiments.cli import experiment_main
from modnets.nac import NACConfig, NeuralAttentiveCircuit
from modnets.nn.tokens import ConvTokenizer
from modnets.profiles import get_profile, select
from modnets.training import (
    ResumableLoop,
    autocast,
    checkpoint_dir,
    maybe_compile,
    save_checkpoint,
    warmup_cosine,
)
from modnets.utils import default_device, progress, seed_everything

__all__ = [
    "TinyImageNetConfig",
    "CONFIGS",
    "PAPER",
    "load_data",
    "build_model",
    "train",
    "evaluate",
    "drop_curve",
    "edge_curve",
    "throughput",
    "gflops_per_sample",
    "trained_model",
    "run",
]

#: NAC Table 1 (Tiny-ImageNet validation, 200 classes, 400 epochs) and the §4.1 / App. F claims.
PAPER = {
    "Perceiver IO": {"top1": 58.89, "top5": 80.09},
    "NAC (scale_free)": {"top1": 60.76, "top5": 80.86},
    "NAC (planted_partition)": {"top1": 60.71, "top5": 81.34},
    "NAC (ring_of_cliques)": {"top1": 60.54, "top5": 81.18},
    "NAC (erdos_renyi)": {"top1": 60.33, "top5": 81.08},
    "claims": {
        "drop": "over 80 % of modules dropped at < 3 % accuracy cost (Fig. 5a)",
        "speedup": "~8x inference speed-up with > 80 % of modules dropped (Fig. 5b, A100)",
        "edges": "~90 % of connections removed with only a marginal loss (Fig. 10)",
    },
}


@dataclass(frozen=True)
class TinyImageNetConfig:
    """Sizes of one run. ``gpu`` is NAC Table 4; ``cpu`` and ``smoke`` shrink the data (20 classes
    with all their 500 training images), the width, the depth, the modules and the epochs."""

    classes: int | None = None  # the first n wnids of wnids.txt (None: all 200)
    max_train_per_class: int | None = None
    max_val_per_class: int | None = None
    epochs: int = 400
    warmup_epochs: int = 25
    batch_size: int = 1024
    nac_lr: float = 3e-4 * 2  # Table 4's base rates are for batch 512; scaled linearly
    pio_lr: float = 5e-4 * 2
    min_lr: float = 1e-5 * 2
    weight_decay: float = 0.05
    graph_weight: float = 1.0  # times the *mean* squared deviation of eq. 6 over pairs
    augment: str | None = "gpu"  # smoke/cpu: crop + flip; gpu: + RandAugment; None: no augmentation
    mixup: float = 0.0
    cutmix: float = 0.0
    priors: tuple[str, ...] = ("scale_free",)
    tokenizer: dict = field(default_factory=lambda: {"hidden_channels": 96,
                                                     "out_channels": 384, "pos_dim": 64})  # fmt: skip
    nac: dict = field(default_factory=dict)  # NACConfig overrides (defaults: Table 4)
    drop_fractions: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    edge_fractions: tuple[float, ...] = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0)
    throughput_batch: int = 64
    throughput_repeats: int = 5
    eval_batch: int = 256
    seed: int = 0

    def nac_config(self, prior: str | None = "scale_free") -> NACConfig:
        tok = ConvTokenizer(**self.tokenizer)
        return NACConfig(input_dim=tok.out_dim, num_outputs=self.classes or 200,
                         **{"prior": prior, **self.nac})  # fmt: skip

    def key(self, kind: str) -> str:
        """A short hash of everything that determines a trained model (for checkpoints)."""
        skip = ("drop_fractions", "edge_fractions", "throughput", "eval_batch", "priors")
        relevant = {k: v for k, v in asdict(self).items() if not k.startswith(skip)}
        blob = json.dumps({"model": kind, **relevant}, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:10]


CONFIGS = {
    "smoke": TinyImageNetConfig(
        classes=4, max_train_per_class=32, max_val_per_class=8, epochs=1, warmup_epochs=0,
        batch_size=32, nac_lr=1e-3, pio_lr=1e-3, min_lr=1e-5, augment="smoke",
        tokenizer={"hidden_channels": 8, "out_channels": 16, "pos_dim": 8},
        nac=dict(dim=16, num_layers=1, num_processors=10, num_readouts=2, num_heads=2,
                 ffn_hidden=32, sig_dim=4, code_dim=8),
        drop_fractions=(0.0, 0.5, 0.8, 0.9), edge_fractions=(0.0, 0.9), throughput_batch=8,
        throughput_repeats=1, eval_batch=64,
    ),
    # About 15 minutes on two CPU cores: 20 classes (10,000 train / 1,000 val images), a quarter
    # of Table 4's width and depth, 64 processor modules, 8 epochs. The short schedule takes a
    # higher learning rate than Table 4's and no warm-up epochs beyond one.
    "cpu": TinyImageNetConfig(
        classes=20, epochs=8, warmup_epochs=1, batch_size=64, nac_lr=1e-3, pio_lr=1e-3,
        min_lr=1e-5, augment="cpu",
        tokenizer={"hidden_channels": 32, "out_channels": 64, "pos_dim": 32},
        nac=dict(dim=96, num_layers=4, num_processors=64, num_readouts=8, num_heads=4,
                 ffn_hidden=192, sig_dim=16, code_dim=48),
    ),
    "gpu": TinyImageNetConfig(mixup=0.8, cutmix=1.0,
                              priors=("scale_free", "planted_partition", "ring_of_cliques",
                                      "erdos_renyi")),
}  # fmt: skip


# ----------------------------------------------------------------------------- data and models


@dataclass
class Data:
    x_train: Tensor  # (N, 3, 64, 64) uint8
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    class_names: list[str]


def load_data(config: TinyImageNetConfig, root=None) -> Data:
    """The train and val splits of the configured class subset (uint8 images)."""
    train = load_tiny_imagenet(
        "train", config.classes, root, max_per_class=config.max_train_per_class
    )
    val = load_tiny_imagenet("val", config.classes, root, max_per_class=config.max_val_per_class)
    return Data(train.images, train.labels, val.images, val.labels, train.class_names)


def build_model(
    kind: str, config: TinyImageNetConfig, prior: str | None = "scale_free"
) -> nn.Module:
    """``"nac"`` (with the graph ``prior``) or ``"pio"``, each with the App. C tokeniser."""
    nac_cfg = config.nac_config(prior)
    tokenizer = ConvTokenizer(**config.tokenizer)
    if kind == "nac":
        return NeuralAttentiveCircuit(nac_cfg, tokenizer)
    if kind == "pio":
        return PerceiverIO(nac_cfg, tokenizer)
    raise ValueError(f"kind must be 'nac' or 'pio', got {kind!r}")


# ----------------------------------------------------------------------------- training


def _graph_penalty(model: nn.Module) -> Tensor | None:
    if isinstance(model, NeuralAttentiveCircuit) and model.graph_prior is not None:
        U = model.config.num_processors
        return model.graph_loss() / (U * (U - 1))  # eq. 6 as a mean over ordered pairs
    return None


def train(model: nn.Module, data: Data, config: TinyImageNetConfig, lr: float, desc: str = "training",
          show_progress: bool = True, state_path: str | Path | None = None, resume: bool = False,
          save_every: int = 200) -> dict:  # fmt: skip
    """AdamW with a warm-up + cosine schedule, no weight decay on vectors, codes or signatures
    (NAC App. C, Table 4); the NAC adds ``graph_weight`` times its graph-prior regulariser.

    With ``state_path``, the full training state (model, optimiser, scheduler, RNGs, the position
    in the epoch) is saved there every ``save_every`` steps, at the end and on Ctrl-C; ``resume``
    continues from it, ending bit for bit where an uninterrupted run ends (on CPU).
    """
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    num_classes = config.classes or 200
    augment = None
    if config.augment is not None:
        augment = TinyImageNetAugment(config.augment, mixup=config.mixup, cutmix=config.cutmix,
                                      num_classes=num_classes)  # fmt: skip
    opt = torch.optim.AdamW(model.parameter_groups(config.weight_decay), lr=lr)
    per_epoch = max(1, len(data.x_train) // config.batch_size)
    steps = config.epochs * per_epoch
    sched = warmup_cosine(opt, steps, config.warmup_epochs * per_epoch, floor=config.min_lr / lr)
    history = {"step": [], "loss": [], "graph": [], "epoch": [], "val_top1": []}
    net = maybe_compile(distributed.wrap(model))  # DDP under torchrun: each rank its shard
    objects = {"model": model, "optimizer": opt, "scheduler": sched}
    with ResumableLoop(state_path, objects, history, asdict(config), config.seed, save_every,
                       resume, enabled=distributed.is_main()) as loop:  # fmt: skip
        bar = progress(total=steps, initial=loop.step, desc=desc,
                       disable=not (show_progress and distributed.is_main()))  # fmt: skip
        for _ in loop.epochs(config.epochs):
            model.train()
            for idx in loop.minibatches(len(data.x_train), config.batch_size):
                idx = distributed.shard(idx)
                x, y = data.x_train[idx].to(device), data.y_train[idx].to(device)
                if augment is None:
                    x, soft = normalize(x), F.one_hot(y, num_classes).float()
                else:
                    x, soft = augment(x, y)
                x = x.to(dtype)  # a float64 model (e.g. in tests) gets float64 images
                with autocast(device):
                    logits = net(x)
                loss = torch.sum(-soft * F.log_softmax(logits.float(), -1), -1).mean()
                penalty = _graph_penalty(model)
                total = loss if penalty is None else loss + config.graph_weight * penalty
                opt.zero_grad(set_to_none=True)
                total.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                step = loop.step + 1
                if step % max(1, steps // 100) == 0 or step == steps:
                    mean_loss = distributed.all_reduce_sum(loss.item()) / distributed.world_size()
                    history["step"].append(step)
                    history["loss"].append(mean_loss)
                    history["graph"].append(None if penalty is None else penalty.item())
                loop.step_done()
                bar.update(1)
            top1 = evaluate(model, data.x_val, data.y_val, config.eval_batch)["top1"]
            history["epoch"].append(len(history["epoch"]) + 1)
            history["val_top1"].append(top1)
            bar.set_postfix(val_top1=f"{top1:.3f}", refresh=False)
            loop.epoch_done()
        bar.close()
    return history


@torch.no_grad()
def evaluate(
    model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 256, **forward_kwargs
) -> dict:
    """Top-1 and top-5 accuracy on uint8 images (evaluation mode, no augmentation)."""
    model.eval()
    device = next(model.parameters()).device
    top1 = top5 = 0
    for i in range(0, len(x), batch_size):
        with autocast(device):
            xb = normalize(x[i : i + batch_size].to(device)).to(next(model.parameters()).dtype)
            logits = model(xb, **forward_kwargs).float()
        target = y[i : i + batch_size].to(device)
        best = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        top1 += (best[:, 0] == target).sum().item()
        top5 += (best == target[:, None]).any(-1).sum().item()
    return {"top1": top1 / len(x), "top5": top5 / len(x)}


def trained_model(kind: str, config: TinyImageNetConfig, data: Data, device, prior: str | None = "scale_free",
                  show_progress: bool = True, cache: bool = True,
                  resume: bool = False) -> tuple[nn.Module, dict]:  # fmt: skip
    """Train ``kind`` ("nac" or "pio"), or load it from a checkpoint of the same configuration."""
    tag = f"{kind}_{prior}" if kind == "nac" else kind
    path = checkpoint_dir() / f"tiny_imagenet_{tag}_{config.key(tag)}.pt"
    seed_everything(config.seed)
    model = build_model(kind, config, prior).to(device)
    if cache and path.exists():
        state = torch.load(path, map_location=device, weights_only=False)
        try:
            model.load_state_dict(state["model"])
            return model, state["history"]
        except RuntimeError as err:  # written by another version of the model: train afresh
            warnings.warn(f"checkpoint {path} does not fit this model ({str(err)[:200]}); "
                          "retraining", stacklevel=2)  # fmt: skip
            seed_everything(config.seed)
            model = build_model(kind, config, prior).to(device)
    lr = config.nac_lr if kind == "nac" else config.pio_lr
    name = f"NAC ({prior})" if kind == "nac" else "Perceiver IO"
    state = path.with_suffix(".train.pt") if cache else None
    history = train(model, data, config, lr, f"training {name}", show_progress, state, resume)
    if cache and distributed.is_main():
        save_checkpoint(
            {"model": model.state_dict(), "history": history, "config": asdict(config)}, path
        )
    distributed.barrier()
    return model, history


# ----------------------------------------------------------------------------- analysis (App. F)


def _num_dropped(fraction: float, total: int) -> int:
    return min(total - 1, round(fraction * total))


def pruned(model: nn.Module, fraction: float, seed: int = 0) -> nn.Module:
    """The NAC without its least connected ``fraction`` of processor modules, or the Perceiver
    IO without a random ``fraction`` of its latents."""
    n = _num_dropped(fraction, model.config.num_processors)
    if isinstance(model, NeuralAttentiveCircuit):
        return model.drop_modules(n)
    return model.drop_latents(n, seed=seed)


def drop_curve(model: nn.Module, data: Data, fractions, batch_size: int = 256) -> list[dict]:
    """Accuracy with each fraction of processor modules (latents) dropped (Fig. 5a)."""
    out = []
    for f in fractions:
        small = pruned(model, f)
        out.append({"fraction": f, "modules": small.config.num_processors,
                    **evaluate(small, data.x_val, data.y_val, batch_size)})  # fmt: skip
    return out


def edge_curve(
    model: NeuralAttentiveCircuit, data: Data, fractions, batch_size: int = 256
) -> list[dict]:
    """Accuracy as the smallest ``P_ij`` are set to 0 (Fig. 10)."""
    return [{"fraction": f, **evaluate(model.eliminate_edges(f), data.x_val, data.y_val, batch_size)}
            for f in fractions]  # fmt: skip


@torch.inference_mode()
def throughput(model: nn.Module, batch: int = 64, repeats: int = 5, warmup: int = 2) -> float:
    """Samples per second at ``batch`` (median of ``repeats`` timed forward passes)."""
    model.eval()
    device = next(model.parameters()).device
    x = torch.randn(batch, 3, 64, 64, device=device)

    def forward():
        with autocast(device):
            model(x)

    return batch / median_time(forward, repeats, warmup, device)


def gflops_per_sample(model: nn.Module, batch: int = 4) -> float:
    """Forward GFLOPs per sample, counted by ``torch.utils.flop_counter`` (matmuls, convs,
    attention; elementwise operations are not counted)."""
    model.eval()
    device = next(model.parameters()).device
    x = torch.randn(batch, 3, 64, 64, device=device)
    with FlopCounterMode(display=False) as counter:  # (under no_grad its module hooks fail)
        model(x)
    return counter.get_total_flops() / batch / 1e9


def speed_curve(model: nn.Module, fractions, batch: int, repeats: int) -> list[dict]:
    """Throughput and GFLOPs per sample with each fraction dropped (Fig. 5b, Fig. 15)."""
    out = []
    for f in fractions:
        small = pruned(model, f)
        out.append({"fraction": f, "samples_per_s": throughput(small, batch, repeats),
                    "gflops": gflops_per_sample(small)})  # fmt: skip
    return out


# ----------------------------------------------------------------------------- the experiment


def run(config: TinyImageNetConfig | None = None, profile: str | None = None, show_progress: bool = True,
        keep_models: bool = False, cache: bool = True, root=None, resume: bool = False) -> dict:  # fmt: skip
    """Train (or load) the models and run every analysis; a JSON-serialisable dict. ``resume``
    continues an interrupted training from its checkpoint."""
    profile = get_profile(profile)
    config = select(CONFIGS, profile) if config is None else config
    device = distributed.local_device() if distributed.is_distributed() else default_device()
    start = time.perf_counter()
    data = load_data(config, root)
    results: dict = {"profile": profile, "device": str(device), "config": asdict(config),
                     "train_images": len(data.x_train), "val_images": len(data.x_val),
                     "classes": len(data.class_names), "paper": PAPER, "models": {}}  # fmt: skip
    models = {}
    runs = [("pio", None)] + [("nac", p) for p in config.priors]
    for kind, prior in runs:
        name = "Perceiver IO" if kind == "pio" else f"NAC ({prior})"
        t0 = time.perf_counter()
        model, history = trained_model(kind, config, data, device, prior, show_progress, cache,
                                       resume)  # fmt: skip
        models[name] = model
        entry = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "history": history,
            "train_or_load_seconds": time.perf_counter() - t0,
            **evaluate(model, data.x_val, data.y_val, config.eval_batch),
        }
        entry["drop"] = drop_curve(model, data, config.drop_fractions, config.eval_batch)
        entry["speed"] = speed_curve(model, config.drop_fractions, config.throughput_batch,
                                     config.throughput_repeats)  # fmt: skip
        if kind == "nac":
            entry["edges"] = edge_curve(model, data, config.edge_fractions, config.eval_batch)
            entry["importance"] = model.module_importance().cpu().tolist()
            entry["link_probabilities"] = model.link_probabilities().detach().cpu().tolist()
        results["models"][name] = entry
    results["seconds"] = time.perf_counter() - start
    if keep_models:
        results["trained"] = models
        results["data"] = data
    return results


def format_summary(results: dict) -> str:
    lines = [f"profile: {results['profile']}  ({results['seconds']:.0f} s), "
             f"{results['classes']} classes, {results['train_images']} train / "
             f"{results['val_images']} val images"]  # fmt: skip
    for name, r in results["models"].items():
        paper = results["paper"].get(name, {})
        lines.append(
            f"{name:<24} {r['parameters']:>10,} params  top-1 {r['top1']:.3f} top-5 {r['top5']:.3f}"
            f"   (paper, 200 classes: {paper.get('top1', '-')} / {paper.get('top5', '-')})"
        )
        drop, speed = r["drop"], r["speed"]
        for d, s in zip(drop, speed, strict=True):
            lines.append(
                f"    drop {d['fraction']:.0%}: {d['modules']:>4} modules  top-1 {d['top1']:.3f}  "
                f"{s['samples_per_s']:>8.1f} samples/s  {s['gflops']:.3f} GFLOPs"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    experiment_main(run, format_summary, __doc__, argv, exclude=("trained", "data"))


if __name__ == "__main__":
    main()
