"""The experiment harness: fit, load-or-train keys, seeds, claims, probes, the results schema,
and the properties every experiment module shares (one suite parametrised over experiments)."""

import dataclasses
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from modnets import probes
from modnets.experiments import fuzzy_boolean as fb
from modnets.experiments import get, list_experiments
from modnets.experiments.core import claims as cl
from modnets.experiments.core import fingerprints, harness, report
from modnets.experiments.core.options import RunOptions
from modnets.models.ni import NeuralInterpreter, NIConfig
from modnets.training import CheckpointError, TrainConfig, fit

#: The experiments the library ships (each test below runs over every one discovery finds).
EXPERIMENTS = list_experiments()


# ----------------------------------------------------------------------------- fit


def test_fit_logs_the_mean_loss_since_the_last_log_point():
    model = nn.Linear(1, 1, bias=False)
    values = iter(range(100))

    def step(net, idx):  # the loss is the step number (and its gradient is zero)
        return net.weight.sum() * 0 + float(next(values))

    cfg = TrainConfig(epochs=2, batch_size=1, lr=1e-3, schedule="constant", log_points=4, amp=False)
    hist = fit(model, step, cfg, n=4, show_progress=False)
    assert hist["step"] == [2, 4, 6, 8] and hist["epoch"] == [1, 2]
    assert hist["loss"] == [0.5, 2.5, 4.5, 6.5]  # means of steps (0, 1), (2, 3), ...


def test_a_non_finite_loss_stops_fit_naming_the_step_and_the_last_finite_loss(tmp_path):
    model = nn.Linear(1, 1, bias=False)
    values = iter([1.0, 3.0, 5.0, 7.0, float("nan"), 1.0, 1.0, 1.0])

    def step(net, idx):
        return net.weight.sum() * 0 + next(values)

    cfg = TrainConfig(epochs=2, batch_size=1, lr=1e-3, schedule="constant", log_points=4, amp=False)
    state = tmp_path / "state.pt"
    with pytest.raises(
        FloatingPointError, match=r"nan at step 5 \(last finite loss: 7 at step 4\)"
    ):
        fit(model, step, cfg, n=4, show_progress=False, state_path=state)
    saved = torch.load(state, weights_only=False)  # the state of the last finite epoch, kept
    assert saved["step"] == 4 and saved["history"]["loss"] == [2.0, 6.0]


@pytest.mark.parametrize("clip", [None, 0.5])
def test_fit_clips_gradients_only_when_asked(clip):
    model = nn.Linear(3, 1, bias=False)
    cfg = TrainConfig(epochs=1, batch_size=1, lr=1e-3, clip_grad_norm=clip, amp=False)
    fit(model, lambda net, idx: 1e3 * net.weight.sum(), cfg, n=2, show_progress=False)
    norm = model.weight.grad.norm().item()  # the last step's gradient, after clipping
    assert norm == pytest.approx(0.5) if clip else norm == pytest.approx(1e3 * 3**0.5)


def test_fit_restores_the_best_epoch():
    model = nn.Linear(2, 1)
    scores = iter([0.2, 0.9, 0.1])
    snapshots = []

    def evaluate(m):
        snapshots.append(m.weight.detach().clone())
        return {"acc": next(scores)}

    cfg = TrainConfig(epochs=3, batch_size=2, lr=0.1, best="acc", amp=False)
    x = torch.randn(4, 2)
    hist = fit(
        model,
        lambda net, idx: net(x[idx]).pow(2).mean(),
        cfg,
        n=4,
        evaluate=evaluate,
        show_progress=False,
    )
    assert hist["val_acc"] == [0.2, 0.9, 0.1] and hist["best_epoch"] == 2
    torch.testing.assert_close(model.weight, snapshots[1])


