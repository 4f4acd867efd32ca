"""The architectures, each built from :mod:`modnets.nn` alone: Neural Interpreters (``ni``), Neural
Attentive Circuits (``nac``), Neural Function Modules (``nfm``) and the plain baselines they are
compared with (``baselines``: ViT, Perceiver IO); ``factory`` picks an NI or its ViT by name."""

from modnets.models.factory import MODELS, build_model

__all__ = ["MODELS", "build_model"]
