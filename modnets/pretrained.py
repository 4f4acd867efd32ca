"""A model as a folder, and the folder as the model again: ``model.save_pretrained(folder)`` and
``NeuralInterpreter.from_pretrained(folder)`` (the Hugging Face convention), or the functions
:func:`save` and :func:`load` for any modnets model.

The folder holds ``config.json``, how to build the model again -- its class and every argument
of its constructor as the model is now (after ``add_functions``, ``drop_modules`` or any other
edit), every field of a configuration included, so that a changed default or preset never
changes a saved model -- and ``weights.pt``, its ``state_dict``. Loading builds the model from
``config.json`` (only modnets classes) and reads the weights with ``torch.load(weights_only=True)``:
neither file runs code.

A model class says how it is built again with :meth:`Pretrained.arguments`; an argument that is
itself a module (an NAC's tokenizer) is built again where it is a modnets part too; one of one's
own is saved with the weights and passed again on loading (``load(folder, tokenizer=...)``).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import torch
from torch import nn

from modnets.utils import atomic_file

__all__ = ["FORMAT", "Pretrained", "save", "load"]

FORMAT = "modnets-pretrained-2"


class Pretrained:
    """What makes a model class savable: :meth:`arguments`, the arguments its constructor takes
    to build the model as it is now; it then has :meth:`save_pretrained` and
    :meth:`from_pretrained`."""

    def arguments(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} does not say how it is built again")

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write this model to ``folder`` (:func:`save`)."""
        return save(self, folder)

    @classmethod
    def from_pretrained(cls, folder: str | Path, map_location="cpu", **parts) -> nn.Module:
        """The model :meth:`save_pretrained` wrote to ``folder``, refused unless it is a ``cls``
        (:func:`load`)."""
        model = load(folder, map_location, **parts)
        if not isinstance(model, cls):
            raise TypeError(f"{folder} holds a {type(model).__name__}, not a {cls.__name__}")
        return model


def _qualified(obj) -> str:
    kind = obj if isinstance(obj, type) else type(obj)
    return f"{kind.__module__}:{kind.__qualname__}"


def _encode(value, where: str):
    """``value`` as JSON, tagged where plain JSON would lose what it is."""
    if isinstance(value, nn.Module):
        if not isinstance(value, Pretrained):  # its weights are saved; it is passed on loading
            return {"given": _qualified(value)}
        return {"module": _qualified(value), "arguments": _arguments(value, where)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"dataclass": _qualified(value), "fields": _encode(fields, where)["dict"]}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {"dict": {str(k): _encode(v, f"{where}.{k}") for k, v in value.items()}}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"{where} is a {type(value).__name__}, which a config.json cannot hold")


def _arguments(model, where: str) -> dict:
    return {k: _encode(v, f"{where}.{k}") for k, v in model.arguments().items()}


def _class(name: str):
    """A modnets class by ``module:qualname``; nothing else is ever built from a file."""
    module, _, qualname = name.partition(":")
    if module != "modnets" and not module.startswith("modnets."):
        raise ValueError(f"config.json names {name!r}: only modnets classes are built from a file")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _decode(value, parts: dict, where: str):
    if isinstance(value, list):
        return [_decode(v, parts, where) for v in value]
    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(_decode(v, parts, where) for v in value["tuple"])
    if "dict" in value:
        return {k: _decode(v, parts, f"{where}.{k}") for k, v in value["dict"].items()}
    if "dataclass" in value:
        fields = {k: _decode(v, parts, where) for k, v in value["fields"].items()}
        return _class(value["dataclass"])(**fields)
    if "module" in value:
        return _build(value, parts, where)
    if "given" in value:
        name = where.split(".")[-1]
        raise TypeError(
            f"{where} is a {value['given'].split(':')[-1]}, not a modnets part, so the folder "
            f"cannot build it: pass one, load(folder, {name}=...) (its weights are in the folder)"
        )
    raise ValueError(f"config.json: {where} is not a value modnets wrote")


def _build(record: dict, parts: dict, where: str = "model") -> nn.Module:
    arguments = {}
    for k, v in record["arguments"].items():
        arguments[k] = parts.pop(k) if k in parts else _decode(v, parts, f"{where}.{k}")
    return _class(record["module"])(**arguments)


def save(model: nn.Module, folder: str | Path) -> Path:
    """Write ``model`` (any modnets model) to ``folder``: ``config.json`` (its class and every
    argument it is built from) and ``weights.pt`` (its ``state_dict``, the weights of a part of
    one's own included: :func:`load` asks for that part)."""
    if not isinstance(model, Pretrained):
        raise TypeError(f"model is a {type(model).__name__}, not a modnets model")
    record = {
        "format": FORMAT,
        "module": _qualified(model),
        "arguments": _arguments(model, "model"),
        "registry_name": getattr(model, "registry_name", None),
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_file(folder / "weights.pt") as tmp:
        torch.save(state, tmp)
    with atomic_file(folder / "config.json") as tmp:
        tmp.write_text(json.dumps(record, indent=1) + "\n")
    return folder


def load(folder: str | Path, map_location="cpu", **parts) -> nn.Module:
    """The model :func:`save` wrote to ``folder``, in evaluation mode. ``parts``: arguments
    passed again in place of what the folder says (a tokenizer of one's own)."""
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
    unused = dict(parts)
    model = _build(record, unused)
    if unused:
        raise TypeError(f"{sorted(unused)}: not arguments of the saved {type(model).__name__}")
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
    if "registry_name" in record and record["registry_name"] is not None:
        model.registry_name = record["registry_name"]
    return model.eval()
