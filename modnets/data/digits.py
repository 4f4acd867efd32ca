"""Light loaders for the digit datasets of NI §4.2: MNIST, K-MNIST, MNIST-M and SVHN.

No torchvision: numpy, PIL, scipy and torch read the standard on-disk layouts below the data root
(:func:`modnets.data.data_root`)::

    MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz      (the IDX files torchvision uses)
    KMNIST/raw/kmnist-{train,test}-{imgs,labels}.npz               (the official npz files)
    MNIST-M/mnist_m/mnist_m_{train,test}/*.png                     (the original release)
    MNIST-M/mnist_m/mnist_m_{train,test}_labels.txt                ("00000000.png 7" per line)
    SVHN/{train,test}_32x32.mat                                    (the official .mat files)

Missing files are downloaded when the internet is reachable (and their md5 checked); otherwise a
:class:`~modnets.data.DatasetNotFoundError` names the dataset, the expected path and where to get
it. A file that fails to parse (truncated gzip, bad npz, short IDX, undecodable PNG) or whose md5 is
not one of the known releases raises :class:`~modnets.data.DatasetCorruptedError`; nothing broken is
used silently.

Every loader returns ``(images, labels)``: ``uint8`` arrays ``(N, H, W)`` (grey) or ``(N, H, W, 3)``
(colour), and ``int64`` labels in ``0..9``.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modnets.data import DatasetCorruptedError, DatasetNotFoundError, data_root
from modnets.data import download_root as _download_root
from modnets.data import writable as _writable

__all__ = [
    "mnist_files",
    "load_mnist",
    "load_kmnist",
    "load_mnist_m",
    "load_svhn",
    "load_digits",
    "DIGIT_DATASETS",
    "read_idx",
    "md5sum",
]

DIGIT_DATASETS = ("mnist", "kmnist", "mnist_m", "svhn")
SPLITS = ("train", "test")


@dataclass(frozen=True)
class _Remote:
    url: str
    md5: tuple[str, ...]  # accepted releases; empty: structure is checked instead


_MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
_MNIST = {
    "train-images-idx3-ubyte.gz": ("f68b3c2dcbeaaa9fbdd348bbdeb94873",),
    "train-labels-idx1-ubyte.gz": ("d53e105ee54ea40749a09fcbcd1e9432",),
    "t10k-images-idx3-ubyte.gz": ("9fb629c4189551a2d022fa330f9573f3",),
    "t10k-labels-idx1-ubyte.gz": ("ec29112dd5afa0611ce80d1b7f02629c",),
}
_KMNIST_URL = "http://codh.rois.ac.jp/kmnist/dataset/kmnist/"
_KMNIST = {
    # no checksum recorded for the train npz files: they are parsed and shape-checked instead
    "kmnist-train-imgs.npz": (),
    "kmnist-train-labels.npz": (),
    # the current release, and the first release (the one kept in shared/data)
    "kmnist-test-imgs.npz": (
        "dace6de62ca8b90843cc45366337d02e",
        "c8fe4d39f842711ac6cc8c1b4be5ee21",
    ),
    "kmnist-test-labels.npz": ("3ae489a79983d0fe386152684e3b5412",),
}
_SVHN_URL = "http://ufldl.stanford.edu/housenumbers/"
_SVHN = {
    "train_32x32.mat": ("e26dedcc434d2e4c54c9b2d4a06d0373",),
    "test_32x32.mat": ("eb5a983be6a315427106f1b164d9cef3",),
}
# The original "unpacked" MNIST-M archive (Ganin & Lempitsky 2015), from a public mirror used by
# the pytorch-adapt library, with that library's checksum. After unpacking, the labels files and
# every PNG are checked as they are read.
_MNIST_M_URL = "https://cornell.box.com/shared/static/jado7quprg6hzzdubvwzh9umr75damwi"
_MNIST_M_MD5 = ("859df31c91afe82e80e5012ba928f279",)

_HOW = {
    "mnist": f"the four IDX .gz files from {_MNIST_URL} (or http://yann.lecun.com/exdb/mnist/)",
    "kmnist": f"the npz files from {_KMNIST_URL} (https://github.com/rois-codh/kmnist)",
    "mnist_m": "the original mnist_m.tar.gz release (http://yaroslav.ganin.net), unpacked",
    "svhn": f"train_32x32.mat / test_32x32.mat from {_SVHN_URL}",
}


def md5sum(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _root(root: str | os.PathLike | None) -> Path:
    return Path(root).expanduser() if root is not None else data_root()


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _missing(dataset: str, paths: list[Path], reason: str = "") -> DatasetNotFoundError:
    listing = "\n".join(f"  {p}" for p in paths)
    return DatasetNotFoundError(
        f"{dataset}: missing file(s)\n{listing}\n{reason}"
        f"Get {_HOW[dataset]} and place them there, or point MODNETS_DATA at a folder that holds "
        f"them (the data root now is {data_root()})."
    )


def _download(url: str, dest: Path, md5: tuple[str, ...], timeout: float = 20.0) -> None:
    """Download ``url`` to ``dest`` atomically, checking the md5 when one is known."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
            while block := response.read(1 << 20):
                out.write(block)
        if md5 and md5sum(tmp) not in md5:
            raise DatasetCorruptedError(
                f"downloaded {url} but its md5 {md5sum(tmp)} is not {md5[0]}"
            )
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def _elsewhere(folder: Path, root: Path) -> Path:
    """``folder`` (under ``root``) at the same place under :func:`modnets.data.download_root`."""
    return _download_root() / folder.relative_to(root)


