"""An NFM network (NFM Algorithm 1): a CNN whose layers, pass after pass, also read from earlier
layers through NFM attention."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from modnets.models.nfm.attention import NFMAttention, num_candidates
from modnets.probes import probe, trace
from modnets.utils import check_input, positive_int


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

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        dims: Sequence[int],
        passes: int = 2,
        placement: str = "before",
        share_blocks: bool = False,
        share_attention: bool = False,
        projections: str = "writer",
        **attention,
    ):
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
        unknown = set(attention) - {
            "key_dim",
            "value_dim",
            "num_heads",
            "top_k",
            "hidden_dim",
            "batch_norm",
            "activation",
            "topk_mode",
        }
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
        return [
            self.attn(k, i).gamma.item() for k in range(self.passes) for i in range(self.num_blocks)
        ]

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
