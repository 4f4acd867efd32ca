"""Tiny-ImageNet loader on a tiny fake tree (layout, labels, errors, cache, download) and the
batch augmentation; one test on the shared real subset, skipped when it is absent."""

import io
import os
import urllib.error
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from modnets.data import DatasetCorruptedError, DatasetNotFoundError
from modnets.data import tiny_imagenet as tin
from modnets.data.tiny_imagenet import (
    IMAGENET_MEAN,
    TinyImageNetAugment,
    cache_dir,
    load_tiny_imagenet,
    normalize,
    tiny_imagenet_dir,
    train_augment,
)

WNIDS = ["n0000003", "n0000001", "n0000002"]  # wnids.txt order, deliberately not sorted
NAMES = {"n0000003": "cat, kitty", "n0000001": "reel", "n0000002": "volleyball"}
N_TRAIN = 4  # images per class
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"  # <checkout>/../shared/data


def jpeg(color, mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (64, 64), color).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def colour(label: int, i: int) -> tuple[int, int, int]:
    """A flat colour that encodes class and index (recovered after JPEG within a few levels)."""
    return (40 * label + 20, 30 * i + 10, 200)


def make_tree(root: Path) -> Path:
    folder = root / "TinyImageNet" / "tiny-imagenet-200"
    folder.mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(WNIDS) + "\n")
    (folder / "words.txt").write_text(
        "n0000000\tentity\n" + "".join(f"{w}\t{NAMES[w]}\n" for w in sorted(WNIDS))
    )
    for label, wnid in enumerate(WNIDS):
        images = folder / "train" / wnid / "images"
        images.mkdir(parents=True)
        for i in range(N_TRAIN):
            grey = label == 1 and i == 2
            data = jpeg(77, "L") if grey else jpeg(colour(label, i))
            (images / f"{wnid}_{i}.JPEG").write_bytes(data)
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
    # a name with a two-digit index must sort after _2, not after _1
    (folder / "train" / WNIDS[0] / "images" / f"{WNIDS[0]}_10.JPEG").write_bytes(jpeg(colour(0, 7)))
    (folder / "val" / "images").mkdir(parents=True)
    val_labels = [2, 0, 1, 0, 2, 1, 0]
    lines = []
    for k, label in enumerate(val_labels):
        (folder / "val" / "images" / f"val_{k}.JPEG").write_bytes(jpeg((10 * k, 100, 40 * label)))
        lines.append(f"val_{k}.JPEG\t{WNIDS[label]}\t0\t0\t63\t63")
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MODNETS_DATA", str(tmp_path / "data"))
    return make_tree(tmp_path / "data")


def test_train_shapes_labels_names_and_order(tree):
    data = load_tiny_imagenet("train", download=False)
    images, labels, names = data  # unpacks like a tuple
    assert images.shape == (3 * N_TRAIN + 1, 3, 64, 64) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64
    assert labels.tolist() == [0] * (N_TRAIN + 1) + [1] * N_TRAIN + [2] * N_TRAIN
    assert names == ["cat", "reel", "volleyball"] and data.wnids == WNIDS
    assert data.num_classes == 3
    # class 0 is read in index order 0, 1, 2, 3, 10: its green channel encodes the index
    green = images[:5, 1].float().mean((1, 2))
    expected = torch.tensor([30.0 * i + 10 for i in (0, 1, 2, 3, 7)])
    assert torch.allclose(green, expected, atol=4)


def test_greyscale_jpeg_becomes_three_equal_channels(tree):
    images, labels, _ = load_tiny_imagenet("train", classes=[WNIDS[1]], download=False)
    grey = images[2]  # n0000001_2 is the 'L' mode JPEG
    assert grey.shape == (3, 64, 64)
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])
    assert not torch.equal(images[0, 0], images[0, 2])  # the others stay colour


