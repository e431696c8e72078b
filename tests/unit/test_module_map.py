"""The module map in ``stoker/__init__.py`` is the package as it is: every module and subpackage listed,
nothing listed that is gone, and every subpackage says in its docstring what room it is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import stoker

pytestmark = pytest.mark.unit

ROOT = Path(stoker.__file__).parent
SHARED = {"exceptions", "paths", "files", "layout", "process"}
"""The few modules every room uses, at the package's top; everything else lives in a room."""


def _on_disk() -> set[str]:
    found = set()
    for p in ROOT.rglob("*.py"):
        parts = ["stoker", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 1:
            found.add(".".join(parts))
    return found


def _listed() -> set[str]:
    return set(re.findall(r"^(?:    )?(stoker(?:\.\w+)+)\b", stoker.__doc__ or "", re.M))


def test_the_map_lists_every_module_and_nothing_that_is_gone():
    on_disk, listed = _on_disk(), _listed()
    assert not on_disk - listed, f"modules missing from stoker/__init__.py's map: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"listed in stoker/__init__.py's map but gone: {sorted(listed - on_disk)}"


def test_only_the_shared_modules_sit_at_the_top():
    top = {p.stem for p in ROOT.glob("*.py")} - {"__init__"}
    assert top == SHARED, f"modules at stoker/'s top beyond the shared ones: {sorted(top - SHARED)}"


def test_every_subpackage_says_what_room_it_is():
    for init in ROOT.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 5, f"{init.relative_to(ROOT.parent)}: no docstring naming its room"


def test_the_development_pages_code_map_is_the_module_docstrings():
    from stoker_local.codemap import BEGIN, END, render

    page = (ROOT.parent / "docs" / "development.md").read_text()
    shown = BEGIN + page.split(BEGIN, 1)[1].split(END, 1)[0] + END
    assert shown == render(ROOT.parent), "docs/development.md's code map differs from the code: run `make docs`"
