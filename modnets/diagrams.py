"""Pictures of the architectures, drawn with matplotlib so that they render anywhere (the book,
Colab, a terminal saving a file): the Neural Interpreter (NI Fig. 1), its function streams, the
Neural Attentive Circuit's generator and executor (NAC Fig. 1), NFM's passes over a growing
memory (NFM Algorithm 1), the inside of a LOC, SKMDPA's kernel, the graph prior's matching and
how an experiment decides a claim. ``draw(name)`` returns the figure; :data:`DIAGRAMS` lists the names.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

__all__ = ["DIAGRAMS", "draw"]

# one colour per role, the same in every picture
COLOURS = {
    "data": "#e8e8e8",
    "route": "#fde2b8",  # what decides routing: types, signatures, link probabilities, reads
    "module": "#cfe3f7",  # what computes: functions, processor modules, blocks
    "code": "#d9ecd0",  # what is shared or conditioned on: codes
    "panel": "#fafafa",
}


def _box(ax, x, y, w, h, text, role="module", size=9, **kw):
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            fc=COLOURS[role],
            ec="#555555",
            lw=0.8,
            **kw,
        )
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)


def _arrow(ax, start, end, style="-|>", **kw):
    kw.setdefault("color", "#333333")
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, lw=0.9, **kw))


def _canvas(width: float, height: float, title: str):
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10 * height / width)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    return fig, ax


def neural_interpreter():
    """NI Fig. 1: tokens through scripts; inside a script, function iterations; inside one,
    type matching routes each token to functions made of LOCs modulated by their codes."""
    fig, ax = _canvas(10, 4.8, "Neural Interpreter (NI eqs. 1-14)")
    top, h = 3.7, 0.7
    row = [
        (0.1, 1.1, "input x", "data"),
        (1.5, 1.5, "tokenizer\n+ CLS tokens", "data"),
        (3.4, 1.1, "script 1", "module"),
        (5.3, 1.2, "script $n_s$", "module"),
        (6.9, 1.5, "heads on the\nCLS tokens", "data"),
        (8.8, 1.1, "logits", "data"),
    ]
    for x, w, text, role in row:
        _box(ax, x, top, w, h, text, role)
    ax.text(4.9, top + h / 2, "...", ha="center", va="center", fontsize=12)
    for (x0, w0, *_), (x1, *_) in zip(row, row[1:], strict=False):
        _arrow(ax, (x0 + w0, top + h / 2), (x1, top + h / 2))
    # the zoom: one script = a function iteration, repeated n_i times with shared parameters
    ax.add_patch(Rectangle((0.1, 0.15), 9.8, 3.15, fc=COLOURS["panel"], ec="#999999", ls="--"))
    _arrow(ax, (3.95, top), (3.95, 3.3), style="-", ls="--", color="#999999")
    ax.text(
        0.25,
        3.05,
        "a script: one function iteration applied $n_i$ times (NI eq. 14)",
        fontsize=9,
        style="italic",
    )
    mid = 1.55
    _box(ax, 0.3, mid - 0.35, 1.0, 0.7, "tokens\n$x_i$", "data")
    _box(ax, 1.7, mid - 0.45, 1.6, 0.9, "type inference\n$t_i$ (NI eq. 2)", "route")
    _box(
        ax,
        3.7,
        mid - 0.6,
        2.0,
        1.2,
        "type matching\n$C_{ui}$: kernel of\n$d(s_u, t_i)$, cut at $\\tau$\n(NI eqs. 2-3)",
        "route",
        size=8,
    )
    for k in range(3):  # U functions, drawn as a stack
        _box(
            ax,
            6.15 + 0.12 * k,
            0.5 + 0.15 * k,
            2.0,
            1.5,
            ""
            if k < 2
            else "function $u$:\n$n_l$ LOCs (ModAttn\n+ ModMLP), each\nmodulated by code $c_u$",
            "module",
            size=8,
        )
    _box(ax, 3.75, 2.35, 1.9, 0.45, "signatures $s_u$", "route", size=8)
    _box(ax, 6.6, 2.35, 1.6, 0.45, "codes $c_u$", "code", size=8)
    _box(
        ax,
        8.75,
        mid - 0.45,
        1.05,
        0.9,
        "$x_i\\ +$\n$\\sum_u C_{ui} f_u$\n(NI eq. 11)",
        "data",
        size=8,
    )
    _arrow(ax, (1.3, mid), (1.7, mid))
    _arrow(ax, (3.3, mid), (3.7, mid))
    _arrow(ax, (5.7, mid), (6.15, mid))
    _arrow(ax, (8.5, mid), (8.75, mid))
    _arrow(ax, (4.7, 2.35), (4.7, mid + 0.6), color="#b07a2a")
    _arrow(ax, (7.4, 2.35), (7.4, 2.3), color="#6a9a55")
    _arrow(ax, (0.8, mid - 0.35), (0.8, 0.35), style="-", color="#999999")
    _arrow(ax, (0.8, 0.35), (9.3, 0.35), style="-", color="#999999")
    _arrow(ax, (9.3, 0.35), (9.3, mid - 0.45), color="#999999")
    ax.text(
        3.0,
        0.2,
        "residual: a token no function takes passes unchanged",
        fontsize=7.5,
        color="#666666",
    )
    return fig


def function_streams():
    """Chapter 3's layout: every function runs on its own copy of the tokens, one
    ``(B, U, T, d)`` tensor; the compatibilities ``C`` (B, U, T) weight and mask each stream."""
    fig, ax = _canvas(8, 3.4, "One tensor for every function's stream: (B, U, T, d)")
    for u in reversed(range(4)):  # back to front: stream 1 in front
        x, y = 0.5 + 0.35 * u, 0.6 + 0.3 * u
        ax.add_patch(Rectangle((x, y), 3.2, 2.0, fc=COLOURS["module"], ec="#555555", lw=0.8))
        label = f"stream u = {u + 1}" if u < 3 else "stream u = U"
        ax.text(x + 3.1, y + 1.85, label, fontsize=7, ha="right", va="top")
    for t in range(1, 5):  # the front stream's T tokens, one row each
        ax.plot([0.5, 3.7], [0.6 + 0.4 * t - 0.1, 0.6 + 0.4 * t - 0.1], color="#777777", lw=0.5)
    ax.text(2.1, 0.3, "T tokens (rows) x d features", ha="center", fontsize=8)
    ax.text(0.3, 3.6, "a batch element: U copies of its tokens", fontsize=9, style="italic")
    _box(
        ax,
        6.2,
        2.3,
        3.5,
        0.9,
        "ModAttn: projections modulated\nby each stream's code $c_u$",
        "code",
        size=8,
    )
    _box(
        ax,
        6.2,
        0.9,
        3.5,
        0.9,
        "attention within each stream,\nweighted and masked by $C_{ui}$",
        "route",
        size=8,
    )
    _arrow(ax, (5.6, 2.75), (6.2, 2.75))
    _arrow(ax, (5.6, 1.35), (6.2, 1.35))
    return fig


def neural_attentive_circuit():
    """NAC Fig. 1: a generator designs the circuit (codes, signatures, link probabilities and the
    sparse kernel); the executor reads the input into processor modules, propagates over the
    kernel's edges and reads out."""
    fig, ax = _canvas(10, 4.6, "Neural Attentive Circuit (NAC eqs. 1-5)")
    gy = 3.0
    ax.add_patch(Rectangle((0.1, 2.75), 9.8, 1.7, fc=COLOURS["panel"], ec="#999999", ls="--"))
    ax.text(0.25, 4.2, "generator: the circuit's design", fontsize=9, style="italic")
    _box(ax, 0.4, gy, 2.0, 0.9, "codes $c_u$ and\nsignatures $s_u$", "code")
    _box(
        ax,
        3.0,
        gy,
        2.6,
        0.9,
        "link probabilities\n$P_{ij}$ from $d(s_i, s_j)$\n(NAC eq. 2)",
        "route",
        size=8,
    )
    _box(ax, 6.2, gy, 1.7, 0.9, "sparse kernel\n$K_{ij}$ (NAC eq. 2)", "route", size=8)
    _box(ax, 8.2, gy, 1.5, 0.9, "graph prior\n(NAC eq. 6)", "route", size=8)
    _arrow(ax, (2.4, gy + 0.45), (3.0, gy + 0.45))
    _arrow(ax, (5.6, gy + 0.45), (6.2, gy + 0.45))
    _arrow(ax, (8.2, gy + 0.45), (5.6, gy + 0.6), color="#b07a2a", connectionstyle="arc3,rad=0.3")
    ey, eh = 0.8, 1.0
    ax.text(0.25, 2.25, "executor: the circuit run on one input", fontsize=9, style="italic")
    row = [
        (0.2, 1.3, "input\ntokens $x_j$", "data"),
        (1.9, 2.0, "read-in: modules\nattend to the input\n(NAC eqs. 4-5)", "module"),
        (
            4.5,
            2.3,
            "$L$ propagators:\nSKMDPA over the\nkernel's edges\n(NAC eq. 3) + ModFFN",
            "module",
        ),
        (7.4, 1.4, "read-out\nmodules", "module"),
        (9.1, 0.75, "logits", "data"),
    ]
    for x, w, text, role in row:
        _box(ax, x, ey, w, eh, text, role, size=8)
    for (x0, w0, *_), (x1, *_) in zip(row, row[1:], strict=False):
        _arrow(ax, (x0 + w0, ey + eh / 2), (x1, ey + eh / 2))
    _arrow(ax, (1.4, gy), (2.9, ey + eh), color="#6a9a55")  # codes condition every module
    _arrow(ax, (7.05, gy), (5.65, ey + eh), color="#b07a2a")  # the kernel gates propagation
    ax.text(
        0.2,
        0.3,
        "each module is the same weights under its own code (ModFC, NAC eq. 1); "
        "dropping modules removes rows of the circuit",
        fontsize=7.5,
        color="#666666",
    )
    return fig


