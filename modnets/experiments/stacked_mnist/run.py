"""NFM §4.2, stacked MNIST (NFM Table 5): what the experiment measures at every claim seed
(``measure``; ``core.experiment.run`` makes the results of it).

Run ``python -m modnets.experiments.stacked_mnist --profile cpu --out results.json``.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import replace

import torch

from modnets import parallel
from modnets.data.stacked_mnist import noise_canvases
from modnets.experiments.core import harness
from modnets.experiments.core.experiment import Measurement
from modnets.experiments.core.options import RunOptions
from modnets.experiments.core.stats import per_seed, seed_stats
from modnets.experiments.stacked_mnist.analysis import held_out, ood_dips, read_matrix, traced_reads
from modnets.experiments.stacked_mnist.claims import _convergence
from modnets.experiments.stacked_mnist.config import MODEL_NAMES, StackedMNISTConfig
from modnets.experiments.stacked_mnist.data import inputs, load_test_canvases, training_data
from modnets.experiments.stacked_mnist.models import (
    build_model,
    evaluate,
    loss,
    pretrained_cnn,
    trained_model,
)
from modnets.models.nfm.attention import NFMAttention


def _train_task(config: StackedMNISTConfig, options: RunOptions, task: tuple) -> None:
    """Train (into checkpoints) what :func:`measure`'s loop loads for ``task = (seed, pool,
    kind)``: ``kind`` ("cnn", "nfm", or "pretrain": the CNN both go on from) with the head
    ``pool``."""
    seed, pool, kind = task
    config = replace(config, train=replace(config.train, pool=pool))
    if kind == "pretrain":
        pretrained_cnn(config, seed, options=options.quiet())
    else:
        trained_model(kind, config, seed, options=options.quiet())


def _tasks(config: StackedMNISTConfig) -> list[list[tuple]]:
    """:func:`_train_task`'s tasks in rounds that depend on the ones before: the CNNs that the
    finetuned models go on from first (when ``finetune_epochs``), then every model, NFM first."""
    heads = [
        (seed, pool) for seed in config.seeds for pool in (config.train.pool, *config.dip_pools)
    ]
    models = [(seed, config.train.pool, "nfm") for seed in config.seeds]
    models += [(seed, pool, "cnn") for seed, pool in heads]
    if not config.train.finetune_epochs:
        return [models]
    return [[(seed, pool, "pretrain") for seed, pool in heads], models]


def train_seeds(config: StackedMNISTConfig, options: RunOptions, data: dict | None = None) -> None:
    """Train (into checkpoints) the models of every seed of ``config`` side by side in
    ``options.workers`` processes, NFM(CNN)s first (each costs several CNNs); what is left over
    (fewer models of a kind than workers) :func:`measure` trains with every thread. An evidence
    run calls it with as many seeds as workers: an NFM(CNN) beside another seed's, never beside a
    CNN that would leave a core idle most of the time."""
    workers = options.workers or 1
    if data is None and options.cache and workers > 1 and config.train.finetune_epochs:
        data = training_data(config.train, options.root, options.verify)
    train = functools.partial(_train_task, config, options)
    rounds = _tasks(config)
    with parallel.keep_workers():  # started once for all the rounds
        for i, tasks in enumerate(rounds):
            for kind in dict.fromkeys(t[2] for t in tasks):
                same = [t for t in tasks if t[2] == kind]
                harness.train_ahead(train, same, options, "models", whole_rounds=True)
                # the next round goes on from these: the leftover (a lone pretraining) here
                if options.cache and workers > 1 and i < len(rounds) - 1:
                    for seed, pool, _ in same[len(same) - len(same) % workers :]:
                        head = replace(config, train=replace(config.train, pool=pool))
                        pretrained_cnn(head, seed, data, options)


def measure(config: StackedMNISTConfig, options: RunOptions) -> Measurement:
    """Train (or load) both models at every seed and test them on every digit count.

    ``models[name]["per_seed"]`` holds each seed's test accuracy per count (``exact``,
    ``label``), history and parameter count (:func:`summarise` adds
    ``models[name]["test"][count]["exact"]``, the accuracy summarised over seeds).
    ``diagnostics["per_seed"]`` holds the NFM reads (traced and as a read matrix), the gates
    ``gamma`` and the out-of-distribution dips of both models.
    The models train in ``options.workers`` processes.
    """
    root, verify = options.root, options.verify
    data = training_data(config.train, root, verify)
    held = held_out(config)
    models = {name: {"per_seed": []} for name in MODEL_NAMES.values()}
    diag_per_seed = []
    train_seeds(config, options, data)
    for seed in config.seeds:
        tests = load_test_canvases(config, root, verify, seed)
        diag = {"seed": seed, "ood_dip": {}}
        for kind, name in MODEL_NAMES.items():
            model, history = trained_model(kind, config, seed, data, options)
            test = {c: evaluate(model, ds, config.eval_batch) for c, ds in tests.items()}
            models[name]["per_seed"].append(
                {
                    "seed": seed,
                    "test": test,
                    "history": history,
                    "parameters": sum(p.numel() for p in model.parameters()),
                }
            )
            diag["ood_dip"][name] = ood_dips({c: r["exact"] for c, r in test.items()}, held)
            if kind == "nfm":
                diag.update(_nfm_reads(model, tests, config))
                # the mechanism the claims rely on: the same model with every read switched off
                silent = reads_off(model)
                models[name]["per_seed"][-1]["test_reads_off"] = {
                    c: evaluate(silent, ds, config.eval_batch) for c, ds in tests.items()
                }
        diag["convergence"] = {
            name: _convergence(models[name]["per_seed"][-1]["history"])
            for name in MODEL_NAMES.values()
        }
        # the other heads' plain CNN, by the same protocol: only its dip is wanted
        diag["heads"] = {
            config.train.pool: {
                "test": {c: r["exact"] for c, r in models["CNN"]["per_seed"][-1]["test"].items()},
                "ood_dip": diag["ood_dip"]["CNN"],
                "convergence": diag["convergence"]["CNN"],
            }
        }
        for pool in config.dip_pools:
            other = replace(config, train=replace(config.train, pool=pool))
            model, history = trained_model("cnn", other, seed, data, options)
            test = {c: evaluate(model, ds, config.eval_batch)["exact"] for c, ds in tests.items()}
            diag["heads"][pool] = {
                "test": test,
                "ood_dip": ood_dips(test, held),
                "convergence": _convergence(history),
            }
        diag_per_seed.append(diag)
    return Measurement(models, {"per_seed": diag_per_seed}, config, config.selection_seeds)


def reads_off(model):
    """A copy of an NFM(CNN) with every read switched off (each gate ``gamma = 0``, NFM eq. 3):
    its CNN alone, as NFM(CNN) trained it."""
    silent = copy.deepcopy(model)
    with torch.no_grad():
        for m in silent.modules():
            if isinstance(m, NFMAttention):
                m.gamma.zero_()
    return silent


def _nfm_reads(model, tests: dict, config: StackedMNISTConfig) -> dict:
    """What the NFM read on each test set (traced, and as a read matrix) and its gates."""
    nfm = model.nfm
    return {
        "nfm_reads": {c: traced_reads(model, ds, config.probe_canvases) for c, ds in tests.items()},
        "read_matrix": {
            c: read_matrix(model, ds, config.read_canvases, config.eval_batch)
            for c, ds in tests.items()
        },
        "gamma": [
            [nfm.attn(k, i).gamma.item() for i in range(nfm.num_blocks)] for k in range(nfm.passes)
        ],
    }


def summarise(config: StackedMNISTConfig, models: dict, diagnostics: dict) -> tuple[dict, dict]:
    """The summaries over seeds, from the per-seed entries: each model's accuracy per digit
    count, and the out-of-distribution dips of both models and of every head."""
    diag_per_seed = diagnostics["per_seed"]
    for entry in models.values():
        runs = entry["per_seed"]
        entry["parameters"] = runs[0]["parameters"]
        entry["test"] = {
            c: {m: seed_stats(per_seed(runs, "test", c, m)) for m in ("exact", "label")}
            for c in runs[0]["test"]
        }
    first = diag_per_seed[0]
    dips = {
        name: {
            c: seed_stats([d["ood_dip"][name][c] for d in diag_per_seed])
            for c in first["ood_dip"][name]
        }
        for name in MODEL_NAMES.values()
    }
    heads = {
        pool: {
            c: seed_stats([d["heads"][pool]["ood_dip"][c] for d in diag_per_seed])
            for c in first["heads"][pool]["ood_dip"]
        }
        for pool in first["heads"]
    }
    return models, {"per_seed": diag_per_seed, "ood_dip": dips, "head_dips": heads}


def dry_run(config: StackedMNISTConfig) -> list[harness.DryRun]:
    """Both models of ``config`` and their training loss on two random canvases of the real
    shape (see :func:`modnets.experiments.core.harness.dry_run`)."""
    images, y = noise_canvases(2)
    x = inputs(images, "cpu")
    t = config.train
    b = t.optim.batch_size
    per_epoch = len(t.train_counts) * (t.train_per_count // b)  # batches of one count, full ones
    steps = {
        "cnn": (t.optim.epochs + t.finetune_epochs) * per_epoch,
        "nfm": (t.finetune_epochs or t.optim.epochs) * per_epoch,
    }
    return [
        harness.DryRun(
            name,
            build_model(kind, t, seed=0),
            lambda m: loss(m, x, y),
            samples=2,
            batch_size=b,
            steps=steps[kind],
        )
        for kind, name in MODEL_NAMES.items()
    ]
