"""The side-by-side experiment: one size for all six models, the same starting CNN for NFM,
dropped functions, the data's splits, and claims that need both compared models to learn."""

import dataclasses
import json

import pytest
import torch

from modnets.data import data_root
from modnets.experiments import side_by_side as sbs
from modnets.experiments.core.options import RunOptions

TRAIN = sbs.CONFIGS["cpu"].train


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("profile", ["smoke", "cpu", "gpu"])
def test_all_six_models_hold_parameters_within_ten_percent_of_each_other(profile):
    train = sbs.CONFIGS[profile].train
    sizes = {kind: _params(sbs.build_model(kind, train)) for kind in sbs.MODEL_NAMES}
    assert max(sizes.values()) <= 1.1 * min(sizes.values()), sizes


def test_nfm_starts_as_the_cnn_of_the_same_seed():
    cnn, nfm = (sbs.build_model(k, TRAIN, seed=3) for k in ("cnn", "nfm"))
    x = torch.randn(4, 1, TRAIN.canvas, TRAIN.canvas)
    torch.testing.assert_close(sbs.logits(nfm.eval(), x), sbs.logits(cnn.eval(), x))
    other = sbs.build_model("cnn", TRAIN, seed=4)
    assert not torch.allclose(sbs.logits(other.eval(), x), sbs.logits(cnn, x))


def test_the_one_loss_is_the_cross_entropy_of_ten_logits_plus_the_nacs_prior():
    x = torch.randn(3, 1, TRAIN.canvas, TRAIN.canvas)
    y = torch.zeros(3, 10)
    y[:, 2] = 1.0
    for kind in ("cnn", "ni", "nac"):
        model = sbs.build_model(kind, TRAIN, seed=0).eval()
        z = sbs.logits(model, x)
        bce = torch.nn.functional.binary_cross_entropy_with_logits(z, y)
        prior = 0.0
        if kind == "nac":
            U = model.config.num_processors
            prior = model.graph_loss() / (U * (U - 1))
            assert prior > 0
        torch.testing.assert_close(sbs.loss(model, x, y), bce + prior)


def test_dropped_switches_off_the_fraction_of_ni_functions_and_leaves_the_model_whole():
    ni = sbs.build_model("ni", TRAIN, seed=0)
    for fraction, kept in ((0.5, 3), (0.8, 1)):
        net = sbs.dropped(ni, fraction, seed=1)
        assert int(net.scripts[0].function_mask.sum()) == kept
    assert bool(ni.scripts[0].function_mask.all())  # the trained model is untouched
    assert sbs.droppable("nac") and sbs.droppable("ni") and not sbs.droppable("cnn")
    nac = sbs.build_model("nac", TRAIN, seed=0)
    assert sbs.dropped(nac, 0.5, seed=0).config.num_processors == 16


def _results(values: dict[str, dict[str, list[float]]]) -> dict:
    """Results with ``values[model][measure]`` per seed."""
    models = {}
    for name, measures in values.items():
        n = len(next(iter(measures.values())))
        rows = [{"seed": s, **{m: v[s] for m, v in measures.items()}} for s in range(n)]
        models[name] = {"per_seed": rows}
    return {"models": models}


def test_a_claim_is_untestable_unless_both_of_its_models_learned_the_task():
    good = {"iid": [0.6, 0.7, 0.65], "ood": [0.3, 0.35, 0.32]}
    weak = {"iid": [0.1, 0.5, 0.5], "ood": [0.5, 0.6, 0.55]}
    values = {name: good for name in sbs.MODEL_NAMES.values()}
    claims = {c.id: c for c in sbs.claims(_results({**values}))}
    assert claims["ours-side-nfm-ood"].verdict == "inconclusive"  # a difference of 0
    claims = {c.id: c for c in sbs.claims(_results({**values, "NFM(CNN)": weak}))}
    assert claims["ours-side-nfm-ood"].verdict == "not testable here"
    assert "NFM(CNN) IID" in claims["ours-side-nfm-ood"].reason
    assert claims["ours-side-ni-adapts"].verdict != "not testable here"


def test_the_advice_names_the_best_model_and_whether_its_lead_is_clear():
    values = {
        "CNN": {"iid": [0.8, 0.82, 0.81]},
        "NI": {"iid": [0.5, 0.52, 0.51]},
        "ViT": {"iid": [0.79, 0.84, 0.8]},
    }
    results = _results(values)
    for name in results["models"]:
        results["models"][name]["costs"] = {"step_ms": {"CNN": 1, "NI": 3, "ViT": 2}[name]}
    text = sbs.advice(results)
    assert "IID accuracy (%): CNN" in text and "ahead of ViT" in text and "noise" in text
    assert "NI takes 3.0x" in text


