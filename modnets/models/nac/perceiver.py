"""A NAC built from a Perceiver IO's weights, and the Perceiver IO a NAC's configuration matches."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from modnets.models.baselines import PerceiverIO
from modnets.models.nac.circuit import NeuralAttentiveCircuit
from modnets.models.nac.config import NACConfig


def perceiver_io_config(config: NACConfig) -> NACConfig:
    """The NAC configuration that simulates a Perceiver IO (NAC §4.1, App. B.2): ModFC's
    ``alpha = 0`` (plain linear layers), a dense kernel, free initial states, one read-out module,
    every latent reading the input, and none of the NAC's training noise or LayerScale."""
    return dataclasses.replace(
        config,
        alpha=0.0,
        learn_alpha=False,
        kernel="dense",
        initial_states="free",
        num_readouts=1,
        prior=None,
        generator="unconditional",
        num_read_in=0,
        layer_scale=None,
        drop_path=0.0,
        code_noise=0.0,
        state_noise=False,
    )


def _copy_linear(dst, src: nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


def _copy_ln(dst: nn.LayerNorm, src: nn.LayerNorm) -> None:
    dst.load_state_dict(src.state_dict())


def _copy_attention(dst, src: nn.Module) -> None:
    for a, b in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "out")):
        _copy_linear(getattr(dst, a), getattr(src, b))


def _copy_ffn(dst, src: nn.Sequential) -> None:
    _copy_linear(dst.fc1, src[0])
    _copy_linear(dst.fc2, src[1])


@torch.no_grad()
def nac_from_perceiver_io(pio: PerceiverIO) -> NeuralAttentiveCircuit:
    """A NAC (configured by :func:`perceiver_io_config`) holding ``pio``'s weights: it computes
    what ``pio`` computes. Each ModFC with ``alpha = 0`` is the ``nn.Linear`` it copies."""
    nac = NeuralAttentiveCircuit(perceiver_io_config(pio.config), tokenizer=pio.tokenizer)
    nac.generator.states.copy_(pio.latents)
    nac.generator.out_states.copy_(pio.query)
    r = nac.read_in
    _copy_ln(r.norm_inputs, pio.norm_inputs)
    _copy_ln(r.norm_states, pio.norm_latents)
    _copy_attention(r, pio.encode)
    _copy_ln(r.norm_ffn, pio.norm_encode_mlp)
    _copy_ffn(r.ffn, pio.encode_mlp)
    for dst, src in zip(nac.propagators, pio.layers, strict=True):
        _copy_ln(dst.norm_attn, src.norm1)
        _copy_attention(dst.attn, src.attn)
        _copy_ln(dst.norm_ffn, src.norm2)
        _copy_ffn(dst.ffn, src.mlp)
    o = nac.read_out
    _copy_ln(o.norm_q, pio.norm_query)
    _copy_ln(o.norm_kv, pio.norm_kv)
    _copy_attention(o.attn, pio.decode)
    _copy_ln(o.norm_ffn, pio.norm_decode_mlp)
    _copy_ffn(o.ffn, pio.decode_mlp)
    _copy_ln(o.norm_out, pio.norm_out)
    _copy_linear(o.head, pio.head)
    return nac
