"""The model registry (modnets.registry): every model the book trains, by name; each builds,
runs forward and backward, converts to float64, and comes back bit for bit from a folder --
also after the edits the papers make to trained models (NI Fig. 5b-c, NAC App. F)."""

import copy
import json

import pytest
import torch

import modnets
from modnets.registry import example_input


def _logits(out):
    return out if torch.is_tensor(out) else out.logits


@pytest.mark.parametrize("name", modnets.list_models())
def test_every_registered_model_trains_converts_and_round_trips(name, tmp_path):
    torch.manual_seed(0)
    model = modnets.create_model(name)
    x = example_input(name)
    loss = _logits(model(x)).float().square().mean()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert torch.isfinite(loss) and any(g is not None and g.abs().sum() > 0 for g in grads)
    model.eval()
    with torch.no_grad():
        before = _logits(model(x))
        again = modnets.from_pretrained(modnets.save_pretrained(model, tmp_path / name))
        assert torch.equal(_logits(again(x)), before)  # the same model, bit for bit
        assert _logits(model(example_input(name, batch=0))).shape[0] == 0  # an empty batch
        wide = model.to(torch.float64)
        assert _logits(wide(x.double())).dtype == torch.float64


def test_edited_models_come_back_as_edited(tmp_path):
    torch.manual_seed(0)
    ni = modnets.create_model("ni_digits_cpu").eval()
    ni.add_functions(2, active=False)
    ni.remove_functions([0])
    x = example_input("ni_digits_cpu")
    back = modnets.from_pretrained(modnets.save_pretrained(ni, tmp_path / "ni"))
    assert back.config.num_functions == ni.config.num_functions
    assert torch.equal(back(x), ni(x))
    nac = modnets.create_model("nac_tiny_imagenet_cpu").eval()
    for name, edited in {
        "dropped": nac.drop_modules(16),
        "edges": nac.eliminate_edges(0.5),
    }.items():
        back = modnets.from_pretrained(modnets.save_pretrained(edited, tmp_path / name))
        x = example_input("nac_tiny_imagenet_cpu")
        with torch.no_grad():
            assert torch.equal(back(x), edited(x)), name
    # without the registry: the edited circuit's config builds a circuit its weights load into
    for name, edited in {
        "dropped": nac.drop_modules(16),
        "edges": nac.eliminate_edges(0.5),
    }.items():
        fresh = modnets.NeuralAttentiveCircuit(edited.config, copy.deepcopy(edited.tokenizer))
        fresh.load_state_dict(edited.state_dict())
        with torch.no_grad():
            assert torch.equal(fresh.eval()(x), edited(x)), name


def test_names_overrides_and_pretrained_are_checked():
    with pytest.raises(ValueError, match="ni_digits_cpu"):
        modnets.create_model("ni_digit_cpu")  # a close match is suggested
    with pytest.raises(ValueError, match="unknown NIConfig fields"):
        modnets.create_model("ni_digits_cpu", hidden=3)
    with pytest.raises(ValueError, match="publishes no trained weights"):
        modnets.create_model("ni_digits_cpu", pretrained=True)
    assert modnets.create_model("ni_digits_cpu", num_functions=3).config.num_functions == 3
    # a circuit's tokenizer takes its own overrides: another image size, other channels
    small = modnets.create_model("nac_tiny_imagenet_cpu", image_size=32, out_channels=48)
    assert small(torch.randn(2, 3, 32, 32)).shape == (2, small.config.num_outputs)
    pio = modnets.create_model("pio_tiny_imagenet_cpu", image_size=32, in_channels=1)
    assert pio(torch.randn(2, 1, 32, 32)).shape == (2, pio.config.num_outputs)
    assert modnets.list_models("nac_*") == ["nac_tiny_imagenet_cpu", "nac_tiny_imagenet_gpu"]
    with pytest.raises(TypeError, match="model is a Linear, not a modnets model"):
        modnets.save_pretrained(torch.nn.Linear(2, 2), "unused")


