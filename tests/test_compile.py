"""torch.compile sees each model as one graph: no graph breaks in the forward pass and its loss,
and no recompilation when the batch size changes (the batch dimension marked dynamic). Dynamo
decides both; the ``eager`` and ``aot_eager`` backends check them without Inductor's code
generation, so the test stays fast."""

import pytest
import torch
from torch._dynamo.utils import counters

from modnets.experiments import digits, fuzzy_boolean, tiny_imagenet
from modnets.models.ni import NeuralInterpreter

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "compiler") or not torch._dynamo.is_dynamo_supported(),
    reason="no torch.compile on this platform",
)


def _ni(config):
    return NeuralInterpreter(config), lambda b: torch.rand(
        b, config.in_channels, config.image_size, config.image_size
    )


def _fuzzy():
    t = fuzzy_boolean.CONFIGS["smoke"].train
    return fuzzy_boolean.build_model("ni", t), lambda b: torch.rand(b, t.num_variables)


def _nac():
    model = tiny_imagenet.build_model("nac", tiny_imagenet.CONFIGS["smoke"].train)
    return model, lambda b: torch.rand(b, 3, 64, 64)  # Tiny-ImageNet's 64 x 64 images


MODELS = {
    "NI, vector inputs (fuzzy Booleans)": _fuzzy,
    "NI, image patches (digits)": lambda: _ni(digits.CONFIGS["smoke"].train.ni_config()),
    "NAC (Tiny-ImageNet)": _nac,
}


def _loss(model, x):
    out = model(x)
    return out.float().square().mean()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", MODELS)
def test_forward_and_loss_trace_as_one_graph(name):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    explained = torch._dynamo.explain(_loss)(model, inputs(3))
    reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_break_count == 0, reasons
    assert explained.graph_count == 1


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.long
def test_new_batch_sizes_do_not_recompile_and_match_eager(name):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.eval()  # no dropout: the compiled and eager steps see the same computation
    compiled = torch.compile(model, backend="aot_eager")
    torch._dynamo.config.error_on_recompile = True
    try:
        for b in (3, 5, 8):
            x = inputs(b)
            torch._dynamo.mark_dynamic(x, 0)
            loss = compiled(x).float().square().mean()
            loss.backward()  # the backward graph too
            torch.testing.assert_close(loss, _loss(model, x))
    finally:
        torch._dynamo.config.error_on_recompile = False


# ----------------------------------------------------------------------------- fit's switches


def _fit_tiny(config):
    """A small regression trained by :func:`fit`; returns its final weights."""
    from modnets.training import fit

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)

    def step(net, idx):
        return (net(x[idx]) - y[idx]).square().mean()

    fit(model, step, config, n=len(x), show_progress=False)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _config(**kw):
    from modnets.training import TrainConfig

    return TrainConfig(epochs=2, batch_size=16, lr=1e-2, amp=False, **kw)


def test_fit_compiles_the_model_it_steps_when_asked(monkeypatch):
    real_compile, compiled = torch.compile, []

    def aot_eager(module):  # dynamo and autograd as Inductor sees them, without its code generation
        compiled.append(module)
        return real_compile(module, backend="aot_eager")

    monkeypatch.delenv("MODNETS_COMPILE", raising=False)
    monkeypatch.setattr(torch, "compile", aot_eager)
    eager = _fit_tiny(_config())
    assert compiled == []
    torch.testing.assert_close(_fit_tiny(_config(compile=True)), eager)
    assert len(compiled) == 1
    monkeypatch.setenv("MODNETS_COMPILE", "0")  # the global override wins over the config
    _fit_tiny(_config(compile=True))
    assert len(compiled) == 1


def test_fit_trains_eagerly_with_a_notice_where_no_compiler_is_found(monkeypatch):
    from modnets.training import runtime

    monkeypatch.delenv("MODNETS_COMPILE", raising=False)
    monkeypatch.setattr(runtime, "compiler_available", lambda device: False)
    with pytest.warns(UserWarning, match="needs a compiler"):
        weights = _fit_tiny(_config(compile=True))
    torch.testing.assert_close(weights, _fit_tiny(_config()))


def test_the_fused_optimiser_takes_the_same_steps():
    torch.testing.assert_close(_fit_tiny(_config(fused=True)), _fit_tiny(_config()))
    with pytest.raises(TypeError, match="TrainConfig.fused must be True or False"):
        _config(fused=1)


def test_channels_last_trains_in_that_layout_and_hands_back_the_default_one():
    from modnets.training import fit

    def train(channels_last: bool):
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(2, 4, 3)
        model = torch.nn.Sequential(
            conv, torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 1)
        )
        x, layouts = torch.randn(64, 2, 6, 6), []

        def step(net, idx):
            layouts.append(conv.weight.is_contiguous(memory_format=torch.channels_last))
            return (net(x[idx]) - x[idx].mean((1, 2, 3))[:, None]).square().mean()

        fit(model, step, _config(channels_last=channels_last), n=len(x), show_progress=False)
        assert layouts == [channels_last] * 8  # 2 epochs of 4 batches, every one in the layout
        assert conv.weight.is_contiguous()  # as a checkpoint loads it
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    torch.testing.assert_close(train(True), train(False))
    with pytest.raises(TypeError, match="TrainConfig.channels_last must be True or False"):
        _config(channels_last="yes")


@pytest.mark.parametrize(
    "name", ["ni_digits_cpu", "nac_tiny_imagenet_cpu", "nfm_stacked_mnist_cpu"]
)
def test_any_batch_compiles_at_most_once_more_for_every_batch_size(name):
    """``AnyBatch``: one graph for batches of 1, 4, 5, 8 and 16, one more for 20 and 33 (a plain
    ``torch.compile`` makes one for batch 1, another from 2 and, for the convolutional models, a
    third from 16), and the outputs of the eager model. The guards are the compiler's front end,
    so the test compiles with the eager backend (no code generation)."""
    import modnets
    from modnets.registry import example_input
    from modnets.training import AnyBatch

    torch.manual_seed(0)
    model = modnets.create_model(name).eval()
    torch._dynamo.reset()
    counters.clear()
    compiled = AnyBatch(model, backend="eager")
    graphs = []
    with torch.no_grad():
        for batch in (1, 4, 5, 8, 16, 20, 33):
            x = example_input(name, batch=batch)
            torch.testing.assert_close(compiled(x), model(x))
            graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [1, 1, 1, 1, 1, 2, 2]
    assert compiled.arguments() == model.arguments()  # the model's attributes, through it
