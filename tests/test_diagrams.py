"""The architecture pictures (modnets.diagrams): each names the parts its chapter derives."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from modnets import diagrams  # noqa: E402

PARTS = {
    "neural_interpreter": [
        "script 1",
        "type inference",
        "type matching",
        "LOCs",
        "codes",
        "signatures",
        "residual",
    ],
    "function_streams": ["(B, U, T, d)", "stream u = 1", "ModAttn", "C_{ui}"],
    "neural_attentive_circuit": [
        "generator",
        "link probabilities",
        "sparse kernel",
        "read-in",
        "propagators",
        "read-out",
        "graph prior",
    ],
    "neural_function_modules": ["memory", "pass 1", "pass 2", "top k", "gamma"],
    "loc_inside": ["LayerNorm", "ModAttn", "ModMLP", "C_{ui}", "code $c_u$"],
    "skmdpa_kernel": ["signatures", "cosine distance", "truncation", "Concrete", "softmax"],
    "prior_matching": ["graphon", "permutation", "NAC eq. 6", "NAC eq. 9"],
    "evidence_protocol": ["selection seeds", "pilot", "power", "replication", "agree", "Holm"],
}


def test_every_diagram_is_drawn_in_a_chapter_that_says_what_to_see():
    from modnets.exercises import NOTEBOOKS

    text = "".join(p.read_text() for p in NOTEBOOKS.glob("*.py"))
    missing = [n for n in diagrams.DIAGRAMS if f'diagrams.draw("{n}")' not in text]
    assert not missing, f"no chapter draws {missing}"


@pytest.mark.parametrize("name", sorted(diagrams.DIAGRAMS))
def test_each_diagram_names_the_parts_of_its_architecture(name):
    fig = diagrams.draw(name)
    ax = fig.axes[0]
    text = " ".join([t.get_text() for t in ax.texts] + [ax.get_title()]).replace("\\", "")
    missing = [part for part in PARTS[name] if part not in text]
    assert not missing, f"{name} lacks {missing}"
    assert len(ax.patches) >= 5  # boxes and arrows, not an empty canvas
    plt.close(fig)


def test_an_unknown_diagram_names_the_known_ones():
    with pytest.raises(ValueError, match="neural_interpreter"):
        diagrams.draw("transformer")


def test_nfm_passes_start_from_the_input_and_meet_only_through_the_memory():
    """NFM Algorithm 1 sets h(0) := x at every pass: no arrow may run from one pass's blocks into
    the next pass's, and an arrow from the input reaches the first block of each pass."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig = diagrams.draw("neural_function_modules")
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    label = {t.get_text(): t.get_position() for t in ax.texts}
    blocks = [b for b in boxes if b.get_width() < 1.2 and b.get_height() < 0.8]
    rows = sorted({round(b.get_y(), 3) for b in blocks}, reverse=True)  # pass 1 on top
    assert len(rows) == 2 and label  # two passes drawn

    def row_of(point):
        x, y = point
        return next((r for r in rows if r <= y <= r + 0.7 and x >= 1.3), None)

    arrows = [a._posA_posB for a in ax.patches if isinstance(a, FancyArrowPatch)]
    crossing = [
        (a, b) for a, b in arrows if None not in (row_of(a), row_of(b)) and row_of(a) != row_of(b)
    ]
    assert crossing == [], "an arrow runs from one pass into another"
    first = [(a, b) for a, b in arrows if a[0] < 1.3 and b[0] == pytest.approx(1.3)]
    assert sorted(round(b[1] - 0.35, 3) for _, b in first) == sorted(rows)  # x into every pass
    plt.close(fig)


@pytest.mark.parametrize(
    "name", ["fuzzy_boolean", "tiny_imagenet", "stacked_mnist", "side_by_side"]
)
def test_each_experiment_chapter_draws_its_own_protocol(name):
    """An experiment's protocol names its own selection seeds and, where its evidence record has
    a plan, the plan's n and seeds (the check can fail: the generic drawing names neither)."""
    from modnets.exercises import NOTEBOOKS
    from modnets.experiments.core import evidence, evidence_report
    from modnets.experiments.core.discovery import get
    from modnets.profiles import select

    experiment = get(name)
    chapter = (NOTEBOOKS / f"{experiment.chapter}.py").read_text()
    assert f'evidence_report.protocol_figure("{name}", PROFILE)' in chapter
    fig = evidence_report.protocol_figure(name, "cpu")
    text = " ".join(t.get_text() for t in fig.axes[0].texts).replace("\n", " ")
    selection = select(experiment.configs, "cpu").selection_seeds
    assert all(str(s) in text for s in selection)
    try:
        plan = evidence.load_record(experiment, "cpu").plan
    except FileNotFoundError:
        assert "$n$ seeds" in text
    else:
        assert f"$n$ = {plan.n}" in text and str(plan.seeds["replication"][0]) in text
    plt.close(fig)