@pytest.mark.parametrize(
    "field, value",
    [
        ("epochs", 0),
        ("batch_size", 1.5),
        ("lr", 0.0),
        ("lr", float("inf")),
        ("lr", float("nan")),
        ("min_lr", -1e-2),  # would drive the learning rate negative
        ("min_lr", 1.0),  # above lr: the schedule would raise the rate
        ("weight_decay", -0.1),
        ("optimizer", "sgd"),
        ("schedule", "step"),
        ("warmup_fraction", 1.0),
        ("clip_grad_norm", 0.0),
    ],
)
def test_train_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{"epochs": 1, "batch_size": 1, "lr": 1e-3, field: value})


def test_fit_needs_exactly_one_data_source_and_a_loss():
    model = nn.Linear(1, 1)
    cfg = TrainConfig(epochs=1, batch_size=1, lr=1e-3)
    with pytest.raises(ValueError, match="exactly one"):
        fit(model, lambda net, b: net.weight.sum(), cfg, show_progress=False)
    with pytest.raises(TypeError, match="loss"):
        fit(model, lambda net, b: 1.0, cfg, n=1, show_progress=False)
    with pytest.raises(ValueError, match="evaluate"):
        fit(
            model,
            lambda net, b: net.weight.sum(),
            dataclasses.replace(cfg, best="acc"),
            n=1,
            show_progress=False,
        )


# ----------------------------------------------------------------------------- keys


@pytest.fixture
def tmp_modules(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "modnets_fp_a.py").write_text("import modnets_fp_b\n")
    (tmp_path / "modnets_fp_b.py").write_text("X = 1\n")
    yield tmp_path
    fingerprints._module_closure.cache_clear()
    for m in ("modnets_fp_a", "modnets_fp_b"):
        sys.modules.pop(m, None)


def test_code_fingerprint_follows_imports_and_function_sources(tmp_modules):
    before = harness.code_fingerprint("modnets_fp_a")
    (tmp_modules / "modnets_fp_b.py").write_text("X = 2\n")  # a change in an imported module
    fingerprints._module_closure.cache_clear()
    assert harness.code_fingerprint("modnets_fp_a") != before

    def f():
        return 1

    def g():
        return 2

    assert harness.code_fingerprint(f) != harness.code_fingerprint(g)
    assert harness.code_fingerprint(f) == harness.code_fingerprint(f)
    # a helper of the step's own module that the step calls is hashed with it
    (tmp_modules / "modnets_fp_c.py").write_text(
        "def helper():\n    return 1\n\n\ndef step():\n    return helper()\n"
    )
    c = importlib.import_module("modnets_fp_c")
    first = harness.code_fingerprint(c.step)
    (tmp_modules / "modnets_fp_c.py").write_text(
        "def helper():\n    return 2\n\n\ndef step():\n    return helper()\n"
    )
    c = importlib.reload(c)
    assert harness.code_fingerprint(c.step) != first
    sys.modules.pop("modnets_fp_c", None)
    with pytest.raises(TypeError, match="modules"):
        harness.code_fingerprint(3)


def test_code_fingerprint_follows_what_the_code_does_not_its_words(tmp_modules):
    """A reworded docstring or comment, or a reformatted line, keeps a model's fingerprint (and
    the records trained with it); a changed token changes it."""
    code = '"""{doc}"""\n\n\ndef f(x):\n    """{doc}"""\n    return x + {k}  # {note}\n'
    fingerprints._module_closure.cache_clear()

    def fingerprint(doc: str, k: str) -> str:
        text = code.format(doc=doc, k=k, note=doc.split()[-1])
        (tmp_modules / "modnets_fp_b.py").write_text(text)
        return harness.code_fingerprint("modnets_fp_a")

    base = fingerprint("adds one", "1")
    assert fingerprint("adds 1\n\n    to x", "1") == base
    assert fingerprint("adds one", "(\n        1\n    )") != base  # brackets are tokens
    assert fingerprint("adds one", "2") != base


