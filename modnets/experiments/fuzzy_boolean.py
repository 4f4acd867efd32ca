"""NI §4.1: learning fuzzy Boolean expressions with reusable functions (NI Table 1).

Pretrain a Neural Interpreter to regress 20 fuzzy Boolean functions of 5 variables at once: the
input set is the 5 variables (one token each, with learned positional embeddings) plus one CLS
token per function, read out by one shared regression head. Then give it 10 new functions, with 10
fresh CLS tokens, and finetune three sets of parameters:

* ``cls``  -- the CLS tokens only;
* ``type`` -- + type matching: the type-inference MLP, the signatures and the kernel bandwidth;
* ``all``  -- every parameter.

If the pretrained functions are reusable primitives, re-routing alone (``type``) should come close
to finetuning everything (``all``).

Run ``python -m modnets.experiments.fuzzy_boolean --profile cpu --out results.json``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from modnets import distributed
from modnets.data.fuzzy_boolean import MultiTaskData, make_dataset, sample_functions
from modnets.experiments.cli import experiment_main
from modnets.experiments.results import load_results, save_results
from modnets.ni import NeuralInterpreter, NIConfig
from modnets.profiles import get_profile, select
from modnets.training import (
    ResumableLoop,
    checkpoint_dir,
    maybe_compile,
    r2_score,
    trainable_parameters,
    warmup_cosine,
)
from modnets.utils import default_device, progress, seed_everything

__all__ = [
    "FuzzyBooleanConfig",
    "CONFIGS",
    "REGIMES",
    "PAPER_TABLE_1",
    "build_model",
    "set_trainable",
    "train",
    "run",
    "format_table",
    "save_results",
    "load_results",
]

REGIMES = ("cls", "type", "all")
REGIME_NAMES = {
    "pretrain": "All parameters (pretraining)",
    "cls": "Finetuning CLS tokens",
    "type": "+ type inference parameters",
    "all": "+ remaining parameters",
}
#: NI Table 1: mean and std of R^2 over the functions.
PAPER_TABLE_1 = {
    "pretrain": (0.9983, 0.0005),
    "cls": (0.9202, 0.0198),
    "type": (0.9857, 0.0034),
    "all": (0.9953, 0.0013),
}


@dataclass(frozen=True)
class FuzzyBooleanConfig:
    """Sizes of one run. The paper gives the data sizes and epochs; its Appendix B (the model and
    optimiser) is missing from our copy, so those are our choices."""

    points_per_function: int = 163_840
    num_pretrain_functions: int = 20
    num_finetune_functions: int = 10
    num_variables: int = 5
    pretrain_epochs: int = 20
    finetune_epochs: int = 3
    batch_size: int = 256
    lr: float = 1e-3
    finetune_lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_fraction: float = 0.05
    seed: int = 0
    model: dict = field(default_factory=dict)

    def model_config(self) -> NIConfig:
        base = dict(
            dim=64, type_dim=8, num_functions=6, num_scripts=1, num_iterations=2, num_locs=1,
            num_heads=4, mlp_hidden=128, truncation=1.0, input_kind="vector",
            num_elements=self.num_variables, num_cls=self.num_pretrain_functions, num_outputs=1,
            shared_head=True,
        )  # fmt: skip
        return NIConfig(**{**base, **self.model})


CONFIGS = {
    "smoke": FuzzyBooleanConfig(
        points_per_function=1000, pretrain_epochs=2, finetune_epochs=1, batch_size=100,
        model=dict(dim=16, num_functions=3, num_heads=2, mlp_hidden=32),
    ),
    # About 8 minutes on two CPU cores: 8x fewer points and fewer epochs than the paper.
    "cpu": FuzzyBooleanConfig(
        points_per_function=20_000, pretrain_epochs=10, finetune_epochs=3, batch_size=64,
        lr=2e-3, finetune_lr=4e-3,
    ),
    "gpu": FuzzyBooleanConfig(),
}  # fmt: skip


def build_model(config: FuzzyBooleanConfig) -> NeuralInterpreter:
    return NeuralInterpreter(config.model_config())


def set_trainable(model: NeuralInterpreter, regime: str) -> int:
    """Freeze everything but the parameters of ``regime``; return the trainable count.

    ``cls``: CLS tokens. ``type``: + type-inference MLPs, signatures and kernel bandwidths of every
    script. ``all``: everything (signatures included).
    """
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")
    for p in model.parameters():
        p.requires_grad_(regime == "all")
    model.cls.tokens.requires_grad_(True)
    if regime == "type":
        for script in model.scripts:
            script.iteration.type_inference.requires_grad_(True)
            script.iteration.type_matching.requires_grad_(True)
            for sig in script.signature_chunks:
                sig.requires_grad_(True)
    return trainable_parameters(model)


def target_scaler(data: MultiTaskData) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-function mean and std of the training targets.

    Fuzzy DNF targets have a small variance under uniform inputs (about 0.01), and a model trained
    on them raw tends to stall at predicting the mean; it learns on standardised targets.
    """
    return data.y_train.mean(0), data.y_train.std(0)


