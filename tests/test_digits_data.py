"""Digit loaders on tiny fake files in each on-disk layout, including broken and missing ones."""

import gzip
import io
import struct
import tarfile
import urllib.error

import numpy as np
import pytest
import scipy.io
from PIL import Image

from modnets.data import DatasetCorruptedError, DatasetNotFoundError
from modnets.data import digits as dd
from modnets.data.digits import (
    load_digits,
    load_kmnist,
    load_mnist,
    load_mnist_m,
    load_svhn,
    read_idx,
)

RNG = np.random.default_rng(0)


def write_idx(path, array, compress=True):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    (gzip.open if compress else open)(path, "wb").write(data)


def fake_mnist(root, n=7, prefix="train"):
    images = RNG.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = RNG.integers(0, 10, size=n, dtype=np.uint8)
    write_idx(root / "MNIST" / "raw" / f"{prefix}-images-idx3-ubyte.gz", images)
    write_idx(root / "MNIST" / "raw" / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return images, labels


def test_mnist_idx_layout(tmp_path):
    images, labels = fake_mnist(tmp_path)
    x, y = load_mnist("train", root=tmp_path, download=False, verify=False)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)
    assert y.dtype == np.int64


def test_mnist_md5_mismatch_is_reported(tmp_path):
    fake_mnist(tmp_path)
    with pytest.raises(DatasetCorruptedError, match="md5"):
        load_mnist("train", root=tmp_path, download=False, verify=True)


def test_corrupted_gzip_and_truncated_idx_are_reported(tmp_path):
    images, _ = fake_mnist(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte.gz"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # truncated gzip stream
    with pytest.raises(DatasetCorruptedError, match="gzip"):
        load_mnist("train", root=tmp_path, download=False, verify=False)
    write_idx(path, images)
    full = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(full[:-100]))  # valid gzip, short payload
    with pytest.raises(DatasetCorruptedError, match="truncated"):
        read_idx(path)


