"""Type inference and type matching: how Neural Interpreters route set elements to functions.

Every set element ``x_i`` gets a *type* ``t_i``, a unit vector on the ``d_type``-dimensional
hypersphere, and every function ``u`` has a *signature* ``s_u`` on the same sphere. A function may
read an element only when the two are close (NI §2, NI eqs. 2-3)::

    d_ui  = 1 - s_u . t_i                      (cosine distance, in [0, 2])
    C~_ui = exp(-d_ui / sigma)  if d_ui < tau  else 0
    C_ui  = C~_ui / (eps + sum_u C~_ui)

Direction of the truncation: the extracted NI eq. 3 reads "if d > tau", but the prose ("if this
compatibility is larger than a threshold, f_u is permitted access") and the public code keep pairs
whose distance is *below* tau. We follow the prose and the code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["TypeInference", "TypeMatching", "random_signatures"]


def random_signatures(num: int, dim: int, generator: torch.Generator | None = None) -> Tensor:
    """``num`` unit vectors drawn uniformly on the sphere ``S^(dim-1)``: shape ``(num, dim)``."""
    return F.normalize(torch.randn(num, dim, generator=generator), dim=-1)


class TypeInference(nn.Module):
    """``t_i = TypeInference(x_i)`` (NI eq. 2): LayerNorm -> Linear -> GELU -> Linear -> L2-normalise.

    The public NI code uses this two-layer MLP; the paper says only "an MLP".

    Shapes: x ``(..., dim)`` -> types ``(..., type_dim)``, each of unit norm.
    """

    def __init__(self, dim: int, type_dim: int, hidden: int | None = None):
        super().__init__()
        hidden = dim if hidden is None else hidden
        self.net = nn.Sequential(
            nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, type_dim)
        )
        self.dim, self.type_dim = dim, type_dim

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.net(x), dim=-1)


class TypeMatching(nn.Module):
    """The truncated kernel between signatures and types, NI eqs. 2-3.

    Args:
        truncation: ``tau`` in ``(0, 2]``; a function sees an element only when ``d < tau``.
            ``tau = 2`` truncates nothing but exact antipodes.
        sigma: initial bandwidth (learnable, kept positive through its logarithm).
        eps: ``epsilon`` of the normalisation over functions.
        straight_through: forward uses the truncated kernel; the gradient flows through the
            untruncated one, so pairs just beyond ``tau`` still learn (an option of the public code).

    Shapes: types ``(B, T, d_type)``, signatures ``(U, d_type)`` -> ``C`` of shape ``(B, U, T)``.
    """

    def __init__(
        self,
        *,
        truncation: float = 1.0,
        sigma: float = 1.0,
        eps: float = 1e-6,
        straight_through: bool = False,
    ):
        super().__init__()
        if not 0.0 < float(truncation) <= 2.0:
            raise ValueError(f"truncation (tau) must lie in (0, 2], got {truncation}")
        if not float(sigma) > 0.0:
            raise ValueError(f"sigma must be positive, got {sigma}")
        if not float(eps) >= 0.0:
            raise ValueError(f"eps must be non-negative, got {eps}")
        self.truncation = float(truncation)
        self.eps = float(eps)
        self.straight_through = bool(straight_through)
        self.log_sigma = nn.Parameter(torch.tensor(float(sigma)).log())

    @property
    def sigma(self) -> Tensor:
        return self.log_sigma.exp()

    @staticmethod
    def distance(types: Tensor, signatures: Tensor) -> Tensor:
        """``d_T(s_u, t_i) = 1 - s_u . t_i``: shape ``(B, U, T)``."""
        return 1.0 - torch.einsum("ud,btd->but", signatures, types)

    def kernel(
        self, types: Tensor, signatures: Tensor, function_mask: Tensor | None = None
    ) -> Tensor:
        """The unnormalised, truncated kernel ``C~`` (NI eq. 3): shape ``(B, U, T)``, values in [0, 1].

        ``function_mask`` (``(U,)`` bool, True = active) zeroes masked functions, which is the same
        as removing them. With ``straight_through`` in training, its gradient is the untruncated
        kernel's.
        """
        full, truncated = self._kernels(types, signatures, function_mask)
        if self.straight_through and self.training:
            return full + (truncated - full).detach()
        return truncated

    def _kernels(
        self, types: Tensor, signatures: Tensor, function_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """``exp(-d / sigma)`` of every active pair, and the same truncated at ``tau``."""
        d = self.distance(types, signatures)
        full = torch.exp(-d / self.sigma)
        if function_mask is not None:
            full = full * function_mask.to(torch.bool)[None, :, None]
        return full, full * (d < self.truncation)

    def forward(
        self, types: Tensor, signatures: Tensor, function_mask: Tensor | None = None
    ) -> Tensor:
        """Compatibilities ``C`` (NI eq. 2): ``C~`` normalised over functions; ``sum_u C_ui <= 1``.

        With ``straight_through`` in training, the gradient is that of the *untruncated*
        compatibilities: the truncated ones' normaliser is 0 for an element every function
        truncates, and the gradient through it would be ``1 / eps`` times too large."""
        full, truncated = self._kernels(types, signatures, function_mask)
        # NI eq. 2
        C = truncated / (self.eps + truncated.sum(dim=1, keepdim=True))
        if self.straight_through and self.training:
            C_full = full / (self.eps + full.sum(dim=1, keepdim=True))
            C = C_full + (C - C_full).detach()
        return C

    def extra_repr(self) -> str:
        return (
            f"truncation={self.truncation}, sigma={self.sigma.item():.3g}, eps={self.eps}, "
            f"straight_through={self.straight_through}"
        )
