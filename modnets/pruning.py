"""Dropping modules at inference time, and the controls that make it a test (NAC App. F).

NAC Fig. 5a drops a NAC's mediator modules least connected first (smallest ``q_i``) and claims
that accuracy degrades gracefully. The claim needs controls: the same number of modules dropped
in a *random* order (does the connectivity ranking matter?) and *most* connected first, and a
Perceiver IO with as many latents dropped at random (NAC Fig. 15: it has no connectivity to rank
them by). Chapters 9 and 10 both draw these curves, from here:

* :func:`droppable` -- how many modules a fraction is a fraction of;
* :func:`pruned` -- the model without a fraction of them, in an order;
* :func:`drop_curve` -- a score at each fraction, averaged over random draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from modnets.models.baselines import PerceiverIO
from modnets.models.nac import NeuralAttentiveCircuit

__all__ = ["droppable", "num_dropped", "pruned", "drop_curve"]


def droppable(model: nn.Module) -> int:
    """How many modules a drop fraction is a fraction of: the NAC's mediators (read-in modules
    are never dropped), Perceiver IO's latents."""
    if isinstance(model, NeuralAttentiveCircuit):
        return model.config.num_mediators
    if isinstance(model, PerceiverIO):
        return model.config.num_processors
    raise TypeError(
        f"model must be a NeuralAttentiveCircuit or PerceiverIO, got {type(model).__name__}"
    )


def num_dropped(fraction: float, total: int) -> int:
    """``round(fraction * total)``, leaving at least one module."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    return min(total - 1, round(fraction * total))


def pruned(model: nn.Module, fraction: float, order: str = "least", seed: int = 0) -> nn.Module:
    """The NAC without ``fraction`` of its mediators, dropped in ``order`` (``"least"`` connected
    first, ``"most"``, or ``"random"`` with ``seed``), or the Perceiver IO without a random
    ``fraction`` of its latents (drawn with ``seed``; it has no other order)."""
    n = num_dropped(fraction, droppable(model))
    if isinstance(model, NeuralAttentiveCircuit):
        return model.drop_modules(n, order, "mediators", seed)
    return model.drop_latents(n, seed=seed)


def drop_curve(
    model: nn.Module,
    score: Callable[[nn.Module], dict[str, float]],
    fractions: Sequence[float],
    order: str = "least",
    *,
    draws: int = 1,
    seed: int = 0,
) -> list[dict]:
    """``score`` of the model with each fraction of its modules dropped (NAC Fig. 5a).

    A random order (``"random"``, and every Perceiver IO) is drawn ``draws`` times, with seeds
    ``1000 seed + k``; each row holds the mean of every metric ``score`` returns and, in
    ``"draws"``, the first metric of each draw. A ranked order is deterministic: one draw. Where a
    fraction drops no module, ``score`` gets ``model`` itself, once (a scorer may remember it).
    """
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be a positive int, got {draws!r}")
    random = order == "random" or not isinstance(model, NeuralAttentiveCircuit)
    seeds = [1000 * seed + k for k in range(draws if random else 1)]
    out = []
    for f in fractions:
        if num_dropped(f, droppable(model)) == 0:  # every draw is the model itself
            models, runs = [model], [score(model)] * len(seeds)
        else:
            models = [pruned(model, f, order, s) for s in seeds]
            runs = [score(m) for m in models]
        first = next(iter(runs[0]))
        means = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
        out.append(
            {
                "fraction": f,
                "modules": models[0].config.num_processors,
                **means,
                "draws": [r[first] for r in runs],
            }
        )
    return out