def test_code_text_reads_an_f_string_as_one_token_on_every_python():
    """Python 3.12 splits an f-string into tokens, earlier versions do not: the text a
    fingerprint hashes is the same on both, so records stay fresh on the reader's Python."""
    text = fingerprints.code_text('x = f"{a + b}!" f\'{f"{c}"}\'  # why\n')
    want = ["x", "=", 'f"{a + b}!"', "f'{f\"{c}\"}'", "NEWLINE", "ENDMARKER"]
    assert text == "\x1f".join(want).encode()
    # "from modnets import distributed" is that module, not the package (and every architecture)
    closure = fingerprints._module_closure("modnets.training")
    assert "modnets.distributed" in closure and "modnets" not in closure
    assert "modnets.models.nfm" not in fingerprints._module_closure("modnets.models.ni")


@pytest.mark.long
def test_a_module_run_with_python_m_keys_its_code_as_when_imported(tmp_path):
    # the CLI (python -m modnets.experiments.<name>) and the library (the book's notebooks) must
    # find each other's checkpoints: under -m a function's __module__ is "__main__"
    (tmp_path / "modnets_fp_pkg").mkdir()
    (tmp_path / "modnets_fp_pkg" / "__init__.py").write_text("")
    (tmp_path / "modnets_fp_pkg" / "run.py").write_text(
        "from modnets.experiments.core.harness import code_fingerprint\n\n\n"
        "def helper():\n    return 1\n\n\ndef step():\n    return helper()\n\n\n"
        'if __name__ == "__main__":\n    print(code_fingerprint(step))\n'
    )
    imported = "import modnets_fp_pkg.run as r; print(r.code_fingerprint(r.step))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}

    def key(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    as_cli = key("-m", "modnets_fp_pkg.run")
    assert as_cli == key("-c", imported) and len(as_cli) == 16


def test_data_fingerprint_sees_added_files_not_where_the_folder_lives(tmp_path):
    for root in ("a", "b"):
        (tmp_path / root / "data" / "sub").mkdir(parents=True)
        (tmp_path / root / "data" / "sub" / "x.bin").write_bytes(b"123")
    a, b = tmp_path / "a" / "data", tmp_path / "b" / "data"
    assert harness.data_fingerprint(a) == harness.data_fingerprint(b)
    (b / "sub" / "y.bin").write_bytes(b"4")  # more files: a full download after a subset
    assert harness.data_fingerprint(a) != harness.data_fingerprint(b)
    assert harness.data_fingerprint(tmp_path / "missing") != harness.data_fingerprint(a)


def test_the_key_hashes_training_seed_data_and_code_but_not_the_analysis():
    cfg = fb.CONFIGS["smoke"]
    key = harness.checkpoint_key("x", cfg.train, 0, "data", "code")
    analysis_changed = dataclasses.replace(cfg, routing_points=7)  # analysis only
    assert harness.checkpoint_key("x", analysis_changed.train, 0, "data", "code") == key
    trained_changed = dataclasses.replace(cfg.train, points_per_function=999)
    saving = dataclasses.replace(
        cfg.train, pretrain=dataclasses.replace(cfg.train.pretrain, save_every=7)
    )
    assert harness.checkpoint_key("x", saving, 0, "data", "code") == key  # no effect on weights
    for other in (
        harness.checkpoint_key("x", trained_changed, 0, "data", "code"),
        harness.checkpoint_key("x", cfg.train, 1, "data", "code"),
        harness.checkpoint_key("x", cfg.train, 0, "data2", "code"),
        harness.checkpoint_key("x", cfg.train, 0, "data", "code2"),
    ):
        assert other != key


def test_load_or_train_trains_once_then_loads_and_retrains_on_new_code_or_data(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path))
    calls = []

    def train(model, stage):
        calls.append(stage.state_path)
        if stage.state_path is not None:
            stage.state_path.write_bytes(b"training state")  # as fit would
        with torch.no_grad():
            model.weight.add_(1.0)
        return {"trained": True}

    def build():
        return nn.Linear(2, 2)

    def other_step():  # stands for a changed training step
        return 0

    kw = dict(code=(build,), data="d")
    m1, h1 = harness.load_or_train("toy", {"lr": 1}, 0, build, train, **kw)
    m2, h2 = harness.load_or_train("toy", {"lr": 1}, 0, build, train, **kw)
    assert len(calls) == 1 and h2 == h1 == {"trained": True}
    torch.testing.assert_close(m1.weight, m2.weight)
    assert not list(tmp_path.glob("*.train.pt"))  # the training state is gone once finished
    harness.load_or_train("toy", {"lr": 1}, 0, build, train, code=(build, other_step), data="d")
    harness.load_or_train("toy", {"lr": 1}, 0, build, train, code=(build,), data="d2")
    assert len(calls) == 3
    harness.load_or_train("toy", {"lr": 1}, 0, build, train, options=RunOptions(cache=False), **kw)
    assert len(calls) == 4 and calls[-1] is None  # no cache: no checkpoint read or written


