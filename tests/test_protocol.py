"""The experiment protocol: a new experiment is one package, and the shared machinery finds it.

A sixth experiment is written into a temporary folder (no file of the repository touched) and
named by ``MODNETS_EXPERIMENTS``: it runs through the command line at ``smoke``, and discovery,
the GPU budget and chapter 13's report code all find it."""

import ast
import importlib
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

import pytest

from modnets.experiments import get, list_experiments
from modnets.experiments.core.experiment import Experiment, Measurement
from modnets.experiments.core.options import RunOptions

#: A whole experiment in one file: a line fitted by least squares, one claim of "A toy paper".
PACKAGE = '''
"""A toy experiment: a line fitted by least squares at every seed.

It tests the toy paper's one claim: the fitted slope is above 1.
"""

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from modnets.experiments.core import harness
from modnets.experiments.core.claims import decide_rule, holm, outside_regime
from modnets.experiments.core.experiment import Experiment, Measurement, RegisteredModel
from modnets.experiments.core.rule import Rule
from modnets.experiments.core.rules import declare
from modnets.experiments.core.stats import per_seed, seed_stats
from modnets.training import TrainConfig, fit

NAME = "toy_line"
SOURCE_PAPER = "A toy paper"
CHAPTER = ""
TRAIN_CODE = ()

RULES = declare("toy_line", [
    Rule(
        id="toy-slope",
        kind="paper",
        text="The fitted slope is above 1",
        source="A toy paper, Table 1",
        paper="slope 2.0",
        quantity="fitted slope − 1",
        test=">",
        threshold=0.0,
        paper_effect=1.0,
        basis="A toy paper, Table 1: 2.0 − 1",
    ),
])


@dataclass(frozen=True)
class ToyConfig:
    seeds: tuple = (0, 1)
    selection_seeds: tuple = ()
    points: int = 64
    epochs: int = 30


CONFIGS = {"smoke": ToyConfig(), "cpu": ToyConfig(seeds=(0, 1, 2)), "gpu": ToyConfig(epochs=100)}


def data(config, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(config.points, 1, generator=g)
    return x, 2 * x + 0.1 * torch.randn(config.points, 1, generator=g)


def loss(model, x, y):
    return (model(x) - y).pow(2).mean()


def measure(config, options):
    rows = []
    for seed in config.seeds:
        x, y = (t.to(options.device) for t in data(config, seed))
        torch.manual_seed(seed)
        model = nn.Linear(1, 1).to(options.device)
        cfg = TrainConfig(epochs=config.epochs, batch_size=16, lr=0.1, amp=False)
        step = lambda m, idx: loss(m, x[idx], y[idx])  # noqa: E731
        history = fit(model, step, cfg, n=config.points, show_progress=options.show_progress)
        rows.append({"seed": seed, "slope": model.weight.item(), "history": history})
    models, diagnostics = summarise(config, {"line": {"per_seed": rows}}, {})
    return Measurement(models, diagnostics, config, config.selection_seeds)


def summarise(config, models, diagnostics):
    rows = models["line"]["per_seed"]
    models["line"]["slope"] = seed_stats(per_seed(rows, "slope"))
    return models, diagnostics


def regime(results):
    worst = min(per_seed(results["models"]["line"]["per_seed"], "slope"))
    return harness.regime("a finite slope", {"slope, worst seed": (worst, -1e9, ">=")})


def claims(results):
    slopes = per_seed(results["models"]["line"]["per_seed"], "slope")
    claim = decide_rule("toy-slope", [s - 1 for s in slopes])
    return holm([outside_regime(claim, results["regime"])], "toy")


def format_summary(results):
    return f"slope {results['models']['line']['slope']['mean']:.3f}"


def dry_run(config):
    x, y = data(config, 0)
    part = harness.DryRun("line", nn.Linear(1, 1), lambda m: loss(m, x[:2], y[:2]), samples=2)
    return [dataclasses.replace(part, batch_size=16, steps=config.epochs * config.points // 16)]


REGISTERED = {
    "line_toy": RegisteredModel(
        lambda config, **overrides: nn.Linear(1, 1, **overrides),
        lambda config, batch: torch.randn(batch, 1),
        "the toy line",
    )
}

EXPERIMENT = Experiment.from_namespace(globals())
'''

