"""The equation index: every numbered item of the three papers, with the code that computes it,
the test that pins it and the chapter that derives it.

The index is data (:data:`EQUATIONS`, one :class:`Equation` per row); :func:`render` writes the
book's page from it::

    python -m modnets.equations > book/equations.md      # or: make equations

``tests/test_equations.py`` checks that every numbered item has a row, that every row names code
that imports, a test that exists and a chapter that mentions the item, and that the page is the
rendering of this module.

Labels follow the library's convention: ``NI eq. 4``, ``NAC eq. 6``, ``NFM Algorithm 1``. The NFM
paper prints no equation numbers; ``NFM eqs. 1-3`` are the three formulas of its §3.2.1 in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = ["PAPERS", "Equation", "EQUATIONS", "render"]

#: Abbreviation -> (title, BibTeX key in book/references.bib).
PAPERS = {
    "NI": ("Neural Interpreters", "rahaman2021interpreters"),
    "NAC": ("Neural Attentive Circuits", "weiss2022circuits"),
    "NFM": ("Neural Function Modules", "lamb2021nfm"),
}


@dataclass(frozen=True)
class Equation:
    """One numbered item of a paper and where the library has it.

    Attributes:
        paper: ``"NI"``, ``"NAC"`` or ``"NFM"`` (keys of :data:`PAPERS`).
        number: the item's number in the paper.
        what: what it is, in a few words and the formula (MyST markdown; no ``|``).
        code: the defining ``module.Class``, ``module.function`` or ``module.Class.method``
            that computes it (one or more).
        test: the pytest node id ``tests/test_x.py::test_name`` that pins it.
        chapter: the notebook that derives it, e.g. ``notebooks/03_modattn_and_loc.ipynb``.
        kind: ``"eq."`` or ``"Algorithm"``.
    """

    paper: str
    number: int
    what: str
    code: tuple[str, ...]
    test: str
    chapter: str
    kind: str = "eq."

    def __post_init__(self) -> None:
        if isinstance(self.code, str):
            object.__setattr__(self, "code", (self.code,))

    @property
    def item(self) -> str:
        """The item column: ``kind`` and ``number`` (``"Algorithm 1"``, or an equation)."""
        return f"{self.kind} {self.number}"

    @property
    def label(self) -> str:
        """``"NI eq. 4"``: how the library, the tests and the chapters refer to it."""
        return f"{self.paper} {self.item}"

    @property
    def chapter_number(self) -> int:
        """The chapter's number, from its file name (``03_modattn_and_loc.ipynb`` -> 3)."""
        return int(PurePosixPath(self.chapter).name.split("_", 1)[0])


def _ni(number: int, what: str, code, test: str, chapter: str) -> Equation:
    return Equation("NI", number, what, code, test, f"notebooks/{chapter}.ipynb")


def _nac(number: int, what: str, code, test: str, chapter: str) -> Equation:
    return Equation("NAC", number, what, code, test, f"notebooks/{chapter}.ipynb")


def _nfm(number: int, what: str, code, test: str, kind: str = "eq.") -> Equation:
    chapter = "notebooks/11_neural_function_modules.ipynb"
    return Equation("NFM", number, what, code, test, chapter, kind)


_TYPES = "modnets.nn.type_matching"
_MOD = "modnets.nn.modulated"
_ATTN = "modnets.nn.modattn.ModAttn"
_NI_T = "tests/test_ni.py::"
_MOD_T = "tests/test_modulated.py::"
_GRAPH_T = "tests/test_graphs.py::"
_NFM_T = "tests/test_nfm.py::"

