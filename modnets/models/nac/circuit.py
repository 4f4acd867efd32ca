"""The Neural Attentive Circuit (NAC §2): read-in, propagators and read-out around one circuit
design, with the graph prior, and modules and edges dropped at inference time."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from modnets.graphs import GraphPriorRegularizer, graphon
from modnets.models.nac.config import DROP_AMONG, DROP_ORDERS, CircuitDesign, NACConfig, modfc_alpha
from modnets.models.nac.generators import ConditionalCircuitGenerator, UnconditionalCircuitGenerator
from modnets.models.nac.layers import Propagator, ReadOut
from modnets.nn.modulated import ModFC
from modnets.nn.params import weight_decay_groups
from modnets.nn.read_in import ReadIn
from modnets.nn.skmdpa import link_probabilities
from modnets.pretrained import Pretrained
from modnets.probes import probe
from modnets.utils import check_input


@dataclass
class NACOutput:
    """``logits (B, C)``, read-out ``confidences (B, U_o)`` and the design that produced them."""

    logits: Tensor
    confidences: Tensor
    design: CircuitDesign


def mediators_only(design: CircuitDesign, R: int) -> CircuitDesign:
    """The design with the read-in modules' rows removed (what the read-out sees without them)."""
    sigs = design.signatures
    return dataclasses.replace(
        design,
        signatures=None if sigs is None else sigs[..., R:, :],
        codes=design.codes[..., R:, :],
        states=design.states[..., R:, :],
    )


#: How :meth:`NeuralAttentiveCircuit.graph_loss` reduces NAC eq. 6 over the pairs of modules.
GRAPH_REDUCTIONS = ("sum", "mean")


