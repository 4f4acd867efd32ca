"""NI §4.1: fuzzy Boolean functions, the R^2 metric, the finetunings, the experiment."""

import dataclasses
import importlib
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from modnets.data.fuzzy_boolean import (
    FuzzyBooleanFunctions,
    FuzzyFormulas,
    MultiTaskData,
    fuzzy_and,
    fuzzy_not,
    fuzzy_or,
    make_dataset,
    minterms,
    sample_formulas,
    sample_functions,
)
from modnets.experiments import fuzzy_boolean as fb
from modnets.experiments.core import fingerprints
from modnets.training import CheckpointError, r2_score

# the module, not the function the package names after it
SWEEP_MODULE = importlib.import_module("modnets.experiments.fuzzy_boolean.sweep")

CORNERS = torch.tensor(list(itertools.product([0.0, 1.0], repeat=5)))


def test_fuzzy_operations_reduce_to_boolean_logic():
    for a, b in itertools.product([0.0, 1.0], repeat=2):
        ta, tb = torch.tensor(a), torch.tensor(b)
        assert fuzzy_and(ta, tb).item() == float(bool(a) and bool(b))
        assert fuzzy_or(ta, tb).item() == float(bool(a) or bool(b))
        assert fuzzy_not(ta).item() == float(not bool(a))


def test_fuzzy_operations_between_the_corners_are_ni_eq_15():
    """NI eq. 15 off the corners: and = a b, not = 1 - a, or by De Morgan = a + b - a b."""
    a, b = torch.tensor([0.3, 0.9, 0.5]), torch.tensor([0.5, 0.2, 0.5])
    torch.testing.assert_close(fuzzy_and(a, b), torch.tensor([0.15, 0.18, 0.25]))
    torch.testing.assert_close(fuzzy_not(a), torch.tensor([0.7, 0.1, 0.5]))
    torch.testing.assert_close(fuzzy_or(a, b), torch.tensor([0.65, 0.92, 0.75]))
    assert not torch.allclose(fuzzy_or(a, b), torch.maximum(a, b))  # not the min/max logic


def test_functions_equal_their_truth_tables_on_the_corners():
    f = sample_functions(8, seed=3)
    out = f(CORNERS)  # (32, 8)
    for i, corner in enumerate(CORNERS):
        m = int(sum(int(v) << j for j, v in enumerate(corner.tolist())))  # bit j = x_{j+1}
        assert torch.equal(out[i], f.tables[:, m].float())


def test_dnf_matches_direct_fuzzy_evaluation():
    f = sample_functions(3, seed=1)
    x = torch.rand(50, 5, dtype=torch.float64)
    for k in range(3):
        value = torch.zeros(50, dtype=torch.float64)
        for m in torch.nonzero(f.tables[k]).flatten().tolist():
            term = torch.ones(50, dtype=torch.float64)
            for j in range(5):
                term = fuzzy_and(term, x[:, j] if (m >> j) & 1 else fuzzy_not(x[:, j]))
            value = fuzzy_or(value, term)
        torch.testing.assert_close(f(x)[:, k], value)
    assert f.dnf(0).count("|") == int(f.tables[0].sum()) - 1


def test_minterms_partition_unity():
    torch.testing.assert_close(minterms(torch.rand(20, 5)).sum(-1), torch.ones(20))


def test_generator_is_reproducible_and_rejects_near_constant_functions():
    a, b, c = (
        sample_functions(10, seed=5),
        sample_functions(10, seed=5),
        sample_functions(10, seed=6),
    )
    assert torch.equal(a.tables, b.tables) and not torch.equal(a.tables, c.tables)
    assert len({t.numpy().tobytes() for t in a.tables}) == 10  # distinct
    x = torch.rand(4096, 5)
    assert (a(x).var(0) >= 1e-3).all()
    never = FuzzyBooleanFunctions(torch.zeros(1, 32, dtype=torch.bool))
    assert never(x).abs().max().item() == 0.0
    # The always-true table is not constant under fuzzy semantics (the probabilistic OR of all
    # minterms is below 1 inside the cube), but nearly so: the variance threshold rejects it.
    always = FuzzyBooleanFunctions(torch.ones(1, 32, dtype=torch.bool))
    assert 0 < always(x).var().item() < 2e-3
    with pytest.raises(RuntimeError, match="variance"):
        sample_functions(2, num_variables=2, min_variance=0.5)
    with pytest.raises(ValueError, match="num_functions"):
        sample_functions(0)


