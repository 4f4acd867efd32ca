"""What a Neural Attentive Circuit is made of: :class:`NACConfig` (sizes, the kernel, the graph
prior, the read-in and read-out, training-time noise) and the circuit design a generator emits."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from torch import Tensor

from modnets.graphs import GRAPHONS, SIGNATURE_GRAPHS
from modnets.nn.skmdpa import EVAL_KERNELS
from modnets.utils import positive_int

KERNELS = ("learned", "frozen", "dense")

DROP_ORDERS = ("least", "most", "random")

DROP_AMONG = ("mediators", "processors")

GENERATORS = ("unconditional", "conditional")

INITIAL_STATES = ("codes", "linear", "free")

BANDWIDTHS = ("shared", "per_kernel")

MODFC_FORMS = ("eq1", "public")

PRIOR_LOSSES = ("eq6", "public")

PRIOR_MATCHINGS = ("search", "eq9")
#: How the read-out weighs its modules' logits by their confidences
POOLINGS = ("softmax", "gumbel")

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
            in training (public code: 0.1, which its Tiny-ImageNet run also applies to the
            read-out's branches; ``nc_full`` and ``INET-110E`` give the read-out none, nor does
            modnets).
        code_noise: in training, each receiving module's code is scaled by ``1 + U(-a, a)``
            feature-wise (public code's ``VectorScaleNoise``, ``a = 0.05``; 0 turns it off).
        state_noise: in training, the processor modules' initial states are
            ``mu(c) + sigma(c) * N(0, 1)`` per example (the public seeder noises the read-out's
            too; here it starts from ``mu(c)``),
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
        signature_prefit: ``None``: every signature drawn from ``N(0, 1)``; a name of
            :data:`SIGNATURE_GRAPHS`: the mediators' signatures pre-fitted to a graph of that kind
            before training (public code: orthogonal, then a hinge loss at the truncation;
            :func:`modnets.graphs.prefit_signatures`).
        read_in_layer_scale: ``None``: no LayerScale in the read-in; a value: LayerScale at it on
            the read-in's ModFFN branch and a learnable one at 1 on its attention (public code).
        read_out_drop_path: the read-out's branches get ``drop_path`` too (the public
            Tiny-ImageNet run); ``False``: none, as ``nc_full`` and ``INET-110E``.
        share_layernorm: one LayerNorm for a propagator's receivers and senders; ``False``: the
            senders have their own (the public default).
        read_out_state_noise: the seeder's noise on the read-out modules' initial states too
            (public code), with ``state_noise``.
        read_out_pooling: ``"softmax"`` over the confidences (``INET-110E``) or ``"gumbel"``: a
            Gumbel softmax, with its noise in evaluation too (the public ``OutputLatentPooling``).
        decay_codes: weight decay on the codes (the public Tiny-ImageNet run); ``False``: App. C's
            exemption.
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
    signature_prefit: str | None = None
    read_in_layer_scale: float | None = None
    read_out_drop_path: bool = False
    share_layernorm: bool = True
    read_out_state_noise: bool = False
    read_out_pooling: str = "softmax"
    decay_codes: bool = False

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
        self._check_sizes()
        self._check_choices()
        self._check_ranges()

    def _check_sizes(self) -> None:
        for name in (
            "input_dim",
            "num_outputs",
            "dim",
            "num_layers",
            "num_processors",
            "num_readouts",
            "num_heads",
            "read_in_heads",
            "ffn_hidden",
            "sig_dim",
            "code_dim",
            "generator_dim",
        ):
            positive_int(getattr(self, name), f"NACConfig.{name}")
        if self.condition_dim is not None:
            positive_int(self.condition_dim, "NACConfig.condition_dim")
        for name, heads in (("num_heads", self.num_heads), ("read_in_heads", self.read_in_heads)):
            if self.dim % heads:
                raise ValueError(f"NACConfig.{name}={heads} must divide dim={self.dim}")
        if (
            isinstance(self.num_read_in, bool)
            or not isinstance(self.num_read_in, int)
            or not (0 <= self.num_read_in < self.num_processors)
        ):
            raise ValueError(
                f"NACConfig.num_read_in must be an int in [0, num_processors), got {self.num_read_in!r}"
            )
        if self.num_mediators < 2 and self.prior is not None:
            raise ValueError(
                "NACConfig.prior needs at least 2 mediators (num_processors - num_read_in)"
            )

    def _check_choices(self) -> None:
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
            "signature_prefit": (None, *SIGNATURE_GRAPHS),
            "read_out_pooling": POOLINGS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"NACConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        if self.generator == "conditional" and self.initial_states == "free":
            raise ValueError("NACConfig.initial_states='free' needs generator='unconditional'")
        for name in (
            "sample_kernel",
            "read_out_truncation",
            "read_out_residual",
            "read_out_drop_path",
            "share_layernorm",
            "read_out_state_noise",
            "decay_codes",
        ):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"NACConfig.{name} must be True or False, got {getattr(self, name)!r}"
                )
        if self.generator == "conditional" and self.kernel == "frozen":
            raise ValueError("NACConfig.kernel='frozen' needs generator='unconditional'")
        if self.signature_prefit is not None and (
            self.generator != "unconditional" or self.kernel == "dense" or self.truncation is None
        ):
            raise ValueError(
                "NACConfig.signature_prefit needs generator='unconditional', a kernel with "
                "signatures and a truncation (the graph is fitted at it)"
            )
        if self.read_out_state_noise and not (self.state_noise and self.initial_states != "free"):
            raise ValueError(
                "NACConfig.read_out_state_noise needs state_noise=True and states from the codes"
            )

    def _check_ranges(self) -> None:
        for name in ("temperature", "bandwidth", "delta"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(
                    f"NACConfig.{name} must be positive and finite, got {getattr(self, name)!r}"
                )
        if not 0 <= self.alpha < math.inf:  # 0: ModFC without modulation
            raise ValueError(f"NACConfig.alpha must be non-negative and finite, got {self.alpha!r}")
        if self.truncation is not None and not 0 < self.truncation <= 2:
            raise ValueError(
                f"NACConfig.truncation must be None or in (0, 2], got {self.truncation}"
            )
        for name in ("layer_scale", "read_in_layer_scale"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"NACConfig.{name} must be None or positive, got {value}")
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