def neural_function_modules():
    """NFM Algorithm 1: ``N`` blocks run for ``K`` passes; each pass starts again from the input
    (``h(0) := x``) and each block writes its state to a memory that every later read attends to
    (sparsely, top-k, with a default slot): a pass hands nothing to the next but the memory."""
    fig, ax = _canvas(10, 4.2, "Neural Function Modules (NFM Algorithm 1, NFM eqs. 1-3)")
    N, K = 4, 2
    rows = [2.6 - 1.55 * k for k in range(K)]
    _box(ax, 0.1, rows[-1], 0.8, rows[0] - rows[-1] + 0.7, "input\n$x$", "data", size=8)
    for k, y in enumerate(rows):
        ax.text(1.3 + 1.55 * N - 0.35, y + 0.3, f"pass {k + 1}", fontsize=8, style="italic")
        _arrow(ax, (0.9, y + 0.35), (1.3, y + 0.35))  # h(0) := x, every pass
        for i in range(N):
            x = 1.3 + 1.55 * i
            _box(ax, x, y, 1.1, 0.7, f"block {i + 1}\n+ NFM read", "module", size=8)
            if i:
                _arrow(ax, (x - 0.45, y + 0.35), (x, y + 0.35))
            _arrow(ax, (x + 0.55, y + 0.7), (x + 0.55, 3.6), style="-", color="#cccccc")
    _box(
        ax,
        1.3,
        3.6,
        1.55 * N - 0.45,
        0.55,
        "memory: every state written so far (it grows by one state per block)",
        "route",
        size=8,
    )
    _box(
        ax,
        7.8,
        0.5,
        2.0,
        2.6,
        "a read (NFM eqs.\n1-3): attend to the\nmemory, keep the\ntop k, "
        "project,\nadd with a gate\n$\\gamma = 0$ at\ninitialisation",
        "route",
        size=8,
    )
    ax.text(
        1.3,
        0.35,
        "each pass starts again from $x$; pass 2 reads what pass 1 wrote through the memory only",
        fontsize=7.5,
        color="#666666",
    )
    return fig