def test_formulas_evaluate_eq15_and_are_boolean_on_the_corners():
    # ((x1 & ~x3) | ~(x2 | x5)) by hand with NI eq. 15
    tree = ("or", ("and", ("var", 0), ("not", ("var", 2))), ("not", ("or", ("var", 1), ("var", 4))))
    f = FuzzyFormulas([tree], 5)
    assert f.expression(0) == "((x1 & ~x3) | ~(x2 | x5))" and f.depth(0) == 2
    x = torch.rand(64, 5, generator=torch.Generator().manual_seed(0))
    by_hand = fuzzy_or(
        fuzzy_and(x[:, 0], fuzzy_not(x[:, 2])), fuzzy_not(fuzzy_or(x[:, 1], x[:, 4]))
    )
    torch.testing.assert_close(f(x)[:, 0], by_hand)
    corners = torch.tensor(list(itertools.product([0.0, 1.0], repeat=5)))
    crisp = [(c[0] and not c[2]) or not (c[1] or c[4]) for c in corners.bool().tolist()]
    assert f(corners)[:, 0].tolist() == [float(v) for v in crisp]


def test_formula_family_is_reproducible_shares_sub_expressions_and_rejects_constants():
    f = sample_formulas(30, seed=0)
    again = sample_formulas(30, seed=0)
    assert [f.expression(i) for i in range(30)] == [again.expression(i) for i in range(30)]
    assert len({f.expression(i) for i in range(30)}) == 30
    assert {f.depth(i) for i in range(30)} == {2, 3}
    x = torch.rand(4096, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert (f(x).var(0) >= 1e-3).all()
    # 30 functions draw their parts from a pool of 10: parts recur across functions
    parts = [
        p for i in range(30) for p in re.findall(r"\((?:~?x\d) [&|] (?:~?x\d)\)", f.expression(i))
    ]
    assert len(set(parts)) <= 10 < len(parts)
    assert len(f[:20]) == 20 and f[3].expression(0) == f.expression(3)
    with pytest.raises(ValueError, match="depths"):
        sample_formulas(3, depths=(4,))


def test_experiment_offers_both_families():
    train = fb.CONFIGS["smoke"].train
    formulas = dataclasses.replace(train, family="formulas")
    _, _, functions = fb.load_data(formulas)
    assert isinstance(functions, FuzzyFormulas)
    assert len(functions) == train.num_pretrain_functions + train.num_finetune_functions
    with pytest.raises(ValueError, match="family"):
        dataclasses.replace(train, family="circuits")


def test_dataset_split_and_reproducibility():
    f = sample_functions(4, seed=0)
    d1, d2 = make_dataset(f, 1000, seed=2), make_dataset(f, 1000, seed=2)
    assert d1.x_train.shape == (800, 5) and d1.y_val.shape == (200, 4)
    assert torch.equal(d1.x_train, d2.x_train)
    assert (d1.x_train >= 0).all() and (d1.x_train <= 1).all()
    torch.testing.assert_close(d1.y_train, f(d1.x_train))


def test_r2_equals_reference():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(100, 3))
    p = y + rng.normal(scale=0.3, size=(100, 3))
    ref = 1 - ((y - p) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)
    ours = r2_score(torch.from_numpy(p), torch.from_numpy(y)).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-12)
    sklearn = pytest.importorskip("sklearn.metrics")
    np.testing.assert_allclose(ours, sklearn.r2_score(y, p, multioutput="raw_values"), rtol=1e-12)
    assert r2_score(torch.from_numpy(y), torch.from_numpy(y)).eq(1).all()


