"""Modulated linear layers: the programmable building block of NI, NAC and NFM.

A modulated layer is an ordinary affine map whose *input* is rescaled, feature by feature, by a
vector computed from a code ``c``. Many modules can share one weight matrix ``W`` and still compute
different functions, because each brings its own code. Only the code (``d_code`` numbers) is per
module; ``W``, ``b`` and the conditioning matrix ``W_c`` are shared.

* :class:`ModLin` -- NI eq. 4: ``y = W (x * LayerNorm(W_c c)) + b``.
* :class:`ModMLP` -- NI eq. 5: ``L`` ModLins sharing ``c`` with GELU between.
* :class:`ModFC` -- NAC eq. 1: ``y = W (x * (1 + alpha LayerNorm(W_c c))) + b``.
* :class:`ModFFN` -- NAC §2: ModFCs sharing ``c`` with GELU or GEGLU between.

Shapes. ``x`` is ``(..., d_in)`` and ``code`` is ``(..., d_code)``; their leading dimensions
broadcast against each other. So ``x`` of shape ``(batch, U, d_in)`` with codes ``(U, d_code)``
(one code per module) or ``(batch, U, d_code)`` (per-sample codes) runs all ``U`` modules in one
call, and NI's function streams ``(batch, U, tokens, d_in)`` take codes shaped ``(U, 1, d_code)``.
The modulation is computed once per code and broadcast; there is no loop over modules.
``per_function`` takes streams stored function-major, ``(U, batch, tokens, d_in)`` with codes
``(U, d_code)``: each function's rows are then one block of one batched product
(:func:`functions_linear`), the layout NI's LOCs keep their streams in.

The LayerNorm on ``W_c c`` has no affine parameters, as in the public NI code and as NAC App. B.1's
parameter count assumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modnets.utils import positive_int

__all__ = [
    "ModLin",
    "ModMLP",
    "ModFC",
    "ModFFN",
    "functions_linear",
    "modffn_parameter_count",
    "streams_linear",
]


def _check_inputs(layer: nn.Module, x: Tensor, code: Tensor) -> None:
    """Validate ``x`` and ``code`` at the public boundary, naming the argument that is wrong."""
    for name, t in (("x", x), ("code", code)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() == 0:
            raise ValueError(f"{name} must have at least one dimension (its last is features)")
    if x.shape[-1] != layer.in_features:
        raise ValueError(
            f"x has {x.shape[-1]} features in its last dimension, expected "
            f"in_features={layer.in_features} (x.shape={tuple(x.shape)})"
        )
    if code.shape[-1] != layer.code_features:
        raise ValueError(
            f"code has {code.shape[-1]} features in its last dimension, expected "
            f"code_features={layer.code_features} (code.shape={tuple(code.shape)})"
        )
    try:
        torch.broadcast_shapes(x.shape[:-1], code.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"the leading dimensions of x {tuple(x.shape[:-1])} and code {tuple(code.shape[:-1])} "
            "do not broadcast; give one code per module as (U, d_code) for x (..., U, d_in), "
            "per-sample codes as (batch, U, d_code), or insert singleton axes, e.g. (U, 1, d_code) "
            "for x (batch, U, tokens, d_in)"
        ) from None


def _check_per_function(layer: nn.Module, x: Tensor, codes: Tensor) -> None:
    """Validate function-major streams at ``per_function``, naming the argument that is wrong."""
    for name, t in (("x", x), ("codes", codes)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() < 2 or x.shape[-1] != layer.in_features:
        raise ValueError(
            f"x must have shape (functions, ..., {layer.in_features}), got {tuple(x.shape)}"
        )
    if codes.shape != (x.shape[0], layer.code_features):
        raise ValueError(
            f"codes must have shape ({x.shape[0]}, {layer.code_features}): one code per function, "
            f"as many as x's first dimension; got {tuple(codes.shape)}"
        )


def _row_blocks(functions: int, rows: int, device: torch.device) -> int:
    """Into how many blocks to cut each function's ``rows`` so that the ``functions * k``
    products of one ``bmm`` share the CPU threads evenly: torch parallelises a CPU ``bmm`` over
    its batch, so 5 functions on 2 threads leave one thread idle a third of the time (on two
    cores, (5, 1152, 64) @ (5, 64, 64) took 276 us and (10, 576, 64) @ (10, 64, 64) 216 us).
    1 on other devices, under ``torch.compile`` (the compiled kernels split the work themselves;
    asking for the thread count would break the graph), and where no ``k`` up to the thread count
    divides ``rows``."""
    if device.type != "cpu" or torch.compiler.is_compiling():
        return 1
    threads = torch.get_num_threads()
    for k in range(1, threads + 1):
        if (functions * k) % threads == 0 and rows % k == 0:
            return k
    return 1


class _Modulated(nn.Module):
    """Shared parameters and init of ModLin and ModFC.

    ``weight`` (d_out, d_in) is kaiming-uniform like ``nn.Linear``, ``bias`` (d_out) starts at zero,
    and the conditioning matrix ``code_weight`` (d_in, d_code) is bias-free: the choices of the
    public NI code.
    """

    def __init__(self, in_features: int, out_features: int, code_features: int, bias: bool = True):
        super().__init__()
        self.in_features = positive_int(in_features, "in_features")
        self.out_features = positive_int(out_features, "out_features")
        self.code_features = positive_int(code_features, "code_features")
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.code_weight = nn.Parameter(torch.empty(in_features, code_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.kaiming_uniform_(self.code_weight, a=math.sqrt(5))
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def normalized_modulation(self, code: Tensor) -> Tensor:
        """``LayerNorm(W_c c)``: shape ``(..., d_in)`` for ``code`` of shape ``(..., d_code)``."""
        return F.layer_norm(F.linear(code, self.code_weight), (self.in_features,))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"code_features={self.code_features}"
            + ("" if self.bias is not None else ", bias=False")
        )

    def stream_weight(self, m: Tensor) -> Tensor:
        """``W diag(m_u)`` for each function's modulation ``m`` ``(U, 1, d_in)``: ``(U, d_out, d_in)``."""
        return m[:, 0, None, :] * self.weight

    def _modulated_linear(self, x: Tensor, m: Tensor) -> Tensor:
        """``W (x * m) + b``. When one code serves many rows (NI's streams: x ``(..., U, T, d)``
        with m ``(U, 1, d)``) and there are more rows than weights, scaling the columns of ``W``
        once per code (``W diag(m_u)``) is cheaper than scaling every row of ``x``: same result,
        fewer element-wise operations forward and backward (measured in ``bench``); the products
        are :func:`streams_linear`."""
        if (
            m.dim() == 3
            and m.shape[1] == 1
            and x.dim() >= 3
            and x.shape[-3] == m.shape[0]
            and x.shape[-2] > 1
            and x[..., 0].numel() > m.shape[0] * self.out_features
        ):
            return streams_linear(x, self.stream_weight(m), self.bias)
        return F.linear(x * m, self.weight, self.bias)


