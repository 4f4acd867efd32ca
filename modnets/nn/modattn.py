"""ModAttn: kernel-modulated, code-conditioned self-attention in parallel function streams (NI eqs. 6-8).

Each function ``u`` attends within its own stream with queries, keys and values from ModLins
programmed by its code ``c_u`` (NI eq. 6). The softmax weights are then multiplied by the
compatibilities of both tokens and renormalised over keys (NI eq. 7)::

    W~_uhij = C_ui C_uj softmax_j(q_uhi . k_uhj / sqrt(d_key))
    W_uhij  = W~_uhij / (eps + sum_j W~_uhij)

The renormalisation is a division, not a second softmax (a failed public reproduction used a
softmax here). A query token with ``C_ui = 0`` gets an all-zero row: the function does not touch it.

The forward pass never builds the ``(B, U, H, T, T)`` weights. With ``s_ij = softmax_j(A_ij)``,
``sum_j W_ij v_j = C_i N_i / (eps + C_i D_i)`` where ``N_i = sum_j s_ij C_j v_j`` and
``D_i = sum_j s_ij C_j``: one ``F.scaled_dot_product_attention`` over values ``[C_j v_j, C_j]``
gives both (queries and keys padded with a zero channel, so all three share a head width and the
fused CPU / GPU kernels apply). That is NI eq. 7 exactly, ``eps`` included, with no ``log C``: exact
zeros in ``C`` are ordinary numbers. :meth:`ModAttn.attention_weights` keeps the readable NI eq. 7,
and ``fused=False`` runs the forward pass through it.

Which is faster depends on the number of tokens ``T``. On CUDA the fused kernels win. On a CPU
(two cores, torch 2.13, d 64, 4 heads, a fixed B U T), a ModAttn forward + backward through the
fused kernel is 1.7x *slower* at ``T = 18`` (chapter 6's 8x8 patches: the weights are then no
larger than the queries, and the kernel's per-head overhead dominates) and 2.4-3.8x faster at
``T = 256``; where the two cross moved between 32 and 128 tokens from one run to the next (with
the thread policy of :mod:`modnets.threads`: about 64). ``fused=None`` (the default) therefore
picks the fused kernel on CUDA and, on a CPU, from :data:`FUSED_MIN_TOKENS` tokens on
(``python -m bench --only modattn_tokens`` measures the choice).

A learned ``bias`` (the relative positions of chapter 6) changes that on a CPU: torch's fused CPU
kernel cannot give the bias its gradient, so ``F.scaled_dot_product_attention`` falls back to its
math kernel, which keeps the ``(B U, H, T, T)`` weights for backward and is slower than the
reference (0.89x at 4x4 patches, ``T = 66``). ``fused=None`` then stays on the reference.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.nn.modulated import ModLin

__all__ = ["FUSED_MIN_TOKENS", "ModAttn", "check_streams"]

#: On a CPU, ``fused=None`` uses the fused kernel from this many tokens on (measured; see above).
FUSED_MIN_TOKENS = 64


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

    The per-head ModLins of NI eq. 6 are the row blocks of one ModLin per projection, so all heads
    share the conditioning matrix ``W_c`` (as in the public NI code) and keep their own weights.

    Args:
        dim: token width ``d``.
        code_dim: ``d_code``.
        num_heads: ``H``; must divide ``dim``.
        eps: ``epsilon`` of the renormalisation (NI eq. 7).
        fused: ``True``: the forward pass through ``F.scaled_dot_product_attention``;
            ``False``: through :meth:`attention_weights` (the readable NI eq. 7, ``(B, U, H, T, T)``
            in memory); ``None`` (default): whichever is faster here (see the module's docstring).

    Shapes:
        x ``(B, U, T, d)`` (token ``i`` as seen by function ``u``), codes ``(U, d_code)``,
        compat ``(B, U, T)``, optional ``bias`` ``(U, H, T, T)`` added to the logits before the
        softmax (the relative positions of :mod:`modnets.nn.relpos`)  ->  ``(B, U, T, d)``.
    """

    def __init__(
        self,
        dim: int,
        code_dim: int,
        num_heads: int = 4,
        eps: float = 1e-6,
        fused: bool | None = None,
    ):
        super().__init__()
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"num_heads must be positive and divide dim={dim}, got {num_heads}")
        self.dim, self.code_dim, self.num_heads = dim, code_dim, num_heads
        self.head_dim = dim // num_heads
        if fused not in (True, False, None):
            raise TypeError(f"fused must be True, False or None, got {fused!r}")
        self.eps, self.fused = eps, fused
        self.query = ModLin(dim, dim, code_dim)
        self.key = ModLin(dim, dim, code_dim)
        self.value = ModLin(dim, dim, code_dim)
        self.out = ModLin(dim, dim, code_dim)

    def _heads(self, t: Tensor) -> Tensor:
        B, U, T, _ = t.shape
        return t.view(B, U, T, self.num_heads, self.head_dim)

    def attention_weights(
        self, x: Tensor, codes: Tensor, compat: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        """The modulated weights ``W_uhij`` of NI eq. 7: shape ``(B, U, H, T, T)``; rows sum to ~1
        where ``C_ui > 0`` and are zero where ``C_ui = 0``."""
        c = codes[:, None, :]  # broadcast each function's code over tokens
        q = self._heads(self.query(x, c))
        k = self._heads(self.key(x, c))
        logits = torch.einsum("buihc,bujhc->buhij", q, k) / math.sqrt(self.head_dim)
        if bias is not None:
            logits = logits + bias
        w = torch.softmax(logits, dim=-1)
        w = w * (compat[:, :, None, :, None] * compat[:, :, None, None, :])
        return w / (self.eps + w.sum(dim=-1, keepdim=True))

    def forward(
        self, x: Tensor, codes: Tensor, compat: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        check_streams(x, codes, compat, self.dim, self.code_dim)
        B, U, T, _ = x.shape
        H, dh = self.num_heads, self.head_dim
        if bias is not None and bias.shape not in ((U, H, T, T), (1, H, T, T)):
            raise ValueError(f"bias must have shape ({U}, {H}, {T}, {T}), got {tuple(bias.shape)}")
        c = codes[:, None, :]
        fused = self.fused
        if fused is None:  # the faster path here (see the module's docstring)
            learned_bias = bias is not None and bias.requires_grad
            fused = x.device.type == "cuda" or (T >= FUSED_MIN_TOKENS and not learned_bias)
        if not fused:
            w = self.attention_weights(x, codes, compat, bias)
            v = self._heads(self.value(x, c))
            mixed = torch.einsum("buhij,bujhc->buihc", w, v).flatten(-2)  # heads into channels
            return self.out(mixed, c)
        q, k, v = (self._heads(proj(x, c)) for proj in (self.query, self.key, self.value))
        C = compat.expand(B, U, T)[..., None, None].to(v.dtype)  # (B, U, T, 1, 1)
        zero = v.new_zeros(B, U, T, H, 1)  # a zero channel: q . k unchanged, one head width
        q, k = torch.cat([q, zero], -1), torch.cat([k, zero], -1)
        v = torch.cat([C * v, C.expand(B, U, T, H, 1)], -1)
        # (B, U, T, H, dh + 1) -> (B U, H, T, dh + 1): one attention per function stream and head
        q, k, v = (t.view(B * U, T, H, dh + 1).transpose(1, 2) for t in (q, k, v))
        if bias is not None:  # the fused CPU kernels take 4-d inputs: a (B U, H, T, T) mask
            bias = bias.expand(B, U, H, T, T).reshape(B * U, H, T, T)
        # NI eq. 7: [N_i, D_i] = sum_j softmax_j(q_i . k_j / sqrt(d_key) + b_ij) [C_j v_j, C_j]
        nd = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1 / math.sqrt(dh))
        nd = nd.transpose(1, 2).reshape(B, U, T, H, dh + 1)
        # sum_j W_ij v_j = C_i N_i / (eps + C_i D_i)
        mixed = C * nd[..., :dh] / (self.eps + C * nd[..., dh:])
        return self.out(mixed.flatten(-2), c)
