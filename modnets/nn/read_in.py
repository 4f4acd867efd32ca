"""NAC read-in: modules attend to the input set with code-conditioned projections (NAC eqs. 4-5).

Each processor module ``u`` reads the inputs ``x_j`` through its own keys and values::

    q_u = ModFC(theta_u, c_u),  k_uj = ModFC(x_j, c_u),  v_uj = ModFC(x_j, c_u)      (4)
    y^_u = sum_j softmax_j(q_u . k_uj / sqrt(d)) v_uj,  y_u = ModFC(y^_u, c_u),
    theta'_u = ModFFN(y_u, c_u)                                                     (5)

Eq. 5 as extracted shows no softmax; we use one, as every cross-attention it builds on does
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

__all__ = ["ReadIn"]


class ReadIn(nn.Module):
    """Read-in attention followed by a ModFFN (NAC eqs. 4-5), all modules at once.

    Shapes: inputs ``(B, N, d_in)``, states ``(U, d)`` or ``(B, U, d)``, codes ``(U, d_code)`` ->
    new states ``(B, U, d)``.
    """

    def __init__(self, dim: int, input_dim: int, code_dim: int, num_heads: int = 1,
                 ffn_hidden: int | None = None, activation: str = "gelu", alpha: float = 0.1):  # fmt: skip
        super().__init__()
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"num_heads must be positive and divide dim={dim}, got {num_heads}")
        self.dim, self.input_dim, self.num_heads = dim, input_dim, num_heads
        self.query = ModFC(dim, dim, code_dim, alpha=alpha)
        self.key = ModFC(input_dim, dim, code_dim, alpha=alpha)
        self.value = ModFC(input_dim, dim, code_dim, alpha=alpha)
        self.out = ModFC(dim, dim, code_dim, alpha=alpha)
        self.ffn = ModFFN(
            dim, dim, code_dim, hidden_features=ffn_hidden, activation=activation, alpha=alpha
        )

    def _queries(self, states: Tensor, codes: Tensor, batch: int) -> Tensor:
        if states.dim() == 2:
            states = states.expand(batch, -1, -1)
        return self.query(states, codes)  # (B, U, d)

    def forward(self, inputs: Tensor, states: Tensor, codes: Tensor) -> Tensor:
        B, N, _ = inputs.shape
        U, H = codes.shape[0], self.num_heads
        dh = self.dim // H
        q = self._queries(states, codes, B).view(B, U, H, dh)
        Wk = self.key.weight.view(H, dh, self.input_dim)  # head h uses rows h*dh:(h+1)*dh
        q_tilde = (
            torch.einsum("buhc,hci->buhi", q, Wk) * self.key.modulation(codes)[None, :, None, :]
        )
        logits = torch.einsum("buhi,bni->buhn", q_tilde, inputs)
        logits = logits + torch.einsum("buhc,hc->buh", q, self.key.bias.view(H, dh))[..., None]
        w = torch.softmax(logits / math.sqrt(dh), dim=-1)  # (B, U, H, N)
        x_bar = (
            torch.einsum("buhn,bni->buhi", w, inputs)
            * self.value.modulation(codes)[None, :, None, :]
        )
        Wv = self.value.weight.view(H, dh, self.input_dim)
        y_hat = torch.einsum("buhi,hci->buhc", x_bar, Wv) + self.value.bias.view(
            H, dh
        )  # rows of w sum to 1
        y = self.out(y_hat.reshape(B, U, self.dim), codes)
        return self.ffn(y, codes)

    def naive_forward(self, inputs: Tensor, states: Tensor, codes: Tensor) -> Tensor:
        """Eqs. 4-5 with explicit per-module keys and values ``(B, U, N, d)`` (test reference)."""
        B, N, _ = inputs.shape
        U, H = codes.shape[0], self.num_heads
        dh = self.dim // H
        q = self._queries(states, codes, B).view(B, U, H, dh)
        x = inputs[:, None]  # (B, 1, N, d_in) against codes (U, 1, d_code)
        k = self.key(x, codes[:, None]).view(B, U, N, H, dh)
        v = self.value(x, codes[:, None]).view(B, U, N, H, dh)
        w = torch.softmax(torch.einsum("buhc,bunhc->buhn", q, k) / math.sqrt(dh), dim=-1)
        y_hat = torch.einsum("buhn,bunhc->buhc", w, v).reshape(B, U, self.dim)
        return self.ffn(self.out(y_hat, codes), codes)
