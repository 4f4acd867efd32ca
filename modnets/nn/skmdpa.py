"""Stochastic Kernel Modulated Dot-Product Attention (NAC §2, eqs. 2-3).

Modules communicate only where their *signatures* are close. The link probability of query module
``i`` and key module ``j`` is (eq. 2)::

    P_ij = exp(-d(s_i, s_j) / epsilon),       d = 1 - cos(s_i, s_j)

In training, a kernel ``K_ij ~ Concrete(P_ij, tau)`` (a relaxed Bernoulli, reparameterised) is
sampled; the attention weights are (eq. 3)::

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


def link_probabilities(sig_q: Tensor, sig_k: Tensor, bandwidth: float) -> Tensor:
    """``P_ij = exp(-(1 - cos(s_i, s_j)) / epsilon)`` (eq. 2): ``(..., Uq, Uk)`` in (0, 1]."""
    cos = F.normalize(sig_q, dim=-1) @ F.normalize(sig_k, dim=-1).transpose(-1, -2)
    return torch.exp(-(1.0 - cos) / bandwidth)


def concrete_sample(probs: Tensor, temperature: float, eps: float = 1e-6) -> Tensor:
    """A reparameterised relaxed-Bernoulli (Concrete) sample with success probabilities ``probs``.

    ``sigmoid((logit(p) + log u - log(1 - u)) / tau)`` with ``u ~ U(0, 1)`` {cite}`maddison2017concrete`;
    uses the global RNG, so ``torch.manual_seed`` makes it reproducible.
    """
    p = probs.clamp(eps, 1 - eps)
    u = torch.rand_like(p).clamp(eps, 1 - eps)
    return torch.sigmoid(
        (torch.log(p) - torch.log1p(-p) + torch.log(u) - torch.log1p(-u)) / temperature
    )


class SKMDPA(nn.Module):
    """Multi-head SKMDPA over already projected queries, keys and values (NAC eqs. 2-3).

    Args:
        num_heads: heads; the feature width must be divisible by it.
        bandwidth: ``epsilon`` of eq. 2 (a hyper-parameter).
        temperature: ``tau`` of the Concrete distribution (NAC uses 0.5).
        delta: ``delta`` of eq. 3.
        eval_kernel: ``"probs"`` (default), ``"threshold"`` or ``"sample"``.

    Shapes:
        q ``(B, Uq, d)``, k and v ``(B, Uk, d)``; signatures ``(Uq, d_sig)`` and ``(Uk, d_sig)``
        (or per sample ``(B, U, d_sig)``); optional ``key_mask`` ``(Uk,)`` bool (False = dropped
        module) and ``edge_mask`` ``(Uq, Uk)`` bool (False = dropped edge). Returns ``(B, Uq, d)``.
        Signatures ``None`` give a dense kernel (plain multi-head attention).
    """

    def __init__(
        self,
        num_heads: int = 1,
        bandwidth: float = 1.0,
        temperature: float = 0.5,
        delta: float = 1e-6,
        eval_kernel: str = "probs",
    ):
        super().__init__()
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if not bandwidth > 0:
            raise ValueError(f"bandwidth (epsilon) must be positive, got {bandwidth}")
        if not temperature > 0:
            raise ValueError(f"temperature (tau) must be positive, got {temperature}")
        if eval_kernel not in EVAL_KERNELS:
            raise ValueError(f"eval_kernel must be one of {EVAL_KERNELS}, got {eval_kernel!r}")
        self.num_heads, self.bandwidth, self.temperature = num_heads, bandwidth, temperature
        self.delta, self.eval_kernel = delta, eval_kernel

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, bandwidth={self.bandwidth}, "
            f"temperature={self.temperature}, delta={self.delta}, eval_kernel={self.eval_kernel!r}"
        )

    def kernel(self, probs: Tensor) -> Tensor:
        """``K``: a Concrete sample in training, else per ``eval_kernel``."""
        if self.training or self.eval_kernel == "sample":
            return concrete_sample(probs, self.temperature)
        if self.eval_kernel == "threshold":
            return (probs > 0.5).to(probs.dtype)
        return probs

    def log_kernel(
        self, sig_q, sig_k, key_mask=None, edge_mask=None, shape=None, device=None
    ) -> Tensor:
        """``log K^`` of eq. 3: ``(..., Uq, Uk)``.

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
                K = self.kernel(link_probabilities(sig_q.to(dt), sig_k.to(dt), self.bandwidth))
        if key_mask is not None:
            K = K * key_mask.to(K.dtype)
        if edge_mask is not None:
            K = K * edge_mask.to(K.dtype)
        K_hat = K / (self.delta + K.sum(-1, keepdim=True))
        # An exact zero (a masked module or edge, a thresholded kernel) is no link at all: -inf,
        # so it gets exactly zero weight; small positive K keep their (tiny) log.
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
        qh = q.view(B, Uq, H, -1).transpose(1, 2)  # (B, H, Uq, dh)
        kh = k.view(B, k.shape[1], H, -1).transpose(1, 2)
        vh = v.view(B, v.shape[1], H, -1).transpose(1, 2)
        log_k = self.log_kernel(
            sig_q, sig_k, key_mask, edge_mask, shape=(Uq, k.shape[1]), device=q.device
        )
        log_k = log_k.to(qh.dtype)
        probe("skmdpa.log_kernel", log_k)
        if log_k.dim() == 3:  # per-sample signatures
            log_k = log_k[:, None]
        # A query with no link at all reads nothing (a zero message), rather than a softmax over
        # -inf that would give NaN.
        dead = torch.isneginf(log_k).all(-1, keepdim=True)  # (no branch: no GPU sync)
        log_k = log_k.masked_fill(dead, 0.0)
        # softmax(A + log K^) V with A = q.k / sqrt(d_head): the kernel is an additive mask, so the
        # fused attention kernels apply (no (B, H, Uq, Uk) weights kept for backward on CPU/CUDA).
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=log_k)
        out = out.masked_fill(dead, 0.0)
        return out.transpose(1, 2).reshape(B, Uq, -1)
