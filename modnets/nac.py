"""Neural Attentive Circuits (NAC §2): a circuit generator designs, a circuit executor runs.

A *circuit design* gives each of ``U`` modules a signature ``s_u`` (who talks to whom, NAC eq. 2), a
code ``c_u`` (what it computes, NAC eq. 1) and an initial state ``theta0_u``. ``U_p`` processor
modules do the work and ``U_o`` read-out modules produce the output. The executor (§2.1) is

    tokens X --read-in (NAC eqs. 4-5)--> Theta1 --L propagators (SKMDPA + ModFFN)--> Theta(L+1)
            --read-out (SKMDPA cross-attention + ModFFN, confidence-weighted)--> logits

Every per-module quantity is a row of one tensor, so all modules run in one batched call; a
processor module is nothing but a row of ``signatures``, ``codes`` (and, with free initial states,
``states``). That is why :meth:`NeuralAttentiveCircuit.drop_modules` can return a genuinely
smaller network (App. F).

Choices where the paper is silent (each configurable, each stated in chapter 9):

* pre-LayerNorm residual blocks around every attention and ModFFN, as in Perceiver IO and the
  public NAC code, with its LayerScale and DropPath on the residual branches of the propagators
  and the read-out (``layer_scale``, ``drop_path``);
* one Concrete sample of the kernel per example, layer and forward pass, shared by the heads (the
  public code samples per example);
* one learnable bandwidth ``epsilon`` per circuit, shared by every attention, the graph prior and
  the importances (the public code learns one per propagator and regularises each);
* module roles (``num_read_in``): with ``num_read_in = R > 0`` the first ``R`` processor modules
  are *read-in modules* -- they attend to the input, then only send -- and the others are
  *mediators*, which receive from everyone, are the only modules the graph prior regularises,
  and are the ones :meth:`NeuralAttentiveCircuit.drop_modules` drops by default (the public
  code's input latents and mediators); ``R = 0`` makes every processor module both;
* the read-out modules' confidences are a linear score of their final state, turned into weights by
  a softmax over the read-out modules;
* initial states are a 2-layer GELU MLP of the code (§2.2), shared by processor and read-out modules.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from modnets.baselines import PerceiverIO
from modnets.graphs import GRAPHONS, GraphPriorRegularizer, graphon
from modnets.nn.modulated import ModFC, ModFFN
from modnets.nn.read_in import ReadIn
from modnets.nn.skmdpa import EVAL_KERNELS, SKMDPA, link_probabilities
from modnets.probes import probe
from modnets.training import weight_decay_groups
from modnets.utils import check_input

__all__ = [
    "NACConfig",
    "CircuitDesign",
    "UnconditionalCircuitGenerator",
    "ConditionalCircuitGenerator",
    "ModulatedAttention",
    "Propagator",
    "ReadOut",
    "NACOutput",
    "NeuralAttentiveCircuit",
    "perceiver_io_config",
    "nac_from_perceiver_io",
]

KERNELS = ("learned", "frozen", "dense")
DROP_ORDERS = ("least", "most", "random")
DROP_AMONG = ("mediators", "processors")
GENERATORS = ("unconditional", "conditional")
INITIAL_STATES = ("codes", "linear", "free")
BANDWIDTHS = ("shared", "per_kernel")
MODFC_FORMS = ("eq1", "public")
PRIOR_LOSSES = ("eq6", "public")
PRIOR_MATCHINGS = ("search", "eq9")

#: The kernel of each public NAC run (book/fidelity.md) as :class:`NACConfig` changes, e.g.
#: ``config.replace(**KERNEL_REGIMES["public-tiny"])``. The Tiny-ImageNet run truncates and never
#: samples, with one learned bandwidth per kernel and an untruncated read-out; the ImageNet runs
#: sample and never truncate, at a fixed bandwidth. ``"modnets"``: both, one shared bandwidth.
KERNEL_REGIMES = {
    "modnets": {},
    "public-tiny": dict(
        truncation=0.9,
        sample_kernel=False,
        bandwidths="per_kernel",
        learn_bandwidth=True,
        read_out_truncation=False,
    ),
    "public-imagenet": dict(
        truncation=None, sample_kernel=True, temperature=0.5, bandwidth=1.0, learn_bandwidth=False
    ),
}


@dataclass
class NACConfig:
    """Every size and switch of a NAC (defaults: NAC Table 4, Tiny-ImageNet, and where Table 4 is
    silent the public code's Tiny-ImageNet configuration).

    Attributes:
        input_dim: features of each input token (after the tokenizer).
        num_outputs: classes (logits per sample).
        dim: ``d_model``, the module state width.
        num_layers: ``L`` propagator layers.
        num_processors: ``U_p``; num_readouts: ``U_o``.
        num_heads: heads of the propagators' and read-out's SKMDPA; read_in_heads: of the read-in.
        ffn_hidden, activation: ModFFN hidden width and ``"gelu"`` or ``"geglu"``.
        sig_dim, code_dim: ``d_sig`` and ``d_code``.
        temperature, bandwidth, delta: ``tau`` (Concrete), ``epsilon`` (NAC eq. 2), ``delta`` (NAC eq. 3).
        alpha: ModFC's modulation strength at initialisation (NAC eq. 1); ``learn_alpha=False`` keeps it.
        eval_kernel: SKMDPA's kernel at evaluation (``"probs"``, ``"threshold"``, ``"sample"``).
        share_layers: one set of propagator weights for all ``L`` layers (Table 4: no).
        generator: ``"unconditional"`` (free signatures and codes) or ``"conditional"`` (App. G).
        condition_dim: features of the conditioning set (default ``input_dim``: the tokens).
        generator_dim: width of the conditional generator.
        kernel: ``"learned"`` signatures, ``"frozen"`` (random, not trained: Table 1's "sparse graph
            (not learnable)") or ``"dense"`` (no kernel: every module sees every module).
        initial_states: ``"codes"`` (a 2-layer MLP of the code, §2.2), ``"linear"`` (the public
            code's latent seeder, ``Linear(LayerNorm(c))``) or ``"free"`` parameters (Perceiver
            IO's latents).
        prior, prior_params: the graph prior of App. A (a name of :data:`modnets.graphs.GRAPHONS`
            or ``None``) and its graphon parameters; it regularises the mediators.
        truncation: ``P_ij = 0`` where the cosine distance of two signatures exceeds it (the
            public code's 0.9; ``None`` is NAC eq. 2 as printed, whose mean off-diagonal ``P`` cannot
            fall below ~0.36: chapter 7).
        straight_through: gradients of truncated pairs through the untruncated ``P`` (our
            option; the public code passes none).
        learn_bandwidth: ``epsilon`` is a parameter initialised at ``bandwidth`` (public code).
        num_read_in: ``R`` read-in modules among the ``num_processors`` (public code: 64 of 320);
            0 makes every processor module read the input and be graph-regularised.
        layer_scale: LayerScale's initial value on the propagators' and read-out's residual
            branches (the public code's ``nc_full_tiny_imnet.yml``: 0.1; Table 4 lists none;
            ``None`` turns it off).
        drop_path: DropPath (stochastic depth) probability on the propagators' residual branches
            in training (public code: 0.1; its read-out has none, nor has ours).
        code_noise: in training, each receiving module's code is scaled by ``1 + U(-a, a)``
            feature-wise (public code's ``VectorScaleNoise``, ``a = 0.05``; 0 turns it off).
        state_noise: in training, initial states are ``mu(c) + sigma(c) * N(0, 1)`` per example,
            ``log sigma^2`` a linear map of the code with bias -5 (public code's latent seeder);
            evaluation uses ``mu(c)``. Only with ``initial_states="codes"``.
        per_example_kernel: one Concrete kernel sample per example in training (public code);
            ``False`` shares one sample per layer and forward pass across the batch.
        read_out_from_read_in: with read-in modules, the read-out attends to them as well as to
            the mediators (public code's default, ``enable_input_output_communication``);
            ``False``: to the mediators only, so every message to the output passes through them.
        sample_kernel: in training, ``K ~ Concrete(P, tau)`` (NAC eq. 2); ``False``: ``K = P``
            (the public Tiny-ImageNet run). :data:`KERNEL_REGIMES` names the public runs' kernels.
        bandwidths: ``"shared"``: one ``epsilon`` for every attention and the graph prior;
            ``"per_kernel"``: one per propagator kernel and one for the read-out (public code).
        read_out_truncation: the read-out's kernel is truncated like the propagators' (``False``:
            untruncated, as in every public run).
        read_out_residual: a residual around the read-out's attention and a LayerNorm before its
            heads; ``False``: neither (the public ImageNet read-out).
        modfc: ``"eq1"``: NAC eq. 1, ``W(x * (1 + alpha LN(W_c c))) + b``; ``"public"``: the public
            Tiny-ImageNet run's ``W(x * LN(W_c c)) + b`` (no ``alpha``).
        prior_loss: ``"eq6"``: NAC eq. 6, the sum over pairs ``i != j``; ``"public"``: the mean
            over all ``U^2`` pairs, diagonal included, summed over the propagators' kernels
            (public code). With ``"eq6"`` and per-kernel bandwidths, the mean over the kernels.
        prior_matching: ``"search"`` (:func:`modnets.graphs.match_permutation`, independent of
            how the modules are numbered) or ``"eq9"``: NAC eq. 9's one linear assignment, as the
            paper and the public code do.
    """

    input_dim: int
    num_outputs: int
    dim: int = 384
    num_layers: int = 8
    num_processors: int = 320
    num_readouts: int = 64
    num_heads: int = 6
    read_in_heads: int = 1
    ffn_hidden: int = 1536
    activation: str = "geglu"
    sig_dim: int = 64
    code_dim: int = 384
    temperature: float = 0.5
    bandwidth: float = 1.0
    delta: float = 1e-6
    alpha: float = 0.1
    learn_alpha: bool = True
    eval_kernel: str = "probs"
    share_layers: bool = False
    generator: str = "unconditional"
    condition_dim: int | None = None
    generator_dim: int = 128
    kernel: str = "learned"
    initial_states: str = "codes"
    prior: str | None = "scale_free"
    prior_params: dict = field(default_factory=dict)
    truncation: float | None = 0.9
    straight_through: bool = False
    learn_bandwidth: bool = True
    num_read_in: int = 0
    layer_scale: float | None = 0.1
    drop_path: float = 0.1
    code_noise: float = 0.05
    state_noise: bool = True
    per_example_kernel: bool = True
    read_out_from_read_in: bool = True
    sample_kernel: bool = True
    bandwidths: str = "shared"
    read_out_truncation: bool = True
    read_out_residual: bool = True
    modfc: str = "eq1"
    prior_loss: str = "eq6"
    prior_matching: str = "search"

    def replace(self, **changes) -> NACConfig:
        """A copy with some fields changed (validated again), as ``NIConfig.replace``."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown NACConfig fields {unknown}")
        return dataclasses.replace(self, **changes)

    @property
    def num_mediators(self) -> int:
        """Processor modules that are not read-in modules (all of them when ``num_read_in = 0``)."""
        return self.num_processors - self.num_read_in

    def __post_init__(self):
        for name in ("input_dim", "num_outputs", "dim", "num_layers", "num_processors",
                     "num_readouts", "num_heads", "read_in_heads", "ffn_hidden", "sig_dim",
                     "code_dim", "generator_dim"):  # fmt: skip
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"NACConfig.{name} must be a positive int, got {v!r}")
        if self.condition_dim is not None and (
            not isinstance(self.condition_dim, int) or self.condition_dim <= 0
        ):
            raise ValueError(f"NACConfig.condition_dim must be a positive int or None, got {self.condition_dim!r}")  # fmt: skip
        for name, heads in (("num_heads", self.num_heads), ("read_in_heads", self.read_in_heads)):
            if self.dim % heads:
                raise ValueError(f"NACConfig.{name}={heads} must divide dim={self.dim}")
        for name in ("temperature", "bandwidth", "delta"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(
                    f"NACConfig.{name} must be positive and finite, got {getattr(self, name)!r}"
                )
        if not 0 <= self.alpha < math.inf:  # 0: ModFC without modulation
            raise ValueError(f"NACConfig.alpha must be non-negative and finite, got {self.alpha!r}")
        choices = {
            "activation": ("gelu", "geglu"),
            "eval_kernel": EVAL_KERNELS,
            "generator": GENERATORS,
            "kernel": KERNELS,
            "initial_states": INITIAL_STATES,
            "prior": (None, *GRAPHONS),
            "bandwidths": BANDWIDTHS,
            "modfc": MODFC_FORMS,
            "prior_loss": PRIOR_LOSSES,
            "prior_matching": PRIOR_MATCHINGS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"NACConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        if self.generator == "conditional" and self.initial_states == "free":
            raise ValueError("NACConfig.initial_states='free' needs generator='unconditional'")
        for name in ("sample_kernel", "read_out_truncation", "read_out_residual"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"NACConfig.{name} must be True or False, got {getattr(self, name)!r}"
                )
        if self.generator == "conditional" and self.kernel == "frozen":
            raise ValueError("NACConfig.kernel='frozen' needs generator='unconditional'")
        if (
            isinstance(self.num_read_in, bool)
            or not isinstance(self.num_read_in, int)
            or not (0 <= self.num_read_in < self.num_processors)
        ):
            raise ValueError(f"NACConfig.num_read_in must be an int in [0, num_processors), got {self.num_read_in!r}")  # fmt: skip
        if self.num_mediators < 2 and self.prior is not None:
            raise ValueError("NACConfig.prior needs at least 2 mediators (num_processors - num_read_in)")  # fmt: skip
        if self.truncation is not None and not 0 < self.truncation <= 2:
            raise ValueError(f"NACConfig.truncation must be None or in (0, 2], got {self.truncation}")  # fmt: skip
        if self.layer_scale is not None and not self.layer_scale > 0:
            raise ValueError(f"NACConfig.layer_scale must be None or positive, got {self.layer_scale}")  # fmt: skip
        if not 0 <= self.drop_path < 1:
            raise ValueError(f"NACConfig.drop_path must be in [0, 1), got {self.drop_path}")
        if not 0 <= self.code_noise < 1:
            raise ValueError(f"NACConfig.code_noise must be in [0, 1), got {self.code_noise}")


@dataclass
class CircuitDesign:
    """Signatures, codes and initial states of the processor (``p``) and read-out (``o``) modules.

    Shapes ``(U, .)`` for an unconditional design or ``(B, U, .)`` per sample; signatures are
    ``None`` for a dense kernel.
    """

    signatures: Tensor | None
    codes: Tensor
    states: Tensor
    out_signatures: Tensor | None
    out_codes: Tensor
    out_states: Tensor


def modfc_alpha(config: NACConfig) -> float | None:
    """The ``alpha`` every ModFC of the circuit gets: ``None`` is the public Tiny-ImageNet form."""
    return None if config.modfc == "public" else config.alpha


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


class LayerScale(nn.Module):
    """``gamma * x`` with a learnable per-channel ``gamma`` (CaiT; the public NAC code's ModFFN
    blocks, initial value 0.1); ``init=None`` is the identity."""

    def __init__(self, dim: int, init: float | None):
        super().__init__()
        self.gamma = None if init is None else nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: Tensor) -> Tensor:
        return x if self.gamma is None else x * self.gamma


def drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    """DropPath / stochastic depth: zero a residual branch for a random ``p`` of the examples
    and rescale the rest by ``1 / (1 - p)``, in training only (``x``: ``(B, ...)``)."""
    if p == 0 or not training:
        return x
    keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) >= p
    return x * keep.to(x.dtype) / (1 - p)


def code_noise(codes: Tensor, scale: float, training: bool) -> Tensor:
    """``c * (1 + U(-scale, scale))`` feature-wise in training (public code's VectorScaleNoise:
    ``c + U(-scale |c|, scale |c|)``), ``c`` otherwise."""
    if scale == 0 or not training:
        return codes
    return codes + codes.detach().abs() * scale * (2 * torch.rand_like(codes) - 1)


class UnconditionalCircuitGenerator(nn.Module):
    """Free signatures and codes (NAC §2.2), initial states from the codes (or free)."""

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
            None if self.dense else sigs[:, :P], codes[:, :P], states[:, :P],
            None if self.dense else sigs[:, P:], codes[:, P:], states[:, P:],
        )  # fmt: skip


class ModulatedAttention(nn.Module):
    """SKMDPA with ModFC projections, each conditioned on its own module's code (NAC §2).

    ``q_i = ModFC(x_i; c_i)``, ``k_j = ModFC(y_j; c_j)``, ``v_j = ModFC(y_j; c_j)``, then NAC eq. 3,
    then an output ModFC with the query module's code.

    Shapes: queries ``(B, Uq, d)`` with codes ``(Uq or B x Uq, d_code)`` and signatures; keys and
    values ``(B, Uk, d)`` likewise -> ``(B, Uq, d)``.
    """

    def __init__(
        self, config: NACConfig, bandwidth: float | Tensor | None = None, truncated: bool = True
    ):
        super().__init__()
        c, alpha = config, modfc_alpha(config)
        self.query = ModFC(c.dim, c.dim, c.code_dim, alpha=alpha)
        self.key = ModFC(c.dim, c.dim, c.code_dim, alpha=alpha)
        self.value = ModFC(c.dim, c.dim, c.code_dim, alpha=alpha)
        self.out = ModFC(c.dim, c.dim, c.code_dim, alpha=alpha)
        self.attention = SKMDPA(
            c.num_heads,
            c.bandwidth if bandwidth is None else bandwidth,
            c.temperature,
            c.delta,
            c.eval_kernel,
            c.truncation if truncated else None,
            c.straight_through,
            c.per_example_kernel,
            c.sample_kernel,
        )

    def forward(self, x, codes, sigs, y, y_codes, y_sigs, key_mask=None, edge_mask=None):
        q = self.query(x, codes)
        k, v = self.key(y, y_codes), self.value(y, y_codes)
        return self.out(self.attention(q, k, v, sigs, y_sigs, key_mask, edge_mask), codes)


class Propagator(nn.Module):
    """One propagator layer (NAC §2.1): a round of SKMDPA among the processor modules, then
    ``U_p`` copies of a ModFFN, each conditioned on its module's code; LayerScale and DropPath on
    both residual branches, code noise on the receiving modules' codes (training).

    ``senders``: the read-in modules' ``(states, codes, signatures)``, which send to every
    receiving module (through the kernel) but are not updated; the keys are then the read-in
    modules followed by ``states``, which is how ``key_mask`` and ``edge_mask`` columns are
    ordered.

    Shapes: states ``(B, U, d)`` -> ``(B, U, d)``.
    """

    def __init__(self, config: NACConfig, bandwidth: float | Tensor | None = None):
        super().__init__()
        c = config
        self.norm_attn, self.norm_ffn = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.attn = ModulatedAttention(c, bandwidth)
        self.ffn = ModFFN(c.dim, c.dim, c.code_dim, c.ffn_hidden, c.activation, modfc_alpha(c))
        self.scale_attn, self.scale_ffn = (
            LayerScale(c.dim, c.layer_scale),
            LayerScale(c.dim, c.layer_scale),
        )
        self.drop_path, self.code_noise = c.drop_path, c.code_noise

    def forward(self, states, codes, sigs, key_mask=None, edge_mask=None, senders=None) -> Tensor:
        h = self.norm_attn(states)
        y, y_codes, y_sigs = h, codes, sigs
        if senders is not None:
            s_states, s_codes, s_sigs = senders
            y = torch.cat([self.norm_attn(s_states), h], 1)
            y_codes = torch.cat([s_codes, codes], -2)
            y_sigs = None if sigs is None else torch.cat([s_sigs, sigs], -2)
        codes = code_noise(codes, self.code_noise, self.training)  # the receivers' codes
        msg = self.attn(h, codes, sigs, y, y_codes, y_sigs, key_mask, edge_mask)
        states = states + drop_path(self.scale_attn(msg), self.drop_path, self.training)
        upd = self.ffn(self.norm_ffn(states), codes)
        return states + drop_path(self.scale_ffn(upd), self.drop_path, self.training)


class ReadOut(nn.Module):
    """Read-out (NAC §2.1): the read-out modules cross-attend (SKMDPA) to the final processor
    states, apply a ModFFN, and each emits logits and a confidence; the output is the sum of
    their logits weighted by ``softmax_o(confidence_o)``.

    Shapes: processor states ``(B, U_p, d)``, read-out states ``(U_o, d)`` or ``(B, U_o, d)`` ->
    logits ``(B, num_outputs)`` and weights ``(B, U_o)``.
    """

    def __init__(self, config: NACConfig, bandwidth: float | Tensor | None = None):
        super().__init__()
        c = config
        self.norm_q, self.norm_kv = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.attn = ModulatedAttention(c, bandwidth, truncated=c.read_out_truncation)
        self.norm_ffn = nn.LayerNorm(c.dim)
        self.ffn = ModFFN(c.dim, c.dim, c.code_dim, c.ffn_hidden, c.activation, modfc_alpha(c))
        self.scale_attn, self.scale_ffn = (
            LayerScale(c.dim, c.layer_scale),
            LayerScale(c.dim, c.layer_scale),
        )
        self.drop_path, self.code_noise = 0.0, c.code_noise  # public code: no DropPath here
        # read_out_residual=False: the public ImageNet read-out, no residual and no final norm
        self.residual = c.read_out_residual
        self.norm_out = nn.LayerNorm(c.dim) if c.read_out_residual else nn.Identity()
        self.head = nn.Linear(c.dim, c.num_outputs)
        self.confidence = nn.Linear(c.dim, 1, bias=False)  # a bias cancels in the softmax

    def forward(self, proc_states, design: CircuitDesign, key_mask=None) -> tuple[Tensor, Tensor]:
        B = proc_states.shape[0]
        y = design.out_states
        y = y.expand(B, -1, -1) if y.dim() == 2 else y
        kv = self.norm_kv(proc_states)
        codes = code_noise(design.out_codes, self.code_noise, self.training)
        msg = self.attn(self.norm_q(y), codes, design.out_signatures,
                        kv, design.codes, design.signatures, key_mask)  # fmt: skip
        msg = drop_path(self.scale_attn(msg), self.drop_path, self.training)
        y = y + msg if self.residual else msg
        upd = self.ffn(self.norm_ffn(y), codes)
        y = y + drop_path(self.scale_ffn(upd), self.drop_path, self.training)
        y = self.norm_out(y)
        weights = torch.softmax(self.confidence(y).squeeze(-1), dim=-1)  # (B, U_o)
        return torch.einsum("bo,boc->bc", weights, self.head(y)), weights


@dataclass
class NACOutput:
    """``logits (B, C)``, read-out ``confidences (B, U_o)`` and the design that produced them."""

    logits: Tensor
    confidences: Tensor
    design: CircuitDesign


def _mediators_only(design: CircuitDesign, R: int) -> CircuitDesign:
    """The design with the read-in modules' rows removed (what the read-out sees without them)."""
    sigs = design.signatures
    return dataclasses.replace(design, signatures=None if sigs is None else sigs[..., R:, :],
                               codes=design.codes[..., R:, :], states=design.states[..., R:, :])  # fmt: skip


class NeuralAttentiveCircuit(nn.Module):
    """A Neural Attentive Circuit (NAC §2): generator + read-in + ``L`` propagators + read-out.

    Args:
        config: a :class:`NACConfig`.
        tokenizer: optional module mapping raw inputs to tokens ``(B, N, input_dim)``.

    Shapes: ``x`` -> tokens ``(B, N, input_dim)`` -> logits ``(B, num_outputs)``.
    ``processor_mask`` ``(U_p,)`` bool drops processor modules by masking (False = dropped).
    """

    def __init__(self, config: NACConfig, tokenizer: nn.Module | None = None):
        super().__init__()
        if not isinstance(config, NACConfig):
            raise TypeError(f"config must be a NACConfig, got {type(config).__name__}")
        c = self.config = config
        self.tokenizer = tokenizer
        self.generator = (
            UnconditionalCircuitGenerator(c)
            if c.generator == "unconditional"
            else ConditionalCircuitGenerator(c)
        )

        def epsilon() -> nn.Parameter:  # learnable: public code
            return nn.Parameter(torch.tensor(float(c.bandwidth)), c.learn_bandwidth)

        # epsilon of NAC eq. 2: one per circuit, or one per kernel (public code)
        self.bandwidth = epsilon()
        per_kernel = c.bandwidths == "per_kernel"
        self.read_in = ReadIn(
            c.dim,
            c.input_dim,
            c.code_dim,
            c.read_in_heads,
            c.ffn_hidden,
            c.activation,
            modfc_alpha(c),
        )
        if c.share_layers:
            shared = Propagator(c, self.bandwidth)
            self.propagators = nn.ModuleList([shared] * c.num_layers)
        else:
            self.propagators = nn.ModuleList(
                Propagator(c, epsilon() if per_kernel and i else self.bandwidth)
                for i in range(c.num_layers)
            )
        self.read_out = ReadOut(c, epsilon() if per_kernel else self.bandwidth)
        self.register_buffer("edge_mask", None)
        self.graph_prior = None
        if c.prior is not None and c.generator == "unconditional" and c.kernel == "learned":
            prior = graphon(c.prior, c.num_mediators, **c.prior_params)
            self.graph_prior = GraphPriorRegularizer(
                prior, matching=c.prior_matching, reduction=c.prior_loss
            )
        if not c.learn_alpha:
            for m in self.modules():
                if isinstance(m, ModFC) and m.alpha is not None:
                    m.alpha.requires_grad_(False)

    # -- the circuit ------------------------------------------------------------------------------
    def tokens(self, x: Tensor) -> Tensor:
        x = check_input(x, self)
        t = self.tokenizer(x) if self.tokenizer is not None else x
        if not isinstance(t, Tensor) or t.dim() != 3 or t.shape[-1] != self.config.input_dim:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"x must give tokens of shape (batch, tokens, input_dim={self.config.input_dim}), "
                f"got {shape}"
            )
        if t.shape[1] == 0:  # the read-in would attend over nothing: a constant output
            raise ValueError("x gives no tokens: the read-in needs at least one")
        return t

    def design(self, tokens: Tensor | None = None, condition: Tensor | None = None):
        """The circuit design (for a conditional NAC, of this batch)."""
        if self.config.generator == "conditional":
            return self.generator(condition if condition is not None else tokens)
        return self.generator()

    def kernel_bandwidths(self) -> list[Tensor]:
        """The propagators' ``epsilon``, one per distinct kernel (one when shared)."""
        bandwidths = (layer.attn.attention.bandwidth for layer in self.propagators)
        return list({id(b): b for b in bandwidths}.values())

    def link_probabilities(
        self, design: CircuitDesign | None = None, kernel: int | None = None
    ) -> Tensor:
        """``P`` among all processor modules (NAC eq. 2, truncated as configured):
        ``(U_p, U_p)`` or per sample. With one bandwidth per kernel, ``kernel`` picks a
        propagator kernel's ``P`` (default: the mean over them). The graph prior sees the
        mediator block (:meth:`mediator_links`)."""
        design = design if design is not None else self.design()
        if design.signatures is None:
            raise ValueError("a dense-kernel NAC (kernel='dense') has no link probabilities")
        s, c = design.signatures, self.config
        bandwidths = self.kernel_bandwidths()
        if kernel is not None:
            bandwidths = [bandwidths[kernel]]
        Ps = [link_probabilities(s, s, b, c.truncation, c.straight_through) for b in bandwidths]
        return Ps[0] if len(Ps) == 1 else torch.stack(Ps).mean(0)

    def mediator_links(
        self, design: CircuitDesign | None = None, kernel: int | None = None
    ) -> Tensor:
        """``P`` among the mediators, the graph the prior regularises: ``(M, M)``."""
        R = self.config.num_read_in
        return self.link_probabilities(design, kernel)[..., R:, R:]

    def forward(self, x: Tensor, condition: Tensor | None = None,
                processor_mask: Tensor | None = None, return_details: bool = False):  # fmt: skip
        """The logits ``(B, num_outputs)`` of inputs ``x``: tokens ``(B, N, input_dim)``, or what
        the tokenizer reads (images ``(B, C, H, W)``). ``condition``: a conditional generator's
        input (default: the tokens). ``processor_mask`` ``(num_processors,)`` bool: the modules
        that run (App. F's dropping, without copying the model). ``return_details``: a
        :class:`NACOutput` with the read-out's confidences and the circuit design."""
        tokens = self.tokens(x)
        design = self.design(tokens, condition)
        if processor_mask is not None:
            processor_mask = self._check_mask(processor_mask)
        B, R = tokens.shape[0], self.config.num_read_in
        states = design.states
        if self.generator.to_state is not None:
            states = self.generator.to_state.seed(states, design.codes, B)
        if R == 0:  # every processor module reads the input and propagates
            states = self.read_in(tokens, states, design.codes)
            for layer in self.propagators:
                states = layer(states, design.codes, design.signatures, processor_mask,
                               self.edge_mask)  # fmt: skip
        else:  # read-in modules read the input, then send; mediators receive from everyone
            sigs = design.signatures
            read = self.read_in(tokens, states[..., :R, :], design.codes[..., :R, :])
            senders = (read, design.codes[..., :R, :], None if sigs is None else sigs[..., :R, :])
            med = states[..., R:, :]
            med = med.expand(B, -1, -1) if med.dim() == 2 else med
            edges = None if self.edge_mask is None else self.edge_mask[R:]
            for layer in self.propagators:
                med = layer(med, design.codes[..., R:, :], None if sigs is None else sigs[..., R:, :],
                            processor_mask, edges, senders)  # fmt: skip
            states = torch.cat([read, med], 1)
            if not self.config.read_out_from_read_in:
                states, design = med, _mediators_only(design, R)
                processor_mask = None if processor_mask is None else processor_mask[R:]
        logits, confidences = self.read_out(states, design, processor_mask)
        probe("nac.confidences", confidences)
        return NACOutput(logits, confidences, design) if return_details else logits

    def _check_mask(self, mask: Tensor) -> Tensor:
        U = self.config.num_processors
        if mask.shape != (U,) or mask.dtype != torch.bool:
            raise ValueError(f"processor_mask must be a bool tensor of shape ({U},), got "
                             f"{mask.dtype} {tuple(mask.shape)}")  # fmt: skip
        if not mask.any():
            raise ValueError("processor_mask drops every processor module; keep at least one")
        R = self.config.num_read_in
        if R and not mask[:R].any():
            raise ValueError("processor_mask drops every read-in module; keep at least one")
        return mask.to(self.read_out.head.weight.device)

    # -- the graph prior (App. A) -----------------------------------------------------------------
    def graph_loss(self) -> Tensor:
        """NAC eq. 6 on the mediators' link probabilities (0 without a prior); with one bandwidth
        per kernel, on each propagator kernel's: their mean (``prior_loss="eq6"``) or their sum
        (``"public"``, as the public code)."""
        if self.graph_prior is None:
            return torch.zeros((), device=self.read_out.head.weight.device)
        design = self.design()
        n = len(self.kernel_bandwidths())
        losses = [self.graph_prior(self.mediator_links(design, k)) for k in range(n)]
        total = torch.stack(losses).sum()
        return total if self.config.prior_loss == "public" else total / n

    # -- pruning (App. F) -------------------------------------------------------------------------
    def module_importance(self) -> Tensor:
        """``q_i = sum_j P_ij`` over the mediators ``j`` (NAC App. F, NAC eq. 10): ``(U_p,)``, every
        processor module's degree in the graph the prior regularises (with ``num_read_in = 0``,
        the sum over all processor modules)."""
        if self.config.generator != "unconditional":
            raise ValueError("module importance needs generator='unconditional' (a fixed circuit)")
        with torch.no_grad():
            return self.link_probabilities()[:, self.config.num_read_in :].sum(-1)

    def drop_order(self, order: str = "least", among: str = "mediators", seed: int = 0) -> Tensor:
        """The droppable processor modules' indices in the order they are dropped.

        ``order``: ``"least"`` connected first (smallest ``q_i``; App. F), ``"most"`` connected
        first, or ``"random"`` (drawn with ``seed``: the control). ``among``: ``"mediators"``
        (the paper's reading: read-in modules are never dropped) or ``"processors"`` (any, but
        one read-in module always stays: without it nothing reads the input).
        """
        if order not in DROP_ORDERS:
            raise ValueError(f"order must be one of {DROP_ORDERS}, got {order!r}")
        if among not in DROP_AMONG:
            raise ValueError(f"among must be one of {DROP_AMONG}, got {among!r}")
        q, R = self.module_importance(), self.config.num_read_in
        start = R if among == "mediators" else 0
        idx = torch.arange(start, len(q), device=q.device)
        if order == "random":
            g = torch.Generator().manual_seed(seed)
            out = idx[torch.randperm(len(idx), generator=g).to(q.device)]
        else:
            sign = 1 if order == "least" else -1
            out = idx[torch.argsort(sign * q[start:], stable=True)]
        if among == "processors" and R:  # the last read-in module in the order is never dropped
            last = torch.nonzero(out < R).max()
            out = torch.cat([out[:last], out[last + 1 :]])
        return out

    def keep_mask(self, n: int, order: str = "least", among: str = "mediators",
                  seed: int = 0) -> Tensor:  # fmt: skip
        """The ``processor_mask`` that drops the first ``n`` modules of :meth:`drop_order`."""
        drop = self.drop_order(order, among, seed)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(drop):
            raise ValueError(f"n must be an int in [0, {len(drop) - 1}] (droppable {among}), got {n!r}")  # fmt: skip
        mask = torch.ones(self.config.num_processors, dtype=torch.bool, device=drop.device)
        mask[drop[:n]] = False
        return self._check_mask(mask)

    def drop_modules(self, n: int, order: str = "least", among: str = "mediators",
                     seed: int = 0) -> NeuralAttentiveCircuit:  # fmt: skip
        """A copy without ``n`` processor modules, least connected first by default (App. F).

        The copy's per-module tensors have fewer rows, so every attention, ModFC and ModFFN over
        processor modules really shrinks. It computes what ``processor_mask=keep_mask(n, ...)``
        computes in this model. See :meth:`drop_order` for ``order``, ``among`` and ``seed``.
        """
        mask = self.keep_mask(n, order, among, seed)
        keep = torch.nonzero(mask).squeeze(-1)
        new = copy.deepcopy(self)
        R = int(mask[: self.config.num_read_in].sum())
        new.config = dataclasses.replace(self.config, num_processors=len(keep), num_read_in=R,
                                         prior=None)  # fmt: skip
        g = new.generator
        with torch.no_grad():
            for name in ("signatures", "codes", "states"):
                p = getattr(g, name, None)
                if isinstance(p, nn.Parameter):
                    setattr(g, name, nn.Parameter(p[keep].clone(), p.requires_grad))
        new.graph_prior = None
        if self.edge_mask is not None:
            new.edge_mask = self.edge_mask[keep][:, keep].clone()
        return new

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # a state saved after eliminate_edges carries the edge mask a fresh circuit lacks
        mask = state_dict.get(prefix + "edge_mask")
        if mask is not None and self.edge_mask is None:
            self.edge_mask = torch.empty_like(mask, device=self.bandwidth.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def eliminate_edges(self, fraction: float) -> NeuralAttentiveCircuit:
        """A copy with the smallest ``fraction`` of off-diagonal ``P_ij`` set to 0 (App. F, Fig. 10).

        Pairs are removed symmetrically (``P`` is symmetric), the diagonal is kept.
        """
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        with torch.no_grad():
            P = self.link_probabilities()
        U = P.shape[0]
        iu = torch.triu_indices(U, U, offset=1, device=P.device)
        order = torch.argsort(P[iu[0], iu[1]], stable=True)
        cut = order[: round(fraction * order.numel())]
        mask = torch.ones(U, U, dtype=torch.bool, device=P.device)
        mask[iu[0, cut], iu[1, cut]] = False
        mask[iu[1, cut], iu[0, cut]] = False
        if self.edge_mask is not None:
            mask &= self.edge_mask
        new = copy.deepcopy(self)
        new.edge_mask = mask
        return new

    def parameter_groups(self, weight_decay: float, circuit_lr: float | None = None) -> list[dict]:
        """AdamW groups: no weight decay on parameters with ``dim <= 1``, codes or signatures
        (NAC App. C). ``circuit_lr``: a learning rate of their own for the signatures and the
        bandwidth (the circuit's wiring; ``None``: the optimiser's)."""
        exempt = ("signatures", "out_signatures", "codes", "out_codes", "queries")
        groups = weight_decay_groups(self, weight_decay, exempt)
        if circuit_lr is None:
            return groups
        wiring = {id(p) for n, p in self.named_parameters()
                  if n.rsplit(".", 1)[-1] in ("signatures", "out_signatures", "bandwidth")}  # fmt: skip
        for g in groups:
            g["params"] = [p for p in g["params"] if id(p) not in wiring]
        own = [p for p in self.parameters() if id(p) in wiring and p.requires_grad]
        return [*groups, {"params": own, "weight_decay": 0.0, "lr": circuit_lr}]


# ----------------------------------------------------------------------------- Perceiver IO as a NAC


def perceiver_io_config(config: NACConfig) -> NACConfig:
    """The NAC configuration that simulates a Perceiver IO (NAC §4.1, App. B.2): ModFC's
    ``alpha = 0`` (plain linear layers), a dense kernel, free initial states, one read-out module,
    every latent reading the input, and none of the NAC's training noise or LayerScale."""
    return dataclasses.replace(
        config, alpha=0.0, learn_alpha=False, kernel="dense", initial_states="free",
        num_readouts=1, prior=None, generator="unconditional", num_read_in=0, layer_scale=None,
        drop_path=0.0, code_noise=0.0, state_noise=False,
    )  # fmt: skip


def _copy_linear(dst, src: nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


def _copy_ln(dst: nn.LayerNorm, src: nn.LayerNorm) -> None:
    dst.load_state_dict(src.state_dict())


def _copy_attention(dst, src: nn.Module) -> None:
    for a, b in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "out")):
        _copy_linear(getattr(dst, a), getattr(src, b))


def _copy_ffn(dst, src: nn.Sequential) -> None:
    _copy_linear(dst.fc1, src[0])
    _copy_linear(dst.fc2, src[1])


@torch.no_grad()
def nac_from_perceiver_io(pio: PerceiverIO) -> NeuralAttentiveCircuit:
    """A NAC (configured by :func:`perceiver_io_config`) holding ``pio``'s weights: it computes
    what ``pio`` computes. Each ModFC with ``alpha = 0`` is the ``nn.Linear`` it copies."""
    nac = NeuralAttentiveCircuit(perceiver_io_config(pio.config), tokenizer=pio.tokenizer)
    nac.generator.states.copy_(pio.latents)
    nac.generator.out_states.copy_(pio.query)
    r = nac.read_in
    _copy_ln(r.norm_inputs, pio.norm_inputs)
    _copy_ln(r.norm_states, pio.norm_latents)
    _copy_attention(r, pio.encode)
    _copy_ln(r.norm_ffn, pio.norm_encode_mlp)
    _copy_ffn(r.ffn, pio.encode_mlp)
    for dst, src in zip(nac.propagators, pio.layers, strict=True):
        _copy_ln(dst.norm_attn, src.norm1)
        _copy_attention(dst.attn, src.attn)
        _copy_ln(dst.norm_ffn, src.norm2)
        _copy_ffn(dst.ffn, src.mlp)
    o = nac.read_out
    _copy_ln(o.norm_q, pio.norm_query)
    _copy_ln(o.norm_kv, pio.norm_kv)
    _copy_attention(o.attn, pio.decode)
    _copy_ln(o.norm_ffn, pio.norm_decode_mlp)
    _copy_ffn(o.ffn, pio.decode_mlp)
    _copy_ln(o.norm_out, pio.norm_out)
    _copy_linear(o.head, pio.head)
    return nac