def _flow(ax, y, h, row, size=8):
    """A left-to-right row of boxes ``(x, width, text, role)`` joined by arrows."""
    for x, w, text, role in row:
        _box(ax, x, y, w, h, text, role, size=size)
    for (x0, w0, *_), (x1, *_) in zip(row, row[1:], strict=False):
        _arrow(ax, (x0 + w0, y + h / 2), (x1, y + h / 2))


def loc_inside():
    """A line of code (NI eqs. 9-10), one function's stream: pre-LayerNorm, ModAttn and ModMLP
    programmed by the function's code, each residual branch scaled by the compatibility."""
    fig, ax = _canvas(10, 3.6, "Inside a LOC (NI eqs. 9-10), for function $u$ and token $i$")
    y, h = 1.9, 0.9
    _flow(
        ax,
        y,
        h,
        [
            (0.1, 1.1, "stream\n$x_{ui}$", "data"),
            (1.6, 1.1, "LayerNorm", "module"),
            (3.1, 1.5, "ModAttn over\nthe stream's\ntokens", "module"),
            (5.0, 1.3, "$a_{ui} = x_{ui}$\n$+ C_{ui} \\cdot$ it", "route"),
            (6.7, 1.1, "LayerNorm", "module"),
            (8.2, 1.4, "ModMLP;\n$+ C_{ui} \\cdot$ it", "route"),
        ],
    )
    _box(ax, 2.3, 0.3, 2.6, 0.8, "code $c_u$: programs\nevery ModLin", "code", size=8)
    _box(ax, 5.4, 0.3, 2.9, 0.8, "compatibility $C_{ui}$\n(type matching)", "route", size=8)
    for x in (3.85, 8.9):
        _arrow(ax, (3.6, 1.1), (x, y), color="#6a9a55")
    for x in (5.65, 8.9):
        _arrow(ax, (6.85, 1.1), (x, y), color="#b07a2a")
    ax.text(
        0.1,
        3.15,
        "a token no function matches ($C_{ui} = 0$) passes through unchanged",
        fontsize=8,
        color="#666666",
    )
    return fig


