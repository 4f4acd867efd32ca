"""Baselines: a ViT for Neural Interpreters, Perceiver IO for Neural Attentive Circuits.

:class:`ViT` uses the same tokeniser, CLS tokens and heads as :class:`~modnets.models.ni.NeuralInterpreter`
and is built from the same :class:`~modnets.models.ni.NIConfig`, so an experiment swaps one model for the
other with one argument (:func:`build_model`). This mirrors NI §4.2, which compares against a
vision transformer {Dosovitskiy et al., 2021} of similar size.

:class:`PerceiverIO` {Jaegle et al., 2022} is NAC's baseline (NAC §4.1, App. B.2): the same
scaffolding as :class:`~modnets.models.nac.NeuralAttentiveCircuit` (read-in cross-attention, ``L``
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

from modnets.nn.params import weight_decay_groups
from modnets.nn.tokens import ClassTokenModel, ClassTokens, Heads, make_tokenizer
from modnets.pretrained import Pretrained
from modnets.utils import check_input

__all__ = ["TransformerBlock", "ViT", "PerceiverIO", "require_fields"]

#: What :class:`ViT` reads from its configuration (an :class:`~modnets.models.ni.NIConfig`).
VIT_FIELDS = (
    "dim",
    "num_heads",
    "mlp_hidden",
    "num_scripts",
    "num_iterations",
    "num_locs",
    "num_cls",
    "num_outputs",
    "shared_head",
    "input_kind",
    "positional",
)
#: What :class:`PerceiverIO` reads from its configuration (a :class:`~modnets.models.nac.NACConfig`).
PIO_FIELDS = (
    "num_processors",
    "dim",
    "input_dim",
    "read_in_heads",
    "num_heads",
    "ffn_hidden",
    "activation",
    "num_layers",
    "share_layers",
    "num_outputs",
)


def require_fields(config: object, fields: tuple[str, ...], who: str) -> None:
    """Raise a ``TypeError`` naming the missing fields unless ``config`` is a dataclass with all
    of ``fields``."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"config of {who} must be a configuration dataclass, got {config!r}")
    missing = [f for f in fields if not hasattr(config, f)]
    if missing:
        raise TypeError(
            f"config of {who} lacks the fields {missing} ({type(config).__name__}); "
            f"{who} reads {list(fields)}"
        )


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


class ViT(ClassTokenModel, Pretrained):
    """Vision-transformer baseline with the NI's tokeniser, CLS tokens and heads.

    Args:
        config: the :class:`~modnets.models.ni.NIConfig` whose input/output fields, ``dim``,
            ``num_heads`` and ``mlp_hidden`` are used (any dataclass with :data:`VIT_FIELDS`).
        depth: transformer blocks (default ``num_scripts * num_iterations * num_locs``, the NI's
            number of LOC applications, i.e. the same sequential depth).

    Shapes: as :class:`~modnets.models.ni.NeuralInterpreter`: ``-> (B, num_cls, num_outputs)``.
    """

    def __init__(self, config, depth: int | None = None):
        super().__init__()
        require_fields(config, VIT_FIELDS, "ViT")
        if depth is None:
            depth = config.num_scripts * config.num_iterations * config.num_locs
        if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
            raise ValueError(f"depth must be a positive int, got {depth!r}")
        self.config, self.depth = config, depth
        # a standard ViT: learned absolute positions, whatever the NI it is compared with uses
        self.tokenizer = make_tokenizer(dataclasses.replace(config, positional="absolute"))
        self.cls = ClassTokens(config.num_cls, config.dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.dim, config.num_heads, config.mlp_hidden) for _ in range(depth)
        )
        self.heads = Heads(config.num_cls, config.dim, config.num_outputs, config.shared_head)

    def arguments(self) -> dict:
        return {"config": self.config, "depth": self.depth}

    def forward(self, x: Tensor) -> Tensor:
        """The logits ``(B, num_cls, num_outputs)`` of images ``(B, C, H, W)`` (or vectors, per
        the config's tokenizer), read from the CLS tokens as the NI's are."""
        h = self.cls(self.tokenizer(check_input(x, self)))
        for block in self.blocks:
            h = block(h)
        return self.heads(h[:, : self.config.num_cls])


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
        q, k, v = (
            t.view(B, t.shape[1], H, t.shape[-1] // H).transpose(1, 2)
            for t in (self.q(x), self.k(y), self.v(y))
        )
        mask = None if key_mask is None else key_mask[None, :]  # (1, Tk): broadcast over queries
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(out.transpose(1, 2).reshape(B, x.shape[1], H * out.shape[-1]))


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


class PerceiverIO(nn.Module, Pretrained):
    """Perceiver IO for classification {cite}`jaegle2022perceiverio` built from a
    :class:`~modnets.models.nac.NACConfig` (``num_processors`` latents; NAC-only fields are ignored;
    any dataclass with :data:`PIO_FIELDS` will do).

    ``latents + CrossAttn(LN(latents), LN(tokens))``, ``+ MLP``; ``L`` pre-LN self-attention
    layers; one decoder query cross-attends to the latents; a linear head.

    Shapes: ``x`` -> tokens ``(B, N, input_dim)`` -> logits ``(B, num_outputs)``. ``latent_mask``
    ``(U,)`` bool hides latents (False = dropped) from every attention.
    """

    def __init__(self, config, tokenizer: nn.Module | None = None):
        super().__init__()
        require_fields(config, PIO_FIELDS, "PerceiverIO")
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

    def arguments(self) -> dict:
        return {"config": self.config, "tokenizer": self.tokenizer}

    def forward(self, x: Tensor, latent_mask: Tensor | None = None) -> Tensor:
        """The logits ``(B, num_outputs)`` of tokens ``(B, N, input_dim)`` or what the tokenizer
        reads; ``latent_mask`` ``(num_latents,)`` bool: the latents that run."""
        c = self.config
        x = check_input(x, self)
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
        # a NAC's config also names its read-in latents and graph prior: none in a Perceiver IO
        nac_only = {
            k: v for k, v in (("num_read_in", 0), ("prior", None)) if hasattr(new.config, k)
        }
        new.config = dataclasses.replace(self.config, num_processors=U - n, **nac_only)
        new.latents = nn.Parameter(self.latents.detach()[keep].clone())
        return new

    def parameter_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: no weight decay on parameters with ``dim <= 1``, latents or the query."""
        return weight_decay_groups(self, weight_decay, ("latents", "query"))
