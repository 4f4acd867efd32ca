import os
import signal

import pytest

# the checks the Ctrl-C test shares with the experiments' tests: failures show their values
pytest.register_assert_rewrite("smoke_checks")


def pytest_collection_modifyitems(items):
    """The long tests (``@pytest.mark.long``) first, the rest in their usual order: `make test`'s
    test processes take the next test whenever they are free, so they end together instead of
    one running a long test begun last while the other waits."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


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


@pytest.fixture(autouse=True, scope="session")
def _private_autotune(tmp_path_factory):
    """Tests measure their own path choices (modnets.nn.autotune), never the user's."""
    old = os.environ.get("MODNETS_AUTOTUNE")
    os.environ["MODNETS_AUTOTUNE"] = str(tmp_path_factory.mktemp("autotune") / "autotune.json")
    yield
    if old is None:
        os.environ.pop("MODNETS_AUTOTUNE", None)
    else:
        os.environ["MODNETS_AUTOTUNE"] = old


@pytest.fixture(autouse=True)
def _seed():
    import torch  # here, not at the top: pytest-xdist's controlling process never needs it

    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_enabled():
    """Ctrl-C raises KeyboardInterrupt in the tests (and the processes they start), even when the
    suite was started with it ignored (`nohup make test &`): several tests send a real SIGINT."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
