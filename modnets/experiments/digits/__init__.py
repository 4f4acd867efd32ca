"""NI §4.2: multi-task digits and few-shot adaptation to K-MNIST (NI Figs. 4, 5a-c, 6, 8).

Pretrain a Neural Interpreter and a ViT on several digit datasets at once (one CLS token and head
per dataset), then probe what the NI learned:

* Fig. 5a -- finetune both on K-MNIST with 150-500 samples: does the NI adapt faster? Against the
  paper's ViT (~3x the NI's parameters, the same budget), and two secondary readings: the same
  comparison at matched validation accuracy (the model ahead adapted from its pretraining
  snapshot at the other's accuracy) and a parameter-matched ViT.
* Fig. 6  -- the same for an NI whose function codes and signatures are re-sampled first.
* Fig. 5b -- add functions and finetune only signatures and codes: does capacity help?
* Fig. 5c -- drop 0-4 functions at test time: does accuracy degrade gracefully?
* Fig. 8  -- run fewer or more function iterations at test time (anytime inference).
* Fig. 4  -- t-SNE of the inferred types at each function iteration.

Both models are pretrained from each seed of ``config.seeds`` (the data subsets are fixed by
``data_seed``); per pretraining seed, every adaptation runs ``adaptation_seeds`` times (other
K-MNIST samples, other fresh heads) and is averaged into one value, so that :func:`claims` pairs
the NI and the ViT by pretraining seed.

Run ``python -m modnets.experiments.digits --profile cpu --out results.json``. Pretrained models
are checkpointed (:func:`modnets.experiments.core.harness.load_or_train`), so the analyses re-run
without retraining; an interrupted pretraining (Ctrl-C) continues with ``--resume``. Adaptation
is short and never checkpointed.

One file per job, as in every experiment: ``config`` (what is trained, per profile), ``data``,
``models`` (the models and their training), ``analysis`` (adaptation, re-sampled and dropped
functions, iterations, types), ``claims`` (the paper's claims as tests) and ``run`` (what it
measures at every claim seed).
"""

from modnets.experiments.core.experiment import Experiment
from modnets.experiments.core.results import save_results
from modnets.experiments.digits.analysis import (
    adapt,
    adaptation_seed,
    anytime,
    drop_functions,
    inferred_types,
    prepare_adaptation,
    select_finetune_lr,
    selection_split,
)
from modnets.experiments.digits.claims import (
    REGIME_BARS,
    REGIME_MNIST,
    claims,
    drop_mean,
    format_summary,
    lookup,
    mean_over,
    regime,
)
from modnets.experiments.digits.config import (
    CHAPTER,
    CONFIGS,
    CPU_SPEED,
    DATA_FOLDERS,
    DATASET_NAMES,
    FULL_TRAIN_SIZES,
    KINDS,
    MODEL_NAMES,
    NAME,
    PAPER,
    SOURCE_PAPER,
    DigitsConfig,
    DigitsTrain,
)
from modnets.experiments.digits.data import (
    DigitsData,
    balanced_sample,
    for_seed,
    load_kmnist_data,
    load_pretraining_data,
    pretraining_files,
    subset,
    to_rgb32,
)
from modnets.experiments.digits.models import (
    BUILDERS,
    REGISTERED,
    TRAIN_CODE,
    Preprocess,
    build_model,
    build_ni,
    build_vit,
    evaluate,
    matched_snapshot,
    predict,
    pretrain,
    pretrain_loss,
    trained_model,
)
from modnets.experiments.digits.rules import RULES
from modnets.experiments.digits.run import dry_run, measure, summarise

__all__ = [
    "BUILDERS",
    "CHAPTER",
    "CONFIGS",
    "CPU_SPEED",
    "DATASET_NAMES",
    "DATA_FOLDERS",
    "DigitsConfig",
    "DigitsData",
    "DigitsTrain",
    "EXPERIMENT",
    "FULL_TRAIN_SIZES",
    "KINDS",
    "MODEL_NAMES",
    "NAME",
    "PAPER",
    "Preprocess",
    "REGIME_BARS",
    "REGIME_MNIST",
    "REGISTERED",
    "RULES",
    "SOURCE_PAPER",
    "TRAIN_CODE",
    "adapt",
    "adaptation_seed",
    "anytime",
    "balanced_sample",
    "build_model",
    "build_ni",
    "build_vit",
    "claims",
    "drop_functions",
    "drop_mean",
    "dry_run",
    "evaluate",
    "for_seed",
    "format_summary",
    "inferred_types",
    "load_kmnist_data",
    "load_pretraining_data",
    "lookup",
    "matched_snapshot",
    "mean_over",
    "measure",
    "summarise",
    "predict",
    "prepare_adaptation",
    "pretrain",
    "pretrain_loss",
    "pretraining_files",
    "regime",
    "run",
    "save_results",
    "select_finetune_lr",
    "selection_split",
    "subset",
    "to_rgb32",
    "trained_model",
]

#: The experiment as the shared machinery sees it (modnets.experiments.core.experiment).
EXPERIMENT = Experiment.from_namespace(globals())
run = EXPERIMENT.run
