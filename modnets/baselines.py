"""Baselines: a ViT for Neural Interpreters, Perceiver IO for Neural Attentive Circuits.

:class:`ViT` uses the same tokeniser, CLS tokens and heads as :class:`~modnets.ni.NeuralInterpreter`
and is built from the same :class:`~modnets.ni.NIConfig`, so an experiment swaps one model for the
other with one argument (:func:`build_model`). This mirrors NI §4.2, which compares against a
vision transformer {Dosovitskiy et al., 2021} of similar size.

:class:`PerceiverIO` {Jaegle et al., 2022} is NAC's baseline (NAC §4.1, App. B.2): the same
scaffolding as :class:`~modnets.nac.NeuralAttentiveCircuit` (read-in cross-attention, ``L``
self-attention layers over latents, a decoder query) with plain linear layers, no signatures and
dense attention. :func:`nac_from_perceiver_io` loads one into a NAC with ``alpha = 0`` and a dense
kernel, which then computes exactly the same function.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.nac import NACConfig, NeuralAttentiveCircuit
from modnets.ni import ClassTokenModel, NeuralInterpreter, NIConfig, make_tokenizer
from modnets.nn.tokens import ClassTokens, Heads
from modnets.training import weight_decay_groups

__all__ = [
    "TransformerBlock",
    "ViT",
    "build_model",
    "MODELS",
    "PerceiverIO",
    "perceiver_io_config",
    "nac_from_perceiver_io",
]


class TransformerBlock(nn.Module):
    """Pre-LayerNorm transformer block: ``x + Attn(LN(x))``, then ``+ MLP(LN(.))``.

    Shapes: ``(B, T, d) -> (B, T, d)``. Attention uses ``F.scaled_dot_product_attention`` (fused
    kernels on GPU).
    """

    def __init__(self, dim: int, num_heads: int, mlp_hidden: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide dim={dim}")
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_hidden), nn.GELU(), nn.Linear(mlp_hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        B, T, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(B, T, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, d_head)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(B, T, d))
        return x + self.mlp(self.norm2(x))


class ViT(ClassTokenModel):
    """Vision-transformer baseline with the NI's tokeniser, CLS tokens and heads.

    Args:
        config: the :class:`~modnets.ni.NIConfig` whose input/output fields, ``dim``,
            ``num_heads`` and ``mlp_hidden`` are used.
        depth: transformer blocks (default ``num_scripts * num_iterations * num_locs``, the NI's
            number of LOC applications, i.e. the same sequential depth).

    Shapes: as :class:`~modnets.ni.NeuralInterpreter`: ``-> (B, num_cls, num_outputs)``.
    """

    def __init__(self, config: NIConfig, depth: int | None = None):
        super().__init__()
        if not isinstance(config, NIConfig):
            raise TypeError(f"config must be an NIConfig, got {type(config).__name__}")
        if depth is None:
            depth = config.num_scripts * config.num_iterations * config.num_locs
        if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
            raise ValueError(f"depth must be a positive int, got {depth!r}")
        self.config, self.depth = config, depth
        # a standard ViT: learned absolute positions, whatever the NI it is compared with uses
        self.tokenizer = make_tokenizer(config.replace(positional="absolute"))
        self.cls = ClassTokens(config.num_cls, config.dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.dim, config.num_heads, config.mlp_hidden) for _ in range(depth)
        )
        self.heads = Heads(config.num_cls, config.dim, config.num_outputs, config.shared_head)

    def forward(self, x: Tensor) -> Tensor:
        h = self.cls(self.tokenizer(x))
        for block in self.blocks:
            h = block(h)
        return self.heads(h[:, : self.config.num_cls])


MODELS = ("ni", "vit")


def build_model(kind: str, config: NIConfig, **kwargs) -> nn.Module:
    """``build_model("ni", cfg)`` or ``build_model("vit", cfg, depth=...)``."""
    if kind == "ni":
        return NeuralInterpreter(config, **kwargs)
    if kind == "vit":
        return ViT(config, **kwargs)
    raise ValueError(f"kind must be one of {MODELS}, got {kind!r}")


def _mlp(dim: int, hidden: int, activation: str) -> nn.Sequential:
    first = 2 * hidden if activation == "geglu" else hidden
    return nn.Sequential(nn.Linear(dim, first), nn.Linear(hidden, dim))


def _run_mlp(mlp: nn.Sequential, x: Tensor, activation: str) -> Tensor:
    h = mlp[0](x)
    if activation == "geglu":
        value, gate = h.chunk(2, dim=-1)
        h = value * F.gelu(gate)
    else:
        h = F.gelu(h)
    return mlp[1](h)


class _Attention(nn.Module):
    """Multi-head attention with separate q/k/v/out linears: ``(B, Tq, d), (B, Tk, d_kv)``."""

    def __init__(self, dim: int, kv_dim: int, num_heads: int):
        super().__init__()
        self.q, self.k = nn.Linear(dim, dim), nn.Linear(kv_dim, dim)
        self.v, self.out = nn.Linear(kv_dim, dim), nn.Linear(dim, dim)
        self.num_heads = num_heads

    def forward(self, x: Tensor, y: Tensor, key_mask: Tensor | None = None) -> Tensor:
        B, H = x.shape[0], self.num_heads
        q, k, v = (t.view(B, t.shape[1], H, -1).transpose(1, 2)
                   for t in (self.q(x), self.k(y), self.v(y)))  # fmt: skip
        mask = None if key_mask is None else key_mask[None, :]  # (1, Tk): broadcast over queries
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(out.transpose(1, 2).reshape(B, x.shape[1], -1))


class _Layer(nn.Module):
    def __init__(self, dim, num_heads, hidden, activation):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = _Attention(dim, dim, num_heads)
        self.mlp, self.activation = _mlp(dim, hidden, activation), activation

    def forward(self, z: Tensor, key_mask: Tensor | None = None) -> Tensor:
        h = self.norm1(z)
        z = z + self.attn(h, h, key_mask)
        return z + _run_mlp(self.mlp, self.norm2(z), self.activation)


class PerceiverIO(nn.Module):
    """Perceiver IO for classification {cite}`jaegle2022perceiverio` built from a
    :class:`~modnets.nac.NACConfig` (``num_processors`` latents; NAC-only fields are ignored).

    ``latents + CrossAttn(LN(latents), LN(tokens))``, ``+ MLP``; ``L`` pre-LN self-attention
    layers; one decoder query cross-attends to the latents; a linear head.

    Shapes: ``x`` -> tokens ``(B, N, input_dim)`` -> logits ``(B, num_outputs)``. ``latent_mask``
    ``(U,)`` bool hides latents (False = dropped) from every attention.
    """

    def __init__(self, config: NACConfig, tokenizer: nn.Module | None = None):
        super().__init__()
        if not isinstance(config, NACConfig):
            raise TypeError(f"config must be a NACConfig, got {type(config).__name__}")
        c = self.config = config
        self.tokenizer = tokenizer
        self.latents = nn.Parameter(0.02 * torch.randn(c.num_processors, c.dim))
        self.norm_inputs, self.norm_latents = nn.LayerNorm(c.input_dim), nn.LayerNorm(c.dim)
        self.encode = _Attention(c.dim, c.input_dim, c.read_in_heads)
        self.norm_encode_mlp = nn.LayerNorm(c.dim)
        self.encode_mlp = _mlp(c.dim, c.ffn_hidden, c.activation)
        if c.share_layers:
            shared = _Layer(c.dim, c.num_heads, c.ffn_hidden, c.activation)
            self.layers = nn.ModuleList([shared] * c.num_layers)
        else:
            self.layers = nn.ModuleList(
                _Layer(c.dim, c.num_heads, c.ffn_hidden, c.activation) for _ in range(c.num_layers)
            )
        self.query = nn.Parameter(0.02 * torch.randn(1, c.dim))
        self.norm_query, self.norm_kv = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.decode = _Attention(c.dim, c.dim, c.num_heads)
        self.norm_decode_mlp = nn.LayerNorm(c.dim)
        self.decode_mlp = _mlp(c.dim, c.ffn_hidden, c.activation)
        self.norm_out = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.num_outputs)

    def forward(self, x: Tensor, latent_mask: Tensor | None = None) -> Tensor:
        c = self.config
        t = self.tokenizer(x) if self.tokenizer is not None else x
        if t.dim() != 3 or t.shape[-1] != c.input_dim:
            raise ValueError(
                f"x must give tokens (batch, tokens, input_dim={c.input_dim}), got {tuple(t.shape)}"
            )
        B = t.shape[0]
        if latent_mask is not None and (
            latent_mask.shape != (c.num_processors,) or latent_mask.dtype != torch.bool
        ):
            raise ValueError(f"latent_mask must be a bool tensor of shape ({c.num_processors},)")
        z = self.latents.expand(B, -1, -1)
        z = z + self.encode(self.norm_latents(z), self.norm_inputs(t))
        z = z + _run_mlp(self.encode_mlp, self.norm_encode_mlp(z), c.activation)
        for layer in self.layers:
            z = layer(z, latent_mask)
        y = self.query.expand(B, -1, -1)
        y = y + self.decode(self.norm_query(y), self.norm_kv(z), latent_mask)
        y = y + _run_mlp(self.decode_mlp, self.norm_decode_mlp(y), c.activation)
        return self.head(self.norm_out(y))[:, 0]

    def drop_latents(self, n: int, seed: int = 0) -> PerceiverIO:
        """A copy without ``n`` latents, chosen uniformly at random with ``seed`` (Perceiver IO's
        latents have no connectivity to rank them by; NAC Fig. 15 compares against this)."""
        U = self.config.num_processors
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < U:
            raise ValueError(f"n must be an int in [0, {U - 1}], got {n!r}")
        g = torch.Generator().manual_seed(seed)
        keep = torch.randperm(U, generator=g)[n:].sort().values
        new = copy.deepcopy(self)
        new.config = dataclasses.replace(
            self.config, num_processors=U - n, num_read_in=0, prior=None
        )
        new.latents = nn.Parameter(self.latents.detach()[keep].clone())
        return new

    def parameter_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: no weight decay on parameters with ``dim <= 1``, latents or the query."""
        return weight_decay_groups(self, weight_decay, ("latents", "query"))


def perceiver_io_config(config: NACConfig) -> NACConfig:
    """The NAC configuration that simulates a Perceiver IO (NAC §4.1, App. B.2): ModFC's
    ``alpha = 0`` (plain linear layers), a dense kernel, free initial states, one read-out module,
    every latent reading the input, and none of the NAC's training noise or LayerScale."""
    return dataclasses.replace(
        config, alpha=0.0, learn_alpha=False, kernel="dense", initial_states="free",
        num_readouts=1, prior=None, generator="unconditional", num_read_in=0, layer_scale=None,
        drop_path=0.0, code_noise=0.0, state_noise=False,
    )  # fmt: skip


def _copy_linear(dst, src: nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


def _copy_ln(dst: nn.LayerNorm, src: nn.LayerNorm) -> None:
    dst.load_state_dict(src.state_dict())


def _copy_attention(dst, src: _Attention) -> None:
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