def test_missing_files_name_dataset_path_and_fix(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        load_mnist("test", root=tmp_path, download=False)
    msg = str(err.value)
    assert "mnist" in msg and str(tmp_path / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz") in msg
    assert "MODNETS_DATA" in msg


def test_kmnist_npz_layout_and_bad_npz(tmp_path):
    folder = tmp_path / "KMNIST" / "raw"
    folder.mkdir(parents=True)
    images = RNG.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labels = np.arange(5, dtype=np.uint8)
    np.savez_compressed(folder / "kmnist-test-imgs.npz", images)
    np.savez_compressed(folder / "kmnist-test-labels.npz", labels)
    x, y = load_kmnist("test", root=tmp_path, download=False, verify=False)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)
    (folder / "kmnist-test-imgs.npz").write_bytes(b"not a zip file")
    with pytest.raises(DatasetCorruptedError, match="npz"):
        load_kmnist("test", root=tmp_path, download=False, verify=False)


def test_mnist_m_png_layout_missing_and_broken_png(tmp_path, monkeypatch):
    folder = tmp_path / "MNIST-M" / "mnist_m"
    (folder / "mnist_m_test").mkdir(parents=True)
    images = RNG.integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    lines = []
    for i, img in enumerate(images):
        Image.fromarray(img).save(folder / "mnist_m_test" / f"{i:08d}.png")
        lines.append(f"{i:08d}.png {i + 4}")
    (folder / "mnist_m_test_labels.txt").write_text("\n".join(lines) + "\n")
    x, y = load_mnist_m("test", root=tmp_path, download=False)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, [4, 5, 6])
    # decoded once per process: read again, no PNG is opened, and the copy cannot be edited
    with monkeypatch.context() as m:
        m.setattr(Image, "open", lambda *a, **k: pytest.fail("decoded a second time"))
        again, _ = load_mnist_m("test", root=tmp_path, download=False)
    assert again is x and not x.flags.writeable
    (folder / "mnist_m_test" / "00000001.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(DatasetCorruptedError, match="00000001.png"):
        load_mnist_m("test", root=tmp_path, download=False)
    (folder / "mnist_m_test" / "00000001.png").unlink()
    with pytest.raises(DatasetNotFoundError, match="00000001.png"):
        load_mnist_m("test", root=tmp_path, download=False)
    with pytest.raises(DatasetNotFoundError, match="mnist_m_train_labels.txt"):
        load_mnist_m("train", root=tmp_path, download=False)


def test_svhn_mat_layout_maps_ten_to_zero(tmp_path):
    folder = tmp_path / "SVHN"
    folder.mkdir()
    X = RNG.integers(0, 256, size=(32, 32, 3, 4), dtype=np.uint8)
    y = np.array([[10], [1], [9], [10]], dtype=np.uint8)
    scipy.io.savemat(folder / "test_32x32.mat", {"X": X, "y": y})
    images, labels = load_svhn("test", root=tmp_path, download=False, verify=False)
    assert images.shape == (4, 32, 32, 3)
    np.testing.assert_array_equal(images[1], X[..., 1])
    np.testing.assert_array_equal(labels, [0, 1, 9, 0])
    (folder / "test_32x32.mat").write_bytes(b"garbage")
    with pytest.raises(DatasetCorruptedError, match="SVHN"):
        load_svhn("test", root=tmp_path, download=False, verify=False)


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        load_mnist("validation", download=False)
    with pytest.raises(ValueError, match="dataset"):
        load_digits("cifar", "train")


def test_a_read_only_or_partial_root_gets_its_missing_split_downloaded_elsewhere(
    tmp_path, monkeypatch
):
    """The gpu profile needs full releases (MNIST-M and SVHN train): a missing split is
    downloaded, md5-checked, into ~/.cache/modnets when the data root is read-only or holds a
    partial copy, which is left as it was; offline, the error names what is missing."""
    shared, home = tmp_path / "shared", tmp_path / "home"
    monkeypatch.setattr(dd, "_download_root", lambda: home)
    monkeypatch.setattr(dd, "_writable", lambda p: not str(p).startswith(str(shared)))
    fake_mnist(shared, prefix="t10k")  # the test split only, as in ../shared/data
    before = sorted(p.relative_to(shared) for p in shared.rglob("*"))

    def offline(url, dest, md5, timeout=20.0):
        raise urllib.error.URLError("no internet")

    monkeypatch.setattr(dd, "_download", offline)
    with pytest.raises(DatasetNotFoundError, match="no internet") as info:
        load_mnist("train", root=shared, verify=False)
    assert "train-images-idx3-ubyte.gz" in str(info.value)
    payload = {}
    images, labels = RNG.integers(0, 256, (5, 28, 28), dtype=np.uint8), np.arange(5) % 10
    write_idx(tmp_path / "srv" / "train-images-idx3-ubyte.gz", images)
    write_idx(tmp_path / "srv" / "train-labels-idx1-ubyte.gz", labels)

    def fake_download(url, dest, md5, timeout=20.0):
        payload.setdefault("dests", []).append(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        src = tmp_path / "srv" / dest.name
        dest.write_bytes(src.read_bytes() if src.exists() else payload["tar"])

    monkeypatch.setattr(dd, "_download", fake_download)
    x, y = load_mnist("train", root=shared, verify=False)
    np.testing.assert_array_equal(x, images)
    assert all(d.parent == home / "MNIST" / "raw" for d in payload["dests"])
    assert load_mnist("test", root=shared, verify=False)[0].shape == (7, 28, 28)  # still read here
    assert sorted(p.relative_to(shared) for p in shared.rglob("*")) == before

    # MNIST-M: a folder with only the test split is partial -- the archive goes elsewhere
    folder = shared / "MNIST-M" / "mnist_m" / "mnist_m_test"
    folder.mkdir(parents=True)
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(folder / "00000000.png")
    (folder.parent / "mnist_m_test_labels.txt").write_text("00000000.png 3\n")
    before = sorted(p.relative_to(shared) for p in shared.rglob("*"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        png = io.BytesIO()
        Image.fromarray(np.full((32, 32, 3), 9, np.uint8)).save(png, format="PNG")
        for name, data in (
            ("mnist_m/mnist_m_train/00000000.png", png.getvalue()),
            ("mnist_m/mnist_m_train_labels.txt", b"00000000.png 7\n"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    payload["tar"] = buf.getvalue()
    x, y = load_mnist_m("train", root=shared)
    assert y.tolist() == [7] and (home / "MNIST-M" / "mnist_m" / "mnist_m_train").is_dir()
    assert sorted(p.relative_to(shared) for p in shared.rglob("*")) == before
    assert load_mnist_m("test", root=shared)[1].tolist() == [3]
