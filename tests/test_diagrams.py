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
}


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
