"""Line of Code (LOC): ModAttn then ModMLP, with residuals weighted by compatibility (NI eqs. 9-10)."""

from __future__ import annotations

from torch import Tensor, nn

from modnets.nn.modattn import ModAttn, check_streams
from modnets.nn.modulated import ModMLP
from modnets.nn.relpos import RelativePosition2d

__all__ = ["LOC"]


class LOC(nn.Module):
    """One line of code, applied in every function stream in parallel (NI eqs. 9-10)::

        a_ui = x_ui + C_ui * ModAttn({LayerNorm(x_uj)}_j; c_u, {C_uj}_j)      (9)
        y_ui = a_ui + C_ui * ModMLP(LayerNorm(a_ui); c_u)                       (10)

    so ``y_ui = x_ui`` wherever ``C_ui = 0``: a function leaves alone what it may not read.
    The two LayerNorms are ordinary (affine) and shared by all functions.

    Args:
        dim, code_dim, num_heads: as in :class:`~modnets.nn.modattn.ModAttn`.
        mlp_hidden: hidden width of the ModMLP (default ``dim``).
        mlp_layers: ModLin layers in the ModMLP (NI eq. 5).
        eps: ``epsilon`` of the attention renormalisation.
        relative_grid: with ``G`` patches per side, the attention logits of the last ``G^2``
            tokens get this LOC's relative positions (:class:`~modnets.nn.relpos.RelativePosition2d`,
            NI §4.2); ``None``: no positional bias.

    Shapes: x ``(B, U, T, d)``, codes ``(U, d_code)``, compat ``(B, U, T)`` -> ``(B, U, T, d)``.
    """

    def __init__(
        self,
        dim: int,
        code_dim: int,
        *,
        num_heads: int = 4,
        mlp_hidden: int | None = None,
        mlp_layers: int = 2,
        eps: float = 1e-6,
        relative_grid: int | None = None,
        qk_bias: bool = True,
    ):
        super().__init__()
        self.dim, self.code_dim = dim, code_dim
        self.norm_attn = nn.LayerNorm(dim)
        self.attn = ModAttn(dim, code_dim, num_heads=num_heads, eps=eps, qk_bias=qk_bias)
        self.relpos = (
            None
            if relative_grid is None
            else RelativePosition2d(relative_grid, num_heads, code_dim)
        )
        self.norm_mlp = nn.LayerNorm(dim)
        self.mlp = ModMLP(dim, dim, code_dim, hidden_features=mlp_hidden, num_layers=mlp_layers)

    def forward(self, x: Tensor, codes: Tensor, compat: Tensor) -> Tensor:
        check_streams(x, codes, compat, self.dim, self.code_dim)
        B, U, T, _ = x.shape
        codes = codes.expand(U, -1)
        bias = None if self.relpos is None else self.relpos(codes, T)
        # computed function-major, (U, B, T, d): each function's rows are one block of its
        # products, so the element-wise work between them needs no transposed copies
        x, C = x.transpose(0, 1), compat.expand(B, U, T).transpose(0, 1).contiguous()
        gate = C[..., None]
        a = x + gate * self.attn.per_function(self.norm_attn(x), codes, C, bias)
        y = a + gate * self.mlp.per_function(self.norm_mlp(a), codes)
        return y.transpose(0, 1)