def test_classes_as_list_remaps_labels_in_given_order(tree):
    data = load_tiny_imagenet("train", classes=[WNIDS[2], WNIDS[0]], download=False)
    assert data.wnids == [WNIDS[2], WNIDS[0]] and data.class_names == ["volleyball", "cat"]
    assert data.labels.tolist() == [0] * N_TRAIN + [1] * (N_TRAIN + 1)
    red = data.images[:, 0].float().mean((1, 2))  # red channel encodes the wnids.txt position
    assert torch.allclose(red[:N_TRAIN], torch.full((N_TRAIN,), 100.0), atol=4)
    assert torch.allclose(red[N_TRAIN:], torch.full((N_TRAIN + 1,), 20.0), atol=4)


def test_classes_as_int_and_max_per_class(tree):
    data = load_tiny_imagenet("train", classes=2, max_per_class=2, download=False)
    assert data.wnids == WNIDS[:2]
    assert data.labels.tolist() == [0, 0, 1, 1]
    full = load_tiny_imagenet("train", classes=2, download=False)
    assert torch.equal(data.images[:2], full.images[:2])  # the lowest indices are kept


def test_val_labels_come_from_annotations(tree):
    data = load_tiny_imagenet("val", download=False)
    assert data.labels.tolist() == [2, 0, 1, 0, 2, 1, 0]
    sub = load_tiny_imagenet("val", classes=[WNIDS[2], WNIDS[0]], download=False)
    assert sub.labels.tolist() == [0, 1, 1, 0, 1]  # val_0, val_1, val_3, val_4, val_6
    capped = load_tiny_imagenet("val", classes=[WNIDS[0]], max_per_class=2, download=False)
    assert capped.labels.tolist() == [0, 0]
    assert torch.equal(capped.images, data.images[[1, 3]])


def test_missing_root_names_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DatasetNotFoundError) as info:
        load_tiny_imagenet("val", root=tmp_path / "nowhere", download=False)
    message = str(info.value)
    assert str(tiny_imagenet_dir(tmp_path / "nowhere")) in message
    assert "MODNETS_DATA" in message and "tiny-imagenet-200.zip" in message


def test_failed_download_names_the_path_and_leaves_nothing(tmp_path, monkeypatch):
    def offline(url, dest, md5, timeout=20.0):
        raise urllib.error.URLError("no internet")

    monkeypatch.setattr(tin, "_download", offline)
    with pytest.raises(DatasetNotFoundError, match="no internet") as info:
        load_tiny_imagenet("train", root=tmp_path, download=True, cache=False)
    assert str(tmp_path / "TinyImageNet" / "tiny-imagenet-200") in str(info.value)
    assert not (tmp_path / "TinyImageNet" / "tiny-imagenet-200").exists()


def test_download_unpacks_the_zip_into_place(tmp_path, monkeypatch):
    base = make_tree(tmp_path / "src").parent  # the zip holds tiny-imagenet-200/...
    payload = io.BytesIO()
    with zipfile.ZipFile(payload, "w") as zf:
        for path in sorted(base.rglob("*")):
            zf.write(path, path.relative_to(base).as_posix())

    def fake_download(url, dest, md5, timeout=20.0):
        assert url == tin.TINY_IMAGENET_URL and md5 == (tin.TINY_IMAGENET_MD5,)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(payload.getvalue())

    monkeypatch.setattr(tin, "_download", fake_download)
    root = tmp_path / "fresh"
    data = load_tiny_imagenet("val", root=root, download=True, cache=False)
    assert data.labels.tolist() == [2, 0, 1, 0, 2, 1, 0]
    assert sorted(os.listdir(root / "TinyImageNet")) == ["tiny-imagenet-200"]  # zip, temp gone


def test_bad_arguments_name_the_argument(tree):
    with pytest.raises(ValueError, match="split"):
        load_tiny_imagenet("test", download=False)
    with pytest.raises(ValueError, match="classes"):
        load_tiny_imagenet("train", classes=["n0000001", "n9999999"], download=False)
    with pytest.raises(ValueError, match="classes"):
        load_tiny_imagenet("train", classes=4, download=False)
    with pytest.raises(ValueError, match="classes"):
        load_tiny_imagenet("train", classes="n0000001", download=False)
    with pytest.raises(ValueError, match="max_per_class"):
        load_tiny_imagenet("train", max_per_class=0, download=False)