def test_load_or_train_keeps_an_extra_and_retrains_a_checkpoint_without_one(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path))
    calls = []

    def build():
        return nn.Linear(2, 2)

    def plain(model, stage):
        calls.append("plain")
        return {"trained": True}

    def with_extra(model, stage):
        calls.append("extra")
        return {"trained": True}, [{"epoch": 1, "state": {"w": torch.ones(2)}}]

    kw = dict(code=(build,), data="d")
    harness.load_or_train("toy", {"lr": 1}, 0, build, plain, **kw)
    with pytest.warns(UserWarning, match="holds no extra"):  # saved without: retrained
        _, _, kept = harness.load_or_train("toy", {"lr": 1}, 0, build, with_extra, extra=True, **kw)
    _, history, again = harness.load_or_train(
        "toy", {"lr": 1}, 0, build, with_extra, extra=True, **kw
    )
    assert calls == ["plain", "extra"] and history == {"trained": True}
    assert again[0]["epoch"] == 1 and torch.equal(again[0]["state"]["w"], kept[0]["state"]["w"])
    model, history = harness.load_or_train(
        "toy", {"lr": 1}, 0, build, plain, **kw
    )  # no extra asked
    assert calls == ["plain", "extra"] and isinstance(model, nn.Linear)


# ----------------------------------------------------------------------------- seeds and claims


def test_seed_stats_is_scipys_t_interval():
    v = [0.61, 0.58, 0.66, 0.6]
    s = harness.seed_stats(v)
    assert s["n"] == 4 and s["mean"] == pytest.approx(np.mean(v))
    assert s["sd"] == pytest.approx(np.std(v, ddof=1))
    lo, hi = stats.t.interval(0.95, 3, loc=np.mean(v), scale=stats.sem(v))
    assert s["ci"] == pytest.approx([lo, hi])
    assert harness.seed_stats([0.5])["ci"] is None
    assert harness.seed_stats([0.5, 0.5])["ci"] == [0.5, 0.5]
    with pytest.raises(ValueError, match="at least one"):
        harness.seed_stats([])


@pytest.mark.parametrize(
    "values, threshold, direction, verdict",
    [
        ([0.1, 0.12, 0.11], 0.0, ">", "reproduced"),
        ([-0.1, -0.12, -0.11], 0.0, ">", "not reproduced"),
        ([0.1, -0.12, 0.05], 0.0, ">", "inconclusive"),
        ([0.01, 0.02, 0.015], 0.03, "<", "reproduced"),
        ([0.05, 0.06, 0.055], 0.03, "<", "not reproduced"),
        ([0.5], 0.0, ">", "inconclusive"),
        ([0.5, 0.5], 0.0, ">", "inconclusive"),
        ([0.5, float("nan"), 0.6], 0.0, ">", "inconclusive"),
    ],
)
def test_decide(values, threshold, direction, verdict):
    assert cl.decide(values, threshold, direction)[0] == verdict


def test_paired_claim_is_paired_by_seed():
    # B is far noisier across seeds than A - B: pairing sees the consistent difference
    a, b = [0.50, 0.70, 0.90], [0.49, 0.68, 0.885]
    c = cl.paired("table5-2", a, b, ("A", "B"))
    assert c.verdict == "reproduced" and c.values == pytest.approx([0.01, 0.02, 0.015])
    assert c.kind == "paper" and "A 70.0 pts" in c.ours and "B 68.5 pts" in c.ours
    with pytest.raises(ValueError, match="one value per seed"):
        cl.paired("table5-2", [1, 2], [1], ("A", "B"))


