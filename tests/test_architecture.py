"""ARCHITECTURE.md stays true: no import in ``modnets/`` points to a higher layer, and no module
imports itself through others (function-level imports included)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "modnets"

LAYERS = {
    "base": {"base"},
    "nn": {"base", "nn"},
    "graphs": {"base", "graphs"},
    "models": {"base", "nn", "graphs", "models"},
    "training": {"base", "nn", "training"},
    "data": {"base", "data"},
    "inspect": {"base", "nn", "graphs", "models", "inspect"},
    "experiments": {"base", "nn", "graphs", "models", "training", "data", "inspect", "experiments"},
    "top": {"base", "nn", "graphs", "models", "training", "data", "inspect", "experiments", "top"},
}
BASE = {
    "utils",
    "profiles",
    "threads",
    "timing",
    "distributed",
    "parallel",
    "equations",
    "probes",
    "pretrained",
}
MODELS = {"models", "pruning"}
INSPECT = {"diagnostics", "viz", "diagrams"}


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("registry", "benchmarks", "reproduce", "exercises"):
        return "top"
    name = parts[1]
    if name in BASE:
        return "base"
    if name in MODELS:
        return "models"
    if name in INSPECT:
        return "inspect"
    return name


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """``{module: modules it imports}`` among ``sources`` (module name -> source text), every
    ``import`` statement counted wherever it stands; ``from a import b`` counts ``a.b`` where that
    is a module, else ``a``."""
    graph = {name: set() for name in sources}
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                found = [s for s in subs if s in sources]
                targets = found + ([node.module] if len(found) < len(subs) else [])
            else:
                continue
            graph[name] |= {t for t in targets if t in sources and t != name}
    return graph


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} ({layer(a)}) imports {b} ({layer(b)})"
        for a, bs in graph.items()
        for b in bs
        if layer(b) not in LAYERS[layer(a)]
    )


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.fixture(scope="module")
def graph():
    return import_graph({name: path.read_text() for name, path in modules().items()})


def test_every_module_has_a_layer(graph):
    assert {layer(m) for m in graph} <= set(LAYERS)
    assert len(graph) > 50  # the walk found the library


def test_no_import_points_up(graph):
    assert upward(graph) == []


def test_no_import_cycle(graph):
    assert cycle(graph) is None


def test_the_checks_can_fail():
    sources = {
        "modnets.nn.a": "from modnets.experiments.core import harness\n",
        "modnets.experiments.core.harness": "def f():\n    import modnets.experiments.core.claims\n",
        "modnets.experiments.core.claims": "from modnets.experiments.core.harness import f\n",
    }
    graph = import_graph(sources)
    assert upward(graph) == [
        "modnets.nn.a (nn) imports modnets.experiments.core.harness (experiments)"
    ]
    assert cycle(graph) == [
        "modnets.experiments.core.claims",
        "modnets.experiments.core.harness",
        "modnets.experiments.core.claims",
    ]
