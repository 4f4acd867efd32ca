"""Audit the rendered book's HTML as a reader sees it, with no browser.

Each rule reads a page's code inputs, cell outputs and tables of contents with
:class:`html.parser.HTMLParser` and returns what breaks it:

* ``install_cell``: a code cell that installs packages (the Colab cell belongs in the notebook,
  not on the page: it carries the ``remove-cell`` tag);
* ``progress_spam``: an output with more than :data:`MAX_PROGRESS_LINES` lines of progress bar;
* ``temp_path_warning``: a warning that names a temporary path (``/tmp/ipykernel_...``);
* ``too_wide``: a line of a code cell or of an output wider than :data:`MAX_COLUMNS` characters,
  the width of the content column (a wider line hides behind a horizontal scroll bar);
* ``citation_in_toc``: a raw citation key (``rahaman2021interpreters``) in a table of contents;
* ``pipe_table``: an output that prints a Markdown table as text (``|---|`` rows) instead of
  rendering it (``IPython.display.Markdown``);
* ``six_digits``: a number an output prints with six decimals ending in zeros (``58.890000``,
  pandas' default), where a reader wants it formatted;
* ``record_mismatch``: an output saying a seed the build ran lies outside its evidence record
  (chapter 13's check, :data:`modnets.experiments.core.evidence_report.RECORD_MISMATCH`).

``python tests/book_audit.py _build/html`` (``make audit``) audits a build and exits non-zero on
any finding; ``tests/test_book_audit.py`` shows each rule failing on a small made-up page.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

#: Characters of a ``<pre>`` line that fit the content column of the book's theme at 1280 px
#: (measured in a headless Chromium screenshot of a ruler; the notebooks' code is formatted to it).
MAX_COLUMNS = 88
#: Lines of progress bar an output may show (a bar's final state is one line).
MAX_PROGRESS_LINES = 3
#: Bibliography keys look like ``author2021word``.
CITATION_KEY = re.compile(r"\b[a-z]+(?:19|20)\d\d[a-z]+\b")
PROGRESS_LINE = re.compile(r"\d+%\|.*\|")
TEMP_WARNING = re.compile(
    r"Warning.*(/tmp/|ipykernel_\d+|/var/folders/)|(/tmp/|ipykernel_\d+).*Warning"
)
INSTALL = re.compile(r"google\.colab|pip\W+install")
PIPE_RULE = re.compile(r"^\s*\|(\s*:?-{3,}:?\s*\|)+\s*$")
SIX_DIGITS = re.compile(r"(?<![\w.])\d+\.\d{4}00(?![\w.])")
RECORD_MISMATCH = "outside its evidence record"


@dataclass
class Page:
    """What a reader sees on one page: code inputs, outputs and table-of-contents entries."""

    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    toc: list[str] = field(default_factory=list)
    output_text: list[str] = field(default_factory=list)  # every text of an output, tables too


class _Reader(HTMLParser):
    """Collects the text of ``<pre>`` blocks inside cell inputs and outputs, and of the links of
    the navigation and in-page tables of contents."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._stack: list[tuple[str, str]] = []  # (tag, role) of open elements
        self._pre: list[str] | None = None
        self._pre_role = ""
        self._link: list[str] | None = None

    def _role(self) -> str:
        roles = [r for _, r in self._stack if r]
        return roles[-1] if roles else ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        role = ""
        if "cell_input" in classes:
            role = "input"
        elif "cell_output" in classes:
            role = "output"
        elif tag == "nav" or any(
            c in classes for c in ("bd-toc", "toctree-wrapper", "bd-sidebar-primary")
        ):
            role = "toc"
        if tag not in _VOID:
            self._stack.append((tag, role))
        if tag == "pre" and self._role() in ("input", "output"):
            self._pre, self._pre_role = [], self._role()
        if tag == "a" and self._role() == "toc":
            self._link = []

    def handle_endtag(self, tag):
        if tag == "pre" and self._pre is not None:
            text = "".join(self._pre)
            (self.page.inputs if self._pre_role == "input" else self.page.outputs).append(text)
            self._pre = None
        if tag == "a" and self._link is not None:
            self.page.toc.append(" ".join("".join(self._link).split()))
            self._link = None
        for k in range(len(self._stack) - 1, -1, -1):  # close up to the matching tag
            if self._stack[k][0] == tag:
                del self._stack[k:]
                break

    def handle_data(self, data):
        if self._role() == "output" and data.strip():
            self.page.output_text.append(data)
        if self._pre is not None:
            self._pre.append(data)
        if self._link is not None:
            self._link.append(data)


