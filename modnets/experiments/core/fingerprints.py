"""What a checkpoint is keyed by: the configuration as plain JSON, the code the model depends on
(hashed with the modules it imports and the helpers it calls) and the data files read."""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import sys
import textwrap
import tokenize
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


@functools.cache
def _module_closure(name: str) -> tuple[str, ...]:
    """``name`` and every ``modnets`` module it imports, transitively (read from the source, so
    nothing is executed), sorted."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        try:
            spec = importlib.util.find_spec(mod)
        except (ModuleNotFoundError, ValueError):  # "from modnets.x import SomeClass"
            continue
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        seen.add(mod)
        tree = ast.parse(Path(spec.origin).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("modnets")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith("modnets"):
                    # "from modnets import distributed" imports a submodule, not the package's
                    # __init__ (which imports every architecture); "from modnets.models.ni import X"
                    # imports the module itself
                    subs = [f"{node.module}.{a.name}" for a in node.names]
                    found = [m for m in subs if _is_module(m)]
                    todo += found
                    if len(found) < len(subs):
                        todo.append(node.module)
    return tuple(sorted(seen))


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def _home(module: ModuleType | None) -> str:
    """Where a step's helpers live: its experiment's package (whose files share them), or else
    the step's own module."""
    parts = module.__name__.split(".") if module else []
    if len(parts) > 3 and parts[:2] == ["modnets", "experiments"]:
        return ".".join(parts[:3])
    return ".".join(parts)


def _referenced(fn: Callable) -> list[Callable]:
    """The functions and classes of ``fn``'s own module (or experiment package) that ``fn``
    names, transitively, so that a helper a training step calls is hashed with it."""
    home = _home(inspect.getmodule(fn))
    out, todo, seen = [], [fn], set()
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        out.append(f)
        try:
            names = _source(f)[1]
        except (OSError, TypeError):  # no source: hashed by name alone
            continue
        module = inspect.getmodule(f)
        for name in names:
            obj = getattr(module, name, None)
            helper = inspect.isfunction(obj) or inspect.isclass(obj)
            if helper and inspect.getmodule(obj) and _home(inspect.getmodule(obj)) == home:
                todo.append(obj)
    return out


# A function's source is that of the code it runs: read and parsed once per function object
# (a redefinition or a reload is a new object).
@functools.cache
def _source(f: Callable) -> tuple[str, tuple[str, ...]]:
    """``f``'s source and the names it reads, in the order they occur."""
    source = inspect.getsource(f)
    tree = ast.parse(textwrap.dedent(source))
    return source, tuple(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))


def _import_name(obj: Callable) -> str:
    """The name ``obj``'s module is imported by, also where it runs as ``python -m`` (there its
    ``__module__`` is ``"__main__"``): the CLI and the library then share checkpoints."""
    name = obj.__module__
    if name == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        name = name if spec is None else spec.name
    return name


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The lines of every module, class and function docstring in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def code_text(source: str) -> bytes:
    """What ``source`` does, as text: its tokens without comments, docstrings or line breaks
    inside brackets, so that rewording and reformatting keep a fingerprint and any change to the
    code changes it. Tokens rather than a syntax tree: ``ast.dump`` prints differently from one
    Python version to the next, tokens do not."""
    source = textwrap.dedent(source)
    lines = source.splitlines(keepends=True)
    docs = _docstring_lines(ast.parse(source))
    kept, fstring = [], []  # fstring: where each open f-string starts (Python >= 3.12)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == _FSTRING_START:
            fstring.append(tok.start)
        elif fstring:
            # an f-string as one token, as Python < 3.12 reads it, which splits none
            if tok.type == _FSTRING_END and len(fstring) == 1:
                kept.append(_between(lines, fstring.pop(), tok.end))
            elif tok.type == _FSTRING_END:
                fstring.pop()
        elif tok.type in (tokenize.COMMENT, tokenize.NL) or tok.start[0] in docs:
            continue
        else:
            # indentation by its kind: the block structure, not its width
            kept.append(tokenize.tok_name[tok.type] if tok.type in _LAYOUT else tok.string)
    return "\x1f".join(kept).encode()


