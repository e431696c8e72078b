"""The code's shape, read from outside as a reviewer would: short functions and files, no import
circle (not even through an import inside a function), and one owner (stoker/layout.py) for the names
a run's surfaces share.

The size gauges count code lines: docstrings, comments and blank lines are free, so a why-comment or a
field's docstring never has to go to make a file fit. They describe the code; split by idea near them."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["stoker", "stoker_local", "plugins", "dags", "spark_jobs", "training", "bench"]
MAX_FILE_LINES = 400
"""Code lines per file (see :func:`code_lines`)."""
MAX_FUNCTION_LINES = 60
"""Code lines per function."""
SHARED_NAMES = ["manifest.json", "stoker-train.", "trainer.pid", "trainer.rc", "trainer.log", "train_summary.json",
                "timings.json", "summary.json", ".tasks", "checkpoints\"", "publication\""]
"""File and group names that belong to the run layout: no other module spells them."""


def _files() -> list[Path]:
    return sorted(p for d in SOURCES for p in (REPO / d).rglob("*.py") if ".stoker" not in p.parts)


def _module(path: Path) -> str:
    rel = path.relative_to(REPO)
    parts = list(rel.with_suffix("").parts)
    if parts[0] == "plugins":
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def code_lines(source: str) -> set[int]:
    """The numbers of the lines that hold code: not blank, not only a comment, not part of a docstring (a
    string standing alone as a statement: a module's, a class's, a function's or an attribute's)."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            docs |= set(range(node.lineno, node.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines |= set(range(tok.start[0], tok.end[0] + 1))
    return lines - docs


def test_the_gauge_counts_code_not_words():
    source = "\n".join([
        '"""A module docstring',
        'of two lines."""',
        "",
        "# a why-comment",
        "X = 1",
        '"""X\'s docstring."""',
        "",
        "",
        "def f(a):",
        '    """What f does."""',
        "    # why it does it",
        "    return (a +",
        "            1)  # a comment beside code leaves its line code",
    ])
    assert code_lines(source) == {5, 9, 12, 13}


def test_no_file_is_over_the_limit():
    long = {str(p.relative_to(REPO)): n for p in _files() if (n := len(code_lines(p.read_text()))) > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} code lines: {long}"


def test_no_function_is_over_the_limit():
    long = {}
    for p in _files():
        source = p.read_text()
        code = code_lines(source)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = len(code & set(range(node.lineno, node.end_lineno + 1)))
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(REPO)}:{node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} code lines: {long}"


def _imports(tree: ast.Module) -> set[str]:
    """Every import of the module, at its top or inside a function: a lazy import is a circle too (it only
    moves the failure to whichever call comes first)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _circles(graph: dict[str, set[str]]) -> list[str]:
    """Every strongly connected set of more than one module (Tarjan), each as 'a -> b -> ... -> a'."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[str] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(" <-> ".join(sorted(part)))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_no_import_circle():
    mods = {_module(p): p for p in _files()}
    graph = {m: {i for i in _imports(ast.parse(p.read_text())) if i in mods and i != m and not m.startswith(i + ".")}
             for m, p in mods.items()}
    circles = _circles(graph)
    assert not circles, "import circles (lazy imports included):\n" + "\n".join(circles)


def test_the_contracts_import_no_local_stack_and_no_surface():
    for p in (REPO / "stoker").rglob("*.py"):
        tree = ast.parse(p.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        bad = {m for m in imported if m.startswith(("stoker_local", "stoker_airflow", "spark_jobs", "training",
                                                    "airflow", "pyspark", "torch", "deepspeed"))}
        assert not bad, f"{p.relative_to(REPO)} imports {bad}: the contracts must deploy alone"


def test_no_surface_spells_the_layouts_names():
    spelled = []
    for p in _files():
        if p == REPO / "stoker" / "layout.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and not _is_docstring(node, p):
                spelled += [f"{p.relative_to(REPO)}:{node.lineno} {name!r}" for name in SHARED_NAMES
                            if name.strip('"') in node.value and _as_name(node.value, name)]
    assert not spelled, "names owned by stoker/layout.py spelled elsewhere:\n" + "\n".join(spelled)


def _as_name(value: str, name: str) -> bool:
    if name.endswith('"'):  # a whole string, not a word in a message
        return value == name.strip('"')
    return len(value) < 60 and "{" not in value  # a name: not a sentence of a message, not a URL route


_DOCSTRINGS: dict[Path, set[int]] = {}


def _is_docstring(node: ast.Constant, path: Path) -> bool:
    if path not in _DOCSTRINGS:
        lines: set[int] = set()
        for n in ast.walk(ast.parse(path.read_text())):
            body = getattr(n, "body", None)
            if isinstance(body, list):
                for stmt in body:
                    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                        lines.add(stmt.value.lineno)
        _DOCSTRINGS[path] = lines
    return node.lineno in _DOCSTRINGS[path]


def test_every_test_file_carries_the_marker_of_its_folder():
    unmarked = [str(p.relative_to(REPO)) for p in sorted((REPO / "tests").glob("*/test_*.py"))
                if not re.search(rf"^pytestmark = \[?pytest\.mark\.{p.parent.name}\b", p.read_text(), re.M)]
    assert not unmarked, f"test files without their folder's marker (pytest -m would miss them): {unmarked}"


def _top_names(tree: ast.Module) -> set[str] | None:
    """The names a module defines at its top (None: it defines ``__getattr__``, so any name may exist)."""
    names: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If | ast.Try | ast.With):
            stack += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                      *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return names


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    for root in (REPO, REPO / "plugins"):
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def test_every_name_imported_from_the_project_exists():
    """A name imported from a module of the project (at the top or inside a function, where only running that
    path would fail) is defined there or is a submodule, and so is a name used off an imported module of the
    project (``ledger.head``): a moved function left `bench/gpu_bench.py` importing ``ds_config`` from where it no
    longer was, and `tests/e2e/test_sabotage.py` calling ``nights.head``; nothing ran either before CI did."""
    own = ("stoker", "stoker_local", "stoker_airflow", "spark_jobs", "training", "bench", "tests", "dags")
    files = [p for d in [*SOURCES, "tests"] for p in sorted((REPO / d).rglob("*.py")) if ".stoker" not in p.parts]
    cache: dict[str, set[str] | None] = {}
    missing = []

    def defined(module: str) -> set[str] | None:
        if module not in cache:
            target = _module_file(module)
            cache[module] = _top_names(ast.parse(target.read_text())) if target is not None else None
        return cache[module]

    for path in files:
        tree = ast.parse(path.read_text())
        modules = {}  # a name bound to a module of the project (`from stoker.lines import ledger`): its uses
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith(own):
                modules |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                            if _module_file(f"{node.module}.{a.name}") is not None}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                names = defined(modules[node.value.id])
                sub = _module_file(f"{modules[node.value.id]}.{node.attr}")
                if names is not None and node.attr not in names and sub is None:
                    missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {modules[node.value.id]} has no "
                                   f"{node.attr}")
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith(own):
                continue
            target = _module_file(str(node.module))
            if target is None:
                missing.append(f"{path.relative_to(REPO)}:{node.lineno}: no module {node.module}")
                continue
            names = defined(str(node.module))
            for alias in node.names:
                sub = _module_file(f"{node.module}.{alias.name}")
                if names is not None and alias.name != "*" and alias.name not in names and sub is None:
                    missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.module} has no {alias.name}")
    assert not missing, "\n".join(missing)
