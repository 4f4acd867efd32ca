"""Neural Function Modules (NFM §3): modules that pick their arguments from every earlier layer.

A feed-forward network hands each layer the output of the one before it. An NFM network instead
lets module ``i`` *attend* over everything computed so far -- every earlier module's output, in
this pass and in all earlier passes -- and read only a few of those states (its sparse
arguments). Running the network ``K`` times (Algorithm 1) lets the early modules of pass ``k``
read the late modules of pass ``k - 1``: top-down feedback. ::

    M := []                                            # memory: every state written so far
    for k = 1..K:                                      # passes
        h(0) := x
        for i = 1..N:                                  # modules
            R    := Attention_i(query = h(i-1), keys = values = rescale(M) + [0])
            h(i) := f_i(h(i-1) + gamma_i * R)          # gamma_i = 0 at initialisation
            M.append(h(i))

The pieces, each a function or class here:

* :func:`topk_softmax` -- the sparse ("top-k") softmax of SAB and RIMs: softmax weights, minus
  the (k+1)-th largest weight, clamped at 0, renormalised, so at most ``k`` weights survive.
* :func:`rescale` -- §3.2.2's type conversion between states of different spatial sizes:
  nearest-neighbour upsampling from smaller states, SpaceToDepth from larger ones, so that every
  position of the local window becomes its own attendable element.
* :class:`NFMAttention` -- §3.2.1's multi-head attention of one module, with the zero "default"
  key/value that lets a head read nothing, the output ``sigma(BN(A W_o1)) W_o2`` and ``gamma``.
* :class:`NFMNetwork` -- Algorithm 1 over ``N`` modules and ``K`` passes.
* :class:`ConvNet` -- NFM §4.2 / App. C's CNN (or a pre-activation ResNet), optionally with an
  NFM read after each block: the models of the stacked-MNIST experiment.

Choices where the paper is silent or ambiguous (each explained in chapter 11):

* states are channel-first, ``(batch, channels, *spatial)`` with any number of spatial dims;
  attention runs per position: each position of the query state is one query;
* ``key_dim`` and ``value_dim`` are the widths of *all* heads together (each head gets
  ``key_dim / num_heads``), as in ``torch.nn.MultiheadAttention``; scores are scaled by
  ``1/sqrt(per-head dim)`` as in the Transformer;
* the key and value of a state are computed by the module that wrote it (``W_k``, ``W_v`` of
  module ``j`` for ``h(j)``), once, before rescaling -- a position-wise linear map commutes with
  nearest upsampling and SpaceToDepth, so this equals projecting after rescaling;
* the memory holds the outputs of every earlier module of every pass so far (so with Algorithm
  1's placement the query ``h(i-1)`` itself, from step 2 on) but never the input ``x = h(0)``,
  which Algorithm 1 does not append; so module 1 of pass 1 reads only the default slot;
* Algorithm 1 reads *before* each module; "NFM after each block" (App. B) is the same memory
  with the read after each module, its query the module's output (``placement``);
* the default slot is one of the candidates of the top-k (the paper appends it "to the list of
  keys and values"), so with the default at most ``k`` weights are non-zero per row; a row whose
  ``k + 1`` largest weights tie (a zero query) reads only the default slot;
* no biases in the projections: a module whose heads all read the default slot adds exactly
  nothing to its input (without batch norm);
* per-pass parameters (``theta_k`` in Algorithm 1) start as copies of the first pass, so an NFM
  network with ``gamma = 0`` computes what the wrapped modules compute.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.probes import probe, trace
from modnets.utils import check_input, positive_int

__all__ = [
    "ACTIVATIONS",
    "topk_softmax",
    "TOPK_MODES",
    "space_to_depth",
    "depth_to_space",
    "rescale",
    "num_candidates",
    "NFMAttention",
    "NFMOutput",
    "NFMNetwork",
    "ConvNet",
    "PLACEMENTS",
    "PROJECTIONS",
]

ACTIVATIONS = ("relu", "gelu")
TOPK_MODES = ("sab", "exact")
BLOCKS = ("plain", "preact")
POOLS = ("flatten", "max", "mean")


def _tensor(value, name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


# ----------------------------------------------------------------------------- sparse attention


def topk_softmax(scores: Tensor, k: int, dim: int = -1, mode: str = "sab") -> Tensor:
    """The sparse softmax of SAB {cite}`ke2018sab` and RIMs {cite}`goyal2021rims` along ``dim``
    (the softmax of NFM eq. 1).

    ``mode="exact"`` keeps exactly ``k`` weights even on ties: the ``k`` largest of a stable sort
    (on equal weights, the lowest index first), renormalised, i.e. the softmax over those ``k``
    scores. ``mode="sab"`` (below) subtracts the (k+1)-th largest weight, so a k-th weight tied
    with the (k+1)-th is dropped too and fewer than ``k`` arguments survive.

    ``w = softmax(scores)``; ``w' = max(w - w_(k+1), 0)`` with ``w_(k+1)`` the (k+1)-th largest
    weight of the row; ``w' / sum(w')``. The ``k`` largest weights stay positive (ties aside) and
    the rest become 0; with ``k`` or fewer candidates it is the plain softmax. (SAB's code adds 1
    to ``k`` before taking the threshold for the same reason: subtracting the k-th largest would
    leave only ``k - 1``.) A row whose ``k + 1`` largest weights all tie -- e.g. a zero query,
    where every score is 0 -- has nothing that stands out; it puts its whole weight on its first
    largest element (in :class:`NFMAttention`, the default slot), so every row sums to 1.

    Shapes: any; ``scores.shape[dim]`` candidates per row.
    """
    positive_int(k, "k")
    if mode not in TOPK_MODES:
        raise ValueError(f"mode must be one of {TOPK_MODES}, got {mode!r}")
    w = torch.softmax(scores, dim=dim)
    if scores.shape[dim] <= k:
        return w
    if mode == "exact":
        # the k largest, ties to the lowest index (what a stable sort keeps), renormalised:
        # everything above the k-th largest weight, then the first of those equal to it
        kth = w.topk(k, dim=dim).values.narrow(dim, k - 1, 1)
        above, tied = w > kth, w == kth
        room = k - above.sum(dim, keepdim=True)
        kept = w * (above | (tied & (tied.cumsum(dim) <= room)))
        return kept / kept.sum(dim, keepdim=True)
    threshold = w.topk(k + 1, dim=dim).values.narrow(dim, k, 1)  # the (k+1)-th largest
    sparse = (w - threshold).clamp_min(0)
    total = sparse.sum(dim, keepdim=True)
    tied = total <= 0
    out = sparse / torch.where(tied, torch.ones_like(total), total)
    if tied.any():  # rare: only then build the fallback
        first = F.one_hot(w.argmax(dim), w.shape[dim]).to(w.dtype).movedim(-1, dim)
        out = torch.where(tied, first, out)
    return out


# ----------------------------------------------------------------------------- rescaling (§3.2.2)


def space_to_depth(x: Tensor, factors: Sequence[int]) -> Tensor:
    """Every ``f_1 x f_2 x ...`` window becomes ``prod(f)`` candidates at one coarse position.

    ``(B, C, s_1 f_1, s_2 f_2, ...)`` -> ``(B, prod(f), C, s_1, s_2, ...)``; the candidate index
    runs over the window row-major (the order of ``F.pixel_unshuffle``). A permutation of the
    entries: :func:`depth_to_space` inverts it.
    """
    B, C, *size = x.shape
    if len(factors) != len(size):
        raise ValueError(f"factors {tuple(factors)} must give one factor per spatial dim {size}")
    if any(s % f for s, f in zip(size, factors, strict=True)):
        raise ValueError(f"size {tuple(size)} must be divisible by the factors {tuple(factors)}")
    small = [s // f for s, f in zip(size, factors, strict=True)]
    n = len(size)
    split = [d for pair in zip(small, factors, strict=True) for d in pair]  # s_1, f_1, s_2, f_2
    x = x.reshape(B, C, *split)
    # (B, C, s_1, f_1, s_2, f_2, ...) -> (B, f_1, f_2, ..., C, s_1, s_2, ...)
    order = [0, *(3 + 2 * a for a in range(n)), 1, *(2 + 2 * a for a in range(n))]
    return x.permute(order).reshape(B, math.prod(factors), C, *small)


def depth_to_space(x: Tensor, factors: Sequence[int]) -> Tensor:
    """The inverse of :func:`space_to_depth`: ``(B, prod(f), C, *small)`` -> ``(B, C, *large)``."""
    B, S, C, *small = x.shape
    if len(factors) != len(small) or math.prod(factors) != S:
        raise ValueError(f"factors {tuple(factors)} do not match {S} candidates of size {small}")
    n = len(small)
    x = x.reshape(B, *factors, C, *small)
    # (B, f_1, .., f_n, C, s_1, .., s_n) -> (B, C, s_1, f_1, s_2, f_2, ...)
    order = [0, n + 1, *(i for a in range(n) for i in (n + 2 + a, 1 + a))]
    return x.permute(order).reshape(B, C, *(s * f for s, f in zip(small, factors, strict=True)))


def _factors(src: Sequence[int], dst: Sequence[int]) -> tuple[int, ...]:
    out = []
    for s, d in zip(src, dst, strict=True):
        if s > d and s % d:
            raise ValueError(
                f"a state of size {tuple(src)} cannot be read at size {tuple(dst)}: SpaceToDepth "
                f"needs each larger size to be a multiple of the smaller ({s} vs {d})"
            )
        out.append(s // d if s > d else 1)
    return tuple(out)


def num_candidates(src: Sequence[int], dst: Sequence[int]) -> int:
    """Attendable elements per query position when a state of spatial size ``src`` is read at
    size ``dst``: 1 if it is as small or smaller, ``prod(src / dst)`` over the larger dims."""
    if len(src) != len(dst):
        raise ValueError(f"sizes {tuple(src)} and {tuple(dst)} have different numbers of dims")
    return math.prod(_factors(src, dst))


def rescale(state: Tensor, size: Sequence[int]) -> Tensor:
    """A state read at spatial size ``size`` (NFM §3.2.2), per spatial dim:

    * the same size: unchanged;
    * smaller: nearest-neighbour upsampling (``F.interpolate(mode="nearest")``);
    * larger: SpaceToDepth, each position of the ``src / dst`` window its own candidate.

    Shapes: ``(B, C, *src)`` -> ``(B, S, C, *size)`` with ``S = num_candidates(src, size)``.
    """
    B, C, *src = state.shape
    size = tuple(int(s) for s in size)
    if len(src) != len(size):
        raise ValueError(
            f"state of spatial size {tuple(src)} cannot be read at size {size}: "
            "every state of an NFM network needs the same number of spatial dims"
        )
    factors = _factors(src, size)
    grown = tuple(max(s, d) for s, d in zip(src, size, strict=True))
    if grown != tuple(src):
        state = F.interpolate(state, size=grown, mode="nearest")
    return space_to_depth(state, factors)


# ----------------------------------------------------------------------------- attention (§3.2.1)


class NFMAttention(nn.Module):
    """The attention of one NFM module (NFM §3.2.1).

    Queries, keys and values are linear maps (one per module): ``Q = h W_q`` of the state the
    module reads with, ``K = M W_k`` and ``V = M W_v`` of the state the module *writes* (its
    output, computed once by :meth:`write` and stored in the memory). Per position of the query
    state and per head::

        A  = topk_softmax([0, Q K^T / sqrt(d_head)], k) [0, V]     # NFM eq. 1; 0: the default
        h1 = sigma(BN(A W_o1)) W_o2                                # NFM eq. 2; BN optional
        h2 = h + gamma * h1                                        # NFM eq. 3; gamma = 0 at init

    The NFM paper prints these three formulas of §3.2.1 unnumbered; the book numbers them 1-3
    (``book/equations.md``). NFM eq. 3's residual ``R`` is the state ``h`` the module reads with.

    The default slot is a zero key and value in front of the candidates: its score is 0 and it
    contributes nothing, so a head that puts its weight there reads nothing.

    Args:
        dim: channels of the state that queries (and of the output).
        memory_dim: channels of the state this module writes (default ``dim``).
        key_dim, value_dim: widths of all heads together (``d_k``, ``d_v``).
        num_heads: heads; must divide ``key_dim`` and ``value_dim``.
        top_k: ``k`` of the top-k softmax.
        hidden_dim: width of ``W_o1`` (default ``value_dim``).
        batch_norm: batch norm before ``sigma``.
        activation: ``sigma``, ``"relu"`` (the paper's) or ``"gelu"``.
        topk_mode: :func:`topk_softmax`'s ``mode``: ``"sab"`` (SAB's formula) or ``"exact"``.
        source_dims: channels of each module's state; when given, this module projects every
            state it reads with its own ``W_k``, ``W_v`` for the module that wrote it
            (:meth:`project`, §3.2.1), instead of reading the writer's (:meth:`write`).

    Shapes: state ``(B, dim, *size)``; memory a list of ``(keys, values)`` from :meth:`write`,
    ``(B, key_dim, *size_j)`` and ``(B, value_dim, *size_j)`` with the same number of spatial
    dims. Returns ``(B, dim, *size)`` (and the weights ``(B, heads, prod(size), 1 + S)`` with
    ``return_weights``; column 0 is the default slot, then each entry's candidates in order).
    """

    def __init__(self, dim: int, memory_dim: int | None = None, key_dim: int = 16,
                 value_dim: int = 16, num_heads: int = 4, top_k: int = 5,
                 hidden_dim: int | None = None, batch_norm: bool = False,
                 activation: str = "relu", topk_mode: str = "sab",
                 source_dims: Sequence[int] | None = None):  # fmt: skip
        super().__init__()
        memory_dim = dim if memory_dim is None else memory_dim
        hidden_dim = value_dim if hidden_dim is None else hidden_dim
        for name, v in (("dim", dim), ("memory_dim", memory_dim), ("key_dim", key_dim),
                        ("value_dim", value_dim), ("num_heads", num_heads), ("top_k", top_k),
                        ("hidden_dim", hidden_dim)):  # fmt: skip
            positive_int(v, name)
        for name, v in (("key_dim", key_dim), ("value_dim", value_dim)):
            if v % num_heads:
                raise ValueError(f"{name}={v} must be divisible by num_heads={num_heads}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if not isinstance(batch_norm, bool):
            raise TypeError(f"batch_norm must be a bool, got {type(batch_norm).__name__}")
        if topk_mode not in TOPK_MODES:
            raise ValueError(f"topk_mode must be one of {TOPK_MODES}, got {topk_mode!r}")
        self.topk_mode = topk_mode
        self.dim, self.memory_dim, self.hidden_dim = dim, memory_dim, hidden_dim
        self.key_dim, self.value_dim = key_dim, value_dim
        self.num_heads, self.top_k = num_heads, top_k
        # No biases: with them the default slot's zero key and value would not stay zero, and a
        # module that reads nothing would still add something to its input.
        self.query = nn.Linear(dim, key_dim, bias=False)
        # the writer's projections of the state this module writes (unused, so absent, when
        # readers project: source_dims)
        self.key = nn.Linear(memory_dim, key_dim, bias=False) if source_dims is None else None
        self.value = nn.Linear(memory_dim, value_dim, bias=False) if source_dims is None else None
        self.out1 = nn.Linear(value_dim, hidden_dim, bias=False)
        self.norm = nn.BatchNorm1d(hidden_dim) if batch_norm else None
        self.act = nn.ReLU() if activation == "relu" else nn.GELU()
        self.out2 = nn.Linear(hidden_dim, dim, bias=False)
        self.gamma = nn.Parameter(torch.zeros(()))  # SAGAN's gate: NFM starts as the identity
        # NFM §3.2.1 read literally: the *reading* module's own W_k, W_v, one pair per source
        # (sources differ in channels); see :meth:`project`
        self.source_keys = self.source_values = None
        if source_dims is not None:
            source_dims = [positive_int(c, "source_dims") for c in source_dims]
            self.source_keys = nn.ModuleList(nn.Linear(c, key_dim, bias=False) for c in source_dims)
            self.source_values = nn.ModuleList(
                nn.Linear(c, value_dim, bias=False) for c in source_dims
            )

    @staticmethod
    def _linear(layer: nn.Linear, x: Tensor) -> Tensor:
        """A position-wise linear map of a channel-first ``(B, C, *size)`` tensor."""
        B, C, *size = x.shape
        n = math.prod(size)  # not -1: an empty batch has nothing to infer it from
        return torch.matmul(layer.weight, x.reshape(B, C, n)).reshape(B, layer.out_features, *size)

    def write(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """Key and value of a state this module wrote: ``(B, key_dim, *size)``,
        ``(B, value_dim, *size)``. Projected before rescaling, once per state."""
        if self.key is None:
            raise ValueError("write is for writer-side projections; with source_dims use project")
        if _tensor(state, "state").dim() < 2 or state.shape[1] != self.memory_dim:
            raise ValueError(
                f"state must be (batch, memory_dim={self.memory_dim}, *size), got {tuple(state.shape)}"
            )
        return self._linear(self.key, state), self._linear(self.value, state)

    def project(self, source: int, state: Tensor) -> tuple[Tensor, Tensor]:
        """Key and value of a state written by module ``source``, through *this* (reading)
        module's projections for that source (needs ``source_dims``)."""
        if self.source_keys is None:
            raise ValueError("project needs source_dims: this module reads with the writers' keys")
        if not 0 <= source < len(self.source_keys):
            raise ValueError(f"source must be in [0, {len(self.source_keys)}), got {source}")
        return (self._linear(self.source_keys[source], state),
                self._linear(self.source_values[source], state))  # fmt: skip

    def _attend(
        self, state: Tensor, memory: Sequence[tuple[Tensor, Tensor]]
    ) -> tuple[Tensor, Tensor]:
        """``A`` ``(B, value_dim, T)`` and the weights ``(B, 1 + S, H, T)``."""
        B, _, *size = state.shape
        for keys, values in memory:
            if keys.shape[:2] != (B, self.key_dim) or values.shape[:2] != (B, self.value_dim):
                raise ValueError(
                    f"memory entries must be (keys (batch={B}, key_dim={self.key_dim}, ...), "
                    f"values (batch, value_dim={self.value_dim}, ...)), got "
                    f"{tuple(keys.shape)} and {tuple(values.shape)}"
                )
        T, H = math.prod(size), self.num_heads
        dk, dv = self.key_dim // H, self.value_dim // H
        q = self._linear(self.query, state).reshape(B, 1, H, dk, T) / math.sqrt(dk)
        # every state at the query's size, (B, S, H, d_head, T): candidates outermost and
        # positions innermost, so the products below run over long contiguous rows
        if memory:
            keys = torch.cat([rescale(k, size) for k, _ in memory], 1)
            values = torch.cat([rescale(v, size) for _, v in memory], 1)
        else:  # only the default slot
            keys = state.new_zeros(B, 0, self.key_dim, *size)
            values = state.new_zeros(B, 0, self.value_dim, *size)
        S = keys.shape[1]
        keys, values = keys.reshape(B, S, H, dk, T), values.reshape(B, S, H, dv, T)
        # a product-and-sum over d_head: short contractions beat many tiny matmuls
        scores = (q * keys).sum(3)  # (B, S, H, T)
        default = scores.new_zeros(B, 1, H, T)  # the default slot: q . 0 = 0
        w = topk_softmax(
            torch.cat([default, scores], 1), self.top_k, 1, self.topk_mode
        )  # (B, 1+S, H, T)
        # the default slot's value is 0: only the real candidates contribute
        A = (w[:, 1:, :, None] * values).sum(1)  # (B, H, dv, T)
        return A.reshape(B, self.value_dim, T), w

    def forward(self, state: Tensor, memory: Sequence[tuple[Tensor, Tensor]] = (),
                return_weights: bool = False):  # fmt: skip
        if _tensor(state, "state").dim() < 2 or state.shape[1] != self.dim:
            raise ValueError(
                f"state must be (batch, dim={self.dim}, *size), got {tuple(state.shape)}"
            )
        if not memory and self.norm is None:
            # only the default slot: A = 0, so h1 = sigma(0) W_o2 = 0 and the state passes through
            B, T = state.shape[0], math.prod(state.shape[2:])
            w = state.new_ones(B, self.num_heads, T, 1)
            return (state, w) if return_weights else state
        A, w = self._attend(state, memory)
        w = w.permute(0, 2, 3, 1)  # (B, H, T, 1 + S)
        probe("nfm.read_weights", w)
        h1 = torch.matmul(self.out1.weight, A)  # (B, hidden, T)
        if self.norm is not None:
            h1 = self.norm(h1)
        h1 = torch.matmul(self.out2.weight, self.act(h1)).reshape(state.shape)
        out = state + self.gamma * h1
        return (out, w) if return_weights else out


# ----------------------------------------------------------------------------- Algorithm 1


@dataclass
class NFMOutput:
    """What :meth:`NFMNetwork.forward` returns with ``return_details=True``.

    Attributes:
        output: ``h(N)`` of the last pass.
        states: ``states[k][i]`` is ``h(i+1)`` of pass ``k + 1`` (0-based indices), as written
            to the memory (detached: recorded by the ``"nfm.state"`` probe).
        sources: per read (pass-major), how many memory states were attendable.
        candidates: per read, attendable elements per query position (without the default).
        reads: ``(K N, 1 + K N)``: per read (row), the mean attention weight on the default slot
            (column 0) and on each memory state (column ``1 + k N + i`` for ``h(i+1)`` of pass
            ``k + 1``), summed over a state's candidates and averaged over batch, heads and
            positions; 0 where a state was not yet written.
    """

    output: Tensor
    states: list[list[Tensor]]
    sources: list[int]
    candidates: list[int]
    reads: Tensor


PLACEMENTS = ("before", "after")
#: Whose W_k, W_v project a state for a read: the module that wrote it (computed once), or the
#: module that reads it (NFM §3.2.1: one pair per reader and source).
PROJECTIONS = ("writer", "reader")


class NFMNetwork(nn.Module):
    """Algorithm 1 of NFM: ``N`` modules run for ``K`` passes, each reading the memory.

    ``placement="before"`` is Algorithm 1 as printed: module ``i`` first reads with ``h(i-1)`` as
    the query, then computes ``h(i) = f_i(h(i-1) + gamma R)`` and writes it to the memory.
    ``"after"`` reads after the module instead -- "NFM after each block" (NFM App. B): with
    ``b = f_i(h(i-1))`` as the query, ``h(i) = b + gamma R``, and ``h(i)`` is written. Either
    way the memory at module ``i`` of pass ``k`` holds ``(k - 1) N + (i - 1)`` states: the
    outputs of every earlier module of every pass so far (``x`` is never written), so module 1
    of pass 1 has nothing to read but the default slot.

    Args:
        blocks: the modules ``f_1 .. f_N``; ``f_i`` maps ``(B, dims[i-1], *size)`` to
            ``(B, dims[i], *size')`` (any spatial sizes, same number of spatial dims).
        dims: channels ``(C_0, .., C_N)`` of ``h(0) = x`` and of each module's output.
        passes: ``K``.
        placement: ``"before"`` (Algorithm 1) or ``"after"`` each module.
        share_blocks: one set of module parameters for every pass; otherwise ``theta_k`` per
            pass (Algorithm 1), each pass starting as a copy of ``blocks``.
        share_attention: likewise for the attention parameters (new ones are initialised
            independently, all with ``gamma = 0``).
        projections: ``"writer"``: a state's key and value come from the module that wrote it,
            computed once; ``"reader"``: each reading module projects each state with its own
            ``W_k``, ``W_v`` for the state's writer (NFM §3.2.1), at every read.
        **attention: :class:`NFMAttention` arguments (``key_dim``, ``value_dim``, ``num_heads``,
            ``top_k``, ``hidden_dim``, ``batch_norm``, ``activation``).

    Shapes: ``x`` ``(B, C_0, *size)`` -> ``h(N)`` of the last pass.
    """

    def __init__(self, blocks: Sequence[nn.Module], dims: Sequence[int], passes: int = 2,
                 placement: str = "before", share_blocks: bool = False,
                 share_attention: bool = False, projections: str = "writer",
                 **attention):  # fmt: skip
        super().__init__()
        blocks = list(blocks)
        if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
            raise ValueError("blocks must be a non-empty sequence of nn.Module")
        dims = tuple(dims)
        if len(dims) != len(blocks) + 1:
            raise ValueError(
                f"dims must give C_0 and each block's output channels ({len(blocks) + 1} ints), "
                f"got {len(dims)}"
            )
        for d in dims:
            positive_int(d, "dims")
        positive_int(passes, "passes")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        unknown = set(attention) - {"key_dim", "value_dim", "num_heads", "top_k", "hidden_dim",
                                    "batch_norm", "activation", "topk_mode"}  # fmt: skip
        if unknown:
            raise ValueError(f"unknown NFMAttention arguments {sorted(unknown)}")
        if projections not in PROJECTIONS:
            raise ValueError(f"projections must be one of {PROJECTIONS}, got {projections!r}")
        self.projections = projections
        self.num_blocks, self.passes, self.dims = len(blocks), passes, dims
        self.placement = placement
        self.share_blocks, self.share_attention = share_blocks, share_attention
        n_block_sets = 1 if share_blocks else passes
        self.blocks = nn.ModuleList(
            [
                nn.ModuleList(blocks if p == 0 else copy.deepcopy(blocks))
                for p in range(n_block_sets)
            ]
        )
        # module i reads with h(i-1) ("before") or f_i(h(i-1)) ("after") and writes h(i)
        query_dims = dims[:-1] if placement == "before" else dims[1:]
        n_attn_sets = 1 if share_attention else passes
        sources = list(dims[1:]) if projections == "reader" else None
        self.attention = nn.ModuleList(
            nn.ModuleList(
                NFMAttention(query_dims[i], dims[i + 1], source_dims=sources, **attention)
                for i in range(len(blocks))
            )
            for _ in range(n_attn_sets)
        )

    def block(self, k: int, i: int) -> nn.Module:
        """``f_i`` of pass ``k`` (0-based)."""
        return self.blocks[0 if self.share_blocks else k][i]

    def attn(self, k: int, i: int) -> NFMAttention:
        """``Attention_i`` of pass ``k`` (0-based)."""
        return self.attention[0 if self.share_attention else k][i]

    def gammas(self) -> list[float]:
        """``gamma`` of every read, pass-major (``K N`` values; with shared attention each pass
        repeats the same ``N``): how far each module's reads have opened."""
        return [self.attn(k, i).gamma.item() for k in range(self.passes)
                for i in range(self.num_blocks)]  # fmt: skip

    def memory_sizes(self, passes: int | None = None) -> list[int]:
        """How many memory states each read can attend to (default slot aside), in order:
        ``(k - 1) N + (i - 1)`` at module ``i`` of pass ``k``."""
        K = self.passes if passes is None else passes
        return [k * self.num_blocks + i for k in range(K) for i in range(self.num_blocks)]

    def forward(self, x: Tensor, return_details: bool = False, passes: int | None = None):
        """NFM Algorithm 1 on feature maps ``x`` ``(B, dims[0], *size)``: the last block's
        output; with ``return_details`` an :class:`NFMOutput` with every read's weights and
        state. ``passes``: fewer (or, with shared parameters, more) passes than configured."""
        K = self.passes if passes is None else positive_int(passes, "passes")
        if K > self.passes and not (self.share_blocks and self.share_attention):
            raise ValueError(f"passes={K} exceeds the {self.passes} passes with parameters")
        if check_input(x, self).dim() < 2 or x.shape[1] != self.dims[0]:
            raise ValueError(f"x must be (batch, {self.dims[0]}, *size), got {tuple(x.shape)}")
        if not return_details:
            return self.algorithm_1(x, K)
        with trace("nfm.read_weights", "nfm.state") as t:  # the probes below, nothing else
            h = self.algorithm_1(x, K)
        return self._details(x, h, t, K)

    def algorithm_1(self, x: Tensor, K: int) -> Tensor:
        """NFM Algorithm 1, line by line; ``forward`` validates and calls it."""
        N = self.num_blocks
        memory: list[tuple] = []  # line 2: M (key and value per state, or (state, writer))
        for k in range(K):  # line 3
            h = x  # line 4: every pass starts again from the input
            for i in range(N):  # line 5
                attn = self.attn(k, i)
                if self.placement == "before":  # lines 6-10: R = Attention(K=M, V=M, Q=h(i-1))
                    h = attn(h, self._keys_values(attn, memory))  # NFM eqs. 1-3 with Q = h(i-1)
                h = self.block(k, i)(h)  # line 11: h(i) = f_i(residual = h(i-1), input = R)
                if h.dim() < 2 or h.shape[1] != self.dims[i + 1]:
                    raise ValueError(
                        f"block {i + 1} returned {tuple(h.shape)}; dims says {self.dims[i + 1]} channels"
                    )
                if self.placement == "after":  # NFM App. B: read after the module instead
                    h = attn(h, self._keys_values(attn, memory))
                probe("nfm.state", h)
                if k < K - 1 or i < N - 1:  # line 12: M.append(h(i)) (no one reads the last)
                    memory.append(attn.write(h) if self.projections == "writer" else (h, i))
        return h

    def _keys_values(self, attn: NFMAttention, memory: list[tuple]) -> list[tuple]:
        """The memory as ``attn`` reads it: the writers' keys and values, or its own projections
        of each state (``projections="reader"``)."""
        return memory if self.projections == "writer" else [attn.project(j, s) for s, j in memory]

    def _details(self, x: Tensor, h: Tensor, t, K: int) -> NFMOutput:
        """:class:`NFMOutput` from what the probes recorded during one :meth:`algorithm_1`."""
        N = self.num_blocks
        flat, weights = t["nfm.state"], t.get("nfm.read_weights", [])
        if len(weights) < K * N:  # the first read found the memory empty and passed h through
            weights = [None, *weights]
        sizes = [tuple(s.shape[2:]) for s in flat]
        sources, candidates, reads = [], [], []
        for r, w in enumerate(weights):  # read r: module r % N of pass r // N
            if w is None:  # all its weight on the default slot
                reads.append(torch.eye(1 + K * N, device=h.device)[0])
                sources.append(0)
                candidates.append(0)
                continue
            if self.placement == "after":
                query = sizes[r]
            else:
                query = tuple(x.shape[2:]) if r % N == 0 else sizes[r - 1]
            counts = [num_candidates(s, query) for s in sizes[:r]]
            # weight on each source: the default, then each state's candidates summed
            per_source = torch.stack([c.sum(-1) for c in w.split([1, *counts], -1)], -1)
            row = torch.zeros(1 + K * N, device=w.device)
            row[: 1 + r] = per_source.float().mean((0, 1, 2))
            reads.append(row)
            sources.append(r)
            candidates.append(sum(counts))
        states = [flat[k * N : (k + 1) * N] for k in range(K)]
        return NFMOutput(h, states, sources, candidates, torch.stack(reads))


# ----------------------------------------------------------------------------- the CNN (App. C)


class _PlainBlock(nn.Sequential):
    """App. C's CNN stage: a stride-2 3x3 convolution that doubles the channels, then a 3x3
    convolution, each followed by ReLU (no batch norm, as App. C removes it)."""

    def __init__(self, cin: int, cout: int):
        super().__init__(
            nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(),
        )  # fmt: skip


class _PreActBlock(nn.Module):
    """A pre-activation residual block (He et al., 2016) that halves the resolution:
    ``x -> shortcut(x) + conv(relu(bn(conv_s2(relu(bn(x))))))``, the shortcut a strided 1x1
    convolution. ``norm=False`` drops the batch norms."""

    def __init__(self, cin: int, cout: int, norm: bool = True):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin) if norm else nn.Identity()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=not norm)
        self.bn2 = nn.BatchNorm2d(cout) if norm else nn.Identity()
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=not norm)
        self.shortcut = nn.Conv2d(cin, cout, 1, stride=2, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn1(x))
        return self.shortcut(h) + self.conv2(F.relu(self.bn2(self.conv1(h))))