def test_a_damaged_folder_is_refused_naming_the_file(tmp_path):
    """A damaged ``config.json`` or ``weights.pt``: an error naming the file, never torch's advice
    to load with ``weights_only=False`` (which would run the file's pickled code)."""
    folder = modnets.save_pretrained(modnets.create_model("ni_fuzzy_boolean_cpu"), tmp_path / "m")
    weights = (folder / "weights.pt").read_bytes()
    (folder / "weights.pt").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ValueError, match="weights.pt is not a weights file") as err:
        modnets.from_pretrained(folder)
    assert "weights_only" not in str(err.value)
    torch.save({"w": torch.zeros(1), "code": print}, folder / "weights.pt")  # not only tensors
    with pytest.raises(ValueError, match="other than tensors") as err:
        modnets.from_pretrained(folder)
    assert "weights_only" not in str(err.value)
    (folder / "weights.pt").unlink()
    with pytest.raises(FileNotFoundError, match="weights.pt not found"):
        modnets.from_pretrained(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        modnets.from_pretrained(folder)


def test_a_saved_model_holds_every_field_so_a_changed_preset_does_not_change_it(
    tmp_path, monkeypatch
):
    """Only the fields that differed from the preset were saved: a preset changed later changed
    the loaded model. Now every argument is saved, and the preset is not read."""
    from modnets.experiments import fuzzy_boolean as fb
    from modnets.registry import _variants

    torch.manual_seed(0)
    model = modnets.create_model("ni_fuzzy_boolean_cpu").eval()
    x = example_input("ni_fuzzy_boolean_cpu")
    folder = modnets.save_pretrained(model, tmp_path / "ni")
    preset = fb.FuzzyBooleanTrain.model_config  # the preset, changed after the save
    monkeypatch.setattr(
        fb.FuzzyBooleanTrain, "model_config", lambda t: preset(t).replace(num_iterations=3)
    )
    _variants.cache_clear()
    assert modnets.create_model("ni_fuzzy_boolean_cpu").config.num_iterations == 3
    back = modnets.from_pretrained(folder)
    _variants.cache_clear()
    with torch.no_grad():
        assert back.config == model.config and torch.equal(back(x), model(x))


def test_every_model_saves_and_loads_as_a_method_too(tmp_path):
    """``model.save_pretrained`` and ``Class.from_pretrained`` (the Hugging Face convention), for a
    model built without the registry; a part of one's own (a tokenizer) is saved with the weights
    and passed again on loading, its name in the error otherwise."""
    torch.manual_seed(0)
    nac = modnets.create_model("nac_tiny_imagenet_cpu").eval()
    mine = modnets.NeuralAttentiveCircuit(nac.config, nac.tokenizer).eval()
    x = example_input("nac_tiny_imagenet_cpu")
    back = modnets.NeuralAttentiveCircuit.from_pretrained(mine.save_pretrained(tmp_path / "nac"))
    with torch.no_grad():
        assert torch.equal(back(x), mine(x))
    with pytest.raises(TypeError, match="holds a NeuralAttentiveCircuit, not a NeuralInterpreter"):
        modnets.NeuralInterpreter.from_pretrained(tmp_path / "nac")

    class Own(torch.nn.Module):  # a tokenizer of one's own
        def __init__(self, tok):
            super().__init__()
            self.tok = tok

        def forward(self, x):
            return self.tok(x)

    own = modnets.NeuralAttentiveCircuit(nac.config, Own(nac.tokenizer)).eval()
    folder = own.save_pretrained(tmp_path / "own")
    with pytest.raises(
        TypeError, match=r"model.tokenizer is a .*Own.*load\(folder, tokenizer=\.\.\.\)"
    ):
        modnets.from_pretrained(folder)
    torch.manual_seed(1)  # other weights: the folder's replace them
    again = modnets.from_pretrained(folder, tokenizer=Own(copy.deepcopy(nac.tokenizer)))
    with torch.no_grad():
        assert torch.equal(again(x), own(x))
    with pytest.raises(TypeError, match="not arguments of the saved"):
        modnets.from_pretrained(tmp_path / "nac", head=None)


def test_a_config_naming_other_code_is_refused(tmp_path):
    folder = modnets.save_pretrained(modnets.create_model("ni_fuzzy_boolean_cpu"), tmp_path / "m")
    record = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**record, "module": "os:system"}))
    with pytest.raises(ValueError, match="only modnets classes"):
        modnets.from_pretrained(folder)


def test_the_typed_names_are_the_registry_s_and_the_package_says_it_is_typed():
    """``create_model``'s overloads give a type checker each name's class: every registered name
    is in exactly one, and builds that class; ``py.typed`` ships with the package."""
    from pathlib import Path
    from typing import get_args

    import tomllib

    from modnets import registry
    from modnets.models.baselines import PerceiverIO, ViT
    from modnets.models.nfm import ConvNet

    typed = {
        registry.NIName: modnets.NeuralInterpreter,
        registry.ViTName: ViT,
        registry.NACName: modnets.NeuralAttentiveCircuit,
        registry.PerceiverIOName: PerceiverIO,
        registry.ConvNetName: ConvNet,
    }
    names = [n for alias in typed for n in get_args(alias)]
    assert sorted(names) == modnets.list_models()
    for alias, cls in typed.items():
        assert all(type(modnets.create_model(n)) is cls for n in get_args(alias))
    root = Path(modnets.__file__).parent
    assert (root / "py.typed").is_file()
    project = tomllib.loads((root.parent / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["modnets"]
