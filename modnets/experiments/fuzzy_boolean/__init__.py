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

Every model is trained from each seed of ``config.seeds``, and each seed draws its own task -- the
30 functions and their points (:func:`for_seed`) -- so that the seeds are exchangeable draws of
the whole experiment; the routing sweep chooses its settings on a selection seed that is never a
claim seed. :func:`claims` tests NI Table 1 over the claim seeds.

Run ``python -m modnets.experiments.fuzzy_boolean --profile cpu --out results.json``.

One file per job, as in every experiment: ``config`` (what is trained, per profile), ``data``,
``models`` (the models and their training), ``sweep`` (the routing sweep and its record), ``claims``
(the paper's claims as tests) and ``run`` (what it measures at every claim seed; ``EXPERIMENT.run``
and ``python -m`` run it).
"""

from modnets.experiments.core.experiment import Experiment
from modnets.experiments.fuzzy_boolean.claims import (
    REGIME_R2,
    claims,
    format_summary,
    regime,
    summary,
)
from modnets.experiments.fuzzy_boolean.config import (
    CHAPTER,
    CONFIGS,
    CPU_SPEED,
    FAMILIES,
    FINETUNING_NAMES,
    FINETUNINGS,
    NAME,
    PAPER,
    RECORDED_SWEEPS,
    SOURCE_PAPER,
    SWEPT,
    FuzzyBooleanConfig,
    FuzzyBooleanSweep,
    FuzzyBooleanTrain,
    unswept,
)
from modnets.experiments.fuzzy_boolean.data import (
    describe_functions,
    fit_points,
    for_seed,
    load_data,
    reported_split,
    selection_split,
    target_scaler,
)
from modnets.experiments.fuzzy_boolean.models import (
    REGISTERED,
    TRAIN_CODE,
    build_model,
    evaluate,
    finetuned,
    loss,
    pretrained,
    set_trainable,
    train,
    trained_models,
)
from modnets.experiments.fuzzy_boolean.rules import RULES
from modnets.experiments.fuzzy_boolean.run import dry_run, measure, summarise
from modnets.experiments.fuzzy_boolean.sweep import (
    choose_candidate,
    load_sweep_record,
    record_sweep,
    sweep,
    sweep_record_path,
)

__all__ = [
    "CHAPTER",
    "CONFIGS",
    "CPU_SPEED",
    "EXPERIMENT",
    "FAMILIES",
    "FINETUNINGS",
    "SELECTED_SETTINGS",
    "FINETUNING_NAMES",
    "FuzzyBooleanConfig",
    "FuzzyBooleanSweep",
    "FuzzyBooleanTrain",
    "NAME",
    "PAPER",
    "RECORDED_SWEEPS",
    "REGIME_R2",
    "REGISTERED",
    "RULES",
    "SOURCE_PAPER",
    "SWEPT",
    "TRAIN_CODE",
    "build_model",
    "choose_candidate",
    "claims",
    "describe_functions",
    "dry_run",
    "evaluate",
    "finetuned",
    "fit_points",
    "for_seed",
    "format_summary",
    "load_data",
    "load_sweep_record",
    "loss",
    "measure",
    "summarise",
    "pretrained",
    "record_sweep",
    "regime",
    "reported_split",
    "run",
    "selection_split",
    "set_trainable",
    "summary",
    "sweep",
    "sweep_record_path",
    "target_scaler",
    "train",
    "trained_models",
    "unswept",
]

#: What ``measure`` chooses on the selection seed: the routing sweep's model settings and the
#: fine-tuning rates (each seed's record holds the chosen ones; the rest of ``train`` is the
#: profile's).
SELECTED_SETTINGS = ("train.finetune_lrs", *(f"train.model.{key}" for key in SWEPT))

#: The experiment as the shared machinery sees it (modnets.experiments.core.experiment).
EXPERIMENT = Experiment.from_namespace(globals())
run = EXPERIMENT.run
