"""Layers shared by the architectures."""

from modnets.nn.loc import LOC
from modnets.nn.modattn import ModAttn
from modnets.nn.modulated import ModFC, ModFFN, ModLin, ModMLP, modffn_parameter_count
from modnets.nn.relpos import RelativePosition2d
from modnets.nn.residual import LayerScale, code_noise, drop_path
from modnets.nn.skmdpa import SKMDPA
from modnets.nn.tokens import (
    ClassTokenModel,
    ClassTokens,
    ConvTokenizer,
    ElementEmbedding,
    Heads,
    PatchEmbedding,
    make_tokenizer,
)
from modnets.nn.type_matching import TypeInference, TypeMatching, random_signatures

__all__ = [
    "ModLin",
    "ModMLP",
    "ModFC",
    "ModFFN",
    "modffn_parameter_count",
    "TypeInference",
    "TypeMatching",
    "random_signatures",
    "ModAttn",
    "RelativePosition2d",
    "LayerScale",
    "drop_path",
    "code_noise",
    "LOC",
    "SKMDPA",
    "PatchEmbedding",
    "ConvTokenizer",
    "ElementEmbedding",
    "ClassTokens",
    "Heads",
    "make_tokenizer",
    "ClassTokenModel",
]
