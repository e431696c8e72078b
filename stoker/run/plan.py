"""The run plan: everything one night of one corpus runs with, decided and validated once.

The publish task builds it from the corpus config and the run's params (the DAG's Params, a run's
conf, ``stoker refresh``'s run conf), plans the night's model-line parent, and writes it next to the
manifest, atomically, before Spark starts (``RunLayout.plan``). The Spark job reads the plan instead
of flags; the train task reads its line settings from it; ``stoker runs show`` prints the params it
applied. A retry of the publish task writes it again: a new attempt, a new topic.

Names derived from a corpus (its DAG id) are spelled here and nowhere else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.config import corpus as _config
from stoker.config.corpus import CorpusConfig, parse_corpus
from stoker.config.eval import REVIEWS
from stoker.exceptions import ConfigError
from stoker.files import atomic_write_json
from stoker.layout import RunLayout, run_topic

DAG_PREFIX = "refresh_"
LINE_DAG_PREFIX = "line_"
PLAN_VERSION = 1


def refresh_dag(corpus: str) -> str:
    """The DAG that refreshes ``corpus``."""
    return f"{DAG_PREFIX}{corpus}"


def corpus_of(dag: str) -> str | None:
    """The corpus a refresh DAG serves; None for any other DAG."""
    return dag[len(DAG_PREFIX):] if dag.startswith(DAG_PREFIX) else None


def line_dag(line: str) -> str:
    """The DAG that trains mixture line ``line`` (``corpora/lines/<line>.yaml``)."""
    return f"{LINE_DAG_PREFIX}{line}"


def line_of(dag: str) -> str | None:
    """The mixture line a line DAG trains; None for any other DAG."""
    return dag[len(LINE_DAG_PREFIX):] if dag.startswith(LINE_DAG_PREFIX) else None


@dataclass(frozen=True, slots=True)
class RunParam:
    """A setting a run may change without editing the corpus YAML (a DAG Param)."""

    name: str
    field: str
    """The corpus config's dotted field it replaces for the run."""
    kind: str
    """``string`` or ``integer`` (JSON schema)."""
    title: str
    section: str
    description: str
    bounds: tuple[int, int] | None = None
    """Inclusive; the same constant the config's own check uses."""
    choices: tuple[str, ...] | None = None
    """The values a string param may take (the form's drop-down); the config's own check uses the same."""

    def default(self, cfg: CorpusConfig) -> Any:
        part, key = self.field.split(".")
        return getattr(getattr(cfg, part), key)


RUN_PARAMS: tuple[RunParam, ...] = (
    RunParam("source_uri", "source.uri", "string", "Source", "Source",
             "Where this run reads raw text: a folder or file://, s3://, hdfs:// URI. {ds} / {ds_nodash} become "
             "the run's date (its night's drop); {state} is .stoker/. Only source.uri itself or a folder under the "
             "corpus's source.allowed_uri_prefixes (none by default) is taken."),
    RunParam("seq_len", "pack.seq_len", "integer", "Sequence length", "Packing",
             "Tokens per packed training sequence; each Kafka record holds seq_len+1 token ids. Documents are "
             "packed back to back with EOS between them and never attend across.", _config.SEQ_LEN_BOUNDS),
    RunParam("spark_partitions", "publish.spark_partitions", "integer", "Spark partitions", "Packing",
             "Spark tasks that pack and publish, at least (a large drop gets a multiple of it), each one Kafka "
             "transaction (a retried task is fenced, so nothing is published twice). Set it to the cluster's "
             "cores or a multiple.", _config.SPARK_PARTITIONS_BOUNDS),
    RunParam("review", "eval.review", "string", "Held night", "Evaluation",
             "What happens when the gate holds this night: ask (a person promotes, holds or rolls it back in the "
             "review step; hold when nobody answers within eval.approval_timeout_s), or hold, promote, roll-back "
             "without asking.", choices=REVIEWS),
)
"""What a run may override, in the order the trigger form shows them."""


