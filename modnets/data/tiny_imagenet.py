"""Tiny-ImageNet-200 {cite}`le2015tinyimagenet`: a loader, a decoded-array cache and GPU-friendly
batch augmentation (kornia).

No torchvision: PIL reads the original folder layout below the data root
(:func:`modnets.data.data_root`)::

    TinyImageNet/tiny-imagenet-200/wnids.txt                         200 wnids (this order = labels)
    TinyImageNet/tiny-imagenet-200/words.txt                         wnid -> "name, synonym, ..."
    TinyImageNet/tiny-imagenet-200/train/<wnid>/images/<wnid>_<i>.JPEG
    TinyImageNet/tiny-imagenet-200/val/images/val_<k>.JPEG
    TinyImageNet/tiny-imagenet-200/val/val_annotations.txt           "val_<k>.JPEG <wnid> x0 y0 x1 y1"

The unlabeled test split is not read. The subset kept in ``shared/data`` (see its README) has the
complete val split (50 images per class), all 500 train images for the first 20 wnids of
``wnids.txt`` and 100 (``_0 .. _99``) for the other 180, so ``classes=20`` gives a 20-class task with
10,000 train and 1,000 val images. The loader reads whatever images are present; nothing requires
500 per class.

Labels follow the order of ``classes``: ``None`` is all wnids in ``wnids.txt`` order, an int ``n``
the first ``n`` of them, a list of wnids that list; labels are ``0 .. n-1`` in that order (not the
sorted-wnid order of ``ImageFolder``). Train images come grouped by class, each class in the order
of the integer ``<i>`` in the file names; val images in the order of ``<k>``. ``max_per_class``
keeps the lowest indices. Greyscale JPEGs (about 2% of the files) are converted to RGB.

**Cache.** Decoding 10,000 JPEGs takes a second or two; the decoded arrays are therefore saved as
one uncompressed ``.npz`` per (data folder, split, class list, ``max_per_class``) in
``$MODNETS_CACHE/tiny_imagenet_cache/`` (default ``~/.cache/modnets/tiny_imagenet_cache/``), never
inside the data root, which may be read-only. The cache key also hashes the name, size and mtime of
every image file and text file read, so changed data is never served stale. Cache files are written
atomically (temporary file + :func:`os.replace`); when the cache folder cannot be written, loading
goes on without a cache; an unreadable cache file is ignored and rebuilt. Delete the folder to free
the space.

**Downloads.** When the folder is missing and ``download=True``, the official archive
``http://cs231n.stanford.edu/tiny-imagenet-200.zip`` (248 MB) is downloaded into
``<root>/TinyImageNet/``, its md5 checked, unpacked into a temporary folder that is then renamed into
place (the zip is deleted afterwards; a partial download is deleted on failure). Without internet
access a :class:`~modnets.data.DatasetNotFoundError` names the missing path and how to provide the
data. A half-present folder is never overwritten: the error asks to remove or complete it.

Errors: a bad ``split``, ``classes`` or ``max_per_class`` raises :class:`ValueError` naming the
argument; a requested class without train images, or an image listed in ``val_annotations.txt`` but
absent, raises :class:`~modnets.data.DatasetNotFoundError`; an undecodable or non-64x64 JPEG or a
malformed text file raises :class:`~modnets.data.DatasetCorruptedError` naming the file. With
``verify=True`` every file read is also checked against ``TinyImageNet/MD5SUMS`` (``md5sum`` format,
paths relative to ``TinyImageNet/``) when that file exists, as it does in ``shared/data``.

Augmentation: :class:`TinyImageNetAugment` (and the functional :func:`train_augment`) takes
``uint8`` or ``[0, 1]`` float batches ``(B, 3, H, W)`` on any device and applies random resized
crops, horizontal flips, RandAugment (``gpu`` profile), ImageNet normalisation and optional
MixUp/CutMix with soft targets, all batch-wise with kornia. :func:`normalize` is the evaluation
transform.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from modnets.data import DatasetCorruptedError, DatasetNotFoundError, data_root
from modnets.data import download_root as _download_root
from modnets.data import writable as _writable
from modnets.data.augment import (
    AUGMENT_PROFILES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    TinyImageNetAugment,
    denormalize,
    normalize,
    train_augment,
)
from modnets.data.digits import _download, _root, md5sum
from modnets.data.tiny_imagenet_cache import (
    CACHE_ENV_VAR,
    IMAGE_SIZE,
    cache_dir,
    cache_file,
    decode_all,
    read_cache,
    write_cache,
)

__all__ = [
    "TinyImageNet",
    "load_tiny_imagenet",
    "tiny_imagenet_dir",
    "read_wnids",
    "read_class_names",
    "cache_dir",
    "normalize",
    "denormalize",
    "TinyImageNetAugment",
    "train_augment",
    "SPLITS",
    "IMAGE_SIZE",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "AUGMENT_PROFILES",
    "TINY_IMAGENET_URL",
    "TINY_IMAGENET_MD5",
    "CACHE_ENV_VAR",
]

SPLITS = ("train", "val")

TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"

TINY_IMAGENET_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"

DOWNLOAD_TIMEOUT = 10.0  # seconds per socket operation: fail fast without internet

TRAIN_PER_CLASS = 500  # train images per class in the release

_FOLDER = "tiny-imagenet-200"

_JPEG_SUFFIXES = (".jpeg", ".jpg")


def tiny_imagenet_dir(root: str | os.PathLike | None = None) -> Path:
    """``<root>/TinyImageNet/tiny-imagenet-200`` (``root`` defaults to :func:`data_root`)."""
    return _root(root) / "TinyImageNet" / _FOLDER


def read_wnids(folder: str | os.PathLike) -> list[str]:
    """The wnids of ``<folder>/wnids.txt`` in file order (``folder`` is the tiny-imagenet-200 dir)."""
    path = Path(folder) / "wnids.txt"
    wnids = path.read_text().split()
    if not wnids or len(set(wnids)) != len(wnids):
        raise DatasetCorruptedError(f"{path} is empty or lists a wnid twice")
    return wnids


def read_class_names(folder: str | os.PathLike, wnids: Sequence[str]) -> list[str]:
    """The first name in ``words.txt`` (before the first comma) of each wnid; the wnid if absent."""
    path = Path(folder) / "words.txt"
    wanted, names = set(wnids), {}
    for line in path.read_text().splitlines():
        wnid, _, words = line.partition("\t")
        if wnid in wanted:
            names[wnid] = words.split(",")[0].strip() or wnid
    return [names.get(w, w) for w in wnids]


def _how(folder: Path) -> str:
    return (
        f"Download {TINY_IMAGENET_URL} (md5 {TINY_IMAGENET_MD5}) and unzip it so that {folder} "
        f"holds wnids.txt, words.txt, train/ and val/, or point MODNETS_DATA at a folder that holds "
        f"TinyImageNet/{_FOLDER}/ (the data root now is {data_root()})."
    )


def _required(folder: Path, split: str) -> list[Path]:
    return [folder / "wnids.txt", folder / "words.txt", folder / split]


def _ensure(folder: Path, split: str, download: bool) -> None:
    missing = [p for p in _required(folder, split) if not p.exists()]
    if not missing:
        return
    listing = "\n".join(f"  {p}" for p in missing)
    if folder.exists() and any(folder.iterdir()):
        raise DatasetNotFoundError(
            f"Tiny-ImageNet: {folder} is incomplete; missing\n{listing}\nComplete it, or remove it "
            f"to have it downloaded again. {_how(folder)}"
        )
    if not download:
        raise DatasetNotFoundError(f"Tiny-ImageNet: missing\n{listing}\n{_how(folder)}")
    base = folder.parent
    archive = base / f"{_FOLDER}.zip"
    try:
        if not (archive.exists() and md5sum(archive) == TINY_IMAGENET_MD5):
            _download(TINY_IMAGENET_URL, archive, (TINY_IMAGENET_MD5,), timeout=DOWNLOAD_TIMEOUT)
        _extract(archive, folder)
    except (urllib.error.URLError, TimeoutError, OSError, zipfile.BadZipFile) as err:
        raise DatasetNotFoundError(
            f"Tiny-ImageNet: missing\n{listing}\nDownloading failed ({err}).\n{_how(folder)}"
        ) from None
    archive.unlink(missing_ok=True)


def _short_classes(folder: Path, wnids: list[str]) -> dict[str, int]:
    """The classes whose train folder holds fewer than :data:`TRAIN_PER_CLASS` JPEGs."""
    short = {}
    for wnid in wnids:
        images = folder / "train" / wnid / "images"
        n = (
            sum(n.lower().endswith(_JPEG_SUFFIXES) for n in os.listdir(images))
            if images.is_dir()
            else 0
        )
        if n < TRAIN_PER_CLASS:
            short[wnid] = n
    return short


def _full_copy(folder: Path, classes, download: bool) -> Path:
    """A folder whose train split holds every image of ``classes`` (the release's 500 each):
    ``folder`` itself, or a full copy under :func:`modnets.data.download_root`, downloaded and verified
    there when needed. A partial or read-only ``folder`` is never written into."""
    short = _short_classes(folder, _select_classes(classes, read_wnids(folder)))
    if not short:
        return folder
    first = next(iter(short))
    missing = (
        f"{len(short)} classes hold fewer than the release's {TRAIN_PER_CLASS} train "
        f"images (e.g. {first}: {short[first]}) in {folder}"
    )
    other = tiny_imagenet_dir(_download_root())
    if other != folder:
        if other.is_dir() and (other / "wnids.txt").exists():
            if not _short_classes(other, _select_classes(classes, read_wnids(other))):
                return other  # downloaded before
        elif download and _writable(other.parent):
            try:
                _ensure(other, "train", download=True)
            except DatasetNotFoundError as err:
                raise DatasetNotFoundError(
                    f"Tiny-ImageNet: this configuration trains on the full train split, but "
                    f"{missing}; downloading the release into {other} failed:\n{err}"
                ) from None
            return other
    why = (
        "downloading is off"
        if not download
        else f"the release is downloaded only into a writable folder without a partial copy, and "
        f"{other} is not one"
    )
    raise DatasetNotFoundError(
        f"Tiny-ImageNet: this configuration trains on the full train split, but {missing}; "
        f"{why}. {_how(other)}"
    )


def _extract(archive: Path, folder: Path) -> None:
    """Unpack ``archive`` (holding ``tiny-imagenet-200/``) into a temporary folder, then rename."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{_FOLDER}.", dir=folder.parent))
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)  # zipfile drops absolute paths and ".." components
        unpacked = tmp / _FOLDER
        if not (unpacked / "wnids.txt").exists():
            raise DatasetCorruptedError(f"{archive} does not hold {_FOLDER}/wnids.txt")
        if folder.exists():
            folder.rmdir()  # only an empty folder gets here (see _ensure)
        os.replace(unpacked, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_args(split: str, max_per_class: int | None) -> None:
    if split not in SPLITS:
        raise ValueError(
            f"split must be one of {SPLITS} (the test split has no labels), got {split!r}"
        )
    if max_per_class is not None and (
        isinstance(max_per_class, bool) or not isinstance(max_per_class, int) or max_per_class < 1
    ):
        raise ValueError(f"max_per_class must be None or a positive int, got {max_per_class!r}")


def _select_classes(classes, all_wnids: list[str]) -> list[str]:
    n_all = len(all_wnids)
    if classes is None:
        return list(all_wnids)
    if isinstance(classes, (int, np.integer)) and not isinstance(classes, bool):
        if not 1 <= classes <= n_all:
            raise ValueError(
                f"classes={classes} must be between 1 and {n_all} (wnids.txt has {n_all})"
            )
        return list(all_wnids[: int(classes)])
    if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence):
        raise ValueError(
            f"classes must be None, an int or a list of wnids, got {type(classes).__name__} "
            f"{classes!r}"
        )
    wnids = [str(c) for c in classes]
    if not wnids:
        raise ValueError("classes is an empty list")
    if len(set(wnids)) != len(wnids):
        raise ValueError(f"classes lists a wnid twice: {wnids}")
    known = set(all_wnids)
    unknown = [w for w in wnids if w not in known]
    if unknown:
        raise ValueError(f"classes: wnid(s) {unknown} are not in wnids.txt")
    return wnids