class NeuralAttentiveCircuit(nn.Module, Pretrained):
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
            num_heads=c.read_in_heads,
            ffn_hidden=c.ffn_hidden,
            activation=c.activation,
            alpha=modfc_alpha(c),
            layer_scale=c.read_in_layer_scale,
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
    def arguments(self) -> dict:
        return {"config": self.config, "tokenizer": self.tokenizer}

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

    def forward(
        self,
        x: Tensor,
        condition: Tensor | None = None,
        processor_mask: Tensor | None = None,
        return_details: bool = False,
    ):
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
                states = layer(
                    states, design.codes, design.signatures, processor_mask, self.edge_mask
                )
        else:  # read-in modules read the input, then send; mediators receive from everyone
            sigs = design.signatures
            read = self.read_in(tokens, states[..., :R, :], design.codes[..., :R, :])
            senders = (read, design.codes[..., :R, :], None if sigs is None else sigs[..., :R, :])
            med = states[..., R:, :]
            med = med.expand(B, -1, -1) if med.dim() == 2 else med
            edges = None if self.edge_mask is None else self.edge_mask[R:]
            for layer in self.propagators:
                med = layer(
                    med,
                    design.codes[..., R:, :],
                    None if sigs is None else sigs[..., R:, :],
                    processor_mask,
                    edges,
                    senders,
                )
            states = torch.cat([read, med], 1)
            if not self.config.read_out_from_read_in:
                states, design = med, mediators_only(design, R)
                processor_mask = None if processor_mask is None else processor_mask[R:]
        if self.config.read_out_state_noise:  # the public seeder noises the read-out's too
            out_states = self.generator.to_state.seed(design.out_states, design.out_codes, B)
            design = dataclasses.replace(design, out_states=out_states)
        logits, confidences = self.read_out(states, design, processor_mask)
        probe("nac.confidences", confidences)
        return NACOutput(logits, confidences, design) if return_details else logits

    def _check_mask(self, mask: Tensor) -> Tensor:
        U = self.config.num_processors
        if mask.shape != (U,) or mask.dtype != torch.bool:
            raise ValueError(
                f"processor_mask must be a bool tensor of shape ({U},), got "
                f"{mask.dtype} {tuple(mask.shape)}"
            )
        if not mask.any():
            raise ValueError("processor_mask drops every processor module; keep at least one")
        R = self.config.num_read_in
        if R and not mask[:R].any():
            raise ValueError("processor_mask drops every read-in module; keep at least one")
        return mask.to(self.read_out.head.weight.device)

    # -- the graph prior (App. A) -----------------------------------------------------------------
    def graph_loss(self, reduction: str = "sum") -> Tensor:
        """NAC eq. 6 on the mediators' link probabilities (0 without a prior); with one bandwidth
        per kernel, on each propagator kernel's: their mean (``prior_loss="eq6"``) or their sum
        (``"public"``, as the public code).

        ``reduction="sum"``: NAC eq. 6 as printed, a sum over the ordered pairs ``i != j``;
        ``"mean"``: over the ``U (U - 1)`` pairs, the scale a training loss adds it at (the
        public loss, ``prior_loss="public"``, is already a mean and is left as it is)."""
        if reduction not in GRAPH_REDUCTIONS:
            raise ValueError(f"reduction must be one of {GRAPH_REDUCTIONS}, got {reduction!r}")
        if self.graph_prior is None:
            return torch.zeros((), device=self.read_out.head.weight.device)
        design = self.design()
        n = len(self.kernel_bandwidths())
        losses = [self.graph_prior(self.mediator_links(design, k)) for k in range(n)]
        total = torch.stack(losses).sum()
        if self.config.prior_loss == "public":
            return total
        U = self.config.num_processors
        # NAC eq. 6 (per kernel, then their mean), summed over pairs or averaged
        return total / n if reduction == "sum" else total / n / (U * (U - 1))

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

    def keep_mask(
        self, n: int, order: str = "least", among: str = "mediators", seed: int = 0
    ) -> Tensor:
        """The ``processor_mask`` that drops the first ``n`` modules of :meth:`drop_order`."""
        drop = self.drop_order(order, among, seed)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(drop):
            raise ValueError(
                f"n must be an int in [0, {len(drop) - 1}] (droppable {among}), got {n!r}"
            )
        mask = torch.ones(self.config.num_processors, dtype=torch.bool, device=drop.device)
        mask[drop[:n]] = False
        return self._check_mask(mask)

    def drop_modules(
        self, n: int, order: str = "least", among: str = "mediators", seed: int = 0
    ) -> NeuralAttentiveCircuit:
        """A copy without ``n`` processor modules, least connected first by default (App. F).

        The copy's per-module tensors have fewer rows, so every attention, ModFC and ModFFN over
        processor modules really shrinks. It computes what ``processor_mask=keep_mask(n, ...)``
        computes in this model. See :meth:`drop_order` for ``order``, ``among`` and ``seed``.
        """
        mask = self.keep_mask(n, order, among, seed)
        keep = torch.nonzero(mask).squeeze(-1)
        new = copy.deepcopy(self)
        R = int(mask[: self.config.num_read_in].sum())
        new.config = dataclasses.replace(
            self.config, num_processors=len(keep), num_read_in=R, prior=None
        )
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
        (NAC App. C; the codes decayed with ``decay_codes``). ``circuit_lr``: a learning rate of
        their own for the signatures and the bandwidth (the circuit's wiring; ``None``: the
        optimiser's)."""
        codes = () if self.config.decay_codes else ("codes", "out_codes")
        exempt = ("signatures", "out_signatures", "queries", *codes)
        groups = weight_decay_groups(self, weight_decay, exempt)
        if circuit_lr is None:
            return groups
        wiring = {
            id(p)
            for n, p in self.named_parameters()
            if n.rsplit(".", 1)[-1] in ("signatures", "out_signatures", "bandwidth")
        }
        for g in groups:
            g["params"] = [p for p in g["params"] if id(p) not in wiring]
        own = [p for p in self.parameters() if id(p) in wiring and p.requires_grad]
        return [*groups, {"params": own, "weight_decay": 0.0, "lr": circuit_lr}]