@torch.no_grad()
def evaluate(model: nn.Module, data: MultiTaskData, batch_size: int = 4096) -> torch.Tensor:
    """R^2 per function on the validation split, on the original scale of the targets.

    The model predicts standardised targets; mapping its predictions back by the same affine map
    leaves R^2 unchanged, so this is also the R^2 on the standardised scale.
    """
    model.eval()
    mu, sd = target_scaler(data)
    device = next(model.parameters()).device
    x = data.x_val
    preds = [
        model(x[i : i + batch_size].to(device))[..., 0].float().cpu()
        for i in range(0, len(x), batch_size)
    ]
    return r2_score(torch.cat(preds) * sd + mu, data.y_val).float()


def train(
    model: nn.Module,
    data: MultiTaskData,
    epochs: int,
    lr: float,
    config: FuzzyBooleanConfig,
    desc: str = "training",
    show_progress: bool = True,
    state_path: str | Path | None = None,
    resume: bool = False,
) -> dict:
    """Train the trainable parameters on standardised targets; return a history dict.

    With ``state_path`` the training state is checkpointed (every 500 steps, at the end, on
    Ctrl-C) and ``resume`` continues from it (:class:`~modnets.training.ResumableLoop`).
    """
    device = next(model.parameters()).device
    mu, sd = target_scaler(data)
    x_train, y_train = data.x_train.to(device), ((data.y_train - mu) / sd).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=config.weight_decay)
    steps_per_epoch = len(x_train) // config.batch_size
    total = max(1, epochs * steps_per_epoch)
    sched = warmup_cosine(opt, total, int(config.warmup_fraction * total))
    history = {"step": [], "loss": [], "epoch": [], "val_r2": []}
    net = maybe_compile(distributed.wrap(model))  # DDP under torchrun: each rank its shard
    objects = {"model": model, "optimizer": opt, "scheduler": sched}
    with ResumableLoop(state_path, objects, history, {**asdict(config), "stage": desc},
                       config.seed, 500, resume, enabled=distributed.is_main()) as loop:  # fmt: skip
        bar = progress(total=total, initial=loop.step, desc=desc,
                       disable=not (show_progress and distributed.is_main()))  # fmt: skip
        for _ in loop.epochs(epochs):
            model.train()
            for idx in loop.minibatches(len(x_train), config.batch_size):
                idx = distributed.shard(idx).to(device)
                loss = F.mse_loss(net(x_train[idx])[..., 0], y_train[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                step = loop.step + 1
                if step % max(1, total // 200) == 0 or step == total:
                    history["step"].append(step)
                    history["loss"].append(loss.item())
                loop.step_done()
                bar.update(1)
            r2 = evaluate(model, data)
            history["epoch"].append(len(history["epoch"]) + 1)
            history["val_r2"].append(r2.mean().item())
            bar.set_postfix(val_r2=f"{r2.mean().item():.4f}", refresh=False)
            loop.epoch_done()
        bar.close()
    return history


def _state_path(config: FuzzyBooleanConfig, stage: str) -> Path:
    blob = json.dumps(asdict(config), sort_keys=True, default=str)
    key = hashlib.sha1(blob.encode()).hexdigest()[:10]
    return checkpoint_dir() / f"fuzzy_boolean_{stage}_{key}.train.pt"


def run(
    config: FuzzyBooleanConfig | None = None,
    profile: str | None = None,
    show_progress: bool = True,
    keep_models: bool = False,
    resume: bool = False,
) -> dict:
    """The whole experiment: pretrain, then finetune each regime from the same weights.

    Training states are checkpointed under :func:`modnets.training.checkpoint_dir`; with
    ``resume`` each stage continues from its checkpoint (a finished stage is just reloaded).

    Returns a JSON-serialisable dict (R^2 per function, learning curves, trainable-parameter
    counts, timings). With ``keep_models`` it also holds the trained models under ``"models"``.
    """
    profile = get_profile(profile)
    config = select(CONFIGS, profile) if config is None else config
    device = distributed.local_device() if distributed.is_distributed() else default_device()
    seed_everything(config.seed)
    k_pre, k_new = config.num_pretrain_functions, config.num_finetune_functions
    functions = sample_functions(k_pre + k_new, config.num_variables, seed=config.seed)
    pre_data = make_dataset(functions[:k_pre], config.points_per_function, seed=config.seed + 1)
    new_data = make_dataset(functions[k_pre:], config.points_per_function, seed=config.seed + 2)

    model = build_model(config).to(device)
    results: dict = {"profile": profile, "device": str(device), "config": asdict(config)}
    start = time.perf_counter()
    history = train(model, pre_data, config.pretrain_epochs, config.lr, config, "pretraining",
                    show_progress, _state_path(config, "pretrain"), resume)  # fmt: skip
    r2 = evaluate(model, pre_data)
    results["pretrain"] = {
        "r2": r2.tolist(),
        "history": history,
        "seconds": time.perf_counter() - start,
    }
    pretrained = copy.deepcopy(model.state_dict())
    models = {"pretrain": model}

    for regime in REGIMES:
        seed_everything(config.seed + 100)
        ft = build_model(config).to(device)
        ft.load_state_dict(pretrained)
        ft.reset_cls_tokens(k_new)
        ft.to(device)
        n_trainable = set_trainable(ft, regime)
        start = time.perf_counter()
        history = train(ft, new_data, config.finetune_epochs, config.finetune_lr, config,
                        f"finetune [{regime}]", show_progress, _state_path(config, regime),
                        resume)  # fmt: skip
        r2 = evaluate(ft, new_data)
        results[regime] = {
            "r2": r2.tolist(),
            "history": history,
            "trainable_parameters": n_trainable,
            "seconds": time.perf_counter() - start,
        }
        models[regime] = ft
    results["functions"] = functions.tables.int().tolist()
    if keep_models:
        results["models"] = models
    return results


def summary(results: dict) -> list[tuple[str, float, float, float, float]]:
    """Rows ``(setting, our mean, our std, paper mean, paper std)``."""
    rows = []
    for key in ("pretrain", *REGIMES):
        r2 = torch.tensor(results[key]["r2"])
        rows.append((REGIME_NAMES[key], r2.mean().item(), r2.std().item(), *PAPER_TABLE_1[key]))
    return rows


def format_table(results: dict) -> str:
    lines = [
        f"R^2 on validation data, mean +- std over functions (profile: {results['profile']})",
        f"{'parameter set':<32} {'this run':>18} {'NI Table 1':>18}",
    ]
    for name, m, s, pm, ps in summary(results):
        lines.append(f"{name:<32} {m:>9.4f} +- {s:.4f} {pm:>9.4f} +- {ps:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    experiment_main(run, format_table, __doc__, argv, cache=False)


if __name__ == "__main__":
    main()