def test_class_without_train_images_is_reported(tree):
    (tree / "train" / WNIDS[1] / "images").rename(tree / "train" / WNIDS[1] / "moved")
    with pytest.raises(DatasetNotFoundError, match=WNIDS[1]):
        load_tiny_imagenet("train", download=False)
    assert len(load_tiny_imagenet("train", classes=[WNIDS[0]], download=False).labels) == 5


def test_truncated_jpeg_names_the_file(tree):
    bad = tree / "train" / WNIDS[2] / "images" / f"{WNIDS[2]}_1.JPEG"
    bad.write_bytes(bad.read_bytes()[:300])
    with pytest.raises(DatasetCorruptedError) as info:
        load_tiny_imagenet("train", download=False)
    assert str(bad) in str(info.value)


def test_cache_is_written_and_used(tree, monkeypatch):
    first = load_tiny_imagenet("train", classes=2, download=False)
    files = list(cache_dir().glob("*.npz"))
    assert len(files) == 1 and files[0].is_relative_to(tree.parents[2])

    def no_decode(*args):
        raise AssertionError("decoded although cached")

    decode_all = tin.decode_all
    monkeypatch.setattr(tin, "decode_all", no_decode)
    second = load_tiny_imagenet("train", classes=2, download=False)
    assert torch.equal(first.images, second.images) and torch.equal(first.labels, second.labels)
    monkeypatch.setattr(tin, "decode_all", decode_all)
    # changed data gets a new key: never served stale
    (tree / "train" / WNIDS[0] / "images" / f"{WNIDS[0]}_10.JPEG").unlink()
    third = load_tiny_imagenet("train", classes=2, download=False)
    assert len(third.labels) == len(first.labels) - 1
    # a broken cache file is ignored and rebuilt
    for path in cache_dir().glob("*.npz"):
        path.write_bytes(b"garbage")
    assert torch.equal(load_tiny_imagenet("train", classes=2, download=False).images, third.images)


def test_unwritable_cache_falls_back_silently(tree, monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("MODNETS_CACHE", str(blocker))
    data = load_tiny_imagenet("val", download=False)
    assert len(data.labels) == 7 and blocker.is_file()


def test_normalize():
    x = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    y = normalize(x)
    assert y.dtype == torch.float32
    assert torch.allclose(y[:, 0], torch.tensor((1 - IMAGENET_MEAN[0]) / 0.229))
    assert torch.allclose(tin.denormalize(y), torch.ones(2, 3, 4, 4), atol=1e-6)


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_augment_shape_changes_input_and_is_reproducible(profile):
    x = torch.randint(0, 256, (8, 3, 64, 64), dtype=torch.uint8)
    torch.manual_seed(1)
    a = train_augment(x, profile)
    torch.manual_seed(1)
    b = train_augment(x, profile)
    assert a.shape == (8, 3, 64, 64) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert not torch.allclose(a, normalize(x), atol=1e-3)
    assert not torch.equal(a, train_augment(x, profile))
    out = TinyImageNetAugment(profile, size=32, normalize=False)(x.float() / 255)
    assert out.shape == (8, 3, 32, 32) and 0 <= out.min() and out.max() <= 1


def test_mixup_and_cutmix_soft_targets_match_the_images():
    n, classes = 16, 16
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, 32, 32) / 100
    y = torch.arange(n)
    for kind in ("mixup", "cutmix"):
        aug = TinyImageNetAugment(
            "cpu",
            size=32,
            scale=(1.0, 1.0),
            flip=False,
            normalize=False,
            num_classes=classes,
            **{kind: 1.0},
        )
        torch.manual_seed(3)
        out, soft = aug(x, y)
        assert soft.shape == (n, classes)
        assert torch.allclose(soft.sum(1), torch.ones(n))
        # each image is a constant y/100, so the target-weighted mean value equals the pixel mean
        assert torch.allclose(out.mean((1, 2, 3)), soft @ (y.float() / 100), atol=1e-5), kind
        assert (soft.max(1).values < 1).any(), kind  # something was mixed
    plain, soft = TinyImageNetAugment("smoke", num_classes=5)(x[:5].clone(), y[:5])
    assert torch.equal(soft, torch.eye(5))
    with pytest.raises(ValueError, match="labels"):
        TinyImageNetAugment("cpu", mixup=0.5, num_classes=3)(x)


