"""The code map in ``docs/development.md``, written from the module docstrings (``make docs``): every module of
every surface with the first sentence of its docstring, so the map is what the code says of itself and a
test (``tests/unit/test_module_map.py``) fails when the two drift apart."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from stoker import paths

SURFACES = [
    ("stoker", "the contracts every surface shares (one subpackage per room)"),
    ("spark_jobs", "the Spark stage: pure DataFrame transforms and a thin main()"),
    ("training", "the DeepSpeed trainer fed from Kafka"),
    ("plugins/stoker_airflow", "the Airflow side: hooks, operators, sensors, triggers, the UI plugin"),
    ("dags", "wiring only: one DAG per corpus file"),
    ("stoker_local", "the local stack and the `stoker` command (no cluster node installs it)"),
]
"""The folders the map covers, in the order a reader meets them, with a line on each."""
BEGIN = "<!-- BEGIN code map: make docs writes this from the module docstrings -->"
END = "<!-- END code map -->"


def summary(path: Path) -> str:
    """The first sentence of the module's docstring, on one line (the module's own words, not a second copy)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?\.)(\s|$)", first)
    return (match.group(1) if match else first).replace("|", "\\|")


def _modules(folder: Path) -> list[Path]:
    return sorted((p for p in folder.rglob("*.py") if "__pycache__" not in p.parts),
                  key=lambda p: (p.parent.relative_to(folder).parts, p.name != "__init__.py", p.name))


def render(root: Path | None = None) -> str:
    """The map: one table per surface, a row per module (its path and its docstring's first sentence)."""
    root = root or paths.project_root()
    out = [BEGIN]
    for folder, what in SURFACES:
        out += ["", f"**`{folder}/`**: {what}", "", "| module | what it is |", "|---|---|"]
        for p in _modules(root / folder):
            rel = p.relative_to(root).as_posix()
            out.append(f"| [`{rel}`](../{rel}) | {summary(p)} |")
    return "\n".join([*out, "", END])


def write(page: Path | None = None) -> Path:
    """Replace the map between the markers of ``docs/development.md``; the rest of the page is left alone."""
    page = page or paths.project_root() / "docs" / "development.md"
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page}: no code map markers ({BEGIN!r} ... {END!r}): put them where the map goes")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(head + render() + tail)
    return page


def main() -> int:
    print(f"wrote {write()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
