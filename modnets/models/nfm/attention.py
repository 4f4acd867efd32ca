"""NFM attention (NFM §3.2): a layer's modules read, with a top-k sparse softmax, from the states of
earlier layers brought to its resolution."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.probes import probe
from modnets.utils import positive_int

ACTIVATIONS = ("relu", "gelu")

TOPK_MODES = ("sab", "exact")


def _tensor(value, name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


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


def read_views(src: Sequence[int], size: Sequence[int]) -> tuple[list, list, list]:
    """How a state of spatial size ``src``, read at ``size``, lines up with the queries without
    a copy (:class:`NFMAttention` reads through these views; :func:`rescale` builds the copies).

    Per spatial dim, the axes of a grid both fit by broadcasting: ``[d]`` where the sizes match;
    ``[d, f]`` where the state is ``f`` times larger (queries ``[d, 1]``; the ``f`` axis indexes
    the SpaceToDepth window's candidates); ``[s, u]`` where it is ``u`` times smaller (states
    ``[s, 1]``: nearest upsampling by an integer factor). Row-major, the query's axes list its
    positions in order, and the candidate axes the window's candidates in :func:`rescale`'s
    order. A smaller size must divide the larger.

    Returns the query's view sizes, the state's view sizes and the candidate axes.
    """
    num_candidates(src, size)  # the same number of dims, a larger size a multiple of the smaller
    qv, sv, cand = [], [], []
    for s, d in zip(src, size, strict=True):
        if s > d:
            cand.append(len(qv) + 1)
            qv += [d, 1]
            sv += [d, s // d]
        elif s < d:
            if d % s:
                raise ValueError(f"size {d} is no multiple of {s}: no view upsamples it")
            qv += [s, d // s]
            sv += [s, 1]
        else:
            qv.append(d)
            sv.append(s)
    return qv, sv, cand


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

    def __init__(
        self,
        dim: int,
        memory_dim: int | None = None,
        key_dim: int = 16,
        value_dim: int = 16,
        num_heads: int = 4,
        top_k: int = 5,
        hidden_dim: int | None = None,
        batch_norm: bool = False,
        activation: str = "relu",
        topk_mode: str = "sab",
        source_dims: Sequence[int] | None = None,
    ):
        super().__init__()
        memory_dim = dim if memory_dim is None else memory_dim
        hidden_dim = value_dim if hidden_dim is None else hidden_dim
        for name, v in (
            ("dim", dim),
            ("memory_dim", memory_dim),
            ("key_dim", key_dim),
            ("value_dim", value_dim),
            ("num_heads", num_heads),
            ("top_k", top_k),
            ("hidden_dim", hidden_dim),
        ):
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
    def _linear(weight: Tensor, x: Tensor) -> Tensor:
        """A position-wise linear map ``weight`` ``(C', C)`` of a channel-first ``(B, C, *size)``
        tensor."""
        B, C, *size = x.shape
        n = math.prod(size)  # not -1: an empty batch has nothing to infer it from
        # one batched product, channels first in and out: a (C', C) @ (B, C, n) matmul would
        # transpose x to (B n, C) and the result back, two copies of each state
        out = torch.bmm(weight.expand(B, -1, -1), x.reshape(B, C, n))
        return out.reshape(B, weight.shape[0], *size)

    def _key_value(self, key: nn.Linear, value: nn.Linear, state: Tensor) -> tuple[Tensor, Tensor]:
        """``state W_k`` and ``state W_v`` in one product."""
        kv = self._linear(torch.cat([key.weight, value.weight]), state)
        return kv.split([self.key_dim, self.value_dim], 1)

    def write(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """Key and value of a state this module wrote: ``(B, key_dim, *size)``,
        ``(B, value_dim, *size)``. Projected before rescaling, once per state."""
        if self.key is None:
            raise ValueError("write is for writer-side projections; with source_dims use project")
        if _tensor(state, "state").dim() < 2 or state.shape[1] != self.memory_dim:
            raise ValueError(
                f"state must be (batch, memory_dim={self.memory_dim}, *size), got {tuple(state.shape)}"
            )
        return self._key_value(self.key, self.value, state)

    def project(self, source: int, state: Tensor) -> tuple[Tensor, Tensor]:
        """Key and value of a state written by module ``source``, through *this* (reading)
        module's projections for that source (needs ``source_dims``)."""
        if self.source_keys is None:
            raise ValueError("project needs source_dims: this module reads with the writers' keys")
        if not 0 <= source < len(self.source_keys):
            raise ValueError(f"source must be in [0, {len(self.source_keys)}), got {source}")
        return self._key_value(self.source_keys[source], self.source_values[source], state)

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
        q = self._linear(self.query.weight, state) / math.sqrt(dk)
        # Each state is read where it lies, through views (:func:`read_views`) laid out on a
        # grid the query and the state both fit by broadcasting: no rescaled copy of the memory
        # is made (save where upsampling repeats unevenly).
        reads = []
        for keys, values in memory:
            src = tuple(keys.shape[2:])
            if len(src) != len(size):
                raise ValueError(
                    f"state of spatial size {src} cannot be read at size {tuple(size)}: "
                    "every state of an NFM network needs the same number of spatial dims"
                )
            _factors(src, size)  # a larger size must be a multiple of the smaller
            if any(a < b and b % a for a, b in zip(src, size, strict=True)):
                # nearest upsampling to a size that is no multiple repeats unevenly: copy it
                src = tuple(max(a, b) for a, b in zip(src, size, strict=True))
                keys = F.interpolate(keys, size=src, mode="nearest")
                values = F.interpolate(values, size=src, mode="nearest")
            qv, sv, cand = read_views(src, size)
            grid = [max(a, b) for a, b in zip(qv, sv, strict=True)]
            rest = [a for a in range(len(grid)) if a not in cand]  # the query's positions
            # (B, H, *grid) -> (B, candidates, H, positions), and back
            order = [0, *(2 + a for a in cand), 1, *(2 + a for a in rest)]
            shape = [B, *(grid[a] for a in cand), H, *(grid[a] for a in rest)]
            keys, values = keys.reshape(B, H, dk, *sv), values.reshape(B, H, dv, *sv)
            reads.append((keys, values, qv, cand, order, shape))
        counts = [math.prod(shape[1 : 1 + len(cand)]) for _, _, _, cand, _, shape in reads]
        # a product-and-sum over d_head per state: short contractions beat many tiny matmuls
        scores = [q.new_zeros(B, 1, H, T)]  # the default slot: q . 0 = 0
        for (keys, _, qv, _, order, _), n in zip(reads, counts, strict=True):
            s = (q.reshape(B, H, dk, *qv) * keys).sum(2)  # (B, H, *grid)
            scores.append(s.permute(order).reshape(B, n, H, T))
        w = topk_softmax(torch.cat(scores, 1), self.top_k, 1, self.topk_mode)  # (B, 1+S, H, T)
        # the default slot's value is 0: only the real candidates contribute
        parts = []
        for read, wj in zip(reads, w[:, 1:].split(counts, 1), strict=True):
            _, values, _, cand, order, shape = read
            wj = wj.reshape(shape).permute(sorted(range(len(order)), key=order.__getitem__))
            Aj = wj.unsqueeze(2) * values  # (B, H, dv, *grid)
            if cand:  # summed over the window's candidates
                Aj = Aj.sum([3 + a for a in cand])
            parts.append(Aj.reshape(B, H, dv, T))
        A = sum(parts[1:], parts[0]) if parts else q.new_zeros(B, H, dv, T)
        return A.reshape(B, self.value_dim, T), w

    def forward(
        self,
        state: Tensor,
        memory: Sequence[tuple[Tensor, Tensor]] = (),
        return_weights: bool = False,
    ):
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
        h1 = self._linear(self.out1.weight, A)  # (B, hidden, T)
        if self.norm is not None:
            h1 = self.norm(h1)
        h1 = self._linear(self.out2.weight, self.act(h1)).reshape(state.shape)
        out = state + self.gamma * h1
        return (out, w) if return_weights else out
