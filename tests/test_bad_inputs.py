"""The bad-input table: every public boundary rejects bad arguments with an error that names the
argument and says what is allowed (a reader should never meet a bare shape error from deep inside)."""

import pytest
import torch
from torch import nn

import modnets
from modnets import graphs, profiles
from modnets.benchmarks import run_all
from modnets.data.digits import load_mnist
from modnets.data.tiny_imagenet import load_tiny_imagenet
from modnets.models import build_model
from modnets.models.nfm import ConvNet, NFMAttention, NFMNetwork
from modnets.nn import ConvTokenizer, ModAttn, ModFFN, ModMLP
from modnets.nn.read_in import ReadIn
from modnets.training import r2_score, warmup_cosine


def nac_cfg(**kw):
    base = dict(
        input_dim=6,
        num_outputs=3,
        dim=16,
        num_layers=1,
        num_processors=6,
        num_readouts=2,
        num_heads=2,
        ffn_hidden=16,
        sig_dim=4,
        code_dim=8,
    )
    return modnets.NACConfig(**{**base, **kw})


def nac():
    return modnets.NeuralAttentiveCircuit(nac_cfg())


def ni_cfg(**kw):
    base = dict(
        dim=16,
        type_dim=4,
        num_functions=2,
        num_iterations=1,
        num_heads=2,
        image_size=8,
        patch_size=4,
        num_outputs=3,
    )
    return modnets.NIConfig(**{**base, **kw})


def opt():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)