class ConvNet(nn.Module):
    """NFM App. C's CNN for stacked MNIST, optionally with NFM: NFM(CNN).

    A 3x3 stem convolution with ``width`` channels at full resolution, then ``num_blocks`` stages
    that each halve the resolution and double the channels (``block="plain"``: stride-2 conv +
    conv, App. C's nine-layer CNN for 4 stages; ``"preact"``: pre-activation residual blocks),
    then a linear head on the final map: flattened (``pool="flatten"``), or its global maximum
    (``"max"``) or mean (``"mean"``) per channel. With ``nfm`` (a dict of :class:`NFMNetwork`
    arguments, e.g. ``{"passes": 2, "top_k": 5}``) the stages run as Algorithm 1's modules and
    the stem's output is ``x = h(0)`` (the stem reads nothing, so it runs once). By default an
    NFM read sits after every stage (``placement="after"``, "NFM after each block" as in NFM
    App. B): four reads per pass at 1/2 .. 1/16 of the resolution, eight in all for ``K = 2``
    as in NFM §4.2 (the first has an empty memory). ``placement="before"`` reads after the stem
    and after each stage but the last instead (Algorithm 1 with ``x`` the stem's output, as NFM
    App. F's GAN).

    Shapes: images ``(B, in_channels, image_size, image_size)`` -> logits ``(B, num_outputs)``.
    """

    def __init__(self, in_channels: int = 1, num_outputs: int = 10, width: int = 32,
                 num_blocks: int = 4, image_size: int = 64, block: str = "plain",
                 norm: bool = False, pool: str = "flatten",
                 nfm: dict | None = None):  # fmt: skip
        super().__init__()
        for name, v in (("in_channels", in_channels), ("num_outputs", num_outputs),
                        ("width", width), ("num_blocks", num_blocks), ("image_size", image_size)):  # fmt: skip
            positive_int(v, name)
        if block not in BLOCKS:
            raise ValueError(f"block must be one of {BLOCKS}, got {block!r}")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        if image_size % 2**num_blocks:
            raise ValueError(
                f"image_size={image_size} must be divisible by 2**num_blocks={2**num_blocks}"
            )
        self.dims = tuple(width * 2**i for i in range(num_blocks + 1))
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU())
        make = (lambda a, b: _PlainBlock(a, b)) if block == "plain" else (
            lambda a, b: _PreActBlock(a, b, norm))  # fmt: skip
        stages = [make(self.dims[i], self.dims[i + 1]) for i in range(num_blocks)]
        for m in [self.stem, *stages]:
            for conv in m.modules():
                if isinstance(conv, nn.Conv2d):  # He init: nine plain ReLU layers, no batch norm
                    nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
                    if conv.bias is not None:
                        nn.init.zeros_(conv.bias)
        self.body = nn.Sequential(*stages) if nfm is None else self._nfm(stages, nfm)
        final = image_size // 2**num_blocks
        self.pool = pool
        features = self.dims[-1] * (final * final if pool == "flatten" else 1)
        self.head = nn.Linear(features, num_outputs)
        self.nfm_config = None if nfm is None else dict(nfm)

    def _nfm(self, stages, nfm: dict) -> NFMNetwork:
        return NFMNetwork(stages, self.dims, **{"placement": "after", **nfm})

    @property
    def nfm(self) -> NFMNetwork | None:
        return self.body if isinstance(self.body, NFMNetwork) else None

    def with_nfm(self, **nfm) -> ConvNet:
        """A copy with NFM added around this network's stages. With ``gamma = 0`` (the
        initialisation) it computes exactly what this network computes, so NFM can be added to a
        trained model and trained on from there."""
        if self.nfm is not None:
            raise ValueError("this ConvNet already has NFM")
        new = copy.deepcopy(self)
        new.body = new._nfm(list(new.body), nfm)
        new.nfm_config = dict(nfm)
        return new

    def forward(self, x: Tensor, return_details: bool = False):
        """The logits of images ``x`` ``(B, 1, H, W)``; with ``return_details`` (NFM only) also
        the body's :class:`NFMOutput` (reads, states)."""
        h0 = self.stem(check_input(x, self))
        if return_details:
            if self.nfm is None:
                raise ValueError("return_details needs a ConvNet with NFM")
            out = self.body(h0, return_details=True)
            return self._head(out.output), out
        return self._head(self.body(h0))

    def _head(self, h: Tensor) -> Tensor:
        if self.pool == "max":
            h = h.amax((2, 3))
        elif self.pool == "mean":
            h = h.mean((2, 3))
        return self.head(h.flatten(1))
