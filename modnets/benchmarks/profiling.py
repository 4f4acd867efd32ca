"""Where a step's time goes, by operator class: matrix products, fused attention, element-wise
work, reductions and norms, copies and layout changes, and the rest. How a ratio between two
models moves with the machine's matrix-product rate follows from it: a faster GEMM shrinks the
first class and leaves the others, so the model with more time outside GEMMs falls behind."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["GEMM_OPS", "OPERATOR_CLASSES", "classify", "gemm_time", "operator_classes"]

#: Each class and the ATen operators (without ``aten::``) it holds; an operator in none is
#: "other". In-place forms (``mul_``) count with their operator.
OPERATOR_CLASSES = {
    "matrix products": (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "dot",
        "mv",
        "addmv",
        "linear",
        "matmul",
        "mkldnn_convolution",
        "convolution_backward",
        "_convolution",
        "mkldnn_linear",
    ),
    "fused attention": (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
    ),
    "element-wise": (
        "mul",
        "add",
        "sub",
        "div",
        "rsub",
        "neg",
        "reciprocal",
        "pow",
        "sqrt",
        "rsqrt",
        "exp",
        "log",
        "tanh",
        "sigmoid",
        "relu",
        "gelu",
        "silu",
        "threshold_backward",
        "gelu_backward",
        "silu_backward",
        "sigmoid_backward",
        "tanh_backward",
        "where",
        "clamp",
        "clamp_min",
        "maximum",
        "minimum",
        "addcmul",
        "addcdiv",
        "lerp",
        "fill",
        "zero",
        "masked_fill",
        "eq",
        "ne",
        "gt",
        "lt",
        "ge",
        "le",
        "abs",
        "sign",
    ),
    "reductions and norms": (
        "sum",
        "mean",
        "var",
        "std",
        "amax",
        "max",
        "min",
        "norm",
        "_softmax",
        "_softmax_backward_data",
        "_log_softmax",
        "_log_softmax_backward_data",
        "native_layer_norm",
        "native_layer_norm_backward",
        "topk",
        "cumsum",
        "_foreach_norm",
    ),
    "copies and layout": (
        "copy",
        "_to_copy",
        "clone",
        "contiguous",
        "cat",
        "stack",
        "index",
        "index_select",
        "index_put",
        "gather",
        "scatter",
        "scatter_add",
        "repeat",
        "empty",
        "empty_strided",
        "zeros",
        "ones",
        "new_zeros",
        "new_empty",
        "new_empty_strided",
    ),
}

_CLASS_OF = {op: cls for cls, ops in OPERATOR_CLASSES.items() for op in ops}


def classify(name: str) -> str:
    """The class of a profiled operator name (``"aten::mul_"`` -> ``"element-wise"``)."""
    op = name.removeprefix("aten::")
    return _CLASS_OF.get(op, _CLASS_OF.get(op.rstrip("_"), "other"))


@contextlib.contextmanager
def _native_stderr_silenced():
    """The profiler's C++ side writes a line to the process's stderr at every start and stop
    (where a notebook shows it in the cell's output): stderr goes to the null device meanwhile.
    Python exceptions still propagate."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def operator_classes(fn: Callable[[], object], repeats: int = 3) -> dict[str, float]:
    """Milliseconds per call of ``fn`` by operator class (:data:`OPERATOR_CLASSES`): each ATen
    operator's own time (self CPU time, so nothing is counted twice), summed over its class,
    after one warm-up call. The profiler adds a fixed cost per operator call, so a model made of
    many small operators shows more of its time outside the matrix products than it spends there
    unprofiled: compare the classes of two models profiled alike, not the totals with a timing."""
    fn()
    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn()
    out = dict.fromkeys([*OPERATOR_CLASSES, "other"], 0.0)
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            out[classify(event.key)] += event.self_cpu_time_total / 1e3 / repeats
    return out


#: The operators that run a matrix product (BLAS / oneDNN, convolutions, the fused attention
#: kernel), as the dispatcher names them: their time is what no compiler can remove from a step
#: without changing its shapes.
GEMM_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "convolution_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)


class _GemmClock(TorchDispatchMode):
    """Times every call of :data:`GEMM_OPS` that reaches the dispatcher (backward included)."""

    def __init__(self):
        super().__init__()
        self.per_op: dict[str, float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if name not in GEMM_OPS:
            return func(*args, **(kwargs or {}))
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.per_op[name] = self.per_op.get(name, 0.0) + time.perf_counter() - start
        return out


def gemm_time(step: Callable[[], None], steps: int = 3) -> tuple[float, dict[str, float]]:
    """Seconds per ``step`` spent inside :data:`GEMM_OPS` (after one warm-up step), and that
    time per operator."""
    step()
    with _GemmClock() as clock:
        for _ in range(steps):
            step()
    per_op = {k: t / steps for k, t in clock.per_op.items()}
    return sum(per_op.values()), per_op