def test_untestable_and_rendering():
    u = cl.untestable("svhn", "not available offline")
    assert u.verdict == "not testable here" and u.kind == "paper"
    c = cl.decide_rule("ours-least-vs-most", [0.2, 0.21, 0.22])
    assert c.kind == "ours" and c.verdict == "reproduced"
    html = report.claims_table([u, c]).to_html()
    assert "not testable here" in html and "#d4edda" in html  # verdicts coloured
    text = report.verdict_sentences([u, c])
    assert "**reproduced**" in text and "not available offline" in text and "[ours]" in text
    with pytest.raises(ValueError, match="verdict"):
        cl.Claim("i", "paper", "t", "s", "p", "o", "r", "maybe")
    with pytest.raises(ValueError, match="kind"):
        cl.Claim("i", "mine", "t", "s", "p", "o", "r", "reproduced")


# ----------------------------------------------------------------------------- schema


def test_results_schema_rejects_live_objects_missing_keys_and_bad_claims():
    reg = harness.regime("r", {})
    ok = harness.results_dict(
        "x",
        "smoke",
        fb.CONFIGS["smoke"],
        [0, 1],
        {},
        {},
        [],
        {"code_fingerprint": "f"},
        selection_seeds=[7],
        regime=reg,
    )
    assert tuple(ok) == harness.SCHEMA and ok["config"]["seeds"] == [0, 1]
    with pytest.raises(ValueError, match="keys"):
        harness.check_results({k: v for k, v in ok.items() if k != "claims"})
    with pytest.raises(ValueError, match="plain JSON"):
        harness.check_results({**ok, "models": {"NI": nn.Linear(1, 1)}})
    with pytest.raises(ValueError, match="lacks"):
        harness.check_results({**ok, "claims": [{"id": "a"}]})
    with pytest.raises(ValueError, match="both claim and selection seeds"):
        harness.check_results({**ok, "selection_seeds": [1]})
    with pytest.raises(ValueError, match="regime lacks"):
        harness.check_results({**ok, "regime": {}})


def test_smoke_results_decide_no_claim_and_keep_its_numbers():
    claim = cl.decide_rule("table1-type-beats-cls", [0.2, 0.3, 0.25, 0.28])
    assert claim.verdict == "reproduced"

    def results(profile):
        parts = ([0, 1], {}, {}, [claim], {"code_fingerprint": "f"})
        regime = harness.regime("r", {})
        return harness.results_dict("x", profile, fb.CONFIGS[profile], *parts, regime=regime)

    (smoke,) = results("smoke")["claims"]
    assert smoke["verdict"] == smoke["verdict_holm"] == "not testable here"
    assert smoke["reason"].startswith("not testable at smoke")
    assert smoke["interval"] == claim.as_dict()["interval"] and smoke["mde"] == claim.mde
    assert results("cpu")["claims"] == [claim.as_dict()]


# ----------------------------------------------------------------------------- probes


def test_probes_record_only_inside_a_trace():
    cfg = NIConfig(
        dim=16,
        type_dim=4,
        num_functions=3,
        num_iterations=2,
        num_heads=2,
        mlp_hidden=16,
        input_kind="vector",
        num_elements=5,
        num_cls=1,
        num_outputs=1,
    )
    model = NeuralInterpreter(cfg).eval()
    x = torch.rand(4, 5)
    with torch.no_grad():
        out = model(x, return_routing=True)
        with probes.trace("ni.compatibility") as t, probes.trace() as everything:
            assert probes.tracing()
            model(x)
        model(x)  # outside: nothing more recorded
    assert not probes.tracing()
    assert set(t) == {"ni.compatibility"} and {"ni.types", "ni.compatibility"} <= set(everything)
    torch.testing.assert_close(t.stack("ni.compatibility", 1), out.compatibilities[0])
    assert len(t["ni.compatibility"]) == 2
    with pytest.raises(KeyError, match="recorded"):
        t.stack("nac.confidences")


