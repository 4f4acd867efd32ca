"""What the side-by-side experiment trains and from which seeds: six models of about the same
size on one stacked-MNIST task, each profile's data and budget, and the measures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from modnets.training import TrainConfig

NAME = "side_by_side"
#: The paper whose claims it tests: none, every claim here is ours, and the chapter that runs it.
SOURCE_PAPER = ""
#: The folders below the data root it reads.
DATA_FOLDERS = ("MNIST/raw", "KMNIST/raw")
CHAPTER = "11b_side_by_side"

#: No paper makes these claims: every claim here is ours.
PAPER: dict = {}

#: Checkpoint suffix -> the model's name in the results.
MODEL_NAMES = {
    "cnn": "CNN",
    "nfm": "NFM(CNN)",
    "vit": "ViT",
    "ni": "NI",
    "pio": "Perceiver IO",
    "nac": "NAC",
}

#: Parameters that get no gradient at initialisation, by design (see the harness's dry run).
ZERO_GRAD_AT_INIT = {
    "body.attention.": "every NFM read starts with gamma = 0 (NFM §3.2.1), so its projections "
    "get no gradient until the gates move; so do the first pass's gates (that pass reaches the "
    "logits only through the memory), the first read (empty memory) and the last read's keys "
    "and values (never read)",
}

#: Each model's architecture, sized so that all six hold 93k-101k parameters (a test keeps
#: them within 10 % of each other). The NI and the ViT read 8x8 patches (16 tokens), the NAC and
#: the Perceiver IO the NAC's convolutional tokeniser (16 tokens); the CNN has three stages.
ARCH = {
    "cnn": {"width": 9, "num_blocks": 3, "pool": "max"},
    "nfm": {"passes": 2, "top_k": 3, "num_heads": 2, "key_dim": 8, "value_dim": 8},
    "ni": {"dim": 64, "type_dim": 16, "num_functions": 5, "num_iterations": 3, "num_locs": 1},
    "ni_mlp": 256,
    "vit": {"dim": 64, "mlp_hidden": 112, "depth": 3},
    "tokenizer": {"hidden_channels": 16, "out_channels": 48, "pos_dim": 16},
    "nac": {"dim": 32, "ffn_hidden": 80, "num_processors": 32},
    "pio": {"dim": 48, "ffn_hidden": 80, "num_processors": 32},
}


@dataclass(frozen=True)
class SideBySideTrain:
    """The data every model trains on and the budget they share: canvases of ``canvas`` pixels
    cut into a grid of ``digit``-pixel cells, each empty or holding one MNIST digit,
    ``per_count`` canvases of each of ``train_counts`` digits, ``epochs`` passes in batches of
    ``batch_size`` (so every model sees the same examples), AdamW at a learning rate chosen per
    model from ``lrs`` on the selection seeds."""

    canvas: int = 32
    # digits in grid cells, aligned with the 8x8 patches that the ViT and the NI read
    digit: int = 16
    train_counts: tuple[int, ...] = (1, 2)
    per_count: int = 3200
    val_per_count: int = 250
    val_images: int = 5000
    epochs: int = 3
    batch_size: int = 32
    lrs: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    weight_decay: float = 0.05
    data_seed: int = 0

    def optim(self, lr: float) -> TrainConfig:
        """The training configuration at learning rate ``lr``: the same for every model."""
        return TrainConfig(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=lr,
            weight_decay=self.weight_decay,
            warmup_fraction=0.1,
            amp=False,
        )


@dataclass(frozen=True)
class SideBySideConfig:
    """One run: ``train`` at the claim ``seeds`` (learning rates chosen on ``selection_seeds``,
    never claim seeds), tested on ``test_per_count`` fresh canvases of every trained count (IID)
    and of ``ood_counts`` (never trained on); adapted to K-MNIST from ``few_shot`` canvases for
    ``few_shot_epochs``; with ``drop_fractions`` of the modules or functions dropped (random
    orders: the mean over ``drop_draws``); the costs timed at ``speed_batch`` (see
    :func:`~modnets.experiments.side_by_side.analysis.costs`).

    ``learning_rates`` (``{kind: lr}``): the rates a separate selection run chose on the
    selection seeds (``python -m modnets.experiments.side_by_side.selection``, its record in
    ``bench/recorded``); ``None`` chooses them within the run."""

    train: SideBySideTrain = field(default_factory=SideBySideTrain)
    learning_rates: dict | None = None
    seeds: tuple[int, ...] = (0, 1, 2)
    selection_seeds: tuple[int, ...] = (100,)
    test_per_count: int = 1000
    ood_counts: tuple[int, ...] = (3,)
    few_shot: int = 100
    few_shot_epochs: int = 10
    few_shot_batch: int = 25
    drop_fractions: tuple[float, ...] = (0.5, 0.8)
    drop_draws: int = 3
    eval_batch: int = 250
    speed_batch: int = 32
    speed_rounds: int = 3
    speed_calls: int = 5


CONFIGS = {
    # proves the code paths, decides nothing
    "smoke": SideBySideConfig(
        # two candidate rates: enough for the selection to choose
        train=SideBySideTrain(
            per_count=32, val_per_count=16, val_images=500, epochs=1, lrs=(1e-3, 1e-2)
        ),
        seeds=(0, 1),
        test_per_count=32,
        few_shot=20,
        few_shot_epochs=1,
        few_shot_batch=10,
        drop_draws=1,
        eval_batch=64,
        speed_rounds=1,
        speed_calls=1,
    ),
    # the book's budget: three claim seeds of six small models, at the rates one selection seed
    # chose (recorded by the selection command, so the chapter does not train them)
    "cpu": SideBySideConfig(
        train=SideBySideTrain(lrs=(1e-3, 3e-3, 1e-2, 3e-2)),
        learning_rates={
            "cnn": 1e-2,
            "nfm": 1e-2,
            "vit": 3e-3,
            "ni": 3e-3,
            "pio": 3e-3,
            "nac": 3e-3,
        },
    ),
    # more data, more epochs, five claim seeds
    "gpu": SideBySideConfig(
        train=SideBySideTrain(per_count=20000, epochs=20, lrs=(3e-4, 1e-3, 3e-3, 1e-2)),
        seeds=(0, 1, 2, 3, 4),
        selection_seeds=(100, 101),
        test_per_count=5000,
        drop_draws=10,
    ),
}


def recorded_path(profile: str) -> Path:
    """Where the learning rates chosen for ``profile`` are recorded (relative to the repository:
    ``python -m modnets.experiments.side_by_side.selection`` writes it)."""
    return Path("bench/recorded") / f"side_by_side_rates_{profile}.json"
