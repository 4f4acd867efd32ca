"""Relative positional encoding of image patches: a learned bias on attention logits (NI §4.2).

NI §4.2 gives the patch tokens "a relative positional encoding" and no absolute positions. The
public NI code (after Cordonnier et al., 2020) adds to the attention logit of query patch ``i``
and key patch ``j``, for head ``h`` of function ``u``, a bias that depends only on their offset
on the ``G x G`` patch grid::

    b_uhij = R_h[row_j - row_i] + K_h[col_j - col_i] + F_uh          (patches i, j)
    b_uhij = 0                                                      (a CLS token on either side)

``R`` and ``K`` are learned tables over the ``2G - 1`` offsets of each axis and ``F_uh = W_f c_u``
is a linear map of function ``u``'s code (the public code's ``sep_sum`` mode with encodings not
shared between functions: each function has its own offset on patch-to-patch logits). The public
code factors each table through a ``d_key``-wide embedding; a table per head is the same family of
biases with fewer parameters. The patch tokens are the last ``G^2`` of the set, so any number of
CLS tokens may come first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["RelativePosition2d"]


class RelativePosition2d(nn.Module):
    """The bias ``b_uhij`` above, for every function, head and pair of tokens.

    Args:
        grid: ``G``, patches per side (``image_size // patch_size``).
        num_heads: ``H``.
        code_dim: ``d_code`` of the function codes.

    Shapes: codes ``(U, d_code)``, ``num_tokens`` ``T >= G^2`` -> bias ``(U, H, T, T)``.
    """

    def __init__(self, grid: int, num_heads: int, code_dim: int):
        super().__init__()
        if isinstance(grid, bool) or not isinstance(grid, int) or grid <= 0:
            raise ValueError(f"grid must be a positive int, got {grid!r}")
        self.grid, self.num_heads = grid, num_heads
        self.rows = nn.Parameter(0.02 * torch.randn(num_heads, 2 * grid - 1))
        self.cols = nn.Parameter(0.02 * torch.randn(num_heads, 2 * grid - 1))
        self.function = nn.Linear(code_dim, num_heads, bias=False)
        r, c = torch.arange(grid).repeat_interleave(grid), torch.arange(grid).repeat(grid)
        # offsets key - query, shifted to index the tables: (G^2, G^2) each
        self.register_buffer("row_offset", r[None, :] - r[:, None] + grid - 1, persistent=False)
        self.register_buffer("col_offset", c[None, :] - c[:, None] + grid - 1, persistent=False)

    def forward(self, codes: Tensor, num_tokens: int) -> Tensor:
        P = self.grid**2
        if num_tokens < P:
            raise ValueError(f"num_tokens must be at least grid^2 = {P}, got {num_tokens}")
        # NI §4.2 (public code): R_h[row_j - row_i] + K_h[col_j - col_i] + F_uh on patch pairs
        patches = self.rows[:, self.row_offset] + self.cols[:, self.col_offset]  # (H, P, P)
        patches = patches[None] + self.function(codes)[:, :, None, None]  # (U, H, P, P)
        return F.pad(patches, (num_tokens - P, 0, num_tokens - P, 0))  # CLS tokens first: 0

    def extra_repr(self) -> str:
        return f"grid={self.grid}, num_heads={self.num_heads}"
