"""The publishing workflow: it cannot run here, so its shape is checked instead --
valid YAML, the Jupyter Book v1 GitHub Pages workflow (build, upload _build/html, deploy), the
cpu profile, the execution cache kept between runs, and only Makefile targets that exist."""

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"


def _workflow() -> dict:
    wf = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(wf, dict) and "jobs" in wf
    return wf


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):(?!=)", text, flags=re.M))


def _run_lines(job: dict) -> list[str]:
    return [line for s in job["steps"] if "run" in s for line in s["run"].splitlines()]


def test_workflow_builds_at_cpu_with_the_makefile_and_deploys_to_pages():
    wf = _workflow()
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "main" in triggers["push"]["branches"] and "workflow_dispatch" in triggers
    assert wf["permissions"]["pages"] == "write" and wf["permissions"]["id-token"] == "write"
    build, deploy = wf["jobs"]["build"], wf["jobs"]["deploy"]
    assert build["env"]["MODNETS_PROFILE"] == "cpu"
    uses = [s.get("uses", "") for s in build["steps"]]
    assert any(u.startswith("actions/checkout@") for u in uses)
    assert any(u.startswith("actions/setup-python@") for u in uses)
    # every `make X` names a target of the Makefile, and the book is built by `make book`
    targets = _make_targets()
    called = [
        shlex.split(line)[1] for line in _run_lines(build) if line.strip().startswith("make ")
    ]
    assert "book" in called and set(called) <= targets, (called, targets)
    # the execution cache of _config.yml survives between runs
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    (cache,) = [s for s in build["steps"] if s.get("uses", "").startswith("actions/cache@")]
    assert config["execute"]["execute_notebooks"] == "cache"
    assert config["execute"]["cache"] in cache["with"]["path"].split()
    # build -> artifact -> deploy
    (upload,) = [
        s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact@")
    ]
    assert upload["with"]["path"] == "_build/html"
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert any(s.get("uses", "").startswith("actions/deploy-pages@") for s in deploy["steps"])


def test_make_publish_pushes_the_built_book_with_ghp_import():
    targets = _make_targets()
    assert {"book", "publish", "test"} <= targets
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\npublish:", 1)[1].split("\n\n", 1)[0]
    assert "ghp-import" in recipe and "_build/html" in recipe
    book_extra = (ROOT / "pyproject.toml").read_text().split("book = [", 1)[1].split("]", 1)[0]
    assert "ghp-import" in book_extra  # installed by the README's command
