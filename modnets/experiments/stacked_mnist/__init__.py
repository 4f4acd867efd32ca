"""NFM §4.2 / Table 5: stacked-MNIST generalisation to unseen numbers of digits, CNN vs NFM(CNN).

Train App. C's CNN and the same CNN with NFM (K = 2 passes, top-k = 5, 4 heads,
d_k = d_v = 16) on 64x64 canvases holding 1 or 3 MNIST digits (16x16, random positions), as a
multi-label classifier (which of the ten digits are present); test on canvases with 1 to 5
digits. Training canvases come from MNIST's train split (minus images held out for the
validation canvases), test canvases from its test split. As in App. C, each minibatch holds
canvases of one digit count, the CNN has no batch norm, and the reported model is the one from
the epoch with the best validation accuracy. Accuracy is exact match: all ten labels right.

The NFM(CNN) starts as an exact copy of the CNN (same seed, NFM added with ``gamma = 0``), so
the two differ only by what NFM learns. Both models are trained from each seed of
``config.seeds`` (the canvases are fixed by ``data_seed``); :func:`claims` tests Table 5 over
those seeds, paired by seed.

Run ``python -m modnets.experiments.stacked_mnist --profile cpu --out results.json``. Trained
models are checkpointed (:func:`modnets.experiments.core.harness.load_or_train`), so the analysis
re-runs without retraining; an interrupted training (Ctrl-C) continues with ``--resume``.

One file per job, as in every experiment: ``config`` (what is trained, per profile), ``data``,
``models`` (the models and their training), ``analysis`` (convergence, the reads, held-out digit
counts), ``claims`` (the paper's claims as tests) and ``run`` (what it measures at every claim seed).
"""

from modnets.experiments.core.experiment import Experiment
from modnets.experiments.stacked_mnist.analysis import (
    convergence_gain,
    held_out,
    ood_dips,
    read_matrix,
    traced_reads,
)
from modnets.experiments.stacked_mnist.claims import REGIME_FRACTION, claims, format_summary, regime
from modnets.experiments.stacked_mnist.config import (
    CHAPTER,
    CONFIGS,
    CPU_SPEED,
    DATA_FOLDERS,
    MODEL_NAMES,
    NAME,
    NFM_ONLY,
    PAPER,
    SOURCE_PAPER,
    VAL_BATCH,
    ZERO_GRAD_AT_INIT,
    StackedMNISTConfig,
    StackedMNISTTrain,
)
from modnets.experiments.stacked_mnist.data import (
    inputs,
    load_data,
    load_test_canvases,
    training_data,
)
from modnets.experiments.stacked_mnist.models import (
    REGISTERED,
    TRAIN_CODE,
    build_model,
    evaluate,
    loss,
    predict,
    pretrained_cnn,
    train,
    trained_model,
)
from modnets.experiments.stacked_mnist.rules import RULES
from modnets.experiments.stacked_mnist.run import dry_run, measure, summarise, train_seeds

__all__ = [
    "CHAPTER",
    "CONFIGS",
    "CPU_SPEED",
    "DATA_FOLDERS",
    "EXPERIMENT",
    "MODEL_NAMES",
    "NAME",
    "NFM_ONLY",
    "PAPER",
    "REGIME_FRACTION",
    "REGISTERED",
    "RULES",
    "SOURCE_PAPER",
    "StackedMNISTConfig",
    "StackedMNISTTrain",
    "TRAIN_CODE",
    "VAL_BATCH",
    "ZERO_GRAD_AT_INIT",
    "build_model",
    "claims",
    "convergence_gain",
    "dry_run",
    "evaluate",
    "format_summary",
    "held_out",
    "inputs",
    "load_data",
    "load_test_canvases",
    "loss",
    "measure",
    "summarise",
    "ood_dips",
    "predict",
    "pretrained_cnn",
    "read_matrix",
    "regime",
    "run",
    "traced_reads",
    "train",
    "train_seeds",
    "trained_model",
    "training_data",
]

#: The experiment as the shared machinery sees it (modnets.experiments.core.experiment).
EXPERIMENT = Experiment.from_namespace(globals())
run = EXPERIMENT.run
