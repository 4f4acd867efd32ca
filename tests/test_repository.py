"""The book's own rules: outputs stripped, Colab cells consistent, every chapter in the TOC."""

import json
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
