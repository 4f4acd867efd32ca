"""ModAttn: kernel-modulated, code-conditioned self-attention in parallel function streams (NI eqs. 6-8).

Each function ``u`` attends within its own stream with queries, keys and values from ModLins
programmed by its code ``c_u`` (NI eq. 6). The softmax weights are then multiplied by the
compatibilities of both tokens and renormalised over keys (NI eq. 7)::

    W~_uhij = C_ui C_uj softmax_j(q_uhi . k_uhj / sqrt(d_key))
    W_uhij  = W~_uhij / (eps + sum_j W~_uhij)

The renormalisation is a division, not a second softmax: ``exp(0) = 1`` would give every
blocked token weight again. A query token with ``C_ui = 0`` gets an all-zero row: the function
does not touch it.

The fused path never builds the ``(B, U, H, T, T)`` weights. With ``s_ij = softmax_j(A_ij)``,
``sum_j W_ij v_j = C_i N_i / (eps + C_i D_i)`` where ``N_i = sum_j s_ij C_j v_j`` and
``D_i = sum_j s_ij C_j``: one ``F.scaled_dot_product_attention`` over values ``[C_j v_j, C_j]``
gives both (queries and keys padded with zero channels, so all three share a head width and the
fused CPU / GPU kernels apply; on a GPU the width is rounded up to :data:`FUSED_ALIGN`). That is
NI eq. 7 exactly, ``eps`` included, with no ``log C``: exact zeros in ``C`` are ordinary
numbers. It also computes ``q``, ``k`` and ``v`` in one product (:meth:`ModAttn.project`) and
writes the mixed heads function-major, where the out ModLin reads them without a copy.
:meth:`ModAttn.attention_weights` keeps the readable NI eq. 7, and ``fused=False`` runs the
forward pass through the same lines (its ``q``, ``k`` and ``v`` from one product too).

Which path is faster depends on the number of tokens and on the machine: the fused kernel wins
on CUDA, and on a CPU from some number of tokens on (below it its per-head overhead dominates),
a crossover that moves with the CPU's matrix-product rate and with a learned ``bias`` (the
relative positions of chapter 6). ``fused=None`` (the default) therefore has both paths timed
at the first call of each shape, in another process, and keeps the faster
(:mod:`modnets.nn.autotune`, cached on the machine; :meth:`ModAttn.takes_fused` says which);
under ``torch.compile`` it takes NI eq. 7 as written, whose element-wise work Inductor fuses
itself. Both paths run on streams stored function-major
(:meth:`ModAttn.per_function`, what a LOC calls), where each function's rows are one block of
its products and no element-wise kernel between them reads or writes a transposed layout.
Chapter 12 measures all of it (``python -m bench
--only modattn_tokens ni_fused``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.nn import autotune
from modnets.nn.config import fused_attn
from modnets.nn.modulated import ModLin, functions_linear, streams_linear

__all__ = ["FUSED_ALIGN", "FUSED_MIN_TOKENS", "ModAttn", "check_streams"]

#: On a CPU, the path ``fused=None`` keeps unless a measurement at the shape finds the other
#: faster: fused from this many tokens on (where the two cross on the machine chapter 12 was
#: first measured on; a machine with faster matrix products moves the crossover).
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


#: Head widths the fused GPU kernels take: a multiple of 8 (memory-efficient attention rejects
#: others, and ``F.scaled_dot_product_attention`` would fall back to its math kernel, which keeps
#: the weights). The CPU kernels take any width, so there the head is ``dh + 1`` wide.
FUSED_ALIGN = {"cuda": 8}


def _fused_width(head_dim: int, device: torch.device) -> int:
    """The head width of the fused path: ``head_dim + 1`` (the channel of ``C``), rounded up to
    :data:`FUSED_ALIGN` on ``device``."""
    align = FUSED_ALIGN.get(device.type, 1)
    return -(-(head_dim + 1) // align) * align


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
            ``False``: through the lines of :meth:`attention_weights` (the readable NI eq. 7,
            the ``U B H T^2`` weights in memory); ``None`` (default): the library's switch
            (:func:`modnets.nn.config.set_fused_attn`), which by default takes whichever a
            measurement at the shape found faster here (:meth:`takes_fused`).

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
        qk_bias: bool = True,
    ):
        super().__init__()
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"num_heads must be positive and divide dim={dim}, got {num_heads}")
        self.dim, self.code_dim, self.num_heads = dim, code_dim, num_heads
        self.head_dim = dim // num_heads
        if fused not in (True, False, None):
            raise TypeError(f"fused must be True, False or None, got {fused!r}")
        self.eps, self._fused = eps, fused
        # qk_bias=False: the public code's query and key projections have none
        self.query = ModLin(dim, dim, code_dim, bias=qk_bias)
        self.key = ModLin(dim, dim, code_dim, bias=qk_bias)
        self.value = ModLin(dim, dim, code_dim)
        self.out = ModLin(dim, dim, code_dim)

    @property
    def fused(self) -> bool | None:
        """The path this ModAttn was built with (``None``: the library's switch decides)."""
        return self._fused

    def _stacked_weights(self, codes: Tensor, scale: float = 1.0) -> tuple[Tensor, Tensor]:
        """Each function's three ModLins ``W diag(m_u)`` (NI eq. 4) stacked into one ``(U, 3 d, d)``
        matrix, queries times ``scale``, and their biases ``(3 d,)``: ``x`` is read once and its
        gradient comes back from one product, not three."""
        c = codes[:, None, :]
        projs = (self.query, self.key, self.value)
        w = [p.stream_weight(p.modulation(c)) for p in projs]
        b = [p.bias if p.bias is not None else w[0].new_zeros(self.dim) for p in projs]
        w[0], b[0] = scale * w[0], scale * b[0]
        return torch.cat(w, 1), torch.cat(b)

    def project(self, x: Tensor, codes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused path's queries (already times ``1 / sqrt(d_key)``), keys and values, NI eq. 6,
        from one product (:meth:`_stacked_weights`). Returns three ``(B, U, H, T, d_head)``
        views."""
        qkv = streams_linear(x, *self._stacked_weights(codes, 1 / math.sqrt(self.head_dim)))
        qkv = qkv.unflatten(-1, (3, self.num_heads, self.head_dim))  # (B, U, T, 3, H, dh)
        return qkv.permute(3, 0, 1, 4, 2, 5).unbind(0)

    def _weights(self, q: Tensor, k: Tensor, C: Tensor, bias: Tensor | None) -> Tensor:
        """NI eq. 7 on function-major streams: q, k ``(U, B, T, H, dh)``, C ``(U, B, T)``,
        bias ``(U, H, T, T)`` or ``None``  ->  ``W`` ``(U, B, H, T, T)``."""
        logits = torch.einsum("ubihc,ubjhc->ubhij", q, k) / math.sqrt(self.head_dim)
        if bias is not None:
            logits = logits + bias[:, None]
        w = torch.softmax(logits, dim=-1)
        w = w * (C[:, :, None, :, None] * C[:, :, None, None, :])
        return w / (self.eps + w.sum(dim=-1, keepdim=True))

    def _per_function_eq7(
        self, x: Tensor, codes: Tensor, C: Tensor, bias: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The weights ``(U, B, H, T, T)`` and values ``(U, B, T, H, dh)`` of function-major
        streams x ``(U, B, T, d)``."""
        qkv = functions_linear(x, *self._stacked_weights(codes))
        q, k, v = qkv.unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(-3)
        return self._weights(q, k, C, bias), v

    def attention_weights(
        self, x: Tensor, codes: Tensor, compat: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        """The modulated weights ``W_uhij`` of NI eq. 7: shape ``(B, U, H, T, T)``; rows sum to ~1
        where ``C_ui > 0`` and are zero where ``C_ui = 0``."""
        codes, C = codes.expand(x.shape[1], -1), compat.expand(x.shape[:3]).transpose(0, 1)
        return self._per_function_eq7(x.transpose(0, 1), codes, C, bias)[0].transpose(0, 1)

    def forward(
        self, x: Tensor, codes: Tensor, compat: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        check_streams(x, codes, compat, self.dim, self.code_dim)
        C = compat.expand(x.shape[:3]).transpose(0, 1)
        return self.per_function(x.transpose(0, 1), codes, C, bias).transpose(0, 1)

    def per_function(
        self, x: Tensor, codes: Tensor, C: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        """``forward`` on streams stored function-major, as :class:`~modnets.nn.loc.LOC` keeps
        them: x ``(U, B, T, d)``, codes ``(U, d_code)``, C ``(U, B, T)``  ->  ``(U, B, T, d)``."""
        if x.dim() != 4 or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have shape (functions, batch, tokens, {self.dim}), got {tuple(x.shape)}"
            )
        U, B, T, _ = x.shape
        if codes.dim() != 2 or codes.shape[-1] != self.code_dim or codes.shape[0] not in (1, U):
            raise ValueError(
                f"codes must have shape ({U}, {self.code_dim}) (one code per function), "
                f"got {tuple(codes.shape)}"
            )
        if C.shape != (U, B, T):
            raise ValueError(f"C must have shape ({U}, {B}, {T}), got {tuple(C.shape)}")
        H = self.num_heads
        if bias is not None and bias.shape not in ((U, H, T, T), (1, H, T, T)):
            raise ValueError(f"bias must have shape ({U}, {H}, {T}, {T}), got {tuple(bias.shape)}")
        codes = codes.expand(U, -1)
        return self._path(self.takes_fused(x, codes, C, bias), x, codes, C, bias)

    def _path(self, fused: bool, x: Tensor, codes: Tensor, C: Tensor, bias: Tensor | None):
        if not fused:
            w, v = self._per_function_eq7(x, codes, C, bias)
            mixed = torch.einsum("ubhij,ubjhc->ubihc", w, v).flatten(-2)  # heads into channels
            return self.out.per_function(mixed, codes)
        return self._fused_attention(x.transpose(0, 1), codes, C.transpose(0, 1), bias)

    def takes_fused(self, x: Tensor, codes: Tensor, C: Tensor, bias: Tensor | None = None) -> bool:
        """Whether :meth:`per_function` takes the fused path for these function-major inputs:
        this ModAttn's ``fused``, else the library's switch, else the faster path here -- fused
        on CUDA, NI eq. 7 under ``torch.compile`` (Inductor fuses its element-wise work), and on
        a CPU whichever a measurement at this shape chose (:mod:`modnets.nn.autotune`, in
        another process; without one, fused from :data:`FUSED_MIN_TOKENS` tokens on)."""
        fused = fused_attn() if self._fused is None else self._fused
        if fused is not None:
            return fused
        if torch.compiler.is_compiling():
            return False
        if x.device.type == "cuda":
            return True
        U, B, T, d = x.shape
        shape = dict(U=U, B=B, T=T, dim=d, code_dim=self.code_dim, num_heads=self.num_heads)
        shape |= dict(qk_bias=self.query.bias is not None, bias=bias is not None)
        shape |= dict(dtype=str(x.dtype).removeprefix("torch."), grad=torch.is_grad_enabled())
        threads = torch.get_num_threads()
        key = "ModAttn " + " ".join(f"{k}={v}" for k, v in shape.items()) + f" threads={threads}"
        timing = autotune.Measurement("modnets.nn.modattn:time_paths", shape, threads)
        default = "fused" if T >= FUSED_MIN_TOKENS else "eq7"
        return autotune.choose(key, timing, ("fused", "eq7"), default) == "fused"

    def _fused_attention(
        self, x: Tensor, codes: Tensor, compat: Tensor, bias: Tensor | None
    ) -> Tensor:
        """NI eq. 7 through ``F.scaled_dot_product_attention`` (the module's docstring):
        x ``(B, U, T, d)``  ->  ``(U, B, T, d)``, function-major."""
        B, U, T, _ = x.shape
        H, dh = self.num_heads, self.head_dim
        q, k, v = self.project(x, codes)
        C = compat.expand(B, U, T)[:, :, None, :, None].to(v.dtype)  # (B, U, 1, T, 1)
        # (B, U H, T, w): each function's heads side by side, so that one attention over (B, U H)
        # sequences runs every stream and head, and a (U, H, T, T) bias is a mask broadcast over
        # the batch (no copy per example); zero channels: q . k unchanged, one head width
        # w >= dh + 1 for q, k and [C v, C]
        w = _fused_width(dh, x.device)
        zero = v.new_zeros(B, U, H, T, w - dh)
        q, k = (torch.cat([t, zero], -1).view(B, U * H, T, w) for t in (q, k))
        Cv = torch.cat([C * v, C.expand(B, U, H, T, 1), zero[..., 1:]], -1).view(B, U * H, T, w)
        if bias is not None:
            bias = bias.expand(U, H, T, T).reshape(1, U * H, T, T).expand(B, U * H, T, T)
        # NI eq. 7: [N_i, D_i] = sum_j softmax_j(q_i . k_j / sqrt(d_key) + b_ij) [C_j v_j, C_j]
        nd = F.scaled_dot_product_attention(q, k, Cv, attn_mask=bias, scale=1.0)
        nd = nd.unflatten(1, (U, H))
        # sum_j W_ij v_j = C_i N_i / (eps + C_i D_i): one (B, U, H, T, 1) factor times N_i
        mixed = nd[..., :dh] * (C / (self.eps + C * nd[..., dh : dh + 1]))
        # heads into channels, written function-major: the out ModLin reads it without a copy
        mixed = mixed.permute(1, 0, 3, 2, 4).reshape(U, B, T, self.dim)
        return self.out.per_function(mixed, codes)


def time_paths(
    U: int, B: int, T: int, dim: int, code_dim: int, num_heads: int, **case
) -> dict[str, float]:
    """Seconds of each path of a ModAttn at a shape (forward, and backward where ``grad``), on
    random inputs: what :meth:`ModAttn.takes_fused` has another process measure. ``case``:
    ``qk_bias``, ``bias`` (a learned one or none), ``dtype`` (a name) and ``grad``."""
    dtype, grad = getattr(torch, case["dtype"]), case["grad"]
    attn = ModAttn(dim, code_dim, num_heads, qk_bias=case["qk_bias"]).to(dtype)
    x, C = torch.randn(U, B, T, dim, dtype=dtype), torch.rand(U, B, T, dtype=dtype)
    codes = torch.randn(U, code_dim, dtype=dtype)
    bias = torch.randn(U, num_heads, T, T, dtype=dtype) if case["bias"] else None
    inputs = [t for t in (x, bias) if t is not None]
    for t in inputs:
        t.requires_grad_(grad)

    def run(fused: bool) -> None:
        with torch.set_grad_enabled(grad):
            out = attn._path(fused, x, codes, C, bias)
            if grad:
                torch.autograd.grad(out.float().sum(), [*inputs, *attn.parameters()])

    return autotune.fastest_calls({"fused": lambda: run(True), "eq7": lambda: run(False)})