def streams_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y_u = x_u W_u^T + b`` for every function stream ``u``: x ``(..., U, T, d_in)``, weight
    ``(U, d_out, d_in)`` (one matrix per function), bias ``(d_out,)``  ->  ``(..., U, T, d_out)``,
    a view of :func:`functions_linear`'s function-major result, not copied back; ``x`` stored
    function-major (a ``movedim`` of ``(U, ..., T, d_in)`` memory) is read without a copy."""
    return functions_linear(x.movedim(-3, 0), weight, bias).movedim(0, -3)


def functions_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y_u = x_u W_u^T + b`` on function-major rows: x ``(U, ..., d_in)``, weight
    ``(U, d_out, d_in)``, bias ``(d_out,)``  ->  ``(U, ..., d_out)``.

    The ``U`` products are one ``baddbmm`` with the bias added inside it (in :func:`_row_blocks`
    blocks of rows per function): fewer passes over memory than an ``einsum`` then the bias
    (chapter 12, ``modulated``)."""
    U, d_out, d_in = weight.shape
    rows = x.shape[1:-1]
    k = _row_blocks(U, x[..., 0].numel() // U, x.device)
    xu = x.reshape(U * k, -1, d_in)  # k blocks of rows per function
    wt = weight.transpose(1, 2)
    wt = wt.repeat_interleave(k, dim=0) if k > 1 else wt
    y = torch.bmm(xu, wt) if bias is None else torch.baddbmm(bias, xu, wt)
    return y.view(U, *rows, d_out)


class ModLin(_Modulated):
    """Modulated linear layer, NI eq. 4: ``y = W (x * LayerNorm(W_c c)) + b``.

    Args:
        in_features: ``d_in``.
        out_features: ``d_out``.
        code_features: ``d_code``, the size of the code ``c`` that programs the layer.
        bias: learn ``b`` (zero-initialised).

    Shapes:
        x: ``(..., d_in)``; code: ``(..., d_code)``, broadcasting with x's leading dimensions.
        Returns ``(broadcast leading dims, d_out)``.
    """

    def modulation(self, code: Tensor) -> Tensor:
        """The factor that multiplies ``x``: ``LayerNorm(W_c c)``, shape ``(..., d_in)``."""
        return self.normalized_modulation(code)

    def forward(self, x: Tensor, code: Tensor) -> Tensor:
        _check_inputs(self, x, code)
        return self._modulated_linear(x, self.modulation(code))

    def per_function(self, x: Tensor, codes: Tensor) -> Tensor:
        """Every function's layer on its own rows, stored function-major: x ``(U, ..., d_in)``,
        codes ``(U, d_code)``  ->  ``(U, ..., d_out)``; the same numbers as ``forward`` with
        x moved to ``(..., U, T, d_in)`` and codes ``(U, 1, d_code)``."""
        _check_per_function(self, x, codes)
        return functions_linear(x, self.stream_weight(self.modulation(codes[:, None])), self.bias)


class ModFC(_Modulated):
    """Modulated fully-connected layer, NAC eq. 1: ``y = W (x * (1 + alpha LayerNorm(W_c c))) + b``.

    ``alpha`` is a learnable scalar (initialised to 0.1, NAC §2); ``alpha = 0`` removes all
    conditioning and the layer is exactly ``nn.Linear`` with the same ``weight`` and ``bias``.
    ``alpha=None`` is the public code's default ModFC, which its Tiny-ImageNet run uses:
    ``y = W (x * LayerNorm(W_c c)) + b``, no ``1 + alpha``. Shapes as in :class:`ModLin`.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        code_features: int,
        alpha: float | None = 0.1,
        bias: bool = True,
    ):
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, int | float)):
            raise TypeError(f"alpha must be a float or None, got {type(alpha).__name__} {alpha!r}")
        self._alpha_init = None if alpha is None else float(alpha)
        super().__init__(in_features, out_features, code_features, bias)
        self.alpha = None if alpha is None else nn.Parameter(torch.tensor(float(alpha)))

    def modulation(self, code: Tensor) -> Tensor:
        """The factor that multiplies ``x``: ``1 + alpha LayerNorm(W_c c)`` (``alpha=None``:
        ``LayerNorm(W_c c)``), shape ``(..., d_in)``."""
        if self.alpha is None:
            return self.normalized_modulation(code)
        return 1.0 + self.alpha * self.normalized_modulation(code)

    def forward(self, x: Tensor, code: Tensor) -> Tensor:
        _check_inputs(self, x, code)
        return self._modulated_linear(x, self.modulation(code))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", alpha_init={self._alpha_init}"


_ACTIVATIONS = ("gelu", "geglu")


def _check_activation(activation: str, allowed: tuple[str, ...]) -> str:
    if activation not in allowed:
        raise ValueError(f"activation must be one of {allowed}, got {activation!r}")
    return activation


def _geglu(h: Tensor) -> Tensor:
    value, gate = h.chunk(2, dim=-1)
    return value * F.gelu(gate)


class ModMLP(nn.Module):
    """Modulated MLP, NI eq. 5: ``ModLin_L( . ; c) o GELU o ... o ModLin_1( . ; c)``.

    All ``num_layers`` ModLins read the same code ``c``.

    Args:
        in_features, out_features, code_features: as in :class:`ModLin`.
        hidden_features: width between layers (default ``in_features``).
        num_layers: ``L >= 1``; with ``L = 1`` this is a single ModLin.

    Shapes: x ``(..., d_in)``, code ``(..., d_code)`` broadcasting with x -> ``(..., d_out)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        code_features: int,
        hidden_features: int | None = None,
        num_layers: int = 2,
    ):
        super().__init__()
        positive_int(num_layers, "num_layers")
        hidden = in_features if hidden_features is None else hidden_features
        positive_int(hidden, "hidden_features")
        widths = [in_features] + [hidden] * (num_layers - 1) + [out_features]
        self.layers = nn.ModuleList(
            ModLin(a, b, code_features) for a, b in zip(widths[:-1], widths[1:], strict=True)
        )
        self.in_features, self.out_features = in_features, out_features
        self.code_features = code_features

    def forward(self, x: Tensor, code: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            if i > 0:
                x = F.gelu(x)
            x = layer(x, code)
        return x

    def per_function(self, x: Tensor, codes: Tensor) -> Tensor:
        """:meth:`ModLin.per_function` through all layers: x ``(U, ..., d_in)``, codes
        ``(U, d_code)``  ->  ``(U, ..., d_out)``."""
        for i, layer in enumerate(self.layers):
            if i > 0:
                x = F.gelu(x)
            x = layer.per_function(x, codes)
        return x


class ModFFN(nn.Module):
    """Modulated feed-forward network of NAC (§2, App. B.1): ``ModFC -> act -> ModFC``.

    Both ModFCs read the same code. ``activation="geglu"`` (NAC Table 4; the public Tiny-ImageNet run uses GELU) makes
    the first layer ``d_in -> 2 d_hidden`` and gates one half with GELU of the other;
    ``"gelu"`` is the plain two-layer form that App. B.1 counts. The pre-LayerNorm, LayerScale
    and DropPath around it belong to the NAC block, not to this layer.

    Shapes: x ``(..., d_in)``, code ``(..., d_code)`` broadcasting with x -> ``(..., d_out)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        code_features: int,
        *,
        hidden_features: int | None = None,
        activation: str = "gelu",
        alpha: float = 0.1,
    ):
        super().__init__()
        self.activation = _check_activation(activation, _ACTIVATIONS)
        hidden = 4 * in_features if hidden_features is None else hidden_features
        positive_int(hidden, "hidden_features")
        first_out = 2 * hidden if activation == "geglu" else hidden
        self.fc1 = ModFC(in_features, first_out, code_features, alpha=alpha)
        self.fc2 = ModFC(hidden, out_features, code_features, alpha=alpha)
        self.in_features, self.out_features = in_features, out_features
        self.hidden_features, self.code_features = hidden, code_features

    def forward(self, x: Tensor, code: Tensor) -> Tensor:
        act: Callable[[Tensor], Tensor] = _geglu if self.activation == "geglu" else F.gelu
        return self.fc2(act(self.fc1(x, code)), code)


def modffn_parameter_count(
    num_ffns: int, in_features: int, hidden_features: int, code_features: int, num_modules: int
) -> dict[str, int]:
    """Parameters of ``num_ffns`` two-layer GELU ModFFNs (``d_out = d_in``) plus ``U`` codes.

    Returns the formula of NAC App. B.1, ``L (2 d_in d_h + 2 d_c d_h) + U d_c``, and the exact count
    of this implementation. They differ because App. B.1 counts the first layer's conditioning
    matrix as ``d_c x d_h`` where NAC eq. 1 makes it ``d_in x d_c``, and leaves out biases and alpha;
    both grow with the number of modules by exactly ``U d_c``.
    """
    L, d_in, d_h, d_c, U = num_ffns, in_features, hidden_features, code_features, num_modules
    paper = L * (2 * d_in * d_h + 2 * d_c * d_h) + U * d_c
    per_ffn = (d_h * d_in + d_h + d_in * d_c + 1) + (d_in * d_h + d_in + d_h * d_c + 1)
    return {"paper": paper, "exact": L * per_ffn + U * d_c}
