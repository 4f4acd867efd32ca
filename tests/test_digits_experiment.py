"""NI §4.2 experiment plumbing on tiny fake datasets (no real data needed)."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_digits_data import fake_mnist

from modnets.experiments import digits

RNG = np.random.default_rng(1)


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    fake_mnist(root, n=300, prefix="train")
    fake_mnist(root, n=100, prefix="t10k")
    folder = root / "MNIST-M" / "mnist_m"
    (folder / "mnist_m_test").mkdir(parents=True)
    lines = []
    for i in range(120):
        Image.fromarray(RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
            folder / "mnist_m_test" / f"{i:08d}.png"
        )
        lines.append(f"{i:08d}.png {i % 10}")
    (folder / "mnist_m_test_labels.txt").write_text("\n".join(lines))
    k = root / "KMNIST" / "raw"
    k.mkdir(parents=True)
    np.savez_compressed(
        k / "kmnist-test-imgs.npz", RNG.integers(0, 256, (500, 28, 28), dtype=np.uint8)
    )
    np.savez_compressed(k / "kmnist-test-labels.npz", np.arange(500, dtype=np.uint8) % 10)
    return root


def test_to_rgb32_upsamples_grey_and_keeps_colour():
    grey = RNG.integers(0, 256, (4, 28, 28), dtype=np.uint8)
    out = digits.to_rgb32(grey)
    assert out.shape == (4, 3, 32, 32) and out.dtype == torch.uint8
    assert torch.equal(out[:, 0], out[:, 2])
    colour = RNG.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    assert torch.equal(digits.to_rgb32(colour).permute(0, 2, 3, 1), torch.from_numpy(colour))


def test_balanced_sample():
    labels = torch.arange(1000) % 10
    idx = digits.balanced_sample(labels, 150, seed=0)
    assert len(idx) == 150 and len(set(idx.tolist())) == 150
    assert torch.bincount(labels[idx]).tolist() == [15] * 10
    assert torch.equal(idx, digits.balanced_sample(labels, 150, seed=0))


def test_data_resplits_mnist_m_and_keeps_kmnist_parts_disjoint(fake_root):
    cfg = digits.CONFIGS["smoke"]
    data = digits.load_pretraining_data(cfg, fake_root, verify=False)
    assert data.names == ("mnist", "mnist_m")
    n_mm_train = int((data.d_train == 1).sum())
    assert n_mm_train == 96 and int((data.d_val == 1).sum()) == 24  # 120 split 80/20
    k = digits.load_kmnist_data(cfg, fake_root, verify=False)
    assert len(k["x_pool"]) == cfg.kmnist_pool and len(k["x_eval"]) == cfg.kmnist_eval
    pool = {x.numpy().tobytes() for x in k["x_pool"]}
    assert not any(x.numpy().tobytes() in pool for x in k["x_eval"])


def test_adaptation_modes_train_the_intended_parameters():
    cfg = digits.CONFIGS["smoke"]
    ni = digits.build_ni(cfg)
    full = digits.prepare_adaptation(ni, cfg, mode="all")
    assert full.config.num_cls == 1
    # everything trains but the signatures, which stay fixed as in pretraining (NI §2)
    frozen = {n for n, p in full.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, _ in full.named_parameters() if "signature_chunks" in n}
    grown = digits.prepare_adaptation(ni, cfg, mode="functions", num_functions=5)
    script = grown.scripts[0]
    assert script.num_functions == 5 and ni.scripts[0].num_functions == 3  # a copy was grown
    trainable = {n for n, p in grown.named_parameters() if p.requires_grad}
    expected = {
        n for n, _ in grown.named_parameters() if "signature_chunks" in n or "code_chunks" in n
    }
    expected |= {n for n, _ in grown.named_parameters() if n.startswith(("cls.", "heads."))}
    assert trainable == expected
    resampled = digits.prepare_adaptation(ni, cfg, resample=True)
    assert not torch.allclose(resampled.scripts[0].codes, ni.scripts[0].codes)
    with pytest.raises(ValueError, match="mode"):
        digits.prepare_adaptation(ni, cfg, mode="heads")


def test_experiment_runs_end_to_end_and_caches_pretraining(fake_root, tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path / "ckpt"))
    cfg = digits.CONFIGS["smoke"]
    results = digits.run(cfg, profile="smoke", show_progress=False, root=fake_root, verify=False)
    assert set(results["ni"]["val_acc"]) == {"mnist", "mnist_m"}
    for name in ("NI", "ViT", "NI (re-sampled functions)"):
        assert set(results["adaptation"][name]) == set(cfg.sample_counts)
    assert set(results["capacity"]) == set(cfg.capacity_functions)
    assert set(results["drop"]) == {0, 1, 2}
    files = list((tmp_path / "ckpt").glob("digits_*.pt"))
    assert len([f for f in files if not f.name.endswith(".train.pt")]) == 2  # the models
    assert len([f for f in files if f.name.endswith(".train.pt")]) == 2  # resumable states
    again = digits.run(cfg, profile="smoke", show_progress=False, root=fake_root, verify=False)
    assert again["ni"]["history"] == results["ni"]["history"]  # loaded, not retrained
    assert again["ni"]["val_acc"] == results["ni"]["val_acc"]
    out = digits.save_results(results, tmp_path / "r.json")
    assert json.loads(out.read_text())["profile"] == "smoke"
    assert "K-MNIST" in digits.format_summary(results)
