"""The book's own rules: outputs stripped, Colab cells consistent, every chapter in the TOC."""

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no chapters"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name}: a code cell has outputs"
            assert cell.get("execution_count") is None, f"{path.name}: execution_count is set"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_installs_only_in_colab(path):
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    nb = json.loads(path.read_text())
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    src = "".join(first["source"])
    assert '"google.colab" in sys.modules' in src
    assert f"git+{url}" in src, "the Colab install cell must use repository.url from _config.yml"
    # Colab needs it, a reader of the book does not: removed from the rendered page
    assert "remove-cell" in first["metadata"].get("tags", []), f"{path.name}: tag it remove-cell"


def test_every_notebook_is_in_the_toc():
    toc = (ROOT / "_toc.yml").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.stem}" in toc, f"{path.name} is missing from _toc.yml"


def test_config_excludes_build_artifacts():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    excluded = " ".join(cfg["exclude_patterns"])
    for name in (".venv", ".pytest_cache", "_build", ".ipynb_checkpoints"):
        assert name in excluded
    assert cfg["execute"]["execute_notebooks"] == "cache"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names


def test_baselines_depend_on_layers_only():
    """A baseline must not be built from the model it is a baseline for."""
    imported = _imported_modules(ROOT / "modnets" / "models" / "baselines.py")
    assert "modnets.nn.tokens" in imported  # the check reads real imports: it can fail
    models = {"modnets.models.ni", "modnets.models.nac", "modnets.models.nfm", "modnets.models"}
    assert not imported & models, f"baselines.py imports {sorted(imported & models)}"


_PRIVATE_IMPORT = re.compile(r"from\s+modnets[\w.]*\s+import\s+(?:\(([^)]*)\)|([^\n(]+))")


def private_modnets_names(source: str) -> list[str]:
    """Private names (``_x``) a piece of notebook code takes from ``modnets``: imported ones and
    ``modnets.a._b`` attribute paths."""
    found = []
    for m in _PRIVATE_IMPORT.finditer(source):
        names = (m.group(1) or m.group(2)).replace("\\", "").split(",")
        names = [n.split("#")[0].strip().split(" as ")[0] for n in names]
        found += [n for n in names if n.startswith("_")]
    found += re.findall(r"\bmodnets(?:\.\w+)*\.(_\w+)", source)
    return found


def test_private_name_check_can_fail():
    assert private_modnets_names("from modnets.models.nac import NACConfig, _helper as h") == [
        "_helper"
    ]
    assert private_modnets_names("x = modnets.experiments.digits._fit(1)") == ["_fit"]
    assert private_modnets_names(
        "from modnets.models.nac import (\n    NACConfig,\n    _hidden,\n)"
    ) == ["_hidden"]
    assert private_modnets_names("from modnets import graphs\nimport numpy as _np") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_use_no_private_modnets_names(path):
    nb = json.loads(path.read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert not private_modnets_names(code), f"{path.name} uses private names of modnets"


def pair_mismatch(notebook, script) -> str | None:
    """Where a notebook and its percent-format script (both read by jupytext) differ: cell
    types, sources or tags; ``None`` when they agree."""
    if len(notebook.cells) != len(script.cells):
        return f"{len(notebook.cells)} cells in the notebook, {len(script.cells)} in the script"
    for k, (a, b) in enumerate(zip(notebook.cells, script.cells, strict=True)):
        for what in ("cell_type", "source"):
            if a[what] != b[what]:
                return f"cell {k}: the {what} differs"
        if a.metadata.get("tags", []) != b.metadata.get("tags", []):
            return f"cell {k}: the tags differ"
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_and_its_script_are_in_sync(path):
    """Each chapter is edited and reviewed as ``notebooks/NN_name.py`` (jupytext, percent format);
    the ``.ipynb`` beside it must say the same. ``make sync`` levels a pair."""
    import jupytext

    script = path.with_suffix(".py")
    assert script.exists(), f"{path.name} has no paired script {script.name}: run make sync"
    problem = pair_mismatch(jupytext.read(path), jupytext.read(script))
    assert problem is None, (
        f"{path.name} and {script.name} are out of sync ({problem}): run make sync"
    )


def test_pair_check_can_fail():
    import jupytext

    path = NOTEBOOKS[0]
    notebook = jupytext.read(path)
    script = jupytext.reads(jupytext.writes(notebook, fmt="py:percent"), fmt="py:percent")
    assert pair_mismatch(notebook, script) is None
    script.cells[-1].source += "\n# an edit to the script only"
    assert "source" in pair_mismatch(notebook, script)
    script.cells.pop()
    assert "cells" in pair_mismatch(notebook, script)


def test_every_script_has_its_notebook():
    scripts = sorted((ROOT / "notebooks").glob("*.py"))
    assert scripts, "no chapter scripts in notebooks/"
    for script in scripts:
        assert script.with_suffix(".ipynb").exists(), f"{script.name} has no notebook"


_EQ_REF = re.compile(r"[Ee]qs?\. ?[0-9]")
_NAMED = re.compile(r"(NI|NAC|NFM) [Ee]qs?\.")


def unnamed_equation_references(text: str) -> list[str]:
    """Lines that cite an equation without naming its paper."""
    return [line for line in text.splitlines() if _EQ_REF.search(line) and not _NAMED.search(line)]


def test_unnamed_equation_check_can_fail():
    assert unnamed_equation_references("see eq. 4\nNI eq. 4: ModLin") == ["see eq. 4"]


def test_every_equation_reference_names_its_paper():
    files = [
        *(ROOT / "modnets").rglob("*.py"),
        *(ROOT / "notebooks").glob("*.ipynb"),
        *(ROOT / "notebooks").glob("*.py"),
    ]
    bad = {f.name: lines for f in files if (lines := unnamed_equation_references(f.read_text()))}
    assert not bad, f"equation references without their paper (NI/NAC/NFM eq. N): {bad}"