# ----------------------------------------------------------------------------- every experiment


#: Experiments whose claims' regime the cpu budget cannot reach: one seed shows the mechanism.
ONE_CPU_SEED = {"stacked_mnist"}


def test_the_five_experiments_are_found_in_the_books_order():
    assert EXPERIMENTS == [
        "fuzzy_boolean",
        "digits",
        "tiny_imagenet",
        "stacked_mnist",
        "side_by_side",
    ]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_declares_the_protocol(name):
    experiment = get(name)
    mod = importlib.import_module(f"modnets.experiments.{name}")
    assert mod.EXPERIMENT is experiment and experiment.name == name
    configs = experiment.configs
    assert set(configs) == {"smoke", "cpu", "gpu"}
    assert len(configs["smoke"].seeds) == 2
    assert len(configs["cpu"].seeds) >= (1 if name in ONE_CPU_SEED else 3)
    assert not set(configs["cpu"].seeds) & set(configs["cpu"].selection_seeds)
    assert all(isinstance(v, dict) and {"value", "source"} <= set(v) for v in mod.PAPER.values())
    assert experiment.rules and all(r.experiment == name for r in experiment.rules.values())
    assert all(callable(f) for f in (experiment.measure, experiment.regime, experiment.claims))
    assert (Path(mod.__file__).parent / "rules.py").is_file()  # its rules live beside it
    assert bool(experiment.paper) == any(r.kind == "paper" for r in experiment.rules.values())
    harness.code_fingerprint(*experiment.code)  # every part is hashable


#: What each experiment's gpu dry run must build, and what may get no gradient at initialisation.
DRY_RUNS = {
    "fuzzy_boolean": ({"NI (pretraining)"}, False),
    "digits": (
        {"NI (pretraining)", "ViT (pretraining)", "ViT (parameter-matched) (pretraining)"},
        False,
    ),
    "tiny_imagenet": (
        {
            "Perceiver IO",
            "NAC (scale_free)",
            "NAC (planted_partition)",
            "NAC (ring_of_cliques)",
            "NAC (erdos_renyi)",
        },
        False,
    ),
    "stacked_mnist": ({"CNN", "NFM(CNN)"}, True),  # gamma = 0 at first: the NFM reads are silent
    "side_by_side": ({"CNN", "NFM(CNN)", "ViT", "NI", "Perceiver IO", "NAC"}, True),
}


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.long
def test_gpu_configuration_takes_a_finite_training_step(name):
    """The paper-scale models of every experiment, one step at batch 2 on CPU: a finite loss,
    and a gradient on every trainable parameter (zero only where the module says why)."""
    models, some_zero = DRY_RUNS[name]
    report = harness.dry_run(get(name), "gpu")
    assert set(report) == models
    assert all(np.isfinite(r["loss"]) for r in report.values())
    assert any(r["zero_grad"] for r in report.values()) == some_zero
    if name == "tiny_imagenet":
        assert all(r["parameters"] > 10_000_000 for r in report.values())  # Table 4's sizes
    if name == "stacked_mnist":
        assert report["CNN"]["zero_grad"] == []  # every parameter of the CNN learns from step one


def test_a_resumed_fit_logs_the_same_curve(tmp_path):
    """Interrupted between two points of the loss curve, a resumed run logs what an
    uninterrupted run logs (the sums since the last point are part of the training state)."""
    import signal

    x = torch.randn(8, 3)
    cfg = TrainConfig(epochs=3, batch_size=2, lr=1e-2, log_points=3, amp=False)

    def train(path, interrupt_at=None, resume=False):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        calls = {"n": 0}

        def step(net, idx):
            calls["n"] += 1
            if calls["n"] == interrupt_at:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C: finish this step, save, stop
            return net(x[idx]).pow(2).mean()

        hist = fit(model, step, cfg, n=8, show_progress=False, state_path=path, resume=resume)
        return model, hist

    straight_model, straight = train(None)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "s.pt", interrupt_at=6)  # steps 4..8 form one log interval
    model, resumed = train(tmp_path / "s.pt", resume=True)
    for h in (straight, resumed):
        h.pop("seconds")
    assert resumed == straight
    torch.testing.assert_close(model.weight, straight_model.weight, rtol=0, atol=0)


