"""Data-parallel training (torchrun, gloo on CPU) equals one process on the same global batch."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modnets.experiments import tiny_imagenet as ti
from modnets.experiments.core.harness import Stage

HERE = Path(__file__).parent
# augmentation off: each rank would draw its own crops; so would every per-example draw (DropPath,
# state noise, per-example kernels): one Concrete kernel per layer, drawn from the same seed on
# every rank, as in one process
SMOKE = ti.CONFIGS["smoke"].train
CONFIG = dataclasses.replace(
    SMOKE,
    classes=3,
    max_train_per_class=5,
    max_val_per_class=None,
    augment=None,
    nac={**SMOKE.nac, "drop_path": 0.0, "state_noise": False, "per_example_kernel": False},
    nac_train=dataclasses.replace(SMOKE.nac_train, epochs=2, batch_size=4, lr=1e-2),
)


def train_once(config, seed: int = 0) -> dict:
    from modnets.utils import seed_everything

    data = ti.load_data(config)
    seed_everything(seed)
    model = ti.build_model("nac", config).double()  # float64: summation order stays invisible
    ti.train(model, data, config, config.nac_train, Stage(seed=seed, show_progress=False))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture
def fake_data(tmp_path, monkeypatch):
    sys.path.insert(0, str(HERE))
    from test_tiny_imagenet_data import make_tree

    make_tree(tmp_path / "data")
    monkeypatch.setenv("MODNETS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MODNETS_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.mark.long
def test_two_ranks_match_one_process(fake_data):
    out = fake_data / "ddp"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(HERE / "ddp_worker.py"),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (torch.load(out / f"rank{r}.pt") for r in (0, 1))
    single = train_once(CONFIG)
    other = train_once(CONFIG, seed=1)  # other batches, other kernels
    for k in single:
        torch.testing.assert_close(r0[k], r1[k], rtol=0, atol=0)  # ranks stay identical
    gap = max((r0[k] - single[k]).abs().max().item() for k in single)
    scale = max((other[k] - single[k]).abs().max().item() for k in single)
    # Equal up to summation order. In float32, AdamW would turn the rounding noise on gradients
    # that are exactly zero in theory (a key bias, which cancels in the softmax) into steps of
    # order lr; in float64 the noise stays far below AdamW's eps.
    worst = max(single, key=lambda k: (r0[k] - single[k]).abs().max().item())
    assert gap < 1e-9, (gap, worst)
    assert scale > 1e-3, scale
