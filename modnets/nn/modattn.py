"""ModAttn: kernel-modulated, code-conditioned self-attention in parallel function streams (NI eqs. 6-8).

Each function ``u`` attends within its own stream with queries, keys and values from ModLins
programmed by its code ``c_u`` (eq. 6). The softmax weights are then multiplied by the
compatibilities of both tokens and renormalised over keys (eq. 7)::

    W~_uhij = C_ui C_uj softmax_j(q_uhi . k_uhj / sqrt(d_key))
    W_uhij  = W~_uhij / (eps + sum_j W~_uhij)

The renormalisation is a division, not a second softmax (a failed public reproduction used a
softmax here). A query token with ``C_ui = 0`` gets an all-zero row: the function does not touch it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from modnets.nn.modulated import ModLin

__all__ = ["ModAttn", "check_streams"]


def check_streams(x: Tensor, codes: Tensor, compat: Tensor, dim: int, code_dim: int) -> None:
    """Validate the function-stream layout shared by ModAttn, LOC and the interpreter."""
    if x.dim() != 4 or x.shape[-1] != dim:
        raise ValueError(
            f"x must have shape (batch, functions, tokens, {dim}), got {tuple(x.shape)}"
        )
    B, U, T, _ = x.shape
    if codes.dim() != 2 or codes.shape[-1] != code_dim or codes.shape[0] not in (1, U):
        raise ValueError(
            f"codes must have shape ({U}, {code_dim}) (one code per function), got {tuple(codes.shape)}"
        )
    if compat.shape != (B, U, T) and compat.shape != (1, U, T):
        raise ValueError(
            f"compat (the compatibilities C) must have shape ({B}, {U}, {T}), got {tuple(compat.shape)}"
        )


class ModAttn(nn.Module):
    """Modulated multi-head self-attention, NI eqs. 6-8, over all function streams at once.

    The per-head ModLins of eq. 6 are the row blocks of one ModLin per projection, so all heads
    share the conditioning matrix ``W_c`` (as in the public NI code) and keep their own weights.

    Args:
        dim: token width ``d``.
        code_dim: ``d_code``.
        num_heads: ``H``; must divide ``dim``.
        eps: ``epsilon`` of the renormalisation (eq. 7).

    Shapes:
        x ``(B, U, T, d)`` (token ``i`` as seen by function ``u``), codes ``(U, d_code)``,
        compat ``(B, U, T)``  ->  ``(B, U, T, d)``.
    """

    def __init__(self, dim: int, code_dim: int, num_heads: int = 4, eps: float = 1e-6):
        super().__init__()
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"num_heads must be positive and divide dim={dim}, got {num_heads}")
        self.dim, self.code_dim, self.num_heads = dim, code_dim, num_heads
        self.head_dim = dim // num_heads
        self.eps = eps
        self.query = ModLin(dim, dim, code_dim)
        self.key = ModLin(dim, dim, code_dim)
        self.value = ModLin(dim, dim, code_dim)
        self.out = ModLin(dim, dim, code_dim)

    def _heads(self, t: Tensor) -> Tensor:
        B, U, T, _ = t.shape
        return t.view(B, U, T, self.num_heads, self.head_dim)

    def attention_weights(self, x: Tensor, codes: Tensor, compat: Tensor) -> Tensor:
        """The modulated weights ``W_uhij`` of eq. 7: shape ``(B, U, H, T, T)``; rows sum to ~1
        where ``C_ui > 0`` and are zero where ``C_ui = 0``."""
        c = codes[:, None, :]  # broadcast each function's code over tokens
        q = self._heads(self.query(x, c))
        k = self._heads(self.key(x, c))
        logits = torch.einsum("buihc,bujhc->buhij", q, k) / math.sqrt(self.head_dim)
        w = torch.softmax(logits, dim=-1)
        w = w * (compat[:, :, None, :, None] * compat[:, :, None, None, :])
        return w / (self.eps + w.sum(dim=-1, keepdim=True))

    def forward(self, x: Tensor, codes: Tensor, compat: Tensor) -> Tensor:
        check_streams(x, codes, compat, self.dim, self.code_dim)
        w = self.attention_weights(x, codes, compat)
        v = self._heads(self.value(x, codes[:, None, :]))
        mixed = torch.einsum("buhij,bujhc->buihc", w, v).flatten(-2)  # heads folded into channels
        return self.out(mixed, codes[:, None, :])