def test_reproduction_reads_every_claim_and_redoes_holm_over_the_paper(tmp_path):
    from modnets.experiments.core.results import results_path, save_results

    a = cl.holm([cl.decide_rule("table1-type-beats-cls", [0.05, 0.3, 0.2, 0.25, 0.02])], "fuzzy")
    b = cl.holm([cl.decide_rule("fig5a-ni-vs-vit", [0.05, 0.4, 0.1, 0.3, 0.02])], "digits")
    for name, claims in (("fuzzy_boolean", a), ("digits", b)):
        results = harness.results_dict(
            name, "cpu", {}, [0, 1, 2, 3, 4], {}, {}, claims, {}, regime=harness.regime("r", {})
        )
        save_results(results, results_path(name, "cpu", tmp_path))
    assert a[0].verdict_holm == "reproduced"  # alone in its experiment's family
    paper, ours, claims, missing = report.reproduction(("fuzzy_boolean", "digits"), "cpu", tmp_path)
    assert [c["id"] for c in claims] == ["table1-type-beats-cls", "fig5a-ni-vs-vit"] and not missing
    # over the paper's family (both experiments: p = 0.041 and 0.080) 0.041 no longer survives
    assert claims[0]["verdict"] == "reproduced" and claims[0]["verdict_holm"] == "inconclusive"
    assert (
        "mde" in paper.to_html() and report.verdict_counts(claims) == "1 reproduced, 1 inconclusive"
    )
    _, _, _, missing = report.reproduction(("tiny_imagenet",), "cpu", tmp_path)
    assert len(missing) == 1 and "tiny_imagenet" in missing[0]


def _interrupted_fit(state):
    """A fit of 6 steps whose third step fails after the state of step 2 was saved at
    ``state``: ``(model, step, config)`` to go on with."""
    model = nn.Linear(2, 1)
    cfg = TrainConfig(epochs=1, batch_size=1, lr=1e-3, save_every=2, amp=False)
    calls = iter(range(100))

    def step(net, idx):
        if next(calls) == 2:
            raise RuntimeError("stop")
        return net(torch.ones(1, 2)).sum()

    with pytest.raises(RuntimeError, match="stop"):
        fit(model, step, cfg, n=6, show_progress=False, state_path=state)
    return model, step, cfg


def test_resuming_under_a_changed_train_config_is_refused_naming_the_fields(tmp_path):
    state = tmp_path / "state.pt"
    model, step, cfg = _interrupted_fit(state)
    changed = dataclasses.replace(cfg, lr=2e-3, compile=False, save_every=3)
    with pytest.raises(CheckpointError, match=r"fit\.lr: 0\.001 -> 0\.002\)"):
        fit(model, step, changed, n=6, show_progress=False, state_path=state, resume=True)
    # what does not shape the weights may change (save_every); the run then goes on from step 2
    again = dataclasses.replace(cfg, save_every=3)
    hist = fit(model, step, again, n=6, show_progress=False, state_path=state, resume=True)
    assert hist["step"][-1] == 6


