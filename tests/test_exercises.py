"""Every chapter ends with a summary and exercises, and the build runs their hints
(:mod:`modnets.exercises`), so a hint that no longer holds fails the build."""

import pytest

from modnets import exercises
from modnets.exercises import NOTEBOOKS, hints, run_hints

CHAPTERS = sorted(NOTEBOOKS.glob("*.py"))


@pytest.mark.parametrize("script", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_has_a_summary_and_exercises_whose_hints_the_build_runs(script):
    text = script.read_text()
    assert "\n# ## Summary\n" in text and "\n# ## Exercises\n" in text
    assert hints(script), "the exercises give at least one hint with code"
    last_cell = text.rstrip().rsplit("# %%", 1)[-1]
    assert f'run_hints(globals(), "{script.stem}")' in last_cell


def test_hints_run_in_the_chapters_namespace_and_a_broken_one_is_named(tmp_path, monkeypatch):
    script = tmp_path / "99_example.py"
    script.write_text(
        "# %% [markdown]\n# ## Exercises\n#\n# 1. One.\n#\n# ```python\n# y = x + 1\n"
        "# print(y)\n# ```\n#\n# 2. Two.\n#\n# ```python\n# z = y / 0\n# ```\n"
        "\n# %% [markdown]\n# ## After\n#\n# ```python\n# not_a_hint()\n# ```\n"
    )
    assert hints(script) == ["y = x + 1\nprint(y)", "z = y / 0"]
    monkeypatch.setattr(exercises, "NOTEBOOKS", tmp_path)
    namespace = {"x": 1}
    with pytest.raises(RuntimeError, match="99_example: exercise hint 2 fails: ZeroDivision"):
        run_hints(namespace, "99_example")
    assert namespace["y"] == 2  # the first hint ran in the chapter's namespace
    assert run_hints({}, "not_a_chapter") == 0  # no script (an installed package): nothing
