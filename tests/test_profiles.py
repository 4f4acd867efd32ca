from dataclasses import dataclass

import pytest
import torch

from modnets import profiles
from modnets.data import data_root
from modnets.utils import default_device, seed_everything


def test_profile_from_env(monkeypatch):
    for name in profiles.PROFILES:
        monkeypatch.setenv("MODNETS_PROFILE", name)
        assert profiles.get_profile() == name


def test_bogus_profile_lists_valid_ones(monkeypatch):
    monkeypatch.setenv("MODNETS_PROFILE", "bogus")
    with pytest.raises(ValueError, match=r"MODNETS_PROFILE='bogus'.*smoke.*cpu.*gpu"):
        profiles.get_profile()
    with pytest.raises(ValueError, match="valid profiles"):
        profiles.get_profile("huge")


def test_default_profile_follows_hardware(monkeypatch):
    monkeypatch.delenv("MODNETS_PROFILE", raising=False)
    assert profiles.get_profile() == ("gpu" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert profiles.get_profile() == "gpu"


def test_select_picks_dataclass_instance(monkeypatch):
    @dataclass(frozen=True)
    class Cfg:
        steps: int

    table = {"smoke": Cfg(1), "cpu": Cfg(10), "gpu": Cfg(100)}
    monkeypatch.setenv("MODNETS_PROFILE", "smoke")
    assert profiles.select(table) == Cfg(1)
    assert profiles.select(table, "gpu") == Cfg(100)
    with pytest.raises(ValueError, match="missing"):
        profiles.select({"smoke": Cfg(1)})


def test_seed_everything_reproducible():
    seed_everything(5)
    a = torch.randn(4)
    seed_everything(5)
    assert torch.equal(a, torch.randn(4))
    seed_everything(6)
    assert not torch.equal(a, torch.randn(4))


def test_default_device_is_usable():
    torch.zeros(1, device=default_device())


def test_data_root(monkeypatch, tmp_path):
    monkeypatch.setenv("MODNETS_DATA", str(tmp_path))
    assert data_root() == tmp_path
    monkeypatch.delenv("MODNETS_DATA")
    assert data_root().parts[-2:] == (".cache", "modnets")