CASES = [
    # modulated layers (chapter 1)
    ("ModLin in_features=0", lambda: modnets.ModLin(0, 4, 4), ValueError, "in_features"),
    ("ModLin in_features=4.5", lambda: modnets.ModLin(4.5, 4, 4), TypeError, "in_features"),
    ("ModFC alpha='x'", lambda: modnets.ModFC(4, 4, 4, alpha="x"), TypeError, "alpha"),
    (
        "ModLin x features",
        lambda: modnets.ModLin(4, 4, 2)(torch.randn(3, 5), torch.randn(2)),
        ValueError,
        "in_features=4",
    ),
    (
        "ModLin code features",
        lambda: modnets.ModLin(4, 4, 2)(torch.randn(3, 4), torch.randn(3)),
        ValueError,
        "code_features=2",
    ),
    (
        "ModLin no broadcast",
        lambda: modnets.ModLin(4, 4, 2)(torch.randn(3, 5, 4), torch.randn(4, 2)),
        ValueError,
        "do not broadcast",
    ),
    (
        "ModLin x not a tensor",
        lambda: modnets.ModLin(4, 4, 2)([1.0] * 4, torch.randn(2)),
        TypeError,
        "x must be a torch.Tensor",
    ),
    ("ModFFN activation", lambda: ModFFN(4, 4, 2, activation="relu"), ValueError, "activation"),
    ("ModMLP num_layers=0", lambda: ModMLP(4, 4, 2, num_layers=0), ValueError, "num_layers"),
    # Neural Interpreters (chapters 2-4)
    ("ModAttn heads", lambda: ModAttn(10, 4, num_heads=3), ValueError, "num_heads"),
    (
        "ModAttn codes",
        lambda: ModAttn(8, 4, num_heads=2)(
            torch.randn(2, 3, 5, 8), torch.randn(2, 4), torch.rand(2, 3, 5)
        ),
        ValueError,
        "codes",
    ),
    (
        "LOC compat",
        lambda: modnets.LOC(8, 4, num_heads=2)(
            torch.randn(2, 3, 5, 8), torch.randn(3, 4), torch.rand(2, 3, 4)
        ),
        ValueError,
        "compat",
    ),
    (
        "TypeMatching truncation",
        lambda: modnets.TypeMatching(truncation=2.5),
        ValueError,
        "truncation",
    ),
    ("NIConfig dim=0", lambda: ni_cfg(dim=0), ValueError, "dim"),
    ("NIConfig dim float", lambda: ni_cfg(dim=16.0), TypeError, "dim must be a positive int"),
    ("NIConfig functions bool", lambda: ni_cfg(num_functions=True), TypeError, "num_functions"),
    ("NIConfig truncation", lambda: ni_cfg(truncation=3.0), ValueError, "truncation"),
    ("NIConfig input_kind", lambda: ni_cfg(input_kind="audio"), ValueError, "input_kind"),
    ("NIConfig residual", lambda: ni_cfg(residual="sum"), ValueError, "residual"),
    ("NIConfig heads", lambda: ni_cfg(num_heads=3), ValueError, "num_heads"),
    ("NeuralInterpreter config type", lambda: modnets.NeuralInterpreter({}), TypeError, "NIConfig"),
    (
        "NeuralInterpreter image size",
        lambda: modnets.NeuralInterpreter(ni_cfg())(torch.randn(2, 3, 16, 16)),
        ValueError,
        "images",
    ),
    ("build_model kind", lambda: build_model("mlp", ni_cfg()), ValueError, "kind"),
    ("ViT config type", lambda: modnets.ViT({}), TypeError, "dataclass"),
    ("ViT config fields", lambda: modnets.ViT(nac_cfg()), TypeError, "num_cls"),
    (
        "PerceiverIO config fields",
        lambda: modnets.PerceiverIO(ni_cfg()),
        TypeError,
        "num_processors",
    ),
    # NAC (chapters 7-9)
    ("SKMDPA num_heads", lambda: modnets.SKMDPA(num_heads=0), ValueError, "num_heads"),
    ("SKMDPA bandwidth", lambda: modnets.SKMDPA(bandwidth=0.0), ValueError, "bandwidth"),
    ("SKMDPA temperature", lambda: modnets.SKMDPA(temperature=-1.0), ValueError, "temperature"),
    ("SKMDPA eval_kernel", lambda: modnets.SKMDPA(eval_kernel="mean"), ValueError, "eval_kernel"),
    (
        "SKMDPA one signature",
        lambda: modnets.SKMDPA()(
            torch.randn(1, 2, 4),
            torch.randn(1, 2, 4),
            torch.randn(1, 2, 4),
            torch.randn(2, 3),
            None,
        ),
        ValueError,
        "signatures",
    ),
    (
        "ReadIn heads",
        lambda: ReadIn(dim=10, input_dim=4, code_dim=2, num_heads=3),
        ValueError,
        "num_heads",
    ),
    (
        "ReadIn inputs",
        lambda: ReadIn(8, 6, 4)(torch.randn(2, 5, 7), torch.randn(3, 8), torch.randn(3, 4)),
        ValueError,
        "inputs",
    ),
    ("NACConfig dim", lambda: nac_cfg(dim=0), ValueError, "dim"),
    ("NACConfig prior", lambda: nac_cfg(prior="small_world"), ValueError, "prior"),
    ("NACConfig generator", lambda: nac_cfg(generator="auto"), ValueError, "generator"),
    ("NACConfig kernel", lambda: nac_cfg(kernel="sparse"), ValueError, "kernel"),
    ("NACConfig alpha nan", lambda: nac_cfg(alpha=float("nan")), ValueError, "alpha"),
    ("NACConfig delta negative", lambda: nac_cfg(delta=-1.0), ValueError, "delta"),
    (
        "NACConfig temperature inf",
        lambda: nac_cfg(temperature=float("inf")),
        ValueError,
        "temperature",
    ),
    ("NAC config type", lambda: modnets.NeuralAttentiveCircuit({}), TypeError, "NACConfig"),
    ("NAC tokens", lambda: nac()(torch.randn(2, 5, 7)), ValueError, "input_dim=6"),
    (
        "NAC processor_mask shape",
        lambda: nac()(torch.randn(2, 5, 6), processor_mask=torch.ones(5, dtype=torch.bool)),
        ValueError,
        "processor_mask",
    ),
    ("NAC drop_modules n", lambda: nac().drop_modules(6), ValueError, "n must"),
    ("NAC eliminate_edges fraction", lambda: nac().eliminate_edges(1.5), ValueError, "fraction"),
    (
        "PerceiverIO latent_mask",
        lambda: modnets.PerceiverIO(nac_cfg())(
            torch.randn(2, 5, 6), latent_mask=torch.ones(3, dtype=torch.bool)
        ),
        ValueError,
        "latent_mask",
    ),
    ("graphon name", lambda: graphs.graphon("small_world", 8), ValueError, "name"),
    ("graphon num_nodes", lambda: graphs.graphon("erdos_renyi", 1), ValueError, "num_nodes"),
    (
        "GraphPriorRegularizer prior",
        lambda: graphs.GraphPriorRegularizer(torch.rand(3, 4)),
        ValueError,
        "prior",
    ),
    (
        "GraphPriorRegularizer P",
        lambda: graphs.GraphPriorRegularizer(torch.rand(4, 4))(torch.rand(3, 3)),
        ValueError,
        "P must",
    ),
    ("ConvTokenizer image_size", lambda: ConvTokenizer(image_size=60), ValueError, "image_size"),
    (
        "ConvTokenizer images",
        lambda: ConvTokenizer(hidden_channels=4, out_channels=4, pos_dim=2)(
            torch.randn(1, 3, 32, 32)
        ),
        ValueError,
        "images",
    ),
    # Neural Function Modules (chapter 11)
    ("NFMAttention key_dim/heads", lambda: NFMAttention(8, num_heads=3), ValueError, "key_dim"),
    ("NFMAttention top_k", lambda: NFMAttention(8, top_k=0), ValueError, "top_k"),
    ("NFMAttention num_heads type", lambda: NFMAttention(8, num_heads=2.0), TypeError, "num_heads"),
    ("NFMNetwork dims", lambda: NFMNetwork([nn.Identity()], (3,)), ValueError, "dims"),
    (
        "NFMNetwork passes float",
        lambda: NFMNetwork([nn.Identity()], (3, 3), passes=2.0),
        TypeError,
        "passes",
    ),
    ("ConvNet width float", lambda: ConvNet(num_outputs=3, width=4.0), TypeError, "width"),
    (
        "NFMNetwork placement",
        lambda: NFMNetwork([nn.Identity()], (3, 3), placement="x"),
        ValueError,
        "placement",
    ),
    ("ConvNet pool", lambda: ConvNet(pool="sum"), ValueError, "pool"),
    # profiles, data, training, benchmarks
    ("get_profile", lambda: profiles.get_profile("fast"), ValueError, "profile"),
    ("select incomplete", lambda: profiles.select({"cpu": 1}), ValueError, "table"),
    ("load_mnist split", lambda: load_mnist(split="dev"), ValueError, "split"),
    ("load_tiny_imagenet split", lambda: load_tiny_imagenet(split="test"), ValueError, "split"),
    ("warmup_cosine total_steps", lambda: warmup_cosine(opt(), 0), ValueError, "total_steps"),
    ("r2_score shapes", lambda: r2_score(torch.zeros(3), torch.zeros(4)), ValueError, "pred"),
    ("benchmarks only", lambda: run_all("smoke", only=["warp"], show=None), ValueError, "only"),
    # inputs a model cannot read: named before anything runs
    (
        "NI every function masked",
        lambda: ni()(torch.randn(2, 3, 8, 8), function_mask=torch.zeros(2, dtype=torch.bool)),
        ValueError,
        "every function off",
    ),
    (
        "NI integer images",
        lambda: ni()(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)),
        TypeError,
        "uint8",
    ),
    ("NI NumPy images", lambda: ni()(torch.zeros(2, 3, 8, 8).numpy()), TypeError, "ndarray"),
    (
        "NI float64 into float32",
        lambda: ni()(torch.zeros(2, 3, 8, 8, dtype=torch.float64)),
        TypeError,
        "float64 but the model's weights are torch.float32",
    ),
    ("NAC no tokens", lambda: nac()(torch.randn(2, 0, 6)), ValueError, "no tokens"),
    (
        "NAC integer tokens",
        lambda: nac()(torch.zeros(2, 5, 6, dtype=torch.long)),
        TypeError,
        "int64",
    ),
    (
        "NFM(CNN) float64 into float32",
        lambda: ConvNet(width=2).with_nfm()(torch.zeros(1, 1, 8, 8, dtype=torch.float64)),
        TypeError,
        "float64",
    ),
    (
        "ConvNet wrong image size",
        lambda: ConvNet(width=2)(torch.zeros(1, 1, 32, 32)),
        ValueError,
        r"x must have shape \(B, 1, 64, 64\).*got \(1, 1, 32, 32\)",
    ),
    (
        "NFM(CNN) wrong channels",
        lambda: ConvNet(width=2).with_nfm()(torch.zeros(1, 3, 64, 64)),
        ValueError,
        r"x must have shape \(B, 1, 64, 64\), got \(1, 3, 64, 64\)",
    ),
]


def ni():
    return modnets.NeuralInterpreter(ni_cfg())


def test_the_table_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name,call,error,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_rejected_with_a_clear_message(name, call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_nac_config_replace_validates_as_the_ni_s_does():
    cfg = nac_cfg()
    assert cfg.replace(dim=32).dim == 32 and cfg.dim == 16
    with pytest.raises(ValueError, match="unknown NACConfig fields"):
        cfg.replace(width=3)
    with pytest.raises(ValueError, match="alpha"):
        cfg.replace(alpha=float("nan"))