def _index(name: str) -> tuple[int, int | str]:
    """Sort key: the integer after the last ``_`` of ``<prefix>_<i>.JPEG``; other names last."""
    tail = name.rsplit(".", 1)[0].rsplit("_", 1)[-1]
    return (0, int(tail)) if tail.isdigit() else (1, name)


def _train_files(folder: Path, wnids: list[str], max_per_class: int | None):
    files, labels = [], []
    for label, wnid in enumerate(wnids):
        images = folder / "train" / wnid / "images"
        try:
            names = [n for n in os.listdir(images) if n.lower().endswith(_JPEG_SUFFIXES)]
        except FileNotFoundError:
            names = []
        if not names:
            raise DatasetNotFoundError(
                f"Tiny-ImageNet: class {wnid} has no train images: {images} is missing or holds no "
                f"JPEG. {_how(folder)}"
            )
        names = sorted(names, key=_index)[:max_per_class]
        files += [images / n for n in names]
        labels += [label] * len(names)
    return files, labels, []


def _val_files(folder: Path, wnids: list[str], max_per_class: int | None, all_wnids: set[str]):
    ann = folder / "val" / "val_annotations.txt"
    if not ann.exists():
        raise DatasetNotFoundError(f"Tiny-ImageNet: missing {ann}. {_how(folder)}")
    label_of = {w: i for i, w in enumerate(wnids)}
    rows = []
    for lineno, line in enumerate(ann.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) < 2:
            raise DatasetCorruptedError(
                f"{ann}:{lineno}: expected '<file> <wnid> ...', got {line!r}"
            )
        if parts[1] not in all_wnids:
            raise DatasetCorruptedError(f"{ann}:{lineno}: wnid {parts[1]} is not in wnids.txt")
        if parts[1] in label_of:
            rows.append((_index(parts[0]), parts[0], label_of[parts[1]]))
    rows.sort()
    files, labels, count = [], [], [0] * len(wnids)
    for _, name, label in rows:
        if max_per_class is not None and count[label] >= max_per_class:
            continue
        count[label] += 1
        files.append(folder / "val" / "images" / name)
        labels.append(label)
    return files, labels, [ann]


