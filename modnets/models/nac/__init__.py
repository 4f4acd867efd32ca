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

One file per job: ``config`` (NACConfig and the circuit design), ``generators`` (codes, signatures
and initial states), ``layers`` (modulated attention, propagators, read-out), ``circuit`` (the
whole model) and ``perceiver`` (conversion from a Perceiver IO); LayerScale, DropPath and code
noise live in :mod:`modnets.nn.residual`.
"""

from modnets.models.nac.circuit import NACOutput, NeuralAttentiveCircuit, mediators_only
from modnets.models.nac.config import (
    BANDWIDTHS,
    DROP_AMONG,
    DROP_ORDERS,
    GENERATORS,
    INITIAL_STATES,
    KERNEL_REGIMES,
    KERNELS,
    MODFC_FORMS,
    PRIOR_LOSSES,
    PRIOR_MATCHINGS,
    CircuitDesign,
    NACConfig,
    modfc_alpha,
)
from modnets.models.nac.generators import ConditionalCircuitGenerator, UnconditionalCircuitGenerator
from modnets.models.nac.layers import ModulatedAttention, Propagator, ReadOut
from modnets.models.nac.perceiver import nac_from_perceiver_io, perceiver_io_config

__all__ = [
    "KERNELS",
    "DROP_ORDERS",
    "DROP_AMONG",
    "GENERATORS",
    "INITIAL_STATES",
    "BANDWIDTHS",
    "MODFC_FORMS",
    "PRIOR_LOSSES",
    "PRIOR_MATCHINGS",
    "KERNEL_REGIMES",
    "NACConfig",
    "CircuitDesign",
    "modfc_alpha",
    "UnconditionalCircuitGenerator",
    "ConditionalCircuitGenerator",
    "ModulatedAttention",
    "Propagator",
    "ReadOut",
    "NACOutput",
    "mediators_only",
    "NeuralAttentiveCircuit",
    "perceiver_io_config",
    "nac_from_perceiver_io",
]
