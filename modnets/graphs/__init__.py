"""Graph priors for Neural Attentive Circuits (NAC §2.2, App. A, NAC eqs. 6-9).

A *graphon* ``W: [0, 1]^2 -> [0, 1]`` describes a family of random graphs; sampled on the canonical
grid ``r_u = u / (U - 1)`` it gives the prior link-probability matrix ``P0_ij = W(r_i, r_j)`` (NAC eq. 7).
:class:`GraphPriorRegularizer` pulls NAC's link probabilities ``P`` (NAC eq. 2) towards ``P0`` up to a
relabelling of the modules (NAC eq. 6). The relabelling is a quadratic assignment problem; NAC
approximates it with the Hungarian method on the row cost of NAC eq. 9 (:func:`hungarian_permutation`),
which depends on how the modules are numbered. The regulariser uses :func:`match_permutation` by
default, which does not, and finds better relabellings; ``matching="eq9"`` selects NAC eq. 9.

One file per job: ``graphons`` (the priors), ``matching`` (NAC eq. 9 and the search),
``regularizer`` (NAC eq. 6) and ``prefit`` (signatures fitted to a graph before training, the
public code's start).
"""

from modnets.graphs.graphons import GRAPHONS, graphon, to_networkx
from modnets.graphs.matching import (
    DEFAULT_REFINE_STEPS,
    MATCHINGS,
    PriorMatcher,
    best_match,
    check_refine_steps,
    check_square,
    hungarian_permutation,
    match_permutation,
)
from modnets.graphs.prefit import SIGNATURE_GRAPHS, prefit_signatures, signature_graph
from modnets.graphs.regularizer import REDUCTIONS, GraphPriorRegularizer

__all__ = [
    "GRAPHONS",
    "graphon",
    "to_networkx",
    "hungarian_permutation",
    "DEFAULT_REFINE_STEPS",
    "MATCHINGS",
    "check_square",
    "check_refine_steps",
    "PriorMatcher",
    "best_match",
    "match_permutation",
    "REDUCTIONS",
    "GraphPriorRegularizer",
    "SIGNATURE_GRAPHS",
    "signature_graph",
    "prefit_signatures",
]
