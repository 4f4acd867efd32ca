"""The layers of a circuit (NAC §2.1): SKMDPA between modulated projections, the propagator that
updates every processor module, and the read-out."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.models.nac.config import CircuitDesign, NACConfig, modfc_alpha
from modnets.nn.modulated import ModFC, ModFFN
from modnets.nn.residual import LayerScale, code_noise, drop_path
from modnets.nn.skmdpa import SKMDPA


def _ffn(c: NACConfig) -> ModFFN:
    """The modulated FFN of a propagator and of the read-out (NAC App. A)."""
    return ModFFN(
        c.dim,
        c.dim,
        c.code_dim,
        hidden_features=c.ffn_hidden,
        activation=c.activation,
        alpha=modfc_alpha(c),
    )


class ModulatedAttention(nn.Module):
    """SKMDPA with ModFC projections, each conditioned on its own module's code (NAC §2).

    ``q_i = ModFC(x_i; c_i)``, ``k_j = ModFC(y_j; c_j)``, ``v_j = ModFC(y_j; c_j)``, then NAC eq. 3,
    then an output ModFC with the query module's code.

    Shapes: queries ``(B, Uq, d)`` with codes ``(Uq or B x Uq, d_code)`` and signatures; keys and
    values ``(B, Uk, d)`` likewise -> ``(B, Uq, d)``.
    """

    def __init__(
        self, config: NACConfig, bandwidth: float | Tensor | None = None, truncated: bool = True
    ):
        super().__init__()
        c, alpha = config, modfc_alpha(config)
        self.query = ModFC(c.dim, c.dim, c.code_dim, alpha=alpha)
        self.key = ModFC(c.dim, c.dim, c.code_dim, alpha=alpha)
        self.value = ModFC(c.dim, c.dim, c.code_dim, alpha=alpha)
        self.out = ModFC(c.dim, c.dim, c.code_dim, alpha=alpha)
        self.attention = SKMDPA(
            num_heads=c.num_heads,
            bandwidth=c.bandwidth if bandwidth is None else bandwidth,
            temperature=c.temperature,
            delta=c.delta,
            eval_kernel=c.eval_kernel,
            truncation=c.truncation if truncated else None,
            straight_through=c.straight_through,
            per_example=c.per_example_kernel,
            sample=c.sample_kernel,
        )

    def forward(self, x, codes, sigs, y, y_codes, y_sigs, key_mask=None, edge_mask=None):
        q = self.query(x, codes)
        k, v = self.key(y, y_codes), self.value(y, y_codes)
        return self.out(self.attention(q, k, v, sigs, y_sigs, key_mask, edge_mask), codes)


class Propagator(nn.Module):
    """One propagator layer (NAC §2.1): a round of SKMDPA among the processor modules, then
    ``U_p`` copies of a ModFFN, each conditioned on its module's code; LayerScale and DropPath on
    both residual branches, code noise on the receiving modules' codes (training).

    ``senders``: the read-in modules' ``(states, codes, signatures)``, which send to every
    receiving module (through the kernel) but are not updated; the keys are then the read-in
    modules followed by ``states``, which is how ``key_mask`` and ``edge_mask`` columns are
    ordered.

    Shapes: states ``(B, U, d)`` -> ``(B, U, d)``.
    """

    def __init__(self, config: NACConfig, bandwidth: float | Tensor | None = None):
        super().__init__()
        c = config
        self.norm_attn, self.norm_ffn = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        # share_layernorm=False: the senders' own LayerNorm (public code)
        self.norm_senders = None if c.share_layernorm else nn.LayerNorm(c.dim)
        self.attn = ModulatedAttention(c, bandwidth)
        self.ffn = _ffn(c)
        self.scale_attn, self.scale_ffn = (
            LayerScale(c.dim, c.layer_scale),
            LayerScale(c.dim, c.layer_scale),
        )
        self.drop_path, self.code_noise = c.drop_path, c.code_noise

    def forward(self, states, codes, sigs, key_mask=None, edge_mask=None, senders=None) -> Tensor:
        h = self.norm_attn(states)
        norm_senders = self.norm_attn if self.norm_senders is None else self.norm_senders
        y = h if self.norm_senders is None else norm_senders(states)
        y_codes, y_sigs = codes, sigs
        if senders is not None:
            s_states, s_codes, s_sigs = senders
            y = torch.cat([norm_senders(s_states), y], 1)
            y_codes = torch.cat([s_codes, codes], -2)
            y_sigs = None if sigs is None else torch.cat([s_sigs, sigs], -2)
        codes = code_noise(codes, self.code_noise, self.training)  # the receivers' codes
        msg = self.attn(h, codes, sigs, y, y_codes, y_sigs, key_mask, edge_mask)
        states = states + drop_path(self.scale_attn(msg), self.drop_path, self.training)
        upd = self.ffn(self.norm_ffn(states), codes)
        return states + drop_path(self.scale_ffn(upd), self.drop_path, self.training)


class ReadOut(nn.Module):
    """Read-out (NAC §2.1): the read-out modules cross-attend (SKMDPA) to the final processor
    states, apply a ModFFN, and each emits logits and a confidence; the output is the sum of
    their logits weighted by ``softmax_o(confidence_o)`` (or a Gumbel softmax,
    ``read_out_pooling``).

    Shapes: processor states ``(B, U_p, d)``, read-out states ``(U_o, d)`` or ``(B, U_o, d)`` ->
    logits ``(B, num_outputs)`` and weights ``(B, U_o)``.
    """

    def __init__(self, config: NACConfig, bandwidth: float | Tensor | None = None):
        super().__init__()
        c = config
        self.norm_q, self.norm_kv = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.attn = ModulatedAttention(c, bandwidth, truncated=c.read_out_truncation)
        self.norm_ffn = nn.LayerNorm(c.dim)
        self.ffn = _ffn(c)
        self.scale_attn, self.scale_ffn = (
            LayerScale(c.dim, c.layer_scale),
            LayerScale(c.dim, c.layer_scale),
        )
        # DropPath as the propagators' in the public Tiny-ImageNet run; none in nc_full, INET-110E
        self.drop_path = c.drop_path if c.read_out_drop_path else 0.0
        self.code_noise, self.pooling = c.code_noise, c.read_out_pooling
        # read_out_residual=False: the public ImageNet read-out, no residual and no final norm
        self.residual = c.read_out_residual
        self.norm_out = nn.LayerNorm(c.dim) if c.read_out_residual else nn.Identity()
        self.head = nn.Linear(c.dim, c.num_outputs)
        self.confidence = nn.Linear(c.dim, 1, bias=False)  # a bias cancels in the softmax

    def forward(self, proc_states, design: CircuitDesign, key_mask=None) -> tuple[Tensor, Tensor]:
        B = proc_states.shape[0]
        y = design.out_states
        y = y.expand(B, -1, -1) if y.dim() == 2 else y
        kv = self.norm_kv(proc_states)
        codes = code_noise(design.out_codes, self.code_noise, self.training)
        msg = self.attn(
            self.norm_q(y),
            codes,
            design.out_signatures,
            kv,
            design.codes,
            design.signatures,
            key_mask,
        )
        msg = drop_path(self.scale_attn(msg), self.drop_path, self.training)
        y = y + msg if self.residual else msg
        upd = self.ffn(self.norm_ffn(y), codes)
        y = y + drop_path(self.scale_ffn(upd), self.drop_path, self.training)
        y = self.norm_out(y)
        weights = _POOLING[self.pooling](self.confidence(y).squeeze(-1))  # (B, U_o)
        return torch.einsum("bo,boc->bc", weights, self.head(y)), weights


#: The read-out's weights from its modules' confidences ``(B, U_o)``: NAC §2.1's softmax, or
#: the public ``OutputLatentPooling``'s Gumbel softmax (temperature 1, noise in evaluation too)
_POOLING = {
    "softmax": lambda scores: torch.softmax(scores, dim=-1),
    "gumbel": lambda scores: F.gumbel_softmax(scores, tau=1.0, dim=-1),
}
