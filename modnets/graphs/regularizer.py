"""The graph-prior regulariser (NAC eq. 6): how far a circuit's link probabilities are from a
prior, under the relabelling that matches them best."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from modnets.graphs.matching import (
    DEFAULT_REFINE_STEPS,
    MATCHINGS,
    PriorMatcher,
    best_match,
    check_refine_steps,
    check_square,
    hungarian_permutation,
)

REDUCTIONS = ("eq6", "public")


class GraphPriorRegularizer(nn.Module):
    """``L = sum_{i != j} (P_ij - P0_{sigma(i) sigma(j)})^2`` (NAC eq. 6), ``sigma`` from
    :func:`match_permutation` (see there for the algorithm, its accuracy and its cost).

    The permutation is not differentiated; ``P`` is. The loss is computed on ``P`` in its
    canonical order, so relabelling the modules leaves it unchanged (bitwise, for ``P`` without
    exactly tied rows). What depends only on the prior is computed on the first call and kept.
    The priors of :func:`graphon` are symmetric; of a non-symmetric ``P`` or prior the search
    sees the symmetric part (exact for NAC eq. 6 when either matrix is symmetric).
    ``refine_steps`` bounds each stage of the search (default 10; 0 keeps only the first
    assignment and the class ordering). The search runs on the CPU, whatever ``P``'s device.

    ``matching="eq9"``: ``sigma`` is NAC eq. 9's one linear assignment
    (:func:`hungarian_permutation`), as the paper and the public code compute it; it depends on
    how the modules are numbered. ``reduction="public"``: the mean over all ``U^2`` pairs,
    diagonal included (the public code's ``F.mse_loss``), instead of NAC eq. 6's sum over
    ``i != j``.
    """

    def __init__(
        self,
        prior: Tensor,
        refine_steps: int = DEFAULT_REFINE_STEPS,
        matching: str = "search",
        reduction: str = "eq6",
    ):
        super().__init__()
        check_square("prior", prior)
        if not torch.isfinite(prior).all():
            raise ValueError("prior must be finite")
        if matching not in MATCHINGS:
            raise ValueError(f"matching must be one of {MATCHINGS}, got {matching!r}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.register_buffer("prior", prior.float())
        self.refine_steps = check_refine_steps(refine_steps)
        self.matching, self.reduction = matching, reduction
        self._matcher: PriorMatcher | None = None
        self._matcher_key = None

    def matcher(self) -> PriorMatcher:
        """The prior's precomputed structure; rebuilt only if the ``prior`` buffer changes."""
        key = (self.prior.data_ptr(), self.prior._version, self.prior.device)
        if key != self._matcher_key:
            self._matcher, self._matcher_key = PriorMatcher(self.prior), key
        return self._matcher

    def forward(self, P: Tensor) -> Tensor:
        if not isinstance(P, Tensor) or P.shape != self.prior.shape:
            shape = tuple(P.shape) if isinstance(P, Tensor) else type(P).__name__
            raise ValueError(f"P must have shape {tuple(self.prior.shape)}, got {shape}")
        if self.matching == "eq9":  # NAC eq. 9: module v -> prior node sigma[v]
            sigma = hungarian_permutation(P, self.prior).to(P.device)
            canonical = P
            target = self.prior.index_select(0, sigma).index_select(1, sigma)
        else:
            order, sigma_c = best_match(P, self.matcher(), self.refine_steps)
            order = torch.as_tensor(order, device=P.device)
            sigma_c = torch.as_tensor(sigma_c, device=P.device)
            # from here on P is seen in its canonical order, so the loss is bitwise the same under
            # any relabelling of the modules (for P without exactly tied rows)
            canonical = P.index_select(0, order).index_select(1, order)
            target = self.prior.index_select(0, sigma_c).index_select(1, sigma_c)
        residual = (canonical - target) ** 2
        if self.reduction == "public":
            return residual.mean()
        # NAC eq. 6
        return residual.sum() - residual.diagonal().sum()