def _md5_check(folder: Path, paths: list[Path]) -> None:
    sums = folder.parent / "MD5SUMS"
    if not sums.exists():
        return
    known = {}
    for line in sums.read_text().splitlines():
        md5, _, rel = line.strip().partition("  ")
        if rel:
            known[rel.lstrip("*")] = md5
    for path in paths:
        rel = path.relative_to(folder.parent).as_posix()
        if rel in known and md5sum(path) != known[rel]:
            raise DatasetCorruptedError(
                f"{path} has md5 {md5sum(path)}, not {known[rel]} as {sums} says; the file is "
                "corrupted or was changed"
            )


@dataclass(frozen=True)
class TinyImageNet:
    """One split: ``images`` uint8 ``(N, 3, 64, 64)``, ``labels`` int64 ``(N,)`` in ``0..n-1``,
    and per label its ``class_names`` (``words.txt``) and ``wnids``.

    Unpacks as ``images, labels, class_names = load_tiny_imagenet(...)``.
    """

    images: Tensor
    labels: Tensor
    class_names: list[str]
    wnids: list[str]

    def __iter__(self):
        return iter((self.images, self.labels, self.class_names))

    @property
    def num_classes(self) -> int:
        return len(self.wnids)


def load_tiny_imagenet(
    split: str = "train",
    classes: int | Sequence[str] | None = None,
    root: str | os.PathLike | None = None,
    download: bool = True,
    max_per_class: int | None = None,
    verify: bool = False,
    cache: bool = True,
    num_workers: int = 0,
    full: bool = False,
) -> TinyImageNet:
    """Tiny-ImageNet-200 images of ``split`` (``"train"`` or ``"val"``) for ``classes``.

    ``classes``: ``None`` (all, ``wnids.txt`` order), an int ``n`` (the first ``n`` wnids) or a
    list of wnids; labels are ``0..n-1`` in that order. ``max_per_class`` keeps the lowest-indexed
    images of each class. ``cache=False`` neither reads nor writes the decoded-array cache.
    ``num_workers > 0`` decodes in a thread pool (on two CPU cores the plain loop was faster).
    ``verify`` checks md5s against ``TinyImageNet/MD5SUMS`` when present. ``full=True`` (train
    split) needs all 500 images of every class: a data root that holds fewer (e.g. a subset) is
    left as it is and the release is downloaded, verified, into ``~/.cache/modnets`` instead, or,
    offline, a :class:`DatasetNotFoundError` says which classes fall short, before any training.
    See the module docstring.
    """
    _check_args(split, max_per_class)
    folder = tiny_imagenet_dir(root)
    _ensure(folder, split, download)
    if full and split == "train":
        folder = _full_copy(folder, classes, download)
    try:
        all_wnids = read_wnids(folder)
    except FileNotFoundError:
        raise DatasetNotFoundError(f"Tiny-ImageNet: missing {folder / 'wnids.txt'}") from None
    wnids = _select_classes(classes, all_wnids)
    if split == "val":
        files, labels, extra = _val_files(folder, wnids, max_per_class, set(all_wnids))
    else:
        files, labels, extra = _train_files(folder, wnids, max_per_class)
    extra = [folder / "wnids.txt", folder / "words.txt", *extra]
    if verify:
        _md5_check(folder, [*extra, *files])
    labels_arr = np.asarray(labels, dtype=np.int64)

    cached, path = None, None
    if cache:
        try:
            path = cache_file(folder, split, wnids, max_per_class, files, extra)
        except FileNotFoundError:
            path = None  # a listed val image is missing: decode_all names it below
        if path is not None and path.exists():
            cached = read_cache(path, len(files))
    if cached is not None and np.array_equal(cached[1], labels_arr):
        images = cached[0]
    else:
        images = decode_all(files, num_workers)
        if path is not None:
            write_cache(path, images, labels_arr)
    return TinyImageNet(
        images=torch.from_numpy(images),
        labels=torch.from_numpy(labels_arr),
        class_names=read_class_names(folder, wnids),
        wnids=wnids,
    )
