"""Every model the book trains, by name, in timm's manner.

``create_model("ni_digits_cpu")`` builds the NI that chapter 6 trains at the ``cpu`` profile;
``list_models()`` names them all: one variant per experiment model and profile (``cpu``, the
book's reduced scale, and ``gpu``, the papers' settings). Keyword arguments override fields of
the model's configuration (``NIConfig`` / ``NACConfig`` fields, a ViT's ``depth``, a ConvNet's
arguments). ``save_pretrained(model, folder)`` writes a trained model as a JSON config beside its
weights, and ``from_pretrained(folder)`` builds it again -- after ``add_functions``,
``remove_functions``, ``drop_modules`` or ``eliminate_edges`` too -- loading the weights with
``torch.load(weights_only=True)``, which runs no pickled code.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

__all__ = ["create_model", "list_models", "example_input", "save_pretrained", "from_pretrained"]

PROFILES = ("cpu", "gpu")
FORMAT = "modnets-pretrained-1"


@functools.cache
def _variants() -> dict[str, tuple[Callable[..., nn.Module], Callable, str]]:
    """``name -> (build(**overrides), example(batch), what it is)``: every model an experiment
    registers (:class:`~modnets.experiments.core.experiment.RegisteredModel`), once per profile,
    found when first asked for (importing modnets imports no experiment)."""
    from modnets.experiments import get, list_experiments
    from modnets.profiles import select

    out = {}
    for experiment in map(get, list_experiments()):
        for family, model in experiment.registered.items():
            for profile in PROFILES:
                config = select(experiment.configs, profile)
                build = functools.partial(model.build, config)
                example = functools.partial(model.example, config)
                out[f"{family}_{profile}"] = (build, example, f"{model.what} ({profile} profile)")
    return out


def list_models(pattern: str = "*") -> list[str]:
    """The registered names matching the shell-style ``pattern`` (``"ni_*"``), sorted."""
    return sorted(fnmatch.filter(_variants(), pattern))


def create_model(name: str, pretrained: bool = False, **overrides) -> nn.Module:
    """The model ``name`` (one of :func:`list_models`), untrained, with ``overrides`` applied to
    its configuration. ``pretrained``: no trained weights are published with the library; train
    with the experiment and load a folder with :func:`from_pretrained`."""
    variants = _variants()
    if name not in variants:
        close = difflib.get_close_matches(name, variants, n=3)
        hint = f"; did you mean {close}?" if close else ""
        raise ValueError(f"name must be one of list_models(), got {name!r}{hint}")
    if pretrained:
        raise ValueError(
            "pretrained=True: modnets publishes no trained weights; train the model with its "
            "experiment, save it with save_pretrained and load it with from_pretrained"
        )
    model = variants[name][0](**overrides)
    model.registry_name, model.registry_overrides = name, _plain(overrides)
    return model


def example_input(name: str, batch: int = 2) -> torch.Tensor:
    """A random input of the shape model ``name`` reads, ``batch`` samples."""
    if name not in _variants():
        create_model(name)  # says what the names are
    return _variants()[name][1](batch)


# ----------------------------------------------------------------------------- save and load


def _plain(value):
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _overrides(model: nn.Module) -> dict:
    """What makes ``model``'s configuration differ from its registered variant's: fields of its
    config, a ViT's depth."""
    base = create_model(model.registry_name)
    out = dict(getattr(model, "registry_overrides", {}))
    config = getattr(model, "config", None)
    if dataclasses.is_dataclass(config):
        for f in dataclasses.fields(config):
            now = getattr(config, f.name)
            if now != getattr(base.config, f.name):
                out[f.name] = _plain(now)
    if getattr(model, "depth", None) != getattr(base, "depth", None):
        out["depth"] = model.depth
    return out


def save_pretrained(model: nn.Module, folder: str | Path) -> Path:
    """Write ``model`` (made by :func:`create_model`) to ``folder``: ``config.json`` (the variant
    and what differs from it) and ``weights.pt`` (the ``state_dict``)."""
    from modnets.training import save_checkpoint

    name = getattr(model, "registry_name", None)
    if name is None:
        raise TypeError("save_pretrained needs a model made by modnets.create_model")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    save_checkpoint(state, folder / "weights.pt")
    record = {"format": FORMAT, "name": name, "overrides": _overrides(model)}
    (folder / "config.json").write_text(json.dumps(record, indent=1) + "\n")
    return folder


def _as_tuples(value, like):
    if isinstance(like, tuple) and isinstance(value, list):
        return tuple(_as_tuples(v, w) for v, w in zip(value, like, strict=False))
    return value


def from_pretrained(folder: str | Path, map_location="cpu") -> nn.Module:
    """The model :func:`save_pretrained` wrote to ``folder``, in evaluation mode."""
    folder = Path(folder)
    path = folder / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: not a folder written by save_pretrained")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path} is not valid JSON ({err}): not written by save_pretrained"
        ) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} record")
    base = create_model(record["name"])
    config = getattr(base, "config", None)
    overrides = {k: _as_tuples(v, getattr(config, k, None)) for k, v in record["overrides"].items()}
    model = create_model(record["name"], **overrides)
    weights = folder / "weights.pt"
    if not weights.exists():
        raise FileNotFoundError(f"{weights} not found: save_pretrained writes it beside {path}")
    try:
        state = torch.load(weights, map_location=map_location, weights_only=True)
    except Exception as err:  # damaged, or holding more than tensors: torch's advice to unpickle
        # it all would run the file's code, so the message is ours
        raise ValueError(
            f"{weights} is not a weights file modnets can read ({type(err).__name__}): it is "
            "damaged, or holds objects other than tensors, which modnets does not unpickle"
        ) from None
    model.load_state_dict(state)
    return model.eval()
