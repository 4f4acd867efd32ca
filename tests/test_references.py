"""The book refers into the library by symbol, and every such reference resolves.

A reference such as ``modnets/nn/skmdpa.py::SKMDPA.forward`` names a file and a qualified name in
it: a class, a function, a method (``Class.method``), a module-level assignment, or a dataclass
field (``Class.field``, an annotated assignment in the class body). Line numbers
(``modnets/nn/skmdpa.py:224``) go stale silently with every refactor; a symbol that is renamed or
removed fails here. The files are parsed with :mod:`ast`, never imported.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [
        *ROOT.glob("book/*.md"),
        *ROOT.glob("notebooks/*.py"),
        *(p for p in (ROOT / "ARCHITECTURE.md", ROOT / "README.md") if p.is_file()),
    ]
)
SYMBOL_REF = re.compile(r"\b(modnets/[\w/]+\.py)::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
LINE_REF = re.compile(r"\bmodnets/[\w/]+\.py:\d[\d, -]*")
DEFINITIONS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def members(node: ast.Module | ast.ClassDef) -> dict[str, ast.AST]:
    """What a module or class body defines: classes, functions, annotated assignments, and (at
    module level) the names that plain assignments bind."""
    found = {}
    for child in node.body:
        if isinstance(child, DEFINITIONS):
            found[child.name] = child
        elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name):
            found[child.target.id] = child
        elif isinstance(child, ast.Assign) and isinstance(node, ast.Module):
            for target in child.targets:
                found.update((n.id, child) for n in ast.walk(target) if isinstance(n, ast.Name))
    return found


def resolves(path: str, qualname: str) -> bool:
    """Whether ``path`` (relative to the repository) exists and defines ``qualname``."""
    file = ROOT / path
    if not file.is_file():
        return False
    node = ast.parse(file.read_text(), filename=path)
    for part in qualname.split("."):
        if not isinstance(node, ast.Module | ast.ClassDef) or part not in members(node):
            return False
        node = members(node)[part]
    return True


def unresolved(text: str) -> list[str]:
    """The symbol references in ``text`` that do not resolve."""
    return [m[0] for m in SYMBOL_REF.finditer(text) if not resolves(m[1], m[2])]


def test_every_symbol_reference_resolves():
    texts = {src.relative_to(ROOT): src.read_text() for src in SOURCES}
    assert any(SYMBOL_REF.search(t) for t in texts.values()), "no symbol reference found at all"
    bad = [f"{src}: {ref}" for src, text in texts.items() for ref in unresolved(text)]
    assert not bad, "references to nothing in the library:\n" + "\n".join(bad)


def test_the_book_has_no_line_number_references():
    stale = [
        f"{md.relative_to(ROOT)}: {m[0].strip(', ')}"
        for md in sorted(ROOT.glob("book/*.md"))
        for m in LINE_REF.finditer(md.read_text())
    ]
    assert not stale, (
        "line numbers go stale: refer by symbol (modnets/<path>.py::<Qualified.name>):\n"
        + "\n".join(stale)
    )


def test_a_made_up_reference_is_caught():
    good = "`modnets/nn/skmdpa.py::SKMDPA.forward`, `modnets/models/nac/config.py::NACConfig.truncation`"
    bad = [
        "modnets/nn/skmdpa.py::no_such_thing",
        "modnets/nn/skmdpa.py::SKMDPA.no_such_method",
        "modnets/nn/skmdpa.py::SKMDPA.forward.log_k",  # a local variable is no member
        "modnets/nn/no_such_module.py::SKMDPA",
    ]
    text = good + ", " + ", ".join(f"`{ref}`" for ref in bad)
    assert unresolved(text) == bad
