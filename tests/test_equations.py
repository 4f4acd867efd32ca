"""The equation index (modnets/equations.py, book/equations.md): every numbered item of the three
papers has a row, and every row names code that imports, a test that exists and a chapter that
mentions the item; the book's page is the rendering of the index."""

from __future__ import annotations

import ast
import importlib
import json
import re
from functools import cache
from pathlib import Path

import pytest

from modnets.equations import EQUATIONS, PAPERS, Equation, render

ROOT = Path(__file__).resolve().parents[1]

#: Every numbered item of the papers: NI eqs. 1-15, NAC eqs. 1-10, NFM eqs. 1-3 (the formulas of
#: NFM §3.2.1, which prints no numbers) and NFM Algorithm 1.
REQUIRED = (
    [("NI", "eq.", n) for n in range(1, 16)]
    + [("NAC", "eq.", n) for n in range(1, 11)]
    + [("NFM", "eq.", n) for n in range(1, 4)]
    + [("NFM", "Algorithm", 1)]
)

# "NI eq. 4", "NI eqs. 6-8", "NI eqs. 6–10", "NAC eqs. 2-3, 1"
_NUMBERS = r"(\d+(?:\s*[-–]\s*\d+)?(?:\s*,\s*\d+(?:\s*[-–]\s*\d+)?)*)"


def _numbers(spec: str) -> set[int]:
    out: set[int] = set()
    for part in spec.split(","):
        ends = [int(n) for n in re.split(r"[-–]", part)]
        out.update(range(ends[0], ends[-1] + 1))
    return out


def mentions(text: str, eq: Equation) -> bool:
    """Whether ``text`` names ``eq``: ``NI eq. 7`` or a range or list containing it
    (``NI eqs. 6-8``); for NFM's unnumbered formulas also their section, ``§3.2.1``."""
    if eq.kind == "Algorithm":
        return re.search(rf"\bAlgorithm {eq.number}\b", text) is not None
    for match in re.finditer(rf"\b{eq.paper} eqs?\.\s*{_NUMBERS}", text):
        if eq.number in _numbers(match.group(1)):
            return True
    return eq.paper == "NFM" and "§3.2.1" in text


@cache
def notebook_text(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells)


def resolve(dotted: str):
    """``importlib`` the longest module prefix of ``dotted``, ``getattr`` the rest; returns the
    object and the module it was found in."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and name.startswith(e.name):
                continue  # no such module: try a shorter prefix
            raise  # the module exists but one of its imports does not
        obj = module
        for attr in parts[n:]:
            obj = getattr(obj, attr)
        return obj, name
    raise ModuleNotFoundError(dotted)


def defined_tests(path: Path) -> set[str]:
    """``test_x`` and ``TestX::test_x`` node names defined in a test file."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}::{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return names


def row_problems(eq: Equation, root: Path = ROOT) -> list[str]:
    """What is wrong with one row (empty if nothing)."""
    where = eq.label
    problems = []
    if eq.paper not in PAPERS:
        problems.append(f"{where}: unknown paper {eq.paper!r}")
    for dotted in eq.code:
        try:
            obj, module = resolve(dotted)
        except (ImportError, AttributeError) as e:
            problems.append(f"{where}: {dotted} does not import ({type(e).__name__}: {e})")
            continue
        defined_in = getattr(obj, "__module__", module)
        if defined_in != module:
            problems.append(f"{where}: {dotted} is defined in {defined_in}, not {module}")
    path, _, name = eq.test.partition("::")
    test_file = root / path
    if not (path.startswith("tests/") and name):
        problems.append(f"{where}: {eq.test!r} is not a node id tests/test_x.py::test_name")
    elif "[" in name:
        problems.append(f"{where}: {eq.test!r} names one parametrisation; name the function")
    elif not test_file.is_file():
        problems.append(f"{where}: test file {path} does not exist")
    elif name not in defined_tests(test_file):
        problems.append(f"{where}: {path} has no test {name}")
    chapter = root / eq.chapter
    if not (eq.chapter.startswith("notebooks/") and eq.chapter.endswith(".ipynb")):
        problems.append(f"{where}: chapter {eq.chapter!r} is not a notebook in notebooks/")
    elif not chapter.is_file():
        problems.append(f"{where}: chapter {eq.chapter} does not exist")
    else:
        if not mentions(notebook_text(chapter), eq):
            problems.append(f"{where}: chapter {eq.chapter} does not mention {eq.label}")
        toc = (root / "_toc.yml").read_text(encoding="utf-8")
        if f"file: {eq.chapter.removesuffix('.ipynb')}\n" not in toc:
            problems.append(f"{where}: chapter {eq.chapter} is not in _toc.yml")
    return problems


def problems(equations, root: Path = ROOT) -> list[str]:
    """Everything wrong with an index: missing, unknown or repeated items, then each row."""
    keys = [(eq.paper, eq.kind, eq.number) for eq in equations]
    out = [f"{p} {k} {n}: no row" for p, k, n in REQUIRED if (p, k, n) not in keys]
    for key in dict.fromkeys(keys):
        p, k, n = key
        if key not in REQUIRED:
            out.append(f"{p} {k} {n}: not a numbered item of the paper")
        if keys.count(key) > 1:
            out.append(f"{p} {k} {n}: {keys.count(key)} rows")
    for eq in equations:
        out += row_problems(eq, root)
    return out


