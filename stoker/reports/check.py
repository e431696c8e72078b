"""``stoker check <corpus> [--ds DATE]``: everything a refresh of that night needs, checked in seconds
before anything starts (no Spark, no trainer, no topic written): the corpus file, the date, the recipe,
the tokenizer, the model line's parent and its tokenizer agreement, the source store and the night's
drop. Kafka is asked too, briefly; a broker that is down is a warning (``stoker refresh`` starts the
embedded one), not a failure.

Each check is a :class:`Finding`: ``ok``, ``warn`` or ``fail``, with what was seen or what to do."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import date
from typing import Any

from stoker import paths
from stoker.exceptions import StokerError
from stoker.run.plan import refresh_dag


@dataclass(slots=True)
class Finding:
    check: str
    status: str
    """``ok``, ``warn`` or ``fail``."""
    detail: str


def _corpus(name: str, found: list[Finding]) -> Any:
    from stoker.config.corpus import load_corpus

    folder = paths.corpora_dir()
    path = folder / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in folder.glob("*.yaml"))
        found.append(Finding("corpus", "fail", f"no corpus {name!r}: {path} does not exist (corpora in {folder}: "
                                               f"{', '.join(have) or 'none'}; STOKER_CORPORA chooses the folder)"))
        return None
    cfg = load_corpus(path)  # a ConfigError names the field, the value and the limit
    found.append(Finding("corpus", "ok", f"{path} (DAG {refresh_dag(cfg.name)})"))
    return cfg


def _date(ds: str | None, found: list[Finding]) -> str | None:
    from datetime import UTC, datetime

    if ds is None:
        ds = datetime.now(UTC).date().isoformat()
    try:
        date.fromisoformat(ds)
        if len(ds) != 10:
            raise ValueError
    except ValueError:
        found.append(Finding("date", "fail", f"--ds {ds!r}: not a date; give the night as YYYY-MM-DD, e.g. 2026-12-01"))
        return None
    found.append(Finding("date", "ok", ds))
    return ds


def _tokenizer_and_line(cfg: Any, ds: str, found: list[Finding]) -> None:
    from stoker.config.recipes import get_recipe
    from stoker.lines.parents import check_agreement, choose_parent
    from stoker.run.tokenizer import tokenizer_facts

    recipe = get_recipe(cfg.train.recipe)
    found.append(Finding("recipe", "ok", f"{recipe.name}: {cfg.train.world_size} rank(s), micro-batch "
                                         f"{recipe.micro_batch_size} x {recipe.grad_accum_steps}, ZeRO "
                                         f"{recipe.zero_stage}"))
    tok_path = paths.resolve_local(cfg.tokenizer.path)
    if not tok_path.is_file():
        found.append(Finding("tokenizer", "fail", f"tokenizer.path: {tok_path} does not exist (the sample's is made "
                                                  "by `stoker sample-corpus`; a Hugging Face model's is its "
                                                  "tokenizer.json)"))
        return
    tok = tokenizer_facts(tok_path, cfg.tokenizer.eos_token, cfg.tokenizer.pad_token)
    found.append(Finding("tokenizer", "ok", f"{tok_path}: {tok.vocab_size} ids, eos {tok.eos_id}, pad {tok.pad_id}"))
    from stoker.layout import LineLayout

    parent = choose_parent(LineLayout.of(cfg.train.line), ds, cfg.name, cfg.train.init, cfg.train.older_nights)
    check_agreement(parent, tok)
    found.append(Finding("line", "ok", f"night {ds} of line {cfg.train.line} would start from {parent.describe()} "
                                       f"(as its {parent.role})"))


def _source(cfg: Any, ds: str, s3: Any, found: list[Finding]) -> None:
    from stoker.config.corpus import render_uri
    from stoker.stores.drops import drop_status, open_store, scheme_of
    from stoker.stores.local import is_data_path

    uri = render_uri(cfg.source.uri, ds)
    uri = uri if scheme_of(uri) != "file" else str(paths.resolve_local(uri))
    store = open_store(uri, s3=s3, webhdfs_url=cfg.source.webhdfs_url)
    store.check(uri)  # reachable, credentials accepted, bucket there: a SourceError says which
    ready, seen = drop_status(store, uri, cfg.source.success_marker)
    if not ready:
        found.append(Finding("source", "fail", f"{uri}: the night's drop is not complete ({seen}); await_source "
                                               f"would wait up to {cfg.source.timeout_s} s for it"))
        return
    data = [f for f in store.list_files(uri) if is_data_path(uri, f.uri)]
    size = sum(f.size for f in data)
    if not data:
        found.append(Finding("source", "warn", f"{uri}: complete ({seen}) but holds no data file: the night "
                                               "publishes nothing and its training is skipped"))
        return
    found.append(Finding("source", "ok", f"{uri}: complete ({seen}); {len(data)} data file(s), {size:,} bytes"))


def _kafka(config: Mapping[str, Any] | None, found: list[Finding]) -> None:
    from stoker.kafka.topics import check_reachable

    if config is None:
        found.append(Finding("kafka", "warn", "no Kafka connection given (kafka_default); not checked"))
        return
    try:
        n = check_reachable({**config, "log_level": 0}, timeout=2.0)  # the verdict below says it once
    except StokerError as e:
        found.append(Finding("kafka", "warn", f"{config.get('bootstrap.servers')}: {e}"))
        return
    found.append(Finding("kafka", "ok", f"{config.get('bootstrap.servers')}: {n} broker(s)"))


def check(name: str, ds: str | None = None, *, kafka: Mapping[str, Any] | None = None, s3: Any = None) -> list[Finding]:
    """Every check for night ``ds`` (default today, UTC) of corpus ``name``; a failing one stops those that
    depend on it (no source check without a valid corpus), independent ones still run."""
    found: list[Finding] = []
    cfg = _guard("corpus", lambda: _corpus(name, found), found)
    day = _date(ds, found)
    if cfg is not None and day is not None:
        _guard("tokenizer", lambda: _tokenizer_and_line(cfg, day, found), found)
        _guard("source", lambda: _source(cfg, day, s3, found), found)
    _kafka(kafka, found)
    return found


def _guard(what: str, step: Callable[[], Any], found: list[Finding]) -> Any:
    try:
        return step()
    except StokerError as e:  # ConfigError, SourceError: each names what to fix
        found.append(Finding(what, "fail", str(e)))
        return None


def passed(found: list[Finding]) -> bool:
    return all(f.status != "fail" for f in found)


def render(name: str, found: list[Finding]) -> str:
    mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    lines = [f"{mark[f.status]}  {f.check:<10} {f.detail}" for f in found]
    verdict = "ready" if passed(found) else "not ready: fix what FAIL names, then check again"
    return "\n".join([*lines, f"{name}: {verdict}"])


def as_json(found: list[Finding]) -> list[dict[str, str]]:
    return [asdict(f) for f in found]