def test_each_finetuning_freezes_exactly_the_intended_parameters():
    t = fb.CONFIGS["smoke"].train
    model = fb.build_model("ni", t)
    model.reset_cls_tokens(t.num_finetune_functions)
    script = model.scripts[0]
    n_cls = model.cls.tokens.numel()
    n_type = sum(p.numel() for p in script.iteration.type_inference.parameters())
    n_type += script.iteration.type_matching.log_sigma.numel()
    n_type += sum(p.numel() for p in script.signature_chunks)
    n_all = sum(p.numel() for p in model.parameters())
    assert fb.set_trainable(model, "cls") == n_cls
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {"cls.tokens"}
    assert fb.set_trainable(model, "type") == n_cls + n_type
    assert not any(p.requires_grad for p in script.code_chunks)
    assert not any(p.requires_grad for p in model.heads.parameters())
    assert fb.set_trainable(model, "all") == n_all
    with pytest.raises(ValueError, match="finetuning must be one of"):
        fb.set_trainable(model, "heads")


def _made_up(r2: dict) -> dict:
    return {"models": {k: {"per_seed": [{"mean_r2": v} for v in vals]} for k, vals in r2.items()}}


def test_claims_compute_every_verdict_from_made_up_results():
    ids = ("table1-type-beats-cls", "table1-gap-closed", "ours-all-beats-type")
    reproduced = _made_up(
        {
            "pretrain": [0.998, 0.997, 0.999],
            "cls": [0.90, 0.91, 0.92],
            "type": [0.98, 0.985, 0.99],
            "all": [0.995, 0.996, 0.997],
        }
    )
    out = fb.claims(reproduced)
    assert {c.id: c.verdict for c in out} == dict.fromkeys(ids, "reproduced")
    assert [c.kind for c in out] == ["paper", "paper", "ours"]
    assert all(c.mde is not None and c.verdict_holm for c in out)
    # gap closed (0.98 - 0.9) / (0.995 - 0.9) = 0.84 (the paper's 0.87), tested as more than
    # half closed in its linear form: 0.08 - 0.095 / 2
    assert out[1].values[0] == pytest.approx(0.08 - 0.095 / 2)
    assert out[1].paper_effect == pytest.approx(0.0655 - 0.0751 / 2)
    assert "gap closed 0.87" in out[1].ours  # (0.985 - 0.91) / (0.996 - 0.91) over seeds
    # type no better than cls, all worse than type
    failed = _made_up(
        {
            "pretrain": [0.998, 0.997, 0.999],
            "cls": [0.95, 0.96, 0.97],
            "type": [0.90, 0.905, 0.92],
            "all": [0.995, 0.996, 0.997],
        }
    )
    verdicts = {c.id: c.verdict for c in fb.claims(failed)}
    assert verdicts["table1-type-beats-cls"] == verdicts["table1-gap-closed"] == "not reproduced"
    noisy = _made_up(
        {
            "pretrain": [0.998, 0.999, 0.995],
            "cls": [0.90, 0.95, 0.92],
            "type": [0.95, 0.92, 0.93],
            "all": [0.97, 0.91, 0.99],
        }
    )
    assert {c.verdict for c in fb.claims(noisy)} == {"inconclusive"}
    # pretraining that did not fit the functions: outside the paper's regime, nothing decided
    poor = _made_up(
        {
            "pretrain": [0.90, 0.91, 0.92],
            "cls": [0.90, 0.91, 0.92],
            "type": [0.98, 0.985, 0.99],
            "all": [0.995, 0.996, 0.997],
        }
    )
    out = fb.claims(poor)
    assert {c.verdict for c in out} == {"not testable here"}
    assert "pretraining R², worst seed 0.9 (needs >= 0.99)" in out[0].reason