_VOID = {"br", "img", "input", "meta", "link", "hr", "source", "wbr", "col", "area", "base"}


def read_page(html: str) -> Page:
    reader = _Reader()
    reader.feed(html)
    return reader.page


def audit_page(html: str, max_columns: int = MAX_COLUMNS) -> list[str]:
    """Every rule this page breaks, one line each (empty: the page is clean)."""
    page, problems = read_page(html), []
    for code in page.inputs:
        if INSTALL.search(code):
            problems.append(f"install_cell: {code.strip().splitlines()[0][:60]!r}")
    for k, out in enumerate(page.outputs):
        bars = sum(bool(PROGRESS_LINE.search(line)) for line in out.splitlines())
        if bars > MAX_PROGRESS_LINES:
            problems.append(f"progress_spam: output {k} has {bars} lines of progress bar")
        for line in out.splitlines():
            if TEMP_WARNING.search(line):
                problems.append(f"temp_path_warning: {line.strip()[:100]!r}")
    for kind, blocks in (("input", page.inputs), ("output", page.outputs)):
        for block in blocks:
            for line in block.splitlines():
                if len(line.rstrip()) > max_columns:
                    problems.append(
                        f"too_wide: {kind} line of {len(line.rstrip())} > {max_columns}: {line.strip()[:50]!r}"
                    )
    for entry in page.toc:
        if CITATION_KEY.search(entry):
            problems.append(f"citation_in_toc: {entry!r}")
    for out in page.outputs:
        rules = [line for line in out.splitlines() if PIPE_RULE.match(line)]
        if rules:
            problems.append(f"pipe_table: {rules[0].strip()[:50]!r} printed as text")
    for text in page.output_text:
        for number in SIX_DIGITS.findall(text):
            problems.append(f"six_digits: {number} in {text.strip()[:50]!r}")
        if RECORD_MISMATCH in text:
            problems.append(f"record_mismatch: {text.strip()[:80]!r}")
    return problems


def audit_build(html_dir: Path, max_columns: int = MAX_COLUMNS) -> dict[str, list[str]]:
    """``page -> problems`` for every chapter page of a build (Sphinx's own pages skipped)."""
    skip = {"genindex.html", "search.html", "py-modindex.html"}
    pages = sorted(
        p
        for p in Path(html_dir).rglob("*.html")
        if p.name not in skip and "_static" not in p.parts and "_sources" not in p.parts
    )
    if not pages:
        raise FileNotFoundError(f"no HTML pages under {html_dir}: build the book first")
    found = {}
    for p in pages:
        problems = audit_page(p.read_text(encoding="utf-8"), max_columns)
        if problems:
            found[str(p.relative_to(html_dir))] = problems
    return found


def main(argv: list[str]) -> int:
    html_dir = Path(argv[1] if len(argv) > 1 else "_build/html")
    found = audit_build(html_dir)
    for page, problems in found.items():
        print(f"{page}:")
        for p in problems:
            print(f"  {p}")
    n = sum(len(p) for p in found.values())
    pages = len(list(Path(html_dir).rglob("*.html")))
    print(f"book audit of {html_dir}: {n} problems on {len(found)} of {pages} pages")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
