import os

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _private_checkpoints(tmp_path_factory):
    """Tests never read (or leave) checkpoints in the user's cache."""
    old = os.environ.get("MODNETS_CHECKPOINTS")
    os.environ["MODNETS_CHECKPOINTS"] = str(tmp_path_factory.mktemp("checkpoints"))
    yield
    if old is None:
        os.environ.pop("MODNETS_CHECKPOINTS", None)
    else:
        os.environ["MODNETS_CHECKPOINTS"] = old


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