#: What the child process checks with the sixth experiment found: discovery, the budget's
#: table, chapter 13's report code (the papers it iterates, the claims it reads).
CHECKS = """
import json, sys
import modnets
from modnets.experiments import get, list_experiments
from modnets.experiments.core import budget, report
from modnets.experiments.core.results import load_results

out = {"found": list_experiments(), "table": budget.table(budget.estimate("toy_line", "gpu"))}
out["papers"] = {k: list(v) for k, v in report.papers().items()}
claims, results, missing = report.load_claims(report.papers()["A toy paper"], "smoke", sys.argv[1])
out["claims"] = [c["id"] for c in claims]
out["missing"] = missing
out["command"] = report.paper_scale_command("toy_line")
out["registered"] = modnets.list_models("line_toy_*")
print(json.dumps(out))
"""


@pytest.fixture
def sixth(tmp_path):
    """A folder holding one new experiment package, ``toy_line``, and the environment that
    names it."""
    folder = tmp_path / "mine"
    (folder / "toy_line").mkdir(parents=True)
    (folder / "toy_line" / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    env = {**os.environ, "MODNETS_EXPERIMENTS": str(folder), "MODNETS_PROFILE": "smoke"}
    env["MODNETS_CHECKPOINTS"] = str(tmp_path / "checkpoints")
    return folder, env


def test_a_sixth_experiment_is_one_package_found_by_the_cli_the_budget_the_report_the_registry(
    sixth, tmp_path
):
    _, env = sixth
    results_dir = tmp_path / "results"
    out = results_dir / "toy_line_smoke.json"
    cli = [sys.executable, "-m", "modnets.experiments", "toy_line", "--profile", "smoke"]
    ran = subprocess.run(
        [*cli, "--quiet", "--out", str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "toy-slope" in ran.stdout and "slope" in ran.stdout
    results = json.loads(out.read_text())
    assert results["experiment"] == "toy_line" and results["seeds"] == [0, 1]
    assert results["models"]["line"]["slope"]["mean"] > 1.5  # fit learned the line
    assert [c["id"] for c in results["claims"]] == ["toy-slope"]

    checked = subprocess.run(
        [sys.executable, "-c", CHECKS, str(results_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stderr[-2000:]
    seen = json.loads(checked.stdout.strip().splitlines()[-1])
    assert seen["found"] == [*list_experiments(), "toy_line"]  # the book's five, then it
    assert "toy_line" in seen["table"] and "line" in seen["table"]
    assert seen["papers"]["A toy paper"] == ["toy_line"]
    assert seen["claims"] == ["toy-slope"] and seen["missing"] == []
    assert seen["command"] == "python -m modnets.experiments.toy_line --profile gpu"
    assert seen["registered"] == ["line_toy_cpu", "line_toy_gpu"]  # modnets.create_model


def test_the_cli_names_the_experiments_when_given_none_it_knows():
    ran = subprocess.run(
        [sys.executable, "-m", "modnets.experiments", "no_such"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode != 0
    assert "fuzzy_boolean" in ran.stderr and "side_by_side" in ran.stderr


def test_an_experiment_refuses_a_missing_profile_or_a_foreign_rule():
    fuzzy = get("fuzzy_boolean")
    fields = {f: getattr(fuzzy, f) for f in Experiment.__dataclass_fields__}
    with pytest.raises(ValueError, match="lacks the profiles \\['gpu'\\]"):
        Experiment(**{**fields, "configs": {"smoke": 1, "cpu": 1}})
    with pytest.raises(ValueError, match="name another experiment"):
        Experiment(**{**fields, "name": "other"})


def test_run_options_are_checked_before_any_work():
    with pytest.raises(TypeError, match="RunOptions.cache"):
        RunOptions(cache="yes")
    with pytest.raises(ValueError, match="RunOptions.workers"):
        RunOptions(workers=0)
    fuzzy = get("fuzzy_boolean")
    with pytest.raises(TypeError, match="the options are"):
        fuzzy.run(profile="smoke", show_progres=False)  # a misspelt option: nothing trains
    with pytest.raises(TypeError, match="options must be a RunOptions"):
        fuzzy.run(profile="smoke", options={"cache": False})


def test_the_shared_run_ends_with_regime_then_claims_from_what_was_measured():
    """``run`` hands ``measure`` the resolved options (the device and the workers set) and builds
    the results from what it returns: the summaries, then the regime, then the claims, which read
    it, all reading the results as the file will hold them (string keys, lists), so a results
    file, or seed records combined, decide the claims as the run did."""
    fuzzy = get("fuzzy_boolean")
    seen = {}
    models = {"m": {"per_seed": [{"by_count": {3: 0.5}, "sizes": (1, 2)}]}}

    def measure(config, options):
        seen["options"] = options
        return Measurement(models, {"d": 1}, config, config.selection_seeds)

    def summarise(config, models, diagnostics):
        seen["summarised"] = models["m"]["per_seed"][0]
        return {**models, "m": {**models["m"], "n": 1}}, diagnostics

    def regime(results):
        seen["regime_reads"] = sorted(results)
        seen["row"] = results["models"]["m"]["per_seed"][0]
        return {"required": "r", "reached": True, "shortfall": "", "measured": {}}

    def claims(results):
        seen["claims_read"] = results["regime"]["required"]
        return []

    import dataclasses

    toy = dataclasses.replace(
        fuzzy, measure=measure, summarise=summarise, regime=regime, claims=claims
    )
    results = toy.run(profile="smoke", workers=1, show_progress=False)
    assert seen["options"].workers == 1 and seen["options"].show_progress is False
    assert seen["options"].device is not None  # resolved before measure
    assert seen["regime_reads"] == ["config", "diagnostics", "models"]
    assert seen["claims_read"] == "r"
    assert seen["row"] == {"by_count": {"3": 0.5}, "sizes": [1, 2]}  # as json.loads gives it
    assert seen["summarised"] == seen["row"]  # the summaries too, before the regime
    assert results["models"]["m"]["n"] == 1
    assert results["models"]["m"]["per_seed"][0] == seen["row"] and results["diagnostics"] == {
        "d": 1
    }
    assert results["experiment"] == "fuzzy_boolean" and results["profile"] == "smoke"


#: Words of a lab notebook: a timing, a pilot's result, a history ("was", "measured").
LAB_NOTES = re.compile(
    r"\b(was|were|measured|pilots?|seconds?|minutes?|hours?|no faster|slower)\b"
    r"|\b\d+(\.\d+)? ?(s|ms|min|h)\b",
    re.IGNORECASE,
)


def _prose(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, with their line numbers."""
    text = path.read_text()
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out += [(value.lineno + i, line) for i, line in enumerate(value.value.splitlines())]
    return out


@pytest.mark.parametrize("name", list_experiments())
def test_configs_say_what_and_why_never_when(name):
    """A configuration's comments and docstrings carry no timing, pilot result or history: those
    live in the book's engineering notes."""
    path = Path(importlib.import_module(f"modnets.experiments.{name}").__file__).with_name(
        "config.py"
    )
    found = [
        f"{path.name}:{n}: {line.strip()}" for n, line in _prose(path) if LAB_NOTES.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_lab_notebook_check_sees_a_timing():
    assert LAB_NOTES.search("# four seeds cost what three did (120 s)")
    assert LAB_NOTES.search("# in a pilot of 4 epochs")
    assert not LAB_NOTES.search("# four seeds: a narrower interval for the same budget")


def test_a_package_missing_a_part_is_told_which():
    namespace = {"__name__": "mine", "__doc__": "Mine.", "NAME": "mine", "CONFIGS": {}}
    with pytest.raises(ValueError, match="mine must define .*'measure'.*'RULES'"):
        Experiment.from_namespace(namespace)


def test_every_experiment_is_declared_by_its_package_names_with_its_docstrings_title():
    fuzzy = get("fuzzy_boolean")
    assert fuzzy.title.startswith("NI §4.1: learning fuzzy Boolean expressions")
    assert fuzzy.paper == "Neural Interpreters" and fuzzy.chapter == "05_fuzzy_boolean"
    assert get("side_by_side").paper == ""  # our own questions only
    assert get("tiny_imagenet").command.startswith("torchrun")


EXPERIMENTS_DIR = Path(__file__).resolve().parents[1] / "modnets" / "experiments"
LIBRARY_DIR = EXPERIMENTS_DIR.parent


def test_no_call_in_the_experiments_passes_more_than_five_arguments_by_position():
    """Options travel as one object or by keyword: a call whose meaning hangs on the order of
    six or more arguments is refused."""
    found = []
    for path in sorted(EXPERIMENTS_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and len(node.args) > 5:
                where = path.relative_to(LIBRARY_DIR.parent)
                found.append(f"{where}:{node.lineno}: {ast.unparse(node.func)}")
    assert not found, "\n".join(found)


def test_no_file_of_the_library_is_over_500_lines():
    long = {
        str(p.relative_to(LIBRARY_DIR.parent)): n
        for p in LIBRARY_DIR.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long, long