#: The index, in the papers' order: NI eqs. 1-15, NAC eqs. 1-10, NFM eqs. 1-3, NFM Algorithm 1.
EQUATIONS: tuple[Equation, ...] = (
    # ---------------------------------------------------------------- Neural Interpreters
    _ni(
        1,
        r"the model, a stack of $n_s$ scripts: $\{y_j\} = \mathrm{Script}_{n_s} \circ \dots \circ \mathrm{Script}_1(\{x_i\})$",
        "modnets.models.ni.NeuralInterpreter",
        _NI_T + "test_model_composes_its_scripts_and_a_script_repeats_one_function_iteration",
        "04_neural_interpreter",
    ),
    _ni(
        2,
        r"types and compatibilities: $t_i = \mathrm{TypeInference}(x_i)$, $C_{ui} = \tilde C_{ui} / (\epsilon + \sum_u \tilde C_{ui})$",
        (f"{_TYPES}.TypeInference", f"{_TYPES}.TypeMatching"),
        _NI_T + "test_compatibilities_normalised_over_functions",
        "02_type_matching",
    ),
    _ni(
        3,
        r"the truncated kernel: $d_\mathcal{T}(s_u, t_i) = 1 - s_u \cdot t_i$, $\tilde C_{ui} = \exp(-d_\mathcal{T}(s_u, t_i) / \sigma)$ where $d_\mathcal{T} < \tau$, else 0",
        f"{_TYPES}.TypeMatching.kernel",
        _NI_T + "test_mask_direction_close_types_pass_far_types_are_cut",
        "02_type_matching",
    ),
    _ni(
        4,
        r"ModLin: $y = W(x \odot \mathrm{LayerNorm}(W_c c)) + b$",
        f"{_MOD}.ModLin",
        _MOD_T + "test_equation_against_direct_reference",
        "01_modulated_linear",
    ),
    _ni(
        5,
        r"ModMLP: $L$ ModLins sharing the code $c$, GELU between them",
        f"{_MOD}.ModMLP",
        _MOD_T + "test_modmlp_is_composition_of_modlins",
        "01_modulated_linear",
    ),
    _ni(
        6,
        r"ModAttn's projections: $q_{uhi}, k_{uhi}, v_{uhi} = \mathrm{ModLin}^h_{query, key, value}(x_i; c_u)$",
        _ATTN,
        _NI_T + "test_modattn_vectorised_equals_loop",
        "03_modattn_and_loc",
    ),
    _ni(
        7,
        r"ModAttn's weights: $\tilde W_{uhij} = C_{ui} C_{uj} \mathrm{softmax}_j(q_{uhi} \cdot k_{uhj} / \sqrt{d_\text{key}})$, $W_{uhij} = \tilde W_{uhij} / (\epsilon + \sum_j \tilde W_{uhij})$",
        f"{_ATTN}.attention_weights",
        _NI_T + "test_modattn_rows_sum_to_one_or_zero_and_renormalise_not_resoftmax",
        "03_modattn_and_loc",
    ),
    _ni(
        8,
        r"ModAttn's output: $y_{ui} = \mathrm{ModLin}(\tilde y_{ui;h}; c_u)$, $\tilde y_{uhi} = \sum_j W_{uhij} v_{uhj}$",
        _ATTN,
        _NI_T + "test_modattn_vectorised_equals_loop",
        "03_modattn_and_loc",
    ),
    _ni(
        9,
        r"LOC, attention half: $a_{ui} = x_{ui} + C_{ui} \mathrm{ModAttn}(\{\mathrm{LN}(x_{uj})\}_j; c_u, \{C_{uj}\}_j)$",
        "modnets.nn.loc.LOC",
        _NI_T + "test_loc_vectorised_equals_per_function_loop",
        "03_modattn_and_loc",
    ),
    _ni(
        10,
        r"LOC, MLP half: $y_{ui} = a_{ui} + C_{ui} \mathrm{ModMLP}(\mathrm{LN}(a_{ui}); c_u)$, so $y_{ui} = x_{ui}$ where $C_{ui} = 0$",
        "modnets.nn.loc.LOC",
        _NI_T + "test_loc_is_identity_where_compatibility_is_zero",
        "03_modattn_and_loc",
    ),
    _ni(
        11,
        r"interpreter: $y_i = x_i + \sum_u C_{ui} (\mathrm{LOC}_{n_l} \circ \dots \circ \mathrm{LOC}_1)(\{x_j\}; c_u, \{C_{uj}\})$ "
        '(as printed: `residual="literal"`)',
        "modnets.models.ni.Interpreter",
        _NI_T + "test_interpreter_residual_forms",
        "04_neural_interpreter",
    ),
    _ni(
        12,
        r"function iteration: $\{y_i\} = \mathrm{Interpreter}(\{x_j\}, \{c_u\}, \{C_{uj}\})$",
        "modnets.models.ni.FunctionIteration",
        _NI_T + "test_script_leaves_a_token_far_from_every_signature_unchanged",
        "04_neural_interpreter",
    ),
    _ni(
        13,
        r"function iteration's routing: $C_{uj} = \mathrm{TypeMatching}(s_u, x_j)$",
        "modnets.models.ni.FunctionIteration",
        _NI_T + "test_script_leaves_a_token_far_from_every_signature_unchanged",
        "04_neural_interpreter",
    ),
    _ni(
        14,
        r"script: one function iteration applied $n_i$ times, sharing all parameters",
        "modnets.models.ni.Script",
        _NI_T + "test_model_composes_its_scripts_and_a_script_repeats_one_function_iteration",
        "04_neural_interpreter",
    ),
    _ni(
        15,
        r"fuzzy logic: $\mathrm{and}(x_i, x_j) = x_i x_j$, $\mathrm{not}(x_i) = 1 - x_i$, $\mathrm{or}(x_i, x_j) = 1 - (1 - x_i)(1 - x_j)$",
        tuple(f"modnets.data.fuzzy_boolean.fuzzy_{op}" for op in ("and", "not", "or")),
        "tests/test_fuzzy_boolean.py::test_fuzzy_operations_between_the_corners_are_ni_eq_15",
        "05_fuzzy_boolean",
    ),
    # ---------------------------------------------------------------- Neural Attentive Circuits
    _nac(
        1,
        r"ModFC: $y = W(x \odot (1 + \alpha \mathrm{LayerNorm}(W_c c))) + b$",
        f"{_MOD}.ModFC",
        _MOD_T + "test_equation_against_direct_reference",
        "01_modulated_linear",
    ),
    _nac(
        2,
        r"link probabilities and kernel: $P_{ij} = \exp(-d(s_i, s_j) / \epsilon)$, $K_{ij} \sim \mathrm{Concrete}(P_{ij}, \tau)$",
        ("modnets.nn.skmdpa.link_probabilities", "modnets.nn.skmdpa.concrete_sample"),
        "tests/test_skmdpa.py::test_link_probabilities_equation_2",
        "07_skmdpa",
    ),
    _nac(
        3,
        r"SKMDPA: $W_{i \leftarrow j} = \mathrm{softmax}_j(A_{i \leftarrow j} + \log \hat K_{ij})$, $\hat K_{ij} = K_{ij} / (\delta + \sum_j K_{ij})$, $y_i = \sum_j W_{i \leftarrow j} v_j$",
        "modnets.nn.skmdpa.SKMDPA",
        "tests/test_skmdpa.py::test_against_reference_and_rows_sum_to_one",
        "07_skmdpa",
    ),
    _nac(
        4,
        r"read-in projections: $q_u = \mathrm{ModFC}(\theta^{(0)}_u, c_u)$, $k_{uj} = \mathrm{ModFC}(x_j, c_u)$, $v_{uj} = \mathrm{ModFC}(x_j, c_u)$",
        "modnets.nn.read_in.ReadIn",
        "tests/test_read_in.py::test_each_module_reads_through_its_own_code",
        "09_neural_attentive_circuit",
    ),
    _nac(
        5,
        r"read-in: $\hat y_u = \sum_j \mathrm{softmax}_j(q_u \cdot k_{uj} / \sqrt{d}) v_{uj}$, $y_u = \mathrm{ModFC}(\hat y_u, c_u)$, $\theta^{(1)}_u = \mathrm{ModFFN}(y_u, c_u)$ (the softmax is ours: NAC eq. 5 as extracted prints none)",
        "modnets.nn.read_in.ReadIn",
        "tests/test_read_in.py::test_factorised_equals_naive",
        "09_neural_attentive_circuit",
    ),
    _nac(
        6,
        r"graph-prior regulariser: $L_\text{graph} = \sum_{i \ne j} (P_{ij} - P^{(0)}_{\sigma^*(i) \sigma^*(j)})^2$",
        "modnets.graphs.regularizer.GraphPriorRegularizer",
        _GRAPH_T + "test_match_permutation_is_the_regularizers_relabelling",
        "08_graph_priors",
    ),
    _nac(
        7,
        r"prior link probabilities, a graphon on a grid: $P^{(0)}_{ij} = W(r_i, r_j)$, $r_u = u / (U - 1)$",
        "modnets.graphs.graphons.graphon",
        _GRAPH_T + "test_graphon_defining_properties",
        "08_graph_priors",
    ),
    _nac(
        8,
        r"scale-free graphon: $W(r_i, r_j) = \frac{U^\beta}{16} (r_i + 1)^{-\beta} (r_j + 1)^{-\beta}$ ($r$ read as the node index)",
        "modnets.graphs.graphons.graphon",
        _GRAPH_T + "test_graphon_defining_properties",
        "08_graph_priors",
    ),
    _nac(
        9,
        r"Hungarian cost of a relabelling: $C_{vw} = \sum_i (P_{vi} - P^{(0)}_{wi})^2$",
        "modnets.graphs.matching.hungarian_permutation",
        _GRAPH_T + "test_hungarian_agrees_with_brute_force",
        "08_graph_priors",
    ),
    _nac(
        10,
        r"module importance: $q_i = \sum_j P_{ij}$ over the mediators $j$",
        "modnets.models.nac.circuit.NeuralAttentiveCircuit.module_importance",
        "tests/test_nac.py::test_module_importance_is_the_mediator_degree_of_nac_eq_10",
        "09_neural_attentive_circuit",
    ),
    # ---------------------------------------------------------------- Neural Function Modules
    _nfm(
        1,
        r"sparse read: $A = \mathrm{Softmax}(\hat Q \hat K^\top / d_k) V$, top-$k$, with a zero default slot (scaled by $\sqrt{d_\text{head}}$ here)",
        ("modnets.models.nfm.attention.NFMAttention", "modnets.models.nfm.attention.topk_softmax"),
        _NFM_T + "test_attention_matches_the_written_out_equations",
    ),
    _nfm(
        2,
        r"output projection: $h_1 = \sigma(A W_{o1}) W_{o2}$ (batch norm before $\sigma$ optional)",
        "modnets.models.nfm.attention.NFMAttention",
        _NFM_T + "test_batch_norm_before_the_activation",
    ),
    _nfm(
        3,
        r"gated residual: $h_2 = R + \gamma h_1$, $\gamma = 0$ at initialisation",
        "modnets.models.nfm.attention.NFMAttention",
        _NFM_T + "test_attention_matches_the_written_out_equations",
    ),
    _nfm(
        1,
        r"$N$ modules for $K$ passes, each reading the memory of every earlier state",
        "modnets.models.nfm.network.NFMNetwork",
        _NFM_T + "test_attendable_states_at_each_step",
        kind="Algorithm",
    ),
)


