"""What each experiment's command line writes at smoke. test_cli.py's Ctrl-C test runs that
command line on the real data anyway and checks its results here, for every experiment
discovery finds; an experiment's own test runs it on fake data, with the same checks, only where
the real data is not here."""

import numpy as np
import pytest

from modnets.data import data_root
from modnets.experiments import fuzzy_boolean as fb
from modnets.experiments import tiny_imagenet as ti
from modnets.experiments.core.discovery import get, list_experiments, rules_of
from modnets.experiments.core.harness import SCHEMA

#: What each experiment's smoke run reads below the data root (fuzzy Booleans: nothing).
DATA = {name: get(name).data_folders for name in list_experiments()}


#: Results measured with a clock (what differs between two runs of the same work): the endings
#: of their keys (``per_seed`` is not one), and claims about speed.
TIMED_KEYS = ("seconds", "_per_s", "speedup", "speedup_at80", "_ms", "_vs_cnn")
TIMED_CLAIMS = ("throughput", "speedup")


def without_times(obj):
    """Results with every timing left out."""
    if isinstance(obj, dict):
        if any(t in str(obj.get("id", "")) for t in TIMED_CLAIMS):
            return None
        return {k: without_times(v) for k, v in obj.items() if not k.endswith(TIMED_KEYS)}
    if isinstance(obj, list):
        return [without_times(v) for v in obj]
    return obj


def missing_data(name: str) -> list[str]:
    """The folders of ``name``'s smoke run that are not below the data root."""
    return [d for d in DATA[name] if not (data_root() / d).exists()]


def on_fake_data(name: str):
    """Run the marked test only where the real data of ``name`` is missing."""
    return pytest.mark.skipif(
        not missing_data(name),
        reason=f"the real {name} data is here: test_cli.py's Ctrl-C test checks the same",
    )


def _fuzzy_boolean(results: dict) -> None:
    models = results["models"]
    for key in ("pretrain", *fb.FINETUNINGS):
        assert [r["seed"] for r in models[key]["per_seed"]] == [0, 1]
        for r in models[key]["per_seed"]:
            n = 20 if key == "pretrain" else 10
            assert len(r["r2"]) == n and all(np.isfinite(r["r2"]))
        assert models[key]["mean_r2"]["n"] == 2
    n = {k: models[k]["per_seed"][0]["trainable_parameters"] for k in fb.FINETUNINGS}
    assert n["cls"] < n["type"] < n["all"]
    routing = results["diagnostics"]["routing_after_pretraining"]
    assert len(routing) == 2 and len(routing[0]["functions_per_token"]) == 2  # seeds, iterations
    shift = results["diagnostics"]["routing_shift"]
    assert [s["seed"] for s in shift] == [0, 1]
    assert all(
        len(s[r]) == 2 and 0 <= min(s[r]) <= max(s[r]) <= 1 for s in shift for r in fb.FINETUNINGS
    )
    assert max(shift[0]["cls"][:1]) < 1e-6  # CLS tokens alone cannot move the first iteration
    assert "NI Table 1" in fb.format_summary(results)


def _tiny_imagenet(results: dict) -> None:
    assert "top-1" in ti.format_summary(results)


def _stacked_mnist(results: dict) -> None:
    ids = [c["id"] for c in results["claims"]]
    assert ids == ["table5-2", "table5-4", "table5-5", "table5-interaction"]
    assert all(
        c["kind"] == "paper" and "mde" in c and "verdict_holm" in c for c in results["claims"]
    )
    assert results["regime"]["required"] and not set(results["seeds"]) & set(
        results["selection_seeds"]
    )
    for name in ("CNN", "NFM(CNN)"):
        assert [r["seed"] for r in results["models"][name]["per_seed"]] == [0, 1]
    # the max head, trained beside the flatten head for the dip
    heads = results["diagnostics"]["per_seed"][0]["heads"]
    assert set(heads) == {"flatten", "max"}
    cnn = results["models"]["CNN"]["per_seed"][0]["test"]
    assert heads["flatten"]["test"] == {c: r["exact"] for c, r in cnn.items()}
    assert set(heads["max"]["ood_dip"]) == {"2", "4"}
    assert set(heads["max"]["convergence"]) == {"pretrain", "finetune"}
    assert set(results["diagnostics"]["head_dips"]) == {"flatten", "max"}


#: What an experiment's smoke results hold beyond what every experiment's do.
_CHECKS = {
    "fuzzy_boolean": _fuzzy_boolean,
    "tiny_imagenet": _tiny_imagenet,
    "stacked_mnist": _stacked_mnist,
}


def check_smoke_results(name: str, results: dict, folder) -> None:
    """The results ``name``'s command line wrote at smoke into ``folder``: the schema, the seeds,
    every claim with its verdict, and no temporary file left beside them."""
    assert tuple(results) == SCHEMA
    assert results["profile"] == "smoke" and results["seeds"] == [0, 1]
    assert results["claims"] and all(c["verdict"] for c in results["claims"])
    # every rule the experiment declares, each decided (of kind "ours" where it tests no paper)
    assert [c["id"] for c in results["claims"]] == list(rules_of(name))
    if not get(name).paper:
        assert all(c["kind"] == "ours" for c in results["claims"])
    _CHECKS.get(name, lambda results: None)(results)
    assert not list(folder.glob("*.tmp"))