@pytest.mark.skipif(
    not (SHARED / "TinyImageNet" / "tiny-imagenet-200" / "wnids.txt").exists(),
    reason="shared Tiny-ImageNet subset not present",
)
def test_real_subset_val_20_classes(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CACHE", str(tmp_path / "cache"))
    data = load_tiny_imagenet("val", classes=20, root=SHARED, download=False)
    assert data.images.shape == (1000, 3, 64, 64)
    assert np.array_equal(np.bincount(data.labels.numpy()), np.full(20, 50))
    assert data.class_names[:3] == ["Egyptian cat", "reel", "volleyball"]


def _full_zip(tmp_path: Path) -> bytes:
    """The "release" for the tests: the fake tree with 5 train images in every class."""
    folder = make_tree(tmp_path / "release")
    for label, wnid in enumerate(WNIDS[1:], start=1):
        (folder / "train" / wnid / "images" / f"{wnid}_4.JPEG").write_bytes(jpeg(colour(label, 4)))
    payload = io.BytesIO()
    with zipfile.ZipFile(payload, "w") as zf:
        for path in sorted(folder.parent.rglob("*")):
            zf.write(path, path.relative_to(folder.parent).as_posix())
    return payload.getvalue()


@pytest.fixture
def partial(tmp_path, monkeypatch):
    """A data root with part of the release (4 of 5 images in two classes, as the shared
    subset holds 100 of 500), made read-only, and an empty writable home cache."""
    monkeypatch.setattr(tin, "TRAIN_PER_CLASS", 5)
    root = tmp_path / "shared"
    make_tree(root)
    monkeypatch.setattr(tin, "_download_root", lambda: tmp_path / "home" / ".cache" / "modnets")
    monkeypatch.setenv("MODNETS_CACHE", str(tmp_path / "cache"))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    os.chmod(root, 0o555)
    yield root, before
    os.chmod(root, 0o755)


def test_a_partial_train_split_is_never_trained_on_as_the_full_one(partial, tmp_path, monkeypatch):
    root, before = partial

    # offline: it fails before anything is trained, naming the classes that fall short
    def offline(url, dest, md5, timeout=20.0):
        raise urllib.error.URLError("no internet")

    monkeypatch.setattr(tin, "_download", offline)
    with pytest.raises(DatasetNotFoundError) as info:
        load_tiny_imagenet("train", root=root, full=True, cache=False)
    message = str(info.value)
    assert "2 classes hold fewer than the release's 5 train images" in message
    assert "no internet" in message and tin.TINY_IMAGENET_URL in message
    assert not (
        tmp_path / "home" / ".cache" / "modnets" / "TinyImageNet" / "tiny-imagenet-200"
    ).exists()
    with pytest.raises(DatasetNotFoundError, match="downloading is off"):
        load_tiny_imagenet("train", root=root, full=True, download=False, cache=False)
    # a capped or partial request still reads the subset as it is
    assert len(load_tiny_imagenet("train", root=root, max_per_class=4, cache=False).labels) == 12

    # online: the release is downloaded, checked and unpacked into the writable home cache;
    # the read-only partial copy is left exactly as it was
    release = _full_zip(tmp_path)
    calls = []

    def fake_download(url, dest, md5, timeout=20.0):
        assert url == tin.TINY_IMAGENET_URL and md5 == (tin.TINY_IMAGENET_MD5,)
        calls.append(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(release)

    monkeypatch.setattr(tin, "_download", fake_download)
    data = load_tiny_imagenet("train", root=root, full=True, cache=False)
    assert data.labels.bincount().tolist() == [5, 5, 5]
    assert (
        len(calls) == 1
        and calls[0].parent == tmp_path / "home" / ".cache" / "modnets" / "TinyImageNet"
    )
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    # the next call finds the full copy: no second download
    assert load_tiny_imagenet(
        "train", root=root, full=True, cache=False
    ).labels.bincount().tolist() == [5, 5, 5]
    assert len(calls) == 1
