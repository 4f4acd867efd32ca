"""Stochastic Kernel Modulated Dot-Product Attention (NAC §2, NAC eqs. 2-3).

Modules communicate only where their *signatures* are close. The link probability of query module
``i`` and key module ``j`` is (NAC eq. 2)::

    P_ij = exp(-d(s_i, s_j) / epsilon),       d = 1 - cos(s_i, s_j)

As printed, NAC eq. 2 cannot become sparse: ``d <= 2`` gives ``P >= e^-2`` at ``epsilon = 1``, and
because ``U`` unit vectors cannot all point apart (``sum_ij cos_ij = |sum_i s_i|^2 >= 0``) the
mean off-diagonal ``P`` is at least ``exp(-(1 + 1/(U-1)))`` (~0.36, Jensen), whatever the
training. The public NAC code *truncates* the kernel -- ``P_ij = 0`` where ``d > 0.9`` -- and
learns ``epsilon``; this module does the same (``truncation=None`` gives NAC eq. 2 as printed). The
public code passes no gradient through a truncated pair (its straight-through flag acts on a
distance it sets to infinity); ``straight_through=True`` is our option: the forward value is the
truncated ``P`` (exact zeros), the gradient that of the untruncated ``P``.

In training, a kernel ``K_ij ~ Concrete(P_ij, tau)`` (a relaxed Bernoulli, reparameterised) is
sampled *per example*, as in the public code (``rsample(batch_size)``); a truncated pair
(``P_ij = 0``) stays exactly 0. The attention weights are (NAC eq. 3)::

    K^_ij = K_ij / (delta + sum_j K_ij)
    W_ij  = softmax_j(A_ij + log K^_ij),     A_ij = q_i . k_j / sqrt(d_head)

so ``K_ij ~ 0`` gives ``W_ij ~ 0``: the kernel is added to the logits in log space, as in the
public NAC code. In evaluation the kernel is deterministic by default (``K = P``, as the public code
does); ``eval_kernel="threshold"`` uses ``K = [P > 0.5]`` and ``"sample"`` keeps sampling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.probes import probe

__all__ = ["SKMDPA", "link_probabilities", "concrete_sample"]

EVAL_KERNELS = ("probs", "threshold", "sample")
_LOG_FLOOR = 1e-30  # log(0) would give -inf and NaN rows; exp(log 1e-30) is 0 for every purpose


def link_probabilities(
    sig_q: Tensor,
    sig_k: Tensor,
    bandwidth: float | Tensor,
    truncation: float | None = None,
    straight_through: bool = False,
) -> Tensor:
    """``P_ij = exp(-d_ij / epsilon)``, ``d_ij = 1 - cos(s_i, s_j)`` (NAC eq. 2): ``(..., Uq, Uk)``.

    ``truncation``: ``P_ij = 0`` where ``d_ij > truncation`` (the public code's 0.9; the
    threshold is on the distance, independent of ``epsilon``). ``straight_through``: the gradient
    of a truncated pair is that of the untruncated ``P`` (the forward value stays exactly 0).
    ``bandwidth`` may be a (learnable) scalar tensor.
    """
    cos = F.normalize(sig_q, dim=-1) @ F.normalize(sig_k, dim=-1).transpose(-1, -2)
    d = 1.0 - cos
    if isinstance(bandwidth, Tensor):  # a learned epsilon: kept positive
        bandwidth = bandwidth.clamp_min(1e-3)
    # NAC eq. 2
    P = torch.exp(-d / bandwidth)
    if truncation is None:
        return P
    truncated = P.masked_fill(d > truncation, 0.0)
    return P + (truncated - P).detach() if straight_through else truncated


def concrete_sample(
    probs: Tensor, temperature: float, eps: float = 1e-6, batch: int | None = None
) -> Tensor:
    """A reparameterised relaxed-Bernoulli (Concrete) sample with success probabilities ``probs``.

    ``sigmoid((logit(p) + log u - log(1 - u)) / tau)`` with ``u ~ U(0, 1)`` {cite}`maddison2017concrete`;
    uses the global RNG, so ``torch.manual_seed`` makes it reproducible. ``batch``: draw that many
    independent samples, ``(batch, *probs.shape)``. An exact ``p = 0`` (a truncated link) gives
    exactly 0.
    """
    p = probs.clamp(eps, 1 - eps)
    shape = p.shape if batch is None else (batch, *p.shape)
    u = torch.rand(shape, dtype=p.dtype, device=p.device).clamp(eps, 1 - eps)
    K = torch.sigmoid(
        (torch.log(p) - torch.log1p(-p) + torch.log(u) - torch.log1p(-u)) / temperature
    )
    return K.masked_fill(probs == 0, 0.0)


class SKMDPA(nn.Module):
    """Multi-head SKMDPA over already projected queries, keys and values (NAC eqs. 2-3).

    Args:
        num_heads: heads; the feature width must be divisible by it.
        bandwidth: ``epsilon`` of NAC eq. 2: a positive float, or a scalar tensor (e.g. a learnable
            parameter a NAC shares among all its attentions).
        temperature: ``tau`` of the Concrete distribution (NAC uses 0.5).
        delta: ``delta`` of NAC eq. 3.
        eval_kernel: ``"probs"`` (default), ``"threshold"`` or ``"sample"``.
        truncation: ``P = 0`` where the cosine distance exceeds it (``None``: NAC eq. 2 as printed).
        straight_through: the gradient of a truncated pair is the untruncated one.
        per_example: in training, one kernel sample per example (public code); ``False``: one
            per forward pass, shared by the batch.
        sample: in training, ``K ~ Concrete(P, tau)`` (NAC eq. 2); ``False``: ``K = P`` (the
            public code's Tiny-ImageNet run, whose kernel is truncated but never sampled).

    Shapes:
        q ``(B, Uq, d)``, k and v ``(B, Uk, d)``; signatures ``(Uq, d_sig)`` and ``(Uk, d_sig)``
        (or per sample ``(B, U, d_sig)``); optional ``key_mask`` ``(Uk,)`` bool (False = dropped
        module) and ``edge_mask`` ``(Uq, Uk)`` bool (False = dropped edge). Returns ``(B, Uq, d)``.
        Signatures ``None`` give a dense kernel (plain multi-head attention).
    """

    def __init__(
        self,
        *,
        num_heads: int = 1,
        bandwidth: float | Tensor = 1.0,
        temperature: float = 0.5,
        delta: float = 1e-6,
        eval_kernel: str = "probs",
        truncation: float | None = None,
        straight_through: bool = False,
        per_example: bool = True,
        sample: bool = True,
    ):
        super().__init__()
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if not isinstance(bandwidth, Tensor) and not bandwidth > 0:
            raise ValueError(f"bandwidth (epsilon) must be positive, got {bandwidth}")
        if not temperature > 0:
            raise ValueError(f"temperature (tau) must be positive, got {temperature}")
        if eval_kernel not in EVAL_KERNELS:
            raise ValueError(f"eval_kernel must be one of {EVAL_KERNELS}, got {eval_kernel!r}")
        if truncation is not None and not 0 < truncation <= 2:
            raise ValueError(f"truncation must be None or in (0, 2], got {truncation}")
        self.num_heads, self.bandwidth, self.temperature = num_heads, bandwidth, temperature
        self.delta, self.eval_kernel = delta, eval_kernel
        self.truncation, self.straight_through = truncation, straight_through
        self.per_example, self.sample = per_example, sample

    def extra_repr(self) -> str:
        bw = self.bandwidth
        bw = f"{bw.item():.3g} (tensor)" if isinstance(bw, Tensor) else bw
        return (
            f"num_heads={self.num_heads}, bandwidth={bw}, temperature={self.temperature}, "
            f"delta={self.delta}, eval_kernel={self.eval_kernel!r}, "
            f"truncation={self.truncation}, straight_through={self.straight_through}, "
            f"per_example={self.per_example}, sample={self.sample}"
        )

    def probabilities(self, sig_q: Tensor, sig_k: Tensor) -> Tensor:
        """``P`` of NAC eq. 2 with this attention's bandwidth and truncation."""
        return link_probabilities(
            sig_q, sig_k, self.bandwidth, self.truncation, self.straight_through
        )

    def kernel(self, probs: Tensor, batch: int | None = None) -> Tensor:
        """``K``: a Concrete sample in training (``batch`` samples, one per example, when
        ``probs`` is shared by the batch; ``P`` itself without ``sample``), else per
        ``eval_kernel``."""
        if self.training and not self.sample:
            return probs
        if self.training or self.eval_kernel == "sample":
            per_example = self.per_example and probs.dim() == 2
            return concrete_sample(probs, self.temperature, batch=batch if per_example else None)
        if self.eval_kernel == "threshold":
            return (probs > 0.5).to(probs.dtype)
        return probs

    def log_kernel(
        self, sig_q, sig_k, key_mask=None, edge_mask=None, shape=None, device=None, batch=None
    ) -> Tensor:
        """``log K^`` of NAC eq. 3: ``(..., Uq, Uk)`` (``(batch, Uq, Uk)`` when sampled per example).

        Without signatures (``sig_q = sig_k = None``) the kernel is dense, ``K = 1`` (of the given
        ``shape``): ``log K^`` is then constant along each row and the softmax is plain attention,
        which is how a NAC simulates Perceiver IO (NAC App. B.2).
        """
        if sig_q is None and sig_k is None:
            K = torch.ones(shape, device=device)
        elif sig_q is None or sig_k is None:
            raise ValueError("give both signatures (sig_q, sig_k) or neither (a dense kernel)")
        else:
            # in float32 even under autocast: a bf16 Concrete sample rounds 1 - 1e-6 to 1 and
            # its logit (and gradient) to infinity
            dt = torch.promote_types(sig_q.dtype, torch.float32)
            with torch.autocast(sig_q.device.type, enabled=False):
                K = self.kernel(self.probabilities(sig_q.to(dt), sig_k.to(dt)), batch)
        if key_mask is not None:
            K = K * key_mask.to(K.dtype)
        if edge_mask is not None:
            K = K * edge_mask.to(K.dtype)
        # NAC eq. 3: K^ = K / (delta + sum_j K_ij)
        K_hat = K / (self.delta + K.sum(-1, keepdim=True))
        # An exact zero (a masked module or edge, a truncated or thresholded kernel) is no link
        # at all: -inf, so it gets exactly zero weight; small positive K keep their (tiny) log.
        return torch.log(K_hat.clamp_min(_LOG_FLOOR)).masked_fill(K == 0, float("-inf"))

    def forward(self, q, k, v, sig_q, sig_k, key_mask=None, edge_mask=None) -> Tensor:
        B, Uq, d = q.shape
        if k.shape[:2] != v.shape[:2] or k.shape[-1] != d:
            raise ValueError(
                f"k {tuple(k.shape)} and v {tuple(v.shape)} must match q {tuple(q.shape)}"
            )
        if d % self.num_heads or v.shape[-1] % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide the feature widths")
        H = self.num_heads
        # explicit head widths, not -1: an empty batch has nothing to infer them from
        qh = q.view(B, Uq, H, d // H).transpose(1, 2)  # (B, H, Uq, dh)
        kh = k.view(B, k.shape[1], H, d // H).transpose(1, 2)
        vh = v.view(B, v.shape[1], H, v.shape[-1] // H).transpose(1, 2)
        log_k = self.log_kernel(
            sig_q, sig_k, key_mask, edge_mask, shape=(Uq, k.shape[1]), device=q.device, batch=B
        )
        log_k = log_k.to(qh.dtype)
        probe("skmdpa.log_kernel", log_k)
        if log_k.dim() == 3:  # per-sample signatures or per-example kernel samples
            log_k = log_k[:, None]
        # A query with no link at all reads nothing (a zero message), rather than a softmax over
        # -inf that would give NaN.
        dead = torch.isneginf(log_k).all(-1, keepdim=True)  # (no branch: no GPU sync)
        log_k = log_k.masked_fill(dead, 0.0)
        # softmax(A + log K^) V with A = q.k / sqrt(d_head): the kernel is an additive mask, so the
        # fused attention kernels apply (no (B, H, Uq, Uk) weights kept for backward on CPU/CUDA).
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=log_k)
        out = out.masked_fill(dead, 0.0)
        return out.transpose(1, 2).reshape(B, Uq, v.shape[-1])