def skmdpa_kernel():
    """SKMDPA's kernel (NAC eqs. 2-3): signatures give distances, distances link
    probabilities, a truncation and a Concrete sample the kernel, whose log is added to the
    attention logits before the softmax."""
    fig, ax = _canvas(10, 3.4, "SKMDPA's kernel (NAC eqs. 2-3)")
    y, h = 1.7, 1.0
    _flow(
        ax,
        y,
        h,
        [
            (0.1, 1.3, "signatures\n$s_i$, $s_j$", "code"),
            (1.8, 1.5, "cosine distance\n$d_{ij} = 1 - \\cos$", "route"),
            (
                3.7,
                1.6,
                "$P_{ij} = \\exp(-d_{ij} / \\epsilon)$;\n0 where $d_{ij} > \\tau$\n(truncation)",
                "route",
            ),
            (5.7, 1.5, "Concrete sample\n$K_{ij} \\sim P_{ij}$\n(training)", "route"),
            (
                7.6,
                2.2,
                "softmax$_j$($q_i \\cdot k_j / \\sqrt{d}$\n$+ \\log K_{ij}$) $v_j$",
                "module",
            ),
        ],
    )
    ax.text(
        0.1,
        0.9,
        "$K_{ij} = 0$ closes the link: module $i$ never reads module $j$; evaluation uses $P$",
        fontsize=8,
        color="#666666",
    )
    return fig