# ----------------------------------------------------------------------------- the index


def test_every_numbered_item_has_exactly_one_row():
    assert [p for p in problems(EQUATIONS) if p.endswith(("no row", "of the paper", "rows"))] == []
    assert [(eq.paper, eq.kind, eq.number) for eq in EQUATIONS] == REQUIRED  # the papers' order


@pytest.mark.parametrize("eq", EQUATIONS, ids=lambda eq: eq.label)
def test_row_names_code_test_and_chapter_that_exist(eq):
    assert row_problems(eq) == []


def test_book_page_is_generated_from_the_index():
    page = (ROOT / "book" / "equations.md").read_text(encoding="utf-8")
    assert page == render(), "book/equations.md is out of date: run `make equations`"
    assert "file: book/equations\n" in (ROOT / "_toc.yml").read_text(encoding="utf-8")


def test_every_row_is_one_table_row_linking_its_chapter():
    table = [line for line in render().splitlines() if line.startswith("| ")][1:]  # no header
    assert len(table) == len(EQUATIONS)
    for line, eq in zip(table, EQUATIONS, strict=True):
        assert line.count(" | ") == 5 and f"](../{eq.chapter})" in line


# ----------------------------------------------------------------------------- the checks


def made_up(**changes) -> Equation:
    """A row that checks out (NI eq. 4), with ``changes``."""
    base = next(eq for eq in EQUATIONS if eq.label == "NI eq. 4")
    fields = {f: getattr(base, f) for f in ("paper", "number", "what", "code", "test", "chapter")}
    return Equation(**{**fields, **changes})


def test_a_made_up_good_row_has_no_problems():
    assert row_problems(made_up()) == []


@pytest.mark.parametrize(
    "changes, expected",
    [
        (
            dict(code="modnets.nn.modulated.ModLinear"),
            "modnets.nn.modulated.ModLinear does not import",
        ),
        (dict(code="modnets.nn.modulatd.ModLin"), "modnets.nn.modulatd.ModLin does not import"),
        (dict(code="modnets.ModLin"), "is defined in modnets.nn.modulated, not modnets"),
        (
            dict(code=("modnets.nn.modulated.ModLin", "modnets.nn.modulated.ModLin.nope")),
            "ModLin.nope does not import",
        ),
        (dict(test="tests/test_modulated.py::test_no_such_test"), "has no test test_no_such_test"),
        (
            dict(test="tests/test_no_such_file.py::test_x"),
            "test file tests/test_no_such_file.py does not exist",
        ),
        (
            dict(test="tests/test_modulated.py::test_equation_against_direct_reference[cls0-ref0]"),
            "names one parametrisation",
        ),
        (dict(test="test_equation_against_direct_reference"), "is not a node id"),
        (
            dict(chapter="notebooks/99_missing.ipynb"),
            "chapter notebooks/99_missing.ipynb does not exist",
        ),
        (dict(chapter="notebooks/07_skmdpa.ipynb"), "does not mention NI eq. 4"),
        (dict(chapter="book/notation.md"), "is not a notebook"),
        (dict(paper="XY"), "unknown paper"),
    ],
)
def test_the_check_reports_a_broken_made_up_row(changes, expected):
    found = row_problems(made_up(**changes))
    assert any(expected in p for p in found), found
    # an unknown paper's label is not in the chapter either
    assert len(found) == (2 if "paper" in changes else 1), found


def test_the_check_reports_missing_extra_and_repeated_items():
    rows = [eq for eq in EQUATIONS if eq.label != "NAC eq. 7"]
    rows += [made_up(number=16), made_up(), made_up()]
    found = problems(rows)
    assert "NAC eq. 7: no row" in found
    assert "NI eq. 16: not a numbered item of the paper" in found
    assert "NI eq. 4: 3 rows" in found


@pytest.mark.parametrize(
    "text, label, expected",
    [
        ("(NI eq. 4):", "NI eq. 4", True),
        ("(NI eq. 14)", "NI eq. 1", False),
        ("(NI eq. 1)", "NI eq. 11", False),
        ("NI eqs. 6–8", "NI eq. 7", True),
        ("NI eqs. 6-8", "NI eq. 9", False),
        ("NI eqs. 6–10", "NI eq. 10", True),
        ("NAC eqs. 2-3, 1", "NAC eq. 1", True),
        ("NI eq. 1", "NAC eq. 1", False),
        ("One NFM read, by hand (§3.2.1)", "NFM eq. 2", True),
        ("NFM eq. 3", "NFM eq. 3", True),
        ("§3.2.1", "NI eq. 3", False),
        ("Algorithm 1 of the paper", "NFM Algorithm 1", True),
        ("Algorithm 12", "NFM Algorithm 1", False),
    ],
)
def test_mentions_reads_labels_ranges_and_lists(text, label, expected):
    paper, kind, number = re.fullmatch(r"(\w+) (eq\.|Algorithm) (\d+)", label).groups()
    eq = Equation(paper, int(number), "", (), "", "", kind)
    assert mentions(text, eq) is expected
