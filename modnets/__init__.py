"""modnets: modular neural architectures -- Neural Interpreters, Neural Attentive Circuits and
Neural Function Modules -- built from the ground up in PyTorch."""

# ruff: noqa: E402 (the thread policy must be set before anything imports torch)
from modnets import threads

threads.apply()  # before torch loads: the CPU thread policy (modnets.threads)

from modnets import graphs, profiles, utils
from modnets.data import data_root
from modnets.models import build_model
from modnets.models.baselines import PerceiverIO, ViT
from modnets.models.nac import NACConfig, NACOutput, NeuralAttentiveCircuit
from modnets.models.nfm import NFMAttention, NFMNetwork, NFMOutput
from modnets.models.ni import (
    FunctionIteration,
    Interpreter,
    NeuralInterpreter,
    NIConfig,
    NIOutput,
    Script,
)
from modnets.nn.loc import LOC
from modnets.nn.modattn import ModAttn
from modnets.nn.modulated import ModFC, ModFFN, ModLin, ModMLP
from modnets.nn.skmdpa import SKMDPA
from modnets.nn.type_matching import TypeInference, TypeMatching
from modnets.profiles import get_profile
from modnets.registry import create_model, from_pretrained, list_models, save_pretrained
from modnets.utils import default_device, seed_everything

__version__ = "0.1.0"

__all__ = [
    "ModLin",
    "ModMLP",
    "ModFC",
    "ModFFN",
    "TypeInference",
    "TypeMatching",
    "ModAttn",
    "LOC",
    "SKMDPA",
    "NFMAttention",
    "NFMNetwork",
    "NFMOutput",
    "Interpreter",
    "FunctionIteration",
    "Script",
    "NeuralInterpreter",
    "NIConfig",
    "NIOutput",
    "NeuralAttentiveCircuit",
    "NACConfig",
    "NACOutput",
    "PerceiverIO",
    "ViT",
    "build_model",
    "create_model",
    "list_models",
    "save_pretrained",
    "from_pretrained",
    "get_profile",
    "seed_everything",
    "default_device",
    "data_root",
    "graphs",
    "profiles",
    "utils",
]
