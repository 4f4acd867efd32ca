"""Fuzzy Boolean functions and the multi-task regression datasets of NI §4.1.

The fuzzy operations of NI eq. 15 extend Boolean logic from {0, 1} to [0, 1]::

    and(a, b) = a b        not(a) = 1 - a        or(a, b) = 1 - (1 - a)(1 - b)

NI samples "a family of 2^(2^N) fuzzy Boolean functions" with the details in its Appendix B, which
our copy of the paper lacks. We take the natural reading: a function is a random **truth table**
on ``N`` variables (one of the 2^(2^N)), evaluated through its **disjunctive normal form** with the
fuzzy semantics::

    minterm_m(x) = prod_j (x_j if bit j of m is 1 else 1 - x_j)
    f(x)         = or_{m : table[m] = 1} minterm_m(x) = 1 - prod_{m : table[m] = 1} (1 - minterm_m(x))

On {0, 1}^N exactly one minterm is 1, so ``f`` equals the truth table there. Inside the cube the
fuzzy OR is not idempotent: even the always-true table gives ``f(0.5, ..., 0.5) = 1 - (31/32)^32``,
about 0.64. Functions whose variance under uniform inputs is tiny (the always-false table, the
always-true one, and their near neighbours) are rejected: R^2 is undefined or meaningless for them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "fuzzy_and",
    "fuzzy_or",
    "fuzzy_not",
    "minterms",
    "FuzzyBooleanFunctions",
    "sample_functions",
    "FuzzyFormulas",
    "sample_formulas",
    "MultiTaskData",
    "make_dataset",
]


def fuzzy_and(a: Tensor, b: Tensor) -> Tensor:
    """NI eq. 15: ``and(a, b) = a b``."""
    return a * b


def fuzzy_not(a: Tensor) -> Tensor:
    """NI eq. 15: ``not(a) = 1 - a``."""
    return 1 - a


def fuzzy_or(a: Tensor, b: Tensor) -> Tensor:
    """NI eq. 15: ``or(a, b) = not(and(not a, not b)) = 1 - (1 - a)(1 - b)``."""
    return 1 - (1 - a) * (1 - b)


def minterms(x: Tensor) -> Tensor:
    """All ``2^N`` fuzzy minterms of ``x`` ``(n, N)``: shape ``(n, 2^N)``.

    Minterm ``m`` is the fuzzy AND over variables ``j`` of ``x_j`` (bit ``j`` of ``m`` set) or
    ``not x_j``; bit 0 is the first variable. They sum to 1 for every ``x``.
    """
    N = x.shape[-1]
    bits = torch.tensor(list(itertools.product([0, 1], repeat=N)), dtype=x.dtype).flip(-1)
    # bits[m, j] = bit j of m
    lit = x[:, None, :] * bits + (1 - x[:, None, :]) * (1 - bits)  # (n, 2^N, N)
    return lit.prod(dim=-1)


@dataclass
class FuzzyBooleanFunctions:
    """``k`` fuzzy Boolean functions of ``N`` variables, as truth tables ``(k, 2^N)`` (bool)."""

    tables: Tensor

    @property
    def num_functions(self) -> int:
        return self.tables.shape[0]

    @property
    def num_variables(self) -> int:
        return self.tables.shape[1].bit_length() - 1

    def __len__(self) -> int:
        return self.num_functions

    def __getitem__(self, idx) -> FuzzyBooleanFunctions:
        t = self.tables[idx]
        return FuzzyBooleanFunctions(t[None] if t.dim() == 1 else t)

    def __call__(self, x: Tensor) -> Tensor:
        """Evaluate every function: ``x`` ``(n, N)`` in [0, 1] -> ``(n, k)`` in [0, 1].

        Computed in float64 in log space (``prod (1 - m) = exp(sum log(1 - m))``) so that the
        product over up to ``2^N`` minterms neither underflows nor loops over functions.
        """
        if x.dim() != 2 or x.shape[1] != self.num_variables:
            raise ValueError(f"x must have shape (n, {self.num_variables}), got {tuple(x.shape)}")
        m = minterms(x.double()).clamp(max=1 - 1e-15)
        log_not = torch.log1p(-m) @ self.tables.double().T  # (n, k)
        return (1 - torch.exp(log_not)).to(x.dtype)

    def dnf(self, index: int) -> str:
        """Function ``index`` as a DNF string, e.g. ``(x1 & ~x2) | (~x1 & x2)``."""
        N = self.num_variables
        terms = []
        for m in torch.nonzero(self.tables[index]).flatten().tolist():
            lits = [f"x{j + 1}" if (m >> j) & 1 else f"~x{j + 1}" for j in range(N)]
            terms.append("(" + " & ".join(lits) + ")")
        return " | ".join(terms) if terms else "0"


def sample_functions(
    num_functions: int,
    num_variables: int = 5,
    seed: int = 0,
    min_variance: float = 2e-3,
    probe_points: int = 4096,
) -> FuzzyBooleanFunctions:
    """Draw ``num_functions`` distinct random truth tables, rejecting near-constant functions.

    A function is kept when its variance under uniform inputs (estimated on ``probe_points``
    points) is at least ``min_variance``. Reproducible by ``seed``.
    """
    for name, v in (("num_functions", num_functions), ("num_variables", num_variables)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if num_variables > 12:
        raise ValueError(f"num_variables must be at most 12 (2^N minterms), got {num_variables}")
    g = torch.Generator().manual_seed(seed)
    probe = torch.rand(probe_points, num_variables, generator=g, dtype=torch.float64)
    kept: list[Tensor] = []
    seen: set[bytes] = set()
    for _ in range(1000 * num_functions):
        table = torch.rand(2**num_variables, generator=g) < 0.5
        key = table.numpy().tobytes()
        if key in seen:
            continue
        if FuzzyBooleanFunctions(table[None])(probe).var().item() < min_variance:
            continue
        seen.add(key)
        kept.append(table)
        if len(kept) == num_functions:
            return FuzzyBooleanFunctions(torch.stack(kept))
    raise RuntimeError(f"could not draw {num_functions} functions with variance >= {min_variance}")


# A formula is a tree: ("var", j) | ("not", tree) | ("and" | "or", tree, tree).
_BINARY = {"and": fuzzy_and, "or": fuzzy_or}


def _evaluate(tree: tuple, x: Tensor) -> Tensor:
    op = tree[0]
    if op == "var":
        return x[:, tree[1]]
    if op == "not":
        return fuzzy_not(_evaluate(tree[1], x))
    return _BINARY[op](_evaluate(tree[1], x), _evaluate(tree[2], x))


def _show(tree: tuple) -> str:
    op = tree[0]
    if op == "var":
        return f"x{tree[1] + 1}"
    if op == "not":
        return f"~{_show(tree[1])}"
    return f"({_show(tree[1])} {'&' if op == 'and' else '|'} {_show(tree[2])})"


def _depth(tree: tuple) -> int:
    if tree[0] == "var":
        return 0
    if tree[0] == "not":
        return _depth(tree[1])  # a negation is part of its literal or sub-expression
    return 1 + max(_depth(tree[1]), _depth(tree[2]))


@dataclass
class FuzzyFormulas:
    """``k`` fuzzy Boolean *formulas* of ``N`` variables: and / or / not trees evaluated with the
    fuzzy semantics of NI eq. 15 (a second family beside random truth tables; see
    :func:`sample_formulas`)."""

    trees: list
    num_variables: int

    @property
    def num_functions(self) -> int:
        return len(self.trees)

    def __len__(self) -> int:
        return len(self.trees)

    def __getitem__(self, idx) -> FuzzyFormulas:
        trees = self.trees[idx] if isinstance(idx, slice) else [self.trees[idx]]
        return FuzzyFormulas(trees, self.num_variables)

    def __call__(self, x: Tensor) -> Tensor:
        """Evaluate every formula: ``x`` ``(n, N)`` in [0, 1] -> ``(n, k)`` in [0, 1]."""
        if x.dim() != 2 or x.shape[1] != self.num_variables:
            raise ValueError(f"x must have shape (n, {self.num_variables}), got {tuple(x.shape)}")
        xd = x.double()
        return torch.stack([_evaluate(t, xd) for t in self.trees], dim=1).to(x.dtype)

    def expression(self, index: int) -> str:
        """Formula ``index`` as a string, e.g. ``((x1 & ~x3) | (x2 | x5))``."""
        return _show(self.trees[index])

    def depth(self, index: int) -> int:
        """Nesting depth of binary operations (a literal is 0; negations do not count)."""
        return _depth(self.trees[index])


def sample_formulas(
    num_functions: int,
    num_variables: int = 5,
    seed: int = 0,
    depths: tuple[int, ...] = (2, 3),
    pool_size: int | None = None,
    min_variance: float = 2e-3,
    probe_points: int = 4096,
) -> FuzzyFormulas:
    """Draw ``num_functions`` distinct random formulas whose depth is one of ``depths``, built
    from one shared pool of ``pool_size`` (default ``2 N``) depth-1 sub-expressions (an and / or
    of two literals on different variables), so that functions share parts -- what modular
    functions could reuse. Depth 2 joins two pool entries, depth 3 joins a depth-2 formula with a
    third entry; each part is negated with probability 1/4. Near-constant formulas (variance
    under uniform inputs below ``min_variance``) are rejected. Reproducible by ``seed``."""
    for name, v in (("num_functions", num_functions), ("num_variables", num_variables)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if num_variables < 2:
        raise ValueError(f"num_variables must be at least 2, got {num_variables}")
    if not depths or any(d not in (2, 3) for d in depths):
        raise ValueError(f"depths must be a non-empty tuple of 2 and/or 3, got {depths!r}")
    g = torch.Generator().manual_seed(seed)

    def pick(n: int) -> int:
        return int(torch.randint(n, (1,), generator=g))

    def maybe_not(tree: tuple) -> tuple:
        return ("not", tree) if pick(4) == 0 else tree

    def binary(a: tuple, b: tuple) -> tuple:
        return ("and" if pick(2) == 0 else "or", a, b)

    pool = []
    for _ in range(pool_size or 2 * num_variables):
        i, j = torch.randperm(num_variables, generator=g)[:2].tolist()
        pool.append(binary(maybe_not(("var", i)), maybe_not(("var", j))))
    probe = torch.rand(probe_points, num_variables, generator=g, dtype=torch.float64)
    kept: list[tuple] = []
    seen: set[str] = set()
    for _ in range(1000 * num_functions):
        a, b, c = (pool[k] for k in torch.randperm(len(pool), generator=g)[:3].tolist())
        tree = binary(maybe_not(a), maybe_not(b))
        if depths[pick(len(depths))] == 3:
            tree = binary(maybe_not(tree), maybe_not(c))
        key = _show(tree)
        if key in seen:
            continue
        if _evaluate(tree, probe).var().item() < min_variance:
            continue
        seen.add(key)
        kept.append(tree)
        if len(kept) == num_functions:
            return FuzzyFormulas(kept, num_variables)
    raise RuntimeError(f"could not draw {num_functions} formulas with variance >= {min_variance}")


@dataclass
class MultiTaskData:
    """Inputs ``(n, N)`` and targets ``(n, k)`` for training and validation."""

    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor


def make_dataset(
    functions: FuzzyBooleanFunctions,
    num_points: int,
    seed: int = 0,
    train_fraction: float = 0.8,
) -> MultiTaskData:
    """``num_points`` inputs uniform on [0, 1]^N, targets ``f_1..f_k``, split 80/20 (NI §4.1)."""
    if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 2:
        raise ValueError(f"num_points must be an int >= 2, got {num_points!r}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must lie in (0, 1), got {train_fraction}")
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(num_points, functions.num_variables, generator=g)
    y = functions(x)
    n_train = int(round(train_fraction * num_points))
    return MultiTaskData(x[:n_train], y[:n_train], x[n_train:], y[n_train:])