@pytest.mark.skipif(
    not all((data_root() / d / "raw").exists() for d in ("MNIST", "KMNIST")),
    reason="the MNIST / K-MNIST data is not here",
)
def test_the_test_canvases_hold_their_digit_counts_and_change_with_the_seed():
    config = dataclasses.replace(sbs.CONFIGS["smoke"], test_per_count=16)
    a, b = sbs.test_data(config, 0), sbs.test_data(config, 1)
    assert set(a["iid"]) == set(config.train.train_counts) and set(a["ood"]) == {3}
    assert (a["ood"][3].targets.sum(1) == 3).all()
    assert len(a["kmnist_train"][1]) == config.few_shot // 2
    assert not torch.equal(a["iid"][1].images, b["iid"][1].images)


def test_the_profiles_rates_are_the_recorded_selection():
    for profile, config in sbs.CONFIGS.items():
        record = sbs.recorded_path(profile)
        if config.learning_rates is None:
            continue
        assert record.exists(), f"{profile} names rates but {record} is missing"
        chosen = json.loads(record.read_text())
        # chosen under this very training setup (else rerun the selection command)
        assert chosen["train"] == json.loads(json.dumps(dataclasses.asdict(config.train)))
        assert chosen["candidates"] == list(config.train.lrs)
        assert chosen["learning_rates"] == config.learning_rates
        assert chosen["selection_seeds"] == list(config.selection_seeds)
        assert not set(config.selection_seeds) & set(config.seeds)
        assert set(config.learning_rates.values()) <= set(config.train.lrs)


def test_the_training_order_names_every_model_once():
    from modnets.experiments.side_by_side.rates import HEAVIEST_FIRST

    assert sorted(HEAVIEST_FIRST) == sorted(sbs.MODEL_NAMES)


def test_the_summary_fits_the_books_88_columns_with_the_widest_values():
    wide = {m: [-0.999, 0.5, 0.01] for m in sbs.MEASURES}
    results = _results({name: wide for name in sbs.MODEL_NAMES.values()})
    results["profile"], results["seeds"] = "cpu", [0, 1, 2]
    for name in results["models"]:
        results["models"][name]["costs"] = {
            "parameters": 101_380,
            "gflops": 0.027,
            "step_vs_cnn": 13.79,
            "infer_vs_cnn": 0.22,
        }
    lines = sbs.format_summary(results).splitlines()
    assert max(map(len, lines)) <= 88, max(lines, key=len)
    assert all(any(line.startswith(n) for line in lines) for n in sbs.MODEL_NAMES.values())


def test_the_rate_with_the_best_selection_accuracy_wins_and_ties_go_to_the_smaller(monkeypatch):
    from modnets.experiments.side_by_side import rates

    config = dataclasses.replace(
        sbs.CONFIGS["smoke"], train=dataclasses.replace(TRAIN, lrs=(1e-3, 3e-3, 1e-2))
    )
    accuracy = {"cnn": {1e-3: 0.5, 3e-3: 0.7, 1e-2: 0.6}}  # the rest: a tie at 0.4

    def trained(kind, config, seed, data, options, *, lr):
        assert seed in config.selection_seeds  # never a claim seed
        return (kind, lr), {}

    def score(model, data, batch):
        kind, lr = model
        return accuracy.get(kind, {}).get(lr, 0.4)

    monkeypatch.setattr(rates, "trained_model", trained)
    monkeypatch.setattr(rates, "mean_exact", score)
    options = RunOptions(device="cpu", show_progress=False)
    chosen = rates.choose_rates(config, {"val": None}, options)
    assert chosen["cnn"]["lr"] == 3e-3 and chosen["cnn"]["scores"][1e-2] == 0.6
    assert all(chosen[k]["lr"] == 1e-3 for k in sbs.MODEL_NAMES if k != "cnn")


def test_the_selection_command_writes_its_record(monkeypatch, tmp_path, capsys):
    """``python -m modnets.experiments.side_by_side.selection`` writes the chosen rates: a
    record of its own, not an experiment's results (whose schema it does not have)."""
    from modnets.experiments.side_by_side import selection

    chosen = {"profile": "smoke", "learning_rates": {"cnn": 1e-3}}
    chosen["val_exact"] = {sbs.MODEL_NAMES["cnn"]: {"0.001": 0.5}}
    monkeypatch.setattr(selection, "selection", lambda profile, workers: chosen)
    out = tmp_path / "rates.json"
    selection.main(["--profile", "smoke", "--out", str(out)])
    assert json.loads(out.read_text())["learning_rates"] == {"cnn": 1e-3}
    assert "lr 0.001" in capsys.readouterr().out
