"""The configuration reference (``docs/config.md``), generated from the dataclasses themselves: every
field's type and default from the class, its description from the docstring written under it.

``python -m stoker.config.reference`` rewrites the page (``make docs``); a unit test fails when the page and the
code differ, so the reference cannot drift from what the validation accepts."""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import sys
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.config.quality import FILTERS

PAGE = paths.REPO_ROOT / "docs" / "config.md"

# (heading, YAML path, class); the order of the page
SECTIONS: list[tuple[str, str, str]] = [
    ("Corpus", "", "stoker.config.corpus:CorpusConfig"),
    ("Source", "source", "stoker.config.corpus:SourceConfig"),
    ("Cleaning", "clean", "stoker.config.corpus:CleanConfig"),
    ("Quality filters", "quality", "stoker.config.quality:QualityConfig"),
    *((f.TITLE, f"quality.{f.STEP}", f"stoker.config.quality:{f.__name__}") for f in FILTERS),
    ("PII scrubbing", "quality.pii", "stoker.config.quality:PIIConfig"),
    ("Near-dedup", "quality.near_dedup", "stoker.config.quality:NearDedupConfig"),
    ("Tokenizer", "tokenizer", "stoker.config.corpus:TokenizerConfig"),
    ("Packing", "pack", "stoker.config.corpus:PackConfig"),
    ("Topic", "topic", "stoker.config.corpus:TopicConfig"),
    ("Publishing", "publish", "stoker.config.corpus:PublishConfig"),
    ("Schedule", "schedule", "stoker.config.corpus:ScheduleConfig"),
    ("Training", "train", "stoker.config.corpus:TrainConfig"),
    ("Evaluation", "eval", "stoker.config.eval:EvalConfig"),
    ("Recipe (`corpora/recipes/<name>.yaml`)", "", "stoker.config.recipes:TrainRecipe"),
    ("Recipe model shape", "model", "stoker.config.recipes:ModelShape"),
    ("Line (`corpora/lines/<name>.yaml`)", "", "stoker.config.line:LineConfig"),
    ("Line mixture", "mix", "stoker.lines.mixture:Mix"),
    ("Line deadline", "deadline", "stoker.config.line:DeadlineConfig"),
]

INTRO = """\
# Configuration reference

Generated from the dataclasses that validate the files (`stoker/config/corpus.py`, `stoker/config/recipes.py`) by
`make docs`; a unit test fails when this page and the code differ. A corpus is one YAML file in
`corpora/` (or `$STOKER_CORPORA`); a bad value fails when the DAG file is parsed, with an error naming the
field, the value, the limit and what to do. A recipe is a built-in name (`debug_cpu`, `small_1gpu`,
`multi_8gpu`) or a YAML file `corpora/recipes/<name>.yaml` (`base:` a built-in, then the fields to change;
see `corpora/recipes/example.yaml`). A line trained on a mixture of its corpora is a YAML file
`corpora/lines/<name>.yaml` (see `corpora/examples/lines/web_code_papers.yaml`; the DAGs do not read it yet: the
trainer does, through a night's mix plan).
"""


def _class(spec: str) -> type:
    import importlib

    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of ``cls``, read from its source (Python keeps none at run time)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, [*body[1:], None], strict=True):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        return "required"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, enum.Enum):  # a word of a few: the YAML spells its value
        value = value.value
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _type(f: dataclasses.Field[Any], cls: type) -> str:
    """The field's annotation; an enum's as its words (``'carry' | 'fresh'``), which is what the YAML takes."""
    import typing

    tp = typing.get_type_hints(cls).get(f.name)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(repr(m.value) for m in tp)
    return str(f.type)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _anchor(heading: str) -> str:
    return "".join(c for c in heading.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def _sections_by_class() -> dict[str, str]:
    return {spec.split(":")[1]: heading for heading, _, spec in SECTIONS}


def undocumented() -> list[str]:
    """Fields with no docstring and no section of their own: each must say what it does."""
    own = _sections_by_class()
    return [f"{cls.__name__}.{f.name}" for _, _, spec in SECTIONS for cls in [_class(spec)]
            for f in dataclasses.fields(cls) if f.name not in field_docs(cls) and str(f.type) not in own]


def section(heading: str, prefix: str, cls: type) -> str:
    docs, own = field_docs(cls), _sections_by_class()
    rows = ["| Field | Type | Default | What it does |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        name = f"{prefix}.{f.name}" if prefix else f.name
        text = _cell(docs.get(f.name, ""))
        if str(f.type) in own:
            text = (text + " " if text else "") + f"See [{own[str(f.type)]}](#{_anchor(own[str(f.type)])})."
        rows.append(f"| `{name}` | `{_cell(_type(f, cls))}` | {_default(f)} | {text} |")
    return f"## {heading}\n\n" + "\n".join(rows) + "\n"


def run_params() -> str:
    """What a run may change without editing the YAML (the DAG's trigger form, a run's conf)."""
    from stoker.run.plan import RUN_PARAMS

    rows = ["| Param | Replaces | Range | What it does |", "|---|---|---|---|"]
    for p in RUN_PARAMS:
        span = f"{p.bounds[0]} to {p.bounds[1]}" if p.bounds else "-"
        rows.append(f"| `{p.name}` | `{p.field}` | {span} | {_cell(p.description)} |")
    return ("## Run params\n\nA run may change these fields for itself: the DAG's trigger form, a run's conf "
            "(`stoker airflow dags trigger --conf`), `stoker refresh`'s Airflow run. The publish task applies "
            "them to the corpus config, validates the whole once and writes the run plan "
            "(`<run folder>/plan.json`), which the Spark job and the train task read.\n\n" + "\n".join(rows) + "\n")


def render() -> str:
    return "\n".join([INTRO, *(section(h, p, _class(c)) for h, p, c in SECTIONS), run_params()])


def main(argv: list[str]) -> int:
    page = Path(argv[0]) if argv else PAGE
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render())
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