def apply_params(cfg: CorpusConfig, params: dict[str, Any], origin: str) -> CorpusConfig:
    """The corpus config with a run's params applied, validated as the YAML is (one set of checks)."""
    known = {p.name: p for p in RUN_PARAMS}
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ConfigError(f"{origin}: param {unknown[0]!r} is not a run param; allowed: {sorted(known)}")
    data = cfg.to_dict()
    for name, value in params.items():
        if value is None or value == known[name].default(cfg):
            continue
        part, key = known[name].field.split(".")
        if name == "source_uri":
            try:
                cfg.source.check_override(str(value))
            except ConfigError as e:
                raise ConfigError(f"{origin}: {e}") from None
        if known[name].kind == "integer" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)  # a run conf typed on a command line
        data[part][key] = value
    return parse_corpus(data, f"{origin} (the corpus config with the run's params {params})")


@dataclass(kw_only=True, slots=True)
class RunPlan:
    corpus: CorpusConfig
    """The corpus config with this run's params applied."""
    ds: str
    attempt: int
    """The publish task's try: each try publishes to a topic of its own."""
    params: dict[str, Any]
    """The run's values of :data:`RUN_PARAMS` (defaults included)."""
    corpus_path: str
    parent: dict[str, Any] | None = None
    """The night's model-line parent and role as chosen before Spark ran (``stoker.lines.nights.Parent``);
    the train task plans it again at each launch, since the line may move in between."""
    created: float = 0.0

    @property
    def name(self) -> str:
        return self.corpus.name

    @property
    def dag_id(self) -> str:
        return refresh_dag(self.corpus.name)

    @property
    def topic(self) -> str:
        return run_topic(self.corpus.name, self.ds, self.attempt)

    @property
    def run(self) -> RunLayout:
        return RunLayout.of(self.corpus.name, self.ds)

    @property
    def source_uri(self) -> str:
        """The source with the run's date rendered in."""
        return self.corpus.source.render(self.ds)

    def to_dict(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "dag_id": self.dag_id, "ds": self.ds, "attempt": self.attempt,
                "topic": self.topic, "run_dir": str(self.run.run_dir), "source_uri": self.source_uri,
                "params": self.params, "corpus_path": self.corpus_path, "parent": self.parent,
                "created": self.created, "corpus": self.corpus.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any], origin: str = "<plan>") -> RunPlan:
        if d.get("version") != PLAN_VERSION:
            raise ConfigError(f"{origin}: plan version {d.get('version')!r}, this Stoker reads {PLAN_VERSION}: "
                              "re-run the publish task")
        return cls(corpus=parse_corpus(d["corpus"], origin), ds=d["ds"], attempt=int(d["attempt"]),
                   params=dict(d["params"]), corpus_path=d["corpus_path"], parent=d.get("parent"),
                   created=float(d.get("created", 0.0)))

    def write(self, path: Path | None = None) -> Path:
        """Next to the manifest (or at ``path``), atomically: a reader sees the old plan or the new one."""
        path = path or self.run.plan
        atomic_write_json(path, {**self.to_dict(), "run_dir": str(path.parent)})
        return path


def plan_run(corpus_path: str | Path, ds: str, params: dict[str, Any] | None = None, attempt: int = 1,
             parent: dict[str, Any] | None = None) -> RunPlan:
    """Load the corpus config, apply the run's params and validate the whole once."""
    from stoker.config.corpus import load_corpus

    cfg = load_corpus(corpus_path)
    cfg = apply_params(cfg, dict(params or {}), f"run {refresh_dag(cfg.name)} {ds}")
    values = {p.name: p.default(cfg) for p in RUN_PARAMS}
    return RunPlan(corpus=cfg, ds=ds, attempt=attempt, params=values, corpus_path=str(corpus_path),
                   parent=parent, created=time.time())


def read_plan(path: str | Path) -> RunPlan:
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: no readable run plan ({e}); the publish task writes it: re-run it") from None
    return RunPlan.from_dict(data, str(path))
