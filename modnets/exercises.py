"""The book's exercise hints, run: each chapter's hint code (the ``python`` blocks of its
"Exercises" section) executed in the chapter's own namespace at the end of the chapter, so that
a hint which no longer runs fails the build instead of misleading a reader.

Each chapter ends with a hidden cell ``run_hints(globals(), "<chapter>")``; the hints are read
from the chapter's script (``notebooks/<chapter>.py``), where the book's checkout has it.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["NOTEBOOKS", "hints", "run_hints"]

#: Where the chapters' scripts are, in a checkout of the book
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

_FENCE = re.compile(r"^# ```python\n(.*?)^# ```$", re.M | re.S)


def hints(script: str | Path) -> list[str]:
    """The code of every hint in the "Exercises" section of a chapter's script, in order."""
    text = Path(script).read_text()
    start = text.find("\n# ## Exercises")
    if start < 0:
        return []
    end = text.find("\n# ## ", start + 1)
    section = text[start : end if end >= 0 else len(text)]
    return [
        "\n".join(line[2:] if line.startswith("# ") else line[1:] for line in block.splitlines())
        for block in _FENCE.findall(section)
    ]


def run_hints(namespace: dict, chapter: str) -> int:
    """Run the hints of ``chapter`` (``notebooks/<chapter>.py``) in ``namespace`` (the chapter's
    ``globals()``); their output is the reader's to see, so it is discarded here. Returns how
    many ran: 0 where the scripts are not there (an installed package, Colab)."""
    import contextlib
    import io

    script = NOTEBOOKS / f"{chapter}.py"
    if not script.exists():
        return 0
    codes = hints(script)
    for i, code in enumerate(codes, 1):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, f"<{chapter}, hint {i}>", "exec"), namespace)
        except Exception as err:
            raise RuntimeError(f"{chapter}: exercise hint {i} fails: {err!r}") from err
    return len(codes)