def test_a_checkpoint_that_does_not_fit_is_retrained(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path))
    config = fb.CONFIGS["smoke"]
    first = fb.trained_models(config, seed=0, show_progress=False)
    path = next(tmp_path.glob("fuzzy_boolean-pretrain_*.pt"))
    torch.save({"format": "modnets-model-v2", "model": {"w": torch.zeros(3)}, "history": {}}, path)
    with pytest.warns(UserWarning, match="retraining"):
        again = fb.trained_models(config, seed=0, show_progress=False)
    for (a, _), (b, _) in zip(first.values(), again.values(), strict=True):  # the same training
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
            torch.testing.assert_close(x, y)
    path.write_bytes(b"not a checkpoint")  # a truncated file is retrained too
    with pytest.warns(UserWarning, match="retraining"):
        fb.trained_models(config, seed=0, show_progress=False)


class _ValGuarded(MultiTaskData):
    """Training points as given; reading the reported validation split fails the test."""

    def __getattribute__(self, name):
        if name in ("x_val", "y_val"):
            raise AssertionError(f"the reported split was read: {name}")
        return super().__getattribute__(name)


def test_selection_split_is_cut_from_the_training_points():
    data = MultiTaskData(torch.arange(20.0)[:, None], torch.arange(20.0)[:, None], None, None)
    sel = fb.selection_split(data, 0.25)
    assert sel.x_train[:, 0].tolist() == list(range(15)) and sel.x_val[:, 0].tolist() == [
        15,
        16,
        17,
        18,
        19,
    ]
    with pytest.raises(ValueError, match="fraction"):
        fb.selection_split(data, 0.01)


def test_sweep_never_reads_the_reported_split_and_applies_its_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path))
    config = fb.CONFIGS["smoke"]
    pre, new, _ = fb.load_data(config.train)
    guarded = tuple(_ValGuarded(d.x_train, d.y_train, d.x_val, d.y_val) for d in (pre, new))
    with pytest.raises(AssertionError, match="reported split"):  # the guard works
        fb.evaluate(fb.build_model("ni", config.train), guarded[0])
    train, report = fb.sweep(config, data=(*guarded, None), show_progress=False)
    cands = report["candidates"]
    assert len(cands) == len(config.sweep.candidates()) == 2
    best = cands[fb.choose_candidate(cands)]
    assert report["chosen"] == {k: best[k] for k in ("truncation", "type_dim", "straight_through")}
    assert {k: train.model[k] for k in report["chosen"]} == report["chosen"]
    for regime in fb.FINETUNINGS:  # each regime finetunes at its best-scoring rate
        scores = {float(k): v for k, v in report["finetune_lr_selection"][regime].items()}
        assert train.finetune_config(regime).lr == max(scores, key=lambda lr: (scores[lr], -lr))
    # the chosen candidate and its finetunes at the chosen rates are seed 0's models: nothing
    # new is trained for them
    before = set(tmp_path.glob("*.pt"))
    final = dataclasses.replace(config, train=fb.for_seed(train, config.sweep.seed))
    trained = fb.trained_models(
        final, config.sweep.seed, data=(*guarded, None), show_progress=False
    )
    assert set(tmp_path.glob("*.pt")) == before and set(trained) == {"pretrain", *fb.FINETUNINGS}
    assert fb.sweep(dataclasses.replace(config, sweep=None)) == (config.train, {})


def test_the_sweep_resumes_its_models_and_refuses_a_junk_state(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path))
    config = fb.CONFIGS["smoke"]
    calls, real = [], fb.train

    def spy(model, data, tc, stage):
        calls.append((stage.state_path, stage.resume))
        return real(model, data, tc, stage)

    monkeypatch.setattr(fb.models, "train", spy)
    fb.sweep(config, show_progress=False, resume=True)
    assert calls and all(resume for _, resume in calls)  # every candidate and finetune
    for checkpoint in tmp_path.glob("*.pt"):  # nothing trained: the next sweep trains again
        checkpoint.unlink()
    Path(calls[0][0]).write_bytes(b"not a training state")
    with pytest.raises(CheckpointError):
        fb.sweep(config, show_progress=False, resume=True)


