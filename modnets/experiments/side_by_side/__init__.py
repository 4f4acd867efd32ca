"""One task, one budget: NI, NAC and NFM beside their plain counterparts (ours, no paper's).

Six models of about 100k parameters each (the CNN, NFM around the same CNN, a ViT, the NI, a
Perceiver IO and the NAC) train on the same stacked-MNIST task: 32x32 canvases cut into four
16x16 cells, one or two of them holding an MNIST digit, which of the ten digits appear (a
multi-label classification), the same canvases for the same number of epochs, each at the
learning rate its selection seeds chose. Each is then measured on what one of the three papers
promises: canvases with three digits (a count never trained on: NFM's out-of-distribution
generalisation), K-MNIST canvases after finetuning on a few of them (NI's fast adaptation), and
accuracy with half or 80 % of the modules dropped (NAC's graceful degradation, where a model
has modules to drop); and on its cost: parameters, FLOPs, training step and inference time
beside the CNN's.

Run ``python -m modnets.experiments.side_by_side --profile cpu --out results.json``.

One file per job, as in every experiment: ``config``, ``data``, ``models``, ``analysis`` (the
dropped modules and the costs), ``claims`` (our claims as tests, and the computed advice) and
``rates`` (the learning rates chosen on the selection seeds) and ``run`` (what it measures at every
claim seed); ``selection`` records the chosen rates, for a profile that names them.
"""

from modnets.experiments.core.experiment import Experiment
from modnets.experiments.side_by_side.analysis import costs, drop_scores
from modnets.experiments.side_by_side.claims import (
    CLAIMS,
    MEASURES,
    REGIME_EXACT,
    advice,
    claims,
    format_summary,
    per_seed,
    regime,
    regime_of,
)
from modnets.experiments.side_by_side.config import (
    ARCH,
    CHAPTER,
    CONFIGS,
    DATA_FOLDERS,
    MODEL_NAMES,
    NAME,
    PAPER,
    SOURCE_PAPER,
    ZERO_GRAD_AT_INIT,
    SideBySideConfig,
    SideBySideTrain,
    recorded_path,
)
from modnets.experiments.side_by_side.data import inputs, test_data, training_data
from modnets.experiments.side_by_side.models import (
    TRAIN_CODE,
    adapt,
    build_model,
    droppable,
    dropped,
    evaluate,
    logits,
    loss,
    mean_exact,
    train,
    trained_model,
)
from modnets.experiments.side_by_side.rates import choose_rates, select_rates
from modnets.experiments.side_by_side.rules import RULES
from modnets.experiments.side_by_side.run import dry_run, measure, summarise

__all__ = [
    "ARCH",
    "CHAPTER",
    "CLAIMS",
    "CONFIGS",
    "DATA_FOLDERS",
    "EXPERIMENT",
    "MEASURES",
    "MODEL_NAMES",
    "NAME",
    "PAPER",
    "REGIME_EXACT",
    "RULES",
    "SOURCE_PAPER",
    "SideBySideConfig",
    "SideBySideTrain",
    "TRAIN_CODE",
    "ZERO_GRAD_AT_INIT",
    "adapt",
    "advice",
    "build_model",
    "choose_rates",
    "claims",
    "costs",
    "drop_scores",
    "droppable",
    "dropped",
    "dry_run",
    "evaluate",
    "format_summary",
    "inputs",
    "logits",
    "loss",
    "mean_exact",
    "measure",
    "summarise",
    "per_seed",
    "recorded_path",
    "regime",
    "regime_of",
    "run",
    "select_rates",
    "test_data",
    "train",
    "trained_model",
    "training_data",
]

#: The experiment as the shared machinery sees it (modnets.experiments.core.experiment).
EXPERIMENT = Experiment.from_namespace(globals())
run = EXPERIMENT.run
