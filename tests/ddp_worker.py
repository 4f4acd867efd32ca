"""Run by ``torchrun`` from tests/test_distributed.py: a few steps of the Tiny-ImageNet training
loop on a fake tree, data-parallel over the ranks; writes each rank's final weights."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_distributed import CONFIG, train_once  # noqa: E402

from modnets import distributed  # noqa: E402

if __name__ == "__main__":
    out = Path(sys.argv[1])
    distributed.setup()
    assert distributed.world_size() == 2, "run with torchrun --nproc_per_node=2"
    state = train_once(CONFIG)
    torch.save(state, out / f"rank{distributed.rank()}.pt")
    distributed.cleanup()
