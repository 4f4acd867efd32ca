"""Layers shared by the architectures."""

from modnets.nn.modulated import ModFC, ModFFN, ModLin, ModMLP, modffn_parameter_count

__all__ = ["ModLin", "ModMLP", "ModFC", "ModFFN", "modffn_parameter_count"]