def _ensure(
    dataset: str,
    base_url: str,
    files: dict[str, tuple[str, ...]],
    folder: Path,
    download: bool,
    verify: bool,
    root: Path | None = None,
) -> Path:
    """The folder that holds ``files``: ``folder``, or, where files are missing there and it
    cannot be written, the same folder under :func:`modnets.data.download_root` (downloaded into, md5
    checked, when ``download``)."""
    missing = [folder / name for name in files if not (folder / name).exists()]
    if missing and root is not None and not _writable(folder):
        other = _elsewhere(folder, root)
        if download or all((other / name).exists() for name in files):
            folder, missing = other, [other / n for n in files if not (other / n).exists()]
    if missing and download:
        try:
            for path in missing:
                _download(base_url + path.name, path, files[path.name])
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise _missing(dataset, missing, f"Downloading failed ({err}).\n") from None
    elif missing:
        raise _missing(dataset, missing)
    if verify:
        for name, md5 in files.items():
            if md5 and md5sum(folder / name) not in md5:
                raise DatasetCorruptedError(
                    f"{dataset}: {folder / name} has md5 {md5sum(folder / name)}, which is none of "
                    f"the known releases {list(md5)}; the file is truncated or corrupted. Delete it "
                    "and download it again."
                )
    return folder


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read a (gzipped) IDX file as a numpy array, checking its header against its length."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as err:
        raise DatasetCorruptedError(
            f"{path} is not a readable gzip file ({err}); delete it and download it again"
        ) from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DatasetCorruptedError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    offset = 4 + 4 * ndim
    if len(data) - offset != int(np.prod(shape)):
        raise DatasetCorruptedError(
            f"{path} is truncated: header says {shape} ({int(np.prod(shape))} bytes), "
            f"file has {len(data) - offset}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape)


def _check_pair(dataset: str, images: np.ndarray, labels: np.ndarray, where: Path) -> None:
    if len(images) != len(labels):
        raise DatasetCorruptedError(
            f"{dataset} in {where}: {len(images)} images but {len(labels)} labels"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DatasetCorruptedError(f"{dataset} in {where}: labels outside 0..9")


def mnist_files(split: str = "train", root=None) -> list[Path]:
    """The files of MNIST's ``split`` that :func:`load_mnist` reads (images, then labels)."""
    _check_split(split)
    prefix = "train" if split == "train" else "t10k"
    folder = _root(root) / "MNIST" / "raw"
    return [folder / f"{prefix}-images-idx3-ubyte.gz", folder / f"{prefix}-labels-idx1-ubyte.gz"]


def load_mnist(split: str = "train", root=None, download: bool = True, verify: bool = True):
    """MNIST {cite}`lecun1998mnist`: ``(N, 28, 28)`` uint8 images and labels."""
    _check_split(split)
    folder = _root(root) / "MNIST" / "raw"
    prefix = "train" if split == "train" else "t10k"
    files = {k: v for k, v in _MNIST.items() if k.startswith(prefix)}
    folder = _ensure("mnist", _MNIST_URL, files, folder, download, verify, _root(root))
    images = read_idx(folder / f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64)
    _check_pair("mnist", images, labels, folder)
    return images, labels


def _load_npz(path: Path) -> np.ndarray:
    try:
        with np.load(path) as z:
            return z["arr_0"]
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as err:
        raise DatasetCorruptedError(
            f"{path} is not a readable npz file ({err}); delete it and download it again"
        ) from None


def load_kmnist(split: str = "test", root=None, download: bool = True, verify: bool = True):
    """Kuzushiji-MNIST {cite}`clanuwat2018kmnist`: ``(N, 28, 28)`` uint8 images and labels."""
    _check_split(split)
    folder = _root(root) / "KMNIST" / "raw"
    files = {k: v for k, v in _KMNIST.items() if f"-{split}-" in k}
    folder = _ensure("kmnist", _KMNIST_URL, files, folder, download, verify, _root(root))
    images = _load_npz(folder / f"kmnist-{split}-imgs.npz")
    labels = _load_npz(folder / f"kmnist-{split}-labels.npz").astype(np.int64)
    _check_pair("kmnist", images, labels, folder)
    return images, labels


def load_mnist_m(split: str = "test", root=None, download: bool = True, verify: bool = True):
    """MNIST-M {cite}`ganin2015dann`: ``(N, 32, 32, 3)`` uint8 images and labels (read-only)."""
    _check_split(split)
    base = _root(root) / "MNIST-M"
    folder = base / "mnist_m"
    label_file = folder / f"mnist_m_{split}_labels.txt"
    image_dir = folder / f"mnist_m_{split}"
    if (not label_file.exists() or not image_dir.is_dir()) and (
        folder.exists() or not _writable(base)
    ):  # a partial or read-only copy is never unpacked into: the same place in the home cache
        other = _download_root() / "MNIST-M"
        if download or (other / "mnist_m" / f"mnist_m_{split}_labels.txt").exists():
            base, folder = other, other / "mnist_m"
            label_file = folder / f"mnist_m_{split}_labels.txt"
            image_dir = folder / f"mnist_m_{split}"
    if not label_file.exists() or not image_dir.is_dir():
        if download:
            archive = base / "mnist_m.tar.gz"
            try:
                _download(_MNIST_M_URL, archive, _MNIST_M_MD5)
                with tarfile.open(archive) as tar:
                    tar.extractall(base, filter="data")
            except (urllib.error.URLError, TimeoutError, OSError, tarfile.TarError) as err:
                raise _missing(
                    "mnist_m", [label_file, image_dir], f"Downloading failed ({err}).\n"
                ) from None
        else:
            raise _missing("mnist_m", [label_file, image_dir])
    names, labels = [], []
    for lineno, line in enumerate(label_file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise DatasetCorruptedError(
                f"{label_file}:{lineno}: expected 'name.png label', got {line!r}"
            )
        names.append(parts[0])
        labels.append(int(parts[1]))
    stamps = []
    for name in names:
        try:
            st = os.stat(image_dir / name)
        except FileNotFoundError:
            raise _missing("mnist_m", [image_dir / name], f"{label_file} lists it.\n") from None
        stamps.append((st.st_size, st.st_mtime_ns))
    images = _decode_pngs(image_dir, tuple(names), tuple(stamps))
    labels_arr = np.asarray(labels, dtype=np.int64)
    _check_pair("mnist_m", images, labels_arr, folder)
    return images, labels_arr


# Decoding is most of a digits run at smoke, and every seed reads the same split: once per
# process while no file changes (size and mtime of each), read-only so no caller edits the copy.
@functools.lru_cache(maxsize=2)
def _decode_pngs(image_dir: Path, names: tuple[str, ...], stamps: tuple) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    images = np.empty((len(names), 32, 32, 3), dtype=np.uint8)
    for i, name in enumerate(names):
        path = image_dir / name
        try:
            with Image.open(path) as img:
                images[i] = np.asarray(img.convert("RGB"))
        except FileNotFoundError:
            raise _missing("mnist_m", [path]) from None
        except (OSError, UnidentifiedImageError, ValueError) as err:
            raise DatasetCorruptedError(
                f"{path} cannot be decoded as a 32x32 image ({err})"
            ) from None
    images.flags.writeable = False
    return images


def load_svhn(split: str = "train", root=None, download: bool = True, verify: bool = True):
    """SVHN {cite}`netzer2011svhn` (cropped digits): ``(N, 32, 32, 3)`` uint8 images, labels 0..9."""
    import scipy.io

    _check_split(split)
    folder = _root(root) / "SVHN"
    name = f"{split}_32x32.mat"
    folder = _ensure("svhn", _SVHN_URL, {name: _SVHN[name]}, folder, download, verify, _root(root))
    try:
        mat = scipy.io.loadmat(folder / name)
        images = np.ascontiguousarray(mat["X"].transpose(3, 0, 1, 2))
        labels = mat["y"].astype(np.int64).reshape(-1) % 10  # SVHN stores the digit 0 as 10
    except (ValueError, OSError, KeyError, TypeError, scipy.io.matlab.MatReadError) as err:
        raise DatasetCorruptedError(
            f"{folder / name} is not a readable SVHN .mat file ({err})"
        ) from None
    _check_pair("svhn", images, labels, folder)
    return images, labels


_LOADERS = {"mnist": load_mnist, "kmnist": load_kmnist, "mnist_m": load_mnist_m, "svhn": load_svhn}


def load_digits(dataset: str, split: str, root=None, download: bool = True, verify: bool = True):
    """Dispatch to the loader of ``dataset`` (one of :data:`DIGIT_DATASETS`)."""
    if dataset not in _LOADERS:
        raise ValueError(f"dataset must be one of {DIGIT_DATASETS}, got {dataset!r}")
    return _LOADERS[dataset](split, root=root, download=download, verify=verify)
