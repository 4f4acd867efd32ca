"""NAC read-in: modules attend to the input set with code-conditioned projections (NAC eqs. 4-5).

Each processor module ``u`` reads the inputs ``x_j`` through its own keys and values::

    q_u = ModFC(theta_u, c_u),  k_uj = ModFC(x_j, c_u),  v_uj = ModFC(x_j, c_u)      (4)
    y^_u = sum_j softmax_j(q_u . k_uj / sqrt(d)) v_uj,  y_u = ModFC(y^_u, c_u),
    theta'_u = ModFFN(y_u, c_u)                                                     (5)

NAC eq. 5 as extracted shows no softmax; we use one, as every cross-attention it builds on does
(Perceiver IO), and say so here.

Per-module keys and values would be a ``(batch, U, N, d)`` tensor. Because a ModFC is linear in its
input after the modulation ``m_u = 1 + alpha LN(W_c c_u)``, they never need to exist::

    q_u . k_uj = ((W_k^T q_u) * m^k_u) . x_j + q_u . b_k
    sum_j w_uj v_uj = W_v ((sum_j w_uj x_j) * m^v_u) + b_v sum_j w_uj

so memory is ``O(batch U N)`` for the attention weights (per head), as in ordinary cross-attention.
:meth:`ReadIn.naive_forward` materialises them, as the reference the tests compare against.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from modnets.nn.modulated import ModFC, ModFFN
from modnets.nn.residual import LayerScale

__all__ = ["ReadIn"]


def _per_module(m: Tensor) -> Tensor:
    """A modulation ``(U, d)`` or per-sample ``(B, U, d)`` as ``(B or 1, U, 1, d)``."""
    return (m[None] if m.dim() == 2 else m)[:, :, None, :]


class ReadIn(nn.Module):
    """Read-in attention followed by a ModFFN (NAC eqs. 4-5), all modules at once.

    Around NAC eqs. 4-5 we put the pre-LayerNorm residual wiring of Perceiver IO's cross-attention and
    of the public NAC code (the equations show only the attention and the ModFFN)::

        y  = theta0 + ModFC(attend(LN(x), LN(theta0)), c)
        theta1 = y + ModFFN(LN(y), c)

    ``layer_scale``: LayerScale at this value on the ModFFN branch and a learnable one at 1 on the
    attention's, as the public read-in (``None``: neither).

    Shapes: inputs ``(B, N, d_in)``, states ``(U, d)`` or ``(B, U, d)``, codes ``(U, d_code)`` or
    per sample ``(B, U, d_code)`` -> new states ``(B, U, d)``.
    """

    def __init__(
        self,
        dim: int,
        input_dim: int,
        code_dim: int,
        *,
        num_heads: int = 1,
        ffn_hidden: int | None = None,
        activation: str = "gelu",
        alpha: float = 0.1,
        layer_scale: float | None = None,
    ):
        super().__init__()
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"num_heads must be positive and divide dim={dim}, got {num_heads}")
        self.dim, self.input_dim, self.num_heads = dim, input_dim, num_heads
        self.norm_inputs = nn.LayerNorm(input_dim)
        self.norm_states = nn.LayerNorm(dim)
        self.query = ModFC(dim, dim, code_dim, alpha=alpha)
        self.key = ModFC(input_dim, dim, code_dim, alpha=alpha)
        self.value = ModFC(input_dim, dim, code_dim, alpha=alpha)
        self.out = ModFC(dim, dim, code_dim, alpha=alpha)
        self.norm_ffn = nn.LayerNorm(dim)
        self.ffn = ModFFN(
            dim, dim, code_dim, hidden_features=ffn_hidden, activation=activation, alpha=alpha
        )
        self.scale_attn = LayerScale(dim, None if layer_scale is None else 1.0)
        self.scale_ffn = LayerScale(dim, layer_scale)

    def _check(self, inputs: Tensor, states: Tensor, codes: Tensor) -> None:
        if inputs.dim() != 3 or inputs.shape[-1] != self.input_dim:
            raise ValueError(
                f"inputs must be (batch, tokens, {self.input_dim}), got {tuple(inputs.shape)}"
            )
        if states.shape[-1] != self.dim or states.shape[-2] != codes.shape[-2]:
            raise ValueError(
                f"states {tuple(states.shape)} must be (U, {self.dim}) or (batch, U, {self.dim}) "
                f"with U = codes.shape[-2] = {codes.shape[-2]}"
            )

    def _wrap(self, attend, inputs: Tensor, states: Tensor, codes: Tensor) -> Tensor:
        self._check(inputs, states, codes)
        B = inputs.shape[0]
        states = states.expand(B, -1, -1) if states.dim() == 2 else states
        q = self.query(self.norm_states(states), codes)  # (B, U, d)
        y = states + self.scale_attn(self.out(attend(self.norm_inputs(inputs), q, codes), codes))
        return y + self.scale_ffn(self.ffn(self.norm_ffn(y), codes))

    def attend(self, x: Tensor, q: Tensor, codes: Tensor) -> Tensor:
        """NAC eqs. 4-5's attention without per-module keys/values: ``(B, N, d_in)`` -> ``(B, U, d)``."""
        B, U, _ = q.shape
        H = self.num_heads
        dh = self.dim // H
        q = q.view(B, U, H, dh)
        Wk = self.key.weight.view(H, dh, self.input_dim)  # head h uses rows h*dh:(h+1)*dh
        q_tilde = torch.einsum("buhc,hci->buhi", q, Wk) * _per_module(self.key.modulation(codes))
        logits = torch.einsum("buhi,bni->buhn", q_tilde, x)
        logits = logits + torch.einsum("buhc,hc->buh", q, self.key.bias.view(H, dh))[..., None]
        w = torch.softmax(logits / math.sqrt(dh), dim=-1)  # (B, U, H, N)
        x_bar = torch.einsum("buhn,bni->buhi", w, x) * _per_module(self.value.modulation(codes))
        Wv = self.value.weight.view(H, dh, self.input_dim)
        y_hat = torch.einsum("buhi,hci->buhc", x_bar, Wv) + self.value.bias.view(H, dh)
        return y_hat.reshape(B, U, self.dim)  # rows of w sum to 1, so the bias passes through

    def naive_attend(self, x: Tensor, q: Tensor, codes: Tensor) -> Tensor:
        """NAC eq. 4 with explicit per-module keys and values ``(B, U, N, d)`` (the test reference)."""
        B, U, _ = q.shape
        N, H = x.shape[1], self.num_heads
        dh = self.dim // H
        c = codes[..., None, :]  # (U, 1, d_code) or (B, U, 1, d_code) against x (B, 1, N, d_in)
        k = self.key(x[:, None], c).view(B, U, N, H, dh)
        v = self.value(x[:, None], c).view(B, U, N, H, dh)
        w = torch.einsum("buhc,bunhc->buhn", q.view(B, U, H, dh), k) / math.sqrt(dh)
        return torch.einsum("buhn,bunhc->buhc", torch.softmax(w, -1), v).reshape(B, U, self.dim)

    def forward(self, inputs: Tensor, states: Tensor, codes: Tensor) -> Tensor:
        return self._wrap(self.attend, inputs, states, codes)

    def naive_forward(self, inputs: Tensor, states: Tensor, codes: Tensor) -> Tensor:
        """The same block with :meth:`naive_attend` (materialises ``(B, U, N, d)``)."""
        return self._wrap(self.naive_attend, inputs, states, codes)