def test_sweep_prefers_modular_routing_to_a_better_fit():
    rows = [
        {"r2": 0.99, "regime": "collapsed"},
        {"r2": 0.95, "regime": "modular"},
        {"r2": 0.97, "regime": "modular"},
        {"r2": 0.999, "regime": "uniform"},
    ]
    assert fb.choose_candidate(rows) == 2
    # modular at every iteration beats modular overall (e.g. uniform at one iteration)
    strict = [{**rows[2]}, {"r2": 0.96, "regime": "modular", "modular_every_iteration": True}]
    assert fb.choose_candidate(strict) == 1
    no_modular = [{"r2": 0.9, "regime": "uniform"}, {"r2": 0.95, "regime": "collapsed"}]
    assert (
        fb.choose_candidate(no_modular) == 1
    )  # none modular: the best fit, and the report says so
    assert fb.choose_candidate([{"r2": 0.9, "regime": "modular"}] * 2) == 0  # a tie: the first
    with pytest.raises(ValueError, match="candidates"):
        fb.choose_candidate([])


def test_pinned_settings_are_the_recorded_sweeps_choice():
    """A profile without a sweep trains at settings a recorded sweep chose on its selection seed:
    the pinned values must be that record's choice, and the record must have started from the
    profile's configuration as it is now (else rerun ``record_sweep``)."""
    for profile, sw in fb.RECORDED_SWEEPS.items():
        config = fb.CONFIGS[profile]
        record = fb.load_sweep_record(profile)
        report = record["report"]
        assert config.sweep is None and config.selection_seeds == (sw.seed,)
        assert {k: config.train.model[k] for k in report["chosen"]} == report["chosen"]
        assert dict(config.train.finetune_lrs) == report["finetune_lrs"]
        assert record["sweep"] == json.loads(json.dumps(fingerprints.plain(sw)))
        started = fingerprints.plain(fb.unswept(config.train), for_key=True)
        started = json.loads(json.dumps(started))
        assert record["train"] == started, f"the {profile} training changed: rerun record_sweep"
        assert not set(config.selection_seeds) & set(config.seeds)


def test_record_sweep_writes_what_the_sweep_chose(tmp_path, monkeypatch):
    monkeypatch.setenv("MODNETS_CHECKPOINTS", str(tmp_path / "ckpt"))
    smoke = fb.CONFIGS["smoke"]
    pinned = dataclasses.replace(smoke, sweep=None, selection_seeds=(smoke.sweep.seed,))
    monkeypatch.setitem(fb.CONFIGS, "smoke", pinned)
    monkeypatch.setitem(fb.RECORDED_SWEEPS, "smoke", smoke.sweep)
    monkeypatch.setattr(SWEEP_MODULE, "sweep_record_path", lambda p: tmp_path / f"sweep_{p}.json")
    record = fb.record_sweep("smoke", show_progress=False)
    assert fb.load_sweep_record("smoke") == json.loads(json.dumps(record))
    chosen, _ = fb.sweep(dataclasses.replace(pinned, sweep=smoke.sweep), show_progress=False)
    assert record["report"]["chosen"] == {k: chosen.model[k] for k in fb.SWEPT}
    with pytest.raises(ValueError, match="profile"):
        fb.record_sweep("gpu")
    with pytest.raises(FileNotFoundError, match="record_sweep"):
        fb.load_sweep_record("nowhere")
    overlapping = dataclasses.replace(pinned, selection_seeds=(0,))
    with pytest.raises(ValueError, match="selection seeds"):
        fb.run(overlapping, show_progress=False)
