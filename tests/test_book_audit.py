"""The rendered book's audit (tests/book_audit.py), shown to fail on small made-up pages, and
the pieces of the library it relies on (progress bars off in a book build, text that fits)."""

import re

import pytest
from book_audit import MAX_COLUMNS, audit_page

from modnets.utils import TEXT_WIDTH, progress, wrap


def page(inputs=(), outputs=(), toc=()) -> str:
    """A page shaped like a myst-nb chapter: code cells, their outputs, a table of contents."""
    cells = []
    for code in inputs:
        cells.append(
            '<div class="cell docutils container"><div class="cell_input docutils container">'
            f'<div class="highlight"><pre><span></span><span class="n">{code}</span></pre>'
            "</div></div></div>"
        )
    for out in outputs:
        cells.append(
            '<div class="cell_output docutils container"><div class="output stream">'
            f'<div class="highlight"><pre><span></span>{out}</pre></div></div></div>'
        )
    links = "".join(f'<li><a class="nav-link" href="#x">{t}</a></li>' for t in toc)
    return (
        f'<html><body><nav class="bd-toc"><ul>{links}</ul></nav>'
        f"<article>{''.join(cells)}</article></body></html>"
    )


def table_page(cell: str) -> str:
    """A page whose one output is an HTML table (a pandas DataFrame) with ``cell`` in it."""
    return (
        '<html><body><article><div class="cell_output docutils container"><div class="output '
        f'text_html"><table><tr><th>paper</th></tr><tr><td>{cell}</td></tr></table></div></div>'
        "</article></body></html>"
    )


def test_a_clean_page_passes():
    html = page(["x = 1"], ["tensor([1., 2.])"], ["ModLin, step by step"])
    assert audit_page(html) == []
    # formatted numbers, a version string and a rule of dashes that is not a table pass
    assert audit_page(page(outputs=["58.89 | 0.123456 | torch 2.13.000 | ----"])) == []
    assert audit_page(table_page("58.89")) == []


@pytest.mark.parametrize(
    "html, rule",
    [
        (page(inputs=['if "google.colab" in sys.modules:']), "install_cell"),
        (page(inputs=["%pip install modnets"]), "install_cell"),
        (
            page(outputs=["\n".join(f"training: {k}0%|##   | {k}/10" for k in range(1, 6))]),
            "progress_spam",
        ),
        (
            page(outputs=["/tmp/ipykernel_1234/56.py:6: UserWarning: The given NumPy array"]),
            "temp_path_warning",
        ),
        (page(outputs=["x" * (MAX_COLUMNS + 1)]), "too_wide"),
        (page(inputs=["y" * (MAX_COLUMNS + 1)]), "too_wide"),
        (page(toc=["Neural Interpreters rahaman2021interpreters"]), "citation_in_toc"),
        (page(outputs=["| setting | ours |\n|---|---|\n| all | 0.99 |"]), "pipe_table"),
        (page(outputs=["paper: 58.890000"]), "six_digits"),
        (table_page("58.890000"), "six_digits"),
        (table_page("outside its evidence record"), "record_mismatch"),
    ],
)
def test_each_rule_fails_on_a_page_that_breaks_it(html, rule):
    problems = audit_page(html)
    assert problems and all(p.startswith(rule) for p in problems), problems


def test_a_line_at_the_column_fits_and_short_progress_is_allowed():
    bars = "\n".join(f"epoch: {k}0%|##   | {k}/10" for k in range(1, 4))
    assert audit_page(page(outputs=["x" * MAX_COLUMNS, bars])) == []


def test_progress_bars_are_off_when_the_book_builds(monkeypatch, capsys):
    monkeypatch.setenv("MODNETS_PROGRESS", "0")
    assert sum(progress(range(5), desc="training")) == 10  # still iterates
    bar = progress(total=3, desc="training")
    bar.update(3)
    bar.close()
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("MODNETS_PROGRESS", "1")
    list(progress(range(3), desc="training", mininterval=0))
    assert re.search(r"training: 100%", capsys.readouterr().out)  # on elsewhere: it can fail


def test_wrap_fits_the_column_and_leaves_short_lines_alone():
    text = "short line\n  " + " ".join(["word"] * 60)
    out = wrap(text)
    assert out.splitlines()[0] == "short line"
    assert all(len(line) <= TEXT_WIDTH for line in out.splitlines())
    assert out.splitlines()[2].startswith("      word")  # its indent plus four
    assert wrap("x" * 200) == "x" * 200  # no space to break at: left whole
    assert TEXT_WIDTH == MAX_COLUMNS
