"""Decoded Tiny-ImageNet images: JPEGs decoded in parallel into one uint8 array, cached on disk
per selection of classes and images."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from modnets.data import DatasetCorruptedError, DatasetNotFoundError
from modnets.utils import atomic_file

IMAGE_SIZE = 64

CACHE_ENV_VAR = "MODNETS_CACHE"

CACHE_VERSION = 1


def cache_dir() -> Path:
    """Where decoded arrays are cached: ``$MODNETS_CACHE/tiny_imagenet_cache`` or
    ``~/.cache/modnets/tiny_imagenet_cache`` (not created here)."""
    env = os.environ.get(CACHE_ENV_VAR, "").strip()
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "modnets"
    return base / "tiny_imagenet_cache"


def _decode(path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            rgb = np.asarray(img.convert("RGB"))
    except FileNotFoundError:
        raise DatasetNotFoundError(
            f"Tiny-ImageNet: {path} is missing (it is listed in val_annotations.txt)"
        ) from None
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as err:
        raise DatasetCorruptedError(
            f"{path} cannot be decoded as a JPEG ({err}); the file is truncated or corrupted"
        ) from None
    if rgb.shape != (IMAGE_SIZE, IMAGE_SIZE, 3):
        raise DatasetCorruptedError(
            f"{path} is {rgb.shape[1]}x{rgb.shape[0]}, expected {IMAGE_SIZE}x{IMAGE_SIZE}"
        )
    return rgb.transpose(2, 0, 1)


def decode_all(files: list[Path], num_workers: int) -> np.ndarray:
    out = np.empty((len(files), 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)

    def one(i: int) -> None:
        out[i] = _decode(files[i])

    if num_workers > 0 and len(files) > 1:
        with ThreadPoolExecutor(num_workers) as pool:
            list(pool.map(one, range(len(files)), chunksize=64))
    else:
        for i in range(len(files)):
            one(i)
    return out


def cache_file(folder: Path, split: str, wnids: list[str], max_per_class, files, extra) -> Path:
    h = hashlib.sha1()
    h.update(
        json.dumps(
            [CACHE_VERSION, str(folder.resolve()), split, wnids, max_per_class], sort_keys=True
        ).encode()
    )
    for path in [*extra, *files]:
        st = os.stat(path)
        h.update(f"\n{path.relative_to(folder)}\t{st.st_size}\t{st.st_mtime_ns}".encode())
    cap = "all" if max_per_class is None else str(max_per_class)
    return cache_dir() / f"{split}-{len(wnids)}cls-{cap}-{h.hexdigest()[:20]}.npz"


def read_cache(path: Path, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        with np.load(path) as z:
            images, labels = z["images"], z["labels"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if images.shape != (n, 3, IMAGE_SIZE, IMAGE_SIZE) or images.dtype != np.uint8:
        return None
    if labels.shape != (n,) or labels.dtype != np.int64:
        return None
    return images, labels


def write_cache(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """Write atomically; give up silently where the cache folder cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path.parent, os.W_OK):
            return
        with atomic_file(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, images=images, labels=labels)
    except OSError:
        pass
