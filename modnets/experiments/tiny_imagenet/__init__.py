"""NAC §4.1 on Tiny-ImageNet: NAC vs Perceiver IO, then dropping modules at inference time.

* Table 1 -- train a NAC (a graph prior, scale-free by default) and a Perceiver IO with the same
  convolutional tokeniser (App. C) and budget; report top-1 / top-5 validation accuracy.
* Fig. 5a / 15 -- drop 0-90 % of the NAC's mediators (the graph-regularised modules; read-in
  modules stay, the paper's reading) in three orders -- least connected first (App. F,
  ``q_i = sum_j P_ij``), at random (``random_draws`` draws) and most connected first -- against
  Perceiver IO with the same fraction of latents dropped at random; accuracy vs modules dropped
  and vs GFLOPs per sample. The order only matters if the learned circuit has hubs:
  :func:`modnets.diagnostics.circuit` measures that, before and after training.
* Fig. 5b -- measured inference throughput (samples/s, ``torch.inference_mode``, batch 64) as
  modules are dropped: the dropped model is smaller, so compute really shrinks.
* Fig. 10 -- accuracy as the smallest link probabilities ``P_ij`` are set to 0.

Every model is trained from each seed of ``config.seeds`` (the data are fixed);
:func:`claims` tests Table 1 and Figs. 5, 10 and 15 over those seeds. Trained models go through
:func:`modnets.experiments.core.harness.load_or_train` (checkpoints keyed by the training part of the
configuration, the seed, the data files read and the code), so the analyses re-run without
retraining and :func:`trained_model` gives the chapters the live models.

Run ``python -m modnets.experiments.tiny_imagenet --profile cpu --out results.json``.

One file per job, as in every experiment: ``config`` (what is trained, per profile), ``data``,
``models`` (the models and their training), ``analysis`` (drop, edge and speed curves, the
circuit's diagnostics), ``claims`` (the paper's claims as tests) and ``run`` (what it measures at every claim seed; ``EXPERIMENT.run`` and
``python -m`` run it).
"""

from modnets.experiments.core.experiment import Experiment
from modnets.experiments.tiny_imagenet.analysis import (
    drop_curve,
    edge_curve,
    evaluate_tokens,
    gflops_per_sample,
    nac_diagnostics,
    point_at,
    relative_loss,
    scorer,
    speed_curve,
    throughput,
    val_tokens,
)
from modnets.experiments.tiny_imagenet.claims import (
    REGIME_CHANCE_MULTIPLE,
    REGIME_LAST_GAIN,
    REGIME_MEAN_P,
    at_flops,
    claims,
    dropping_matters,
    format_summary,
    last_gain,
    matched_flops,
    regime,
)
from modnets.experiments.tiny_imagenet.config import (
    CHAPTER,
    CONFIGS,
    CPU_CIRCUIT_LR,
    CPU_EPOCHS,
    CPU_NAC,
    CPU_SPEED,
    DATA_FOLDERS,
    DROP_AT,
    EDGES_AT,
    GPU_COMMAND,
    GPU_NAC,
    NAME,
    PAPER,
    SOURCE_PAPER,
    TRAIN_EVAL_BATCH,
    TinyImageNetConfig,
    TinyImageNetTrain,
)
from modnets.experiments.tiny_imagenet.data import Data, data_files, load_data
from modnets.experiments.tiny_imagenet.models import (
    REGISTERED,
    TRAIN_CODE,
    build_model,
    evaluate,
    graph_penalty,
    loss,
    make_step,
    model_name,
    train,
    trained_model,
)
from modnets.experiments.tiny_imagenet.rules import RULES
from modnets.experiments.tiny_imagenet.run import (
    dry_run,
    fit_to_gpu,
    measure,
    model_task,
    readings,
    summarise,
    train_task,
)

__all__ = [
    "CHAPTER",
    "CONFIGS",
    "CPU_CIRCUIT_LR",
    "CPU_EPOCHS",
    "CPU_NAC",
    "CPU_SPEED",
    "DATA_FOLDERS",
    "DROP_AT",
    "Data",
    "EDGES_AT",
    "EXPERIMENT",
    "GPU_COMMAND",
    "GPU_NAC",
    "NAME",
    "PAPER",
    "REGIME_CHANCE_MULTIPLE",
    "REGIME_LAST_GAIN",
    "REGIME_MEAN_P",
    "REGISTERED",
    "RULES",
    "SOURCE_PAPER",
    "TRAIN_CODE",
    "TRAIN_EVAL_BATCH",
    "TinyImageNetConfig",
    "TinyImageNetTrain",
    "at_flops",
    "build_model",
    "claims",
    "data_files",
    "drop_curve",
    "dropping_matters",
    "dry_run",
    "edge_curve",
    "evaluate",
    "evaluate_tokens",
    "fit_to_gpu",
    "format_summary",
    "last_gain",
    "gflops_per_sample",
    "graph_penalty",
    "load_data",
    "loss",
    "make_step",
    "matched_flops",
    "measure",
    "summarise",
    "model_name",
    "model_task",
    "nac_diagnostics",
    "point_at",
    "readings",
    "regime",
    "relative_loss",
    "run",
    "scorer",
    "speed_curve",
    "throughput",
    "train",
    "train_task",
    "trained_model",
    "val_tokens",
]

#: The experiment as the shared machinery sees it (modnets.experiments.core.experiment).
EXPERIMENT = Experiment.from_namespace(globals())
run = EXPERIMENT.run
