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
  position of the local window becomes its own attendable element. :func:`read_views` lays the
  same reads out as views, which is how :class:`NFMAttention` reads without rescaled copies.
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

One file per job: ``attention`` (NFM attention and its sparse softmax), ``convnet`` (the CNN) and
``network`` (the multi-pass network).
"""

from modnets.models.nfm.attention import (
    ACTIVATIONS,
    TOPK_MODES,
    NFMAttention,
    depth_to_space,
    num_candidates,
    read_views,
    rescale,
    space_to_depth,
    topk_softmax,
)
from modnets.models.nfm.convnet import BLOCKS, POOLS, ConvNet
from modnets.models.nfm.network import PLACEMENTS, PROJECTIONS, NFMNetwork, NFMOutput

__all__ = [
    "ACTIVATIONS",
    "TOPK_MODES",
    "topk_softmax",
    "space_to_depth",
    "depth_to_space",
    "num_candidates",
    "rescale",
    "read_views",
    "NFMAttention",
    "BLOCKS",
    "POOLS",
    "ConvNet",
    "NFMOutput",
    "PLACEMENTS",
    "PROJECTIONS",
    "NFMNetwork",
]