def _between(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    """The source text from ``start`` to ``end`` (tokenize's (line, column), lines from 1)."""
    (r0, c0), (r1, c1) = start, end
    if r0 == r1:
        return lines[r0 - 1][c0:c1]
    return lines[r0 - 1][c0:] + "".join(lines[r0 : r1 - 1]) + lines[r1 - 1][:c1]


_FSTRING_START = getattr(tokenize, "FSTRING_START", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)
_LAYOUT = (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE, tokenize.ENDMARKER)


def code_fingerprint(*parts: ModuleType | str | Callable) -> str:
    """A hash of the library code a trained model depends on (:func:`code_text`: what it does,
    not how it is worded).

    Each part is a module (or its dotted name), hashed with every ``modnets`` module it imports,
    or a function or class, hashed by its own source and that of every function or class of its
    module it names, transitively (an experiment's model builder and training step with their
    helpers, without the rest of the module, so that a change to an analysis retrains nothing).
    """
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, str | ModuleType):
            name = part if isinstance(part, str) else part.__name__
            for mod in _module_closure(name):
                origin = importlib.util.find_spec(mod).origin
                h.update(mod.encode() + b"\0" + code_text(Path(origin).read_text()) + b"\0")
        elif callable(part):
            h.update(_functions_text(part))
        else:
            raise TypeError(
                f"code parts must be modules, module names or functions, got {type(part).__name__}"
            )
    return h.hexdigest()[:16]


def _functions_text(fn: Callable) -> bytes:
    """``fn`` and the helpers it names (:func:`_referenced`), each by name and :func:`code_text`."""
    out = b""
    for f in _referenced(fn):
        try:
            text = code_text(_source(f)[0])
        except (OSError, TypeError):  # no source: hashed by name alone
            text = b""
        out += f"{_import_name(f)}.{f.__qualname__}".encode() + b"\0" + text + b"\0"
    return out


def logic_fingerprint(*fns: Callable) -> str:
    """A hash of what functions do: each with the helpers :func:`code_fingerprint` hashes with
    it, by :func:`code_text`, so that rewording their docstrings and comments keeps it."""
    return hashlib.sha256(b"".join(_functions_text(fn) for fn in fns)).hexdigest()[:16]


def data_fingerprint(*paths: str | os.PathLike) -> str:
    """A hash of the data files read: each file's path (relative to what was given) and size;
    a folder stands for every file below it. A missing path hashes as missing, so a checkpoint
    trained on a subset is not reused once more files (a full download) are there."""
    h = hashlib.sha256()
    for p in paths:
        p = Path(p)
        h.update(str(p.name).encode() + b"\0")
        if p.is_file():
            h.update(str(p.stat().st_size).encode())
        elif p.is_dir():
            top = str(p)
            for root, dirs, files in os.walk(top):  # strings: a folder holds thousands of files
                dirs.sort()
                rel = os.path.relpath(root, top)
                for f in sorted(files):
                    name = f if rel == "." else os.path.join(rel, f)
                    h.update(f"{name}:{os.stat(os.path.join(root, f)).st_size}\n".encode())
        else:
            h.update(b"<missing>")
    return h.hexdigest()[:16]


def plain(obj, for_key: bool = False):
    """A configuration as plain JSON types (dataclasses, tuples, paths). ``for_key`` leaves out
    the dataclass fields marked ``metadata={"key": False}`` (they do not change the weights)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: plain(getattr(obj, f.name), for_key)
            for f in dataclasses.fields(obj)
            if not (for_key and f.metadata.get("key", True) is False)
        }
    if isinstance(obj, dict):
        return {str(k): plain(v, for_key) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v, for_key) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _config_classes(obj) -> list[type]:
    """The dataclass types inside a configuration (their methods, e.g. ``model_config``, decide
    the model as much as their fields do)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = [type(obj)]
        for f in dataclasses.fields(obj):
            out += _config_classes(getattr(obj, f.name))
        return out
    if isinstance(obj, dict | list | tuple):
        return [
            c for v in (obj.values() if isinstance(obj, dict) else obj) for c in _config_classes(v)
        ]
    return []


def checkpoint_key(name: str, train_config, seed: int, data: str, code: str) -> str:
    """The checkpoint key: a hash of ``name``, the whole training configuration (its values and
    the source of its dataclasses), the seed and the data and code fingerprints."""
    classes = sorted({c for c in _config_classes(train_config)}, key=lambda c: c.__qualname__)
    sources = [inspect.getsource(c) for c in classes]
    blob = json.dumps(
        {
            "name": name,
            "train": plain(train_config, for_key=True),
            "seed": seed,
            "data": data,
            "code": code,
            "config_code": sources,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