def test_the_summary_plot_counts_each_paper_s_claims_by_holm_verdict():
    import matplotlib

    matplotlib.use("Agg")

    def claim(verdict, holm=None, reason="", kind="paper", vs="-"):
        return {
            "kind": kind,
            "verdict": verdict,
            "verdict_holm": holm or verdict,
            "reason": reason,
            "vs_paper": vs,
        }

    claims = {
        "A": [
            claim("reproduced"),
            claim("reproduced", vs="smaller than the paper's"),
            claim("reproduced", "inconclusive", "underpowered: ..."),
            claim("not reproduced"),
            claim("reproduced", kind="ours"),
        ],
        "B": [claim("not testable here")],
    }
    ax = report.summary_plot(claims)
    bars = [p for p in ax.patches if p.get_width() > 0]
    widths = {}
    for p in bars:
        row = round(p.get_y() + p.get_height() / 2)
        widths[row] = widths.get(row, 0) + p.get_width()
    assert widths == {0: 4, 1: 1}  # paper claims only; the ours row is left out
    hatched = {p.get_hatch(): p.get_width() for p in bars if p.get_hatch()}
    assert hatched == {"//": 1, "..": 1}  # the underpowered one; the smaller one
    sentence = report.paper_sentence("A", claims["A"])
    assert "2 of the 4 claims of A" in sentence and "(1 of them with an effect smaller" in sentence


def test_the_forest_plot_turns_each_claim_toward_what_it_claims():
    """A one-sided claim is measured beyond its threshold in its own direction, a two-sided one
    (``!=``) in the direction its mean lies, each in units of the paper's effect: a claim whose
    mean equals the paper's effect sits at 1, whatever its test or sign."""
    import matplotlib

    matplotlib.use("Agg")

    def claim(cid, test, values, paper_effect):
        return {
            "id": cid,
            "kind": "paper",
            "test": test,
            "threshold": 0.0,
            "values": values,
            "interval": [min(values), max(values)],
            "paper_effect": paper_effect,
            "mde": 0.005,
            "verdict": "reproduced",
            "verdict_holm": "reproduced",
        }

    claims = [
        claim("up", ">", [0.01, 0.03], 0.02),
        claim("down", "<", [-0.01, -0.03], -0.02),
        claim("either, below", "!=", [-0.01, -0.03], 0.02),
        claim("either, above", "!=", [0.01, 0.03], -0.02),
    ]
    ax = report.forest_plot(claims)
    means = [line.get_xdata()[0] for line in ax.lines if line.get_marker() == "o"]
    papers = [line.get_xdata()[0] for line in ax.lines if line.get_marker() == "D"]
    intervals = [sorted(line.get_xdata()) for line in ax.lines if line.get_linewidth() == 2.5]
    ticks = [sorted(line.get_xdata()) for line in ax.lines if line.get_marker() == "|"]
    assert means == pytest.approx([1.0] * 4) and papers == pytest.approx([1.0] * 4)
    assert intervals == [pytest.approx([0.5, 1.5])] * 4
    # the mde: one tick on the claimed side; both sides for a two-sided claim
    assert ticks == [[0.25], [0.25], [-0.25, 0.25], [-0.25, 0.25]]


def test_results_and_checkpoints_get_the_permissions_of_a_new_file(tmp_path):
    from modnets.data.tiny_imagenet_cache import write_cache
    from modnets.experiments.core.results import save_results
    from modnets.training import save_checkpoint

    results = harness.results_dict(
        "fuzzy_boolean", "cpu", {}, [0], {}, {}, [], {}, regime=harness.regime("r", {})
    )

    umask = os.umask(0o022)
    try:
        written = [
            save_checkpoint({"w": torch.zeros(2)}, tmp_path / "a" / "model.pt"),
            save_results(results, tmp_path / "a" / "r.json"),
        ]
        write_cache(tmp_path / "a" / "cache.npz", np.zeros(2), np.zeros(2))
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(umask)
    mode = plain.stat().st_mode & 0o777
    for path in [*written, tmp_path / "a" / "cache.npz"]:
        assert mode == 0o644 and path.stat().st_mode & 0o777 == mode, path  # not mkstemp's 0600
    assert sorted(p.name for p in written[0].parent.iterdir()) == [
        "cache.npz",
        "model.pt",
        "r.json",
    ]


def test_an_interrupted_training_found_without_resume_is_announced(tmp_path):
    state = tmp_path / "state.pt"
    model, step, cfg = _interrupted_fit(state)
    with pytest.warns(UserWarning, match="holds an interrupted training; starting again"):
        fit(model, step, cfg, n=6, show_progress=False, state_path=state)
