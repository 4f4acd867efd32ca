"""The Tiny-ImageNet images an experiment reads, and the files they come from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from modnets.data import DatasetNotFoundError
from modnets.data import tiny_imagenet as tin
from modnets.data.tiny_imagenet import load_tiny_imagenet, read_wnids, tiny_imagenet_dir
from modnets.experiments.core import harness
from modnets.experiments.tiny_imagenet.config import TinyImageNetTrain


@dataclass
class Data:
    x_train: Tensor  # (N, 3, 64, 64) uint8
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    class_names: list[str]
    fingerprint: str = ""  # harness.data_fingerprint of the files read


def data_files(train: TinyImageNetTrain, root=None) -> list[Path]:
    """The files and folders :func:`load_data` reads (for :func:`harness.data_fingerprint`): the
    class lists, each selected class's train images and the val split."""
    folder = tiny_imagenet_dir(root)
    try:
        wnids = read_wnids(folder)[: train.classes]
        if train.max_train_per_class is None:  # the full copy load_data reads (never downloads)
            folder = tin._full_copy(folder, train.classes, download=False)
    except (FileNotFoundError, DatasetNotFoundError):
        wnids = []
    return [
        folder / "wnids.txt",
        folder / "words.txt",
        *(folder / "train" / w / "images" for w in wnids),
        folder / "val" / "val_annotations.txt",
        folder / "val" / "images",
    ]


def load_data(train: TinyImageNetTrain, root=None) -> Data:
    """The train and val splits of the configured class subset (uint8 images)."""
    # without a cap, every image of the release (a partial copy is never trained on silently)
    tr = load_tiny_imagenet(
        "train",
        train.classes,
        root,
        max_per_class=train.max_train_per_class,
        full=train.max_train_per_class is None,
    )
    val = load_tiny_imagenet("val", train.classes, root, max_per_class=train.max_val_per_class)
    return Data(
        x_train=tr.images,
        y_train=tr.labels,
        x_val=val.images,
        y_val=val.labels,
        class_names=tr.class_names,
        fingerprint=harness.data_fingerprint(*data_files(train, root)),
    )