def _cell(text: str) -> str:
    if "|" in text or "\n" in text:
        raise ValueError(f"a table cell cannot hold '|' or a newline: {text!r}")
    return text


def _row(eq: Equation) -> str:
    code = ", ".join(f"`{name}`" for name in eq.code)
    chapter = f"[ch. {eq.chapter_number}](../{eq.chapter})"
    cells = (eq.paper, eq.item, eq.what, code, f"`{eq.test}`", chapter)
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def render(equations: tuple[Equation, ...] = EQUATIONS) -> str:
    """The book's page ``book/equations.md``: a title, two sentences and the table."""
    papers = [f"{title} {{cite}}`{key}` ({abbr})" for abbr, (title, key) in PAPERS.items()]
    lines = [
        "# Equation index",
        "",
        "% Generated from modnets/equations.py by `make equations`; edit that file, not this one.",
        "",
        "Every numbered equation of the three papers,",
        f"{papers[0]},",
        f"{papers[1]} and",
        f"{papers[2]},",
        "with the library code that computes it, the unit test that pins it and the chapter that",
        "derives it.",
        "`tests/test_equations.py` checks that each row's code imports, its test exists, its chapter",
        "names the equation, and that this page is generated from `modnets/equations.py`.",
        "",
        "The NFM paper prints no equation numbers. By this book's convention, NFM eqs. 1–3 are the",
        r"three formulas of its §3.2.1 in order: $A = \mathrm{Softmax}(\hat Q \hat K^\top / d_k) V$",
        r"(NFM eq. 1), $h_1 = \sigma(A W_{o1}) W_{o2}$ (NFM eq. 2) and $h_2 = R + \gamma h_1$",
        "(NFM eq. 3).",
        "",
        "| paper | item | what it is | code | pinned by | derived in |",
        "|---|---|---|---|---|---|",
        *(_row(eq) for eq in equations),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
