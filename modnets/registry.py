"""Every model the book trains, by name, in timm's manner.

``create_model("ni_digits_cpu")`` builds the NI that chapter 6 trains at the ``cpu`` profile;
``list_models()`` names them all: one variant per experiment model and profile (``cpu``, the
book's reduced scale, and ``gpu``, the papers' settings). Keyword arguments override fields of
the model's configuration (``NIConfig`` / ``NACConfig`` fields, a ViT's ``depth``, a ConvNet's
arguments). ``save_pretrained(model, folder)`` (or ``model.save_pretrained(folder)``) writes a
trained model as a JSON config beside its weights, and ``from_pretrained(folder)`` (or
``NeuralInterpreter.from_pretrained(folder)``) builds it again -- after ``add_functions``,
``remove_functions``, ``drop_modules`` or ``eliminate_edges`` too -- running no code from either
file (:mod:`modnets.pretrained`).
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

import torch
from torch import nn

from modnets import pretrained

if TYPE_CHECKING:
    from modnets.models.baselines import PerceiverIO, ViT
    from modnets.models.nac import NeuralAttentiveCircuit
    from modnets.models.nfm import ConvNet
    from modnets.models.ni import NeuralInterpreter

__all__ = ["create_model", "list_models", "example_input", "save_pretrained", "from_pretrained"]

PROFILES = ("cpu", "gpu")
#: The format of the folders the first save_pretrained wrote (read, never written).
LEGACY_FORMAT = "modnets-pretrained-1"


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


#: The registered names by the class they build, for type checkers (``create_model``'s
#: overloads; a test keeps them equal to the registry). Any other name gives an ``nn.Module``.
NIName = Literal["ni_digits_cpu", "ni_digits_gpu", "ni_fuzzy_boolean_cpu", "ni_fuzzy_boolean_gpu"]
ViTName = Literal[
    "vit_digits_cpu", "vit_digits_gpu", "vit_small_digits_cpu", "vit_small_digits_gpu"
]
NACName = Literal["nac_tiny_imagenet_cpu", "nac_tiny_imagenet_gpu"]
PerceiverIOName = Literal["pio_tiny_imagenet_cpu", "pio_tiny_imagenet_gpu"]
ConvNetName = Literal[
    "cnn_stacked_mnist_cpu",
    "cnn_stacked_mnist_gpu",
    "nfm_stacked_mnist_cpu",
    "nfm_stacked_mnist_gpu",
]


@overload
def create_model(name: NIName, pretrained: bool = ..., **overrides) -> NeuralInterpreter: ...
@overload
def create_model(name: ViTName, pretrained: bool = ..., **overrides) -> ViT: ...
@overload
def create_model(name: NACName, pretrained: bool = ..., **overrides) -> NeuralAttentiveCircuit: ...
@overload
def create_model(name: PerceiverIOName, pretrained: bool = ..., **overrides) -> PerceiverIO: ...
@overload
def create_model(name: ConvNetName, pretrained: bool = ..., **overrides) -> ConvNet: ...
@overload
def create_model(name: str, pretrained: bool = ..., **overrides) -> nn.Module: ...
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
    model.registry_name = name
    return model


def example_input(name: str, batch: int = 2) -> torch.Tensor:
    """A random input of the shape model ``name`` reads, ``batch`` samples."""
    if name not in _variants():
        create_model(name)  # says what the names are
    return _variants()[name][1](batch)


# ----------------------------------------------------------------------------- save and load


def save_pretrained(model: nn.Module, folder: str | Path) -> Path:
    """Write ``model`` to ``folder`` (:func:`modnets.pretrained.save`): every argument it is built
    from, so that a preset changed later does not change it, and its weights."""
    return pretrained.save(model, folder)


def _as_tuples(value, like):
    if isinstance(like, tuple) and isinstance(value, list):
        return tuple(_as_tuples(v, w) for v, w in zip(value, like, strict=False))
    return value


def from_pretrained(folder: str | Path, map_location="cpu", **parts) -> nn.Module:
    """The model :func:`save_pretrained` wrote to ``folder``, in evaluation mode
    (:func:`modnets.pretrained.load`). A folder of the first format (a registered name and what
    differed from its preset) is built from today's preset, with a warning."""
    path = Path(folder) / "config.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        record = None  # load says what is wrong
    if not (isinstance(record, dict) and record.get("format") == LEGACY_FORMAT):
        return pretrained.load(folder, map_location, **parts)
    warnings.warn(
        f"{path} records only what differed from the preset {record['name']!r}; a preset changed "
        "since changes the model: save it again with save_pretrained to keep every field",
        stacklevel=2,
    )
    base = create_model(record["name"])
    config = getattr(base, "config", None)
    overrides = {k: _as_tuples(v, getattr(config, k, None)) for k, v in record["overrides"].items()}
    model = create_model(record["name"], **overrides)
    weights = Path(folder) / "weights.pt"
    model.load_state_dict(torch.load(weights, map_location=map_location, weights_only=True))
    return model.eval()