def prior_matching():
    """The graph prior (NAC eqs. 6-9): the circuit's link probabilities against a graphon's,
    after the relabelling of the modules that matches them best."""
    fig, ax = _canvas(10, 3.4, "Matching the circuit to its graph prior (NAC eqs. 6-9)")
    _box(ax, 0.1, 1.9, 2.2, 0.9, "link probabilities\n$P$ (learned)", "route")
    _box(ax, 0.1, 0.5, 2.2, 0.9, "graphon $W$ on a grid:\n$P^{(0)}$ (NAC eq. 7)", "data")
    _box(ax, 3.1, 1.2, 2.4, 0.9, "relabelling $\\sigma$:\na permutation\n(NAC eq. 9)", "route")
    _box(
        ax,
        6.3,
        1.2,
        3.5,
        0.9,
        "NAC eq. 6: $\\sum_{i \\neq j} (P_{ij} - P^{(0)}_{\\sigma(i)\\sigma(j)})^2$\nadded to the loss",
        "module",
        size=8,
    )
    _arrow(ax, (2.3, 2.35), (3.1, 1.8))
    _arrow(ax, (2.3, 0.95), (3.1, 1.5))
    _arrow(ax, (5.5, 1.65), (6.3, 1.65))
    ax.text(
        0.1,
        3.05,
        "the prior fixes the graph's shape, not which module plays which part",
        fontsize=8,
        color="#666666",
    )
    return fig


#: The generic protocol's steps (chapter 4b); an experiment's own fill in its seeds and n
#: (:func:`modnets.experiments.core.evidence_report.protocol_boxes`).
PROTOCOL_STEPS = (
    "rules declared;\nsettings chosen\non selection seeds",
    "pilot seeds\n(900-902):\nthe spread",
    "plan: $n$ seeds\nby power\n(mde)",
    "claim seeds and\nreplication seeds:\nregime, mechanism,\nHolm",
    "decided where\nboth sets agree",
)


def evidence_protocol(
    title: str = "How each experiment decides a paper's claim",
    boxes: tuple[str, ...] = PROTOCOL_STEPS,
):
    """How a claim is decided (chapter 4b): rules and selection first, a pilot sets the number
    of seeds, two disjoint seed sets decide, and the claim counts where they agree. ``title``
    and the five ``boxes`` default to the generic steps; an experiment chapter passes its own
    (:func:`modnets.experiments.core.evidence_report.protocol_figure`)."""
    if len(boxes) != len(PROTOCOL_STEPS):
        raise ValueError(f"boxes must hold {len(PROTOCOL_STEPS)} texts, got {len(boxes)}")
    fig, ax = _canvas(10, 3.2, title)
    xs = ((0.1, 1.9, "code"), (2.4, 1.4, "data"), (4.2, 1.5, "route"), (6.1, 1.9, "module"))
    row = [(x, w, text, role) for (x, w, role), text in zip(xs, boxes, strict=False)]
    _flow(ax, 1.5, 1.2, [*row, (8.4, 1.5, boxes[4], "route")], size=7.5)
    ax.text(
        0.1,
        0.8,
        "every seed's record is committed with the code and machine that made it",
        fontsize=8,
        color="#666666",
    )
    return fig


#: ``name -> drawing function``: what :func:`draw` knows.
DIAGRAMS = {
    "neural_interpreter": neural_interpreter,
    "function_streams": function_streams,
    "neural_attentive_circuit": neural_attentive_circuit,
    "neural_function_modules": neural_function_modules,
    "loc_inside": loc_inside,
    "skmdpa_kernel": skmdpa_kernel,
    "prior_matching": prior_matching,
    "evidence_protocol": evidence_protocol,
}


def draw(name: str):
    """The figure of diagram ``name`` (one of :data:`DIAGRAMS`)."""
    if name not in DIAGRAMS:
        raise ValueError(f"name must be one of {sorted(DIAGRAMS)}, got {name!r}")
    return DIAGRAMS[name]()
