"""Circuit generators (NAC §2.2): the modules' codes, signatures and initial states, learned once
or computed from a condition."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from modnets.graphs import prefit_signatures, signature_graph
from modnets.models.nac.config import CircuitDesign, NACConfig


class _CodeToState(nn.Module):
    """The initial state of a module from its code: a 2-layer GELU MLP (NAC §2.2), or with
    ``form="linear"`` the public code's ``Linear(LayerNorm(c))``; with ``noise`` the public
    code's latent seeder: ``mu(c) + sigma(c) * N(0, 1)`` per example in training,
    ``log sigma^2 = W c + b`` with ``b = -5`` at initialisation (``sigma ~ 0.08``)."""

    def __init__(self, code_dim: int, dim: int, noise: bool = False, form: str = "codes"):
        super().__init__()
        if form == "linear":
            self.norm, self.net = nn.LayerNorm(code_dim), nn.Linear(code_dim, dim)
        else:
            self.norm = nn.Identity()
            self.net = nn.Sequential(nn.Linear(code_dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.log_var = None
        if noise:
            self.log_var = nn.Linear(code_dim, dim)
            nn.init.constant_(self.log_var.bias, -5.0)

    def forward(self, codes: Tensor) -> Tensor:
        return self.net(self.norm(codes))

    def seed(self, states: Tensor, codes: Tensor, batch: int) -> Tensor:
        """``states`` (``mu``) with the seeder's noise added per example (training only)."""
        if self.log_var is None or not self.training:
            return states
        std = self.log_var(self.norm(codes)).mul(0.5).exp()
        shape = (batch, *states.shape[-2:])
        return states + std * torch.randn(shape, dtype=states.dtype, device=states.device)


class UnconditionalCircuitGenerator(nn.Module):
    """Free signatures and codes (NAC §2.2), initial states from the codes (or free); the
    mediators' signatures drawn at random or pre-fitted to a graph (``signature_prefit``)."""

    def __init__(self, config: NACConfig):
        super().__init__()
        c = config
        learn_sigs = c.kernel == "learned"
        if c.kernel == "dense":
            self.signatures = self.out_signatures = None
        else:
            self.signatures = nn.Parameter(torch.randn(c.num_processors, c.sig_dim), learn_sigs)
            self.out_signatures = nn.Parameter(torch.randn(c.num_readouts, c.sig_dim), learn_sigs)
        self.codes = nn.Parameter(torch.randn(c.num_processors, c.code_dim))
        self.out_codes = nn.Parameter(torch.randn(c.num_readouts, c.code_dim))
        if c.initial_states == "free":
            self.states = nn.Parameter(0.02 * torch.randn(c.num_processors, c.dim))
            self.out_states = nn.Parameter(0.02 * torch.randn(c.num_readouts, c.dim))
            self.to_state = None
        else:
            self.to_state = _CodeToState(c.code_dim, c.dim, c.state_noise, c.initial_states)
        if c.signature_prefit is not None:  # the mediators start wired as a graph (public code)
            seed = int(torch.randint(2**31 - 1, ()))
            graph = signature_graph(c.signature_prefit, c.num_mediators, seed)
            fitted = prefit_signatures(graph, c.sig_dim, c.truncation)
            with torch.no_grad():
                self.signatures[c.num_read_in :] = fitted

    def forward(self, condition: Tensor | None = None) -> CircuitDesign:
        if self.to_state is None:
            states, out_states = self.states, self.out_states
        else:
            states, out_states = self.to_state(self.codes), self.to_state(self.out_codes)
        return CircuitDesign(
            self.signatures, self.codes, states, self.out_signatures, self.out_codes, out_states
        )


class ConditionalCircuitGenerator(nn.Module):
    """Per-sample signatures and codes from a conditioning set (NAC §2.2, App. G).

    Learned queries (one per module) cross-attend to the conditioning set, then an FFN, a
    self-attention among the modules, and two FFNs in parallel give signatures and codes.

    Shapes: condition ``(B, M, condition_dim)`` -> a design with ``(B, U, .)`` fields.
    """

    def __init__(self, config: NACConfig):
        super().__init__()
        c = config
        d, heads = c.generator_dim, 4 if c.generator_dim % 4 == 0 else 1
        self.num_processors = c.num_processors
        self.dense = c.kernel == "dense"
        self.queries = nn.Parameter(0.02 * torch.randn(c.num_processors + c.num_readouts, d))
        self.cond_proj = nn.Linear(c.condition_dim or c.input_dim, d)
        self.cross = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.self_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.to_signature = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, c.sig_dim))
        self.to_code = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, c.code_dim))
        self.to_state = _CodeToState(c.code_dim, c.dim, c.state_noise, c.initial_states)

    def forward(self, condition: Tensor | None = None) -> CircuitDesign:
        if condition is None or condition.dim() != 3:
            raise ValueError("the conditional generator needs condition of shape (B, M, features)")
        kv = self.cond_proj(condition)
        q = self.queries.expand(condition.shape[0], -1, -1)
        h = q + self.cross(self.norm1(q), kv, kv, need_weights=False)[0]
        h = h + self.ffn(self.norm2(h))
        g = self.norm3(h)
        h = h + self.self_attn(g, g, g, need_weights=False)[0]
        sigs, codes = self.to_signature(h), self.to_code(h)
        states = self.to_state(codes)
        P = self.num_processors
        return CircuitDesign(
            None if self.dense else sigs[:, :P],
            codes[:, :P],
            states[:, :P],
            None if self.dense else sigs[:, P:],
            codes[:, P:],
            states[:, P:],
        )
