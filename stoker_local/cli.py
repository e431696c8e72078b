"""The ``stoker`` command line.

  stoker up | down | status          the whole local stack: Kafka, PostgreSQL, Airflow (UI on :8080)
  stoker kafka up|down|status        the embedded single-node KRaft broker alone
  stoker storage up|down|status      local S3 (SeaweedFS) and HDFS holding the sample corpus (corpora/examples)
  stoker sample-corpus               make the sample corpus and train its tokenizer (offline)
  stoker refresh <corpus> [--ds D]   run refresh_<corpus> once through Airflow (dags test), then summarise
  stoker runs show [RUN] [--latest] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.exceptions import StokerError
from stoker.reports import runs
from stoker.run.plan import corpus_of
from stoker_local import broker as kbroker
from stoker_local.refresh import refresh


def _kafka(args: argparse.Namespace) -> int:
    if args.action == "up":
        b = kbroker.up(kbroker.default_broker(secure=args.secure))
        print(f"kafka up on {b.bootstrap} (data in {b.home})")
        if b.secure:
            from stoker_local.broker import secure

            print(f"SASL_SSL, SCRAM-SHA-512 user {secure.USER}; password in {secure.credentials_file(b.home)}, "
                  f"CA certificate {secure.tls_dir(b.home) / 'ca.pem'}; client settings: stoker kafka status")
    elif args.action == "down":
        print("kafka stopped" if kbroker.down() else "kafka was not running")
    else:
        print(kbroker.status_json())
    return 0


def _storage(args: argparse.Namespace) -> int:
    from stoker_local import storage

    if args.action == "up":
        ds = args.ds or datetime.now(UTC).date().isoformat()
        storage.storage_up(ds, tuple(args.only or ("s3", "hdfs")))
        print(f"Try          STOKER_CORPORA=corpora/examples stoker refresh sample_s3 --ds {ds}   (or sample_hdfs)")
    elif args.action == "down":
        storage.storage_down()
    else:
        print(json.dumps(storage.storage_status(), indent=2))
    return 0


def _up(args: argparse.Namespace) -> int:
    from stoker_local import services

    s = services.up()
    print()
    print(f"Airflow UI   {s.api_url}  (log in as {services.ADMIN_USER}, password: "
          f"{services.admin_password(s)}; kept in {s.passwords_file})")
    print("Trigger      open refresh_sample, press Trigger; or: stoker refresh sample (no scheduler needed)")
    print("Backfill     .stoker/venv/bin/stoker airflow backfill create --dag-id refresh_sample "
          "--from-date 2026-11-28 --to-date 2026-11-30T23:59:59")
    print("Stop         make down")
    return 0


def _down(args: argparse.Namespace) -> int:
    from stoker_local import services

    services.down()
    return 0


def _airflow(args: argparse.Namespace) -> int:
    """The airflow CLI against the local stack's metadata database (same env as the stack)."""
    from stoker_local import services

    env = {**os.environ, **services.airflow_stack_env(services.default_stack())}
    argv = args.args[1:] if args.args[:1] == ["--"] else args.args
    return subprocess.run([sys.executable, "-m", "airflow", *backfill_limits(argv)], env=env).returncode


def backfill_limits(argv: list[str]) -> list[str]:
    """A backfill runs up to 10 runs at once by default and ignores the DAG's max_active_runs; a
    refresh DAG's backfill gets its corpus's ``schedule.max_active_runs`` unless one is given."""
    if argv[:2] != ["backfill", "create"] or any(a.startswith("--max-active-runs") for a in argv):
        return argv
    dag_id = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--dag-id", "-d")), None)
    dag_id = dag_id or next((a.split("=", 1)[1] for a in argv if a.startswith("--dag-id=")), None)
    if not dag_id or corpus_of(dag_id) is None:
        return argv
    from stoker import paths
    from stoker.config.corpus import load_all

    limit = next((c.schedule.max_active_runs for c in load_all(paths.corpora_dir())
                  if c.name == corpus_of(dag_id)), None)
    if limit is None:
        return argv
    print(f"stoker: {dag_id} allows {limit} refresh(es) at a time (schedule.max_active_runs): "
          f"--max-active-runs {limit}", file=sys.stderr)
    return [*argv, "--max-active-runs", str(limit)]


def _status(args: argparse.Namespace) -> int:
    from stoker_local import services

    print(json.dumps(services.status(), indent=2))
    return 0


def _sample(args: argparse.Namespace) -> int:
    from stoker_local import sample

    out = Path(args.out) if args.out else paths.state_dir() / "data" / "sample"
    tok_dir = Path(args.tokenizer_dir) if args.tokenizer_dir else paths.state_dir() / "tokenizers" / "sample-bpe-8192"
    if not args.force and (out / "_SUCCESS").exists() and (tok_dir / "tokenizer.json").exists():
        print(f"sample corpus already in {out}, tokenizer in {tok_dir} (--force to remake)")
        return 0
    info = sample.write_corpus(out)
    print(f"corpus: {info['lines']} lines ({info['bad_lines']} deliberately bad), {info['bytes']} bytes in {out}")
    tok = sample.train_tokenizer(out, tok_dir, vocab_size=args.vocab_size)
    print(f"tokenizer: vocab {tok['vocab_size']}, sha256 {tok['sha256']} in {tok_dir}")
    return 0


def _runs(args: argparse.Namespace) -> int:
    run_dir = runs.find_run(None if args.latest else args.run)
    s = runs.summary(run_dir)
    print(json.dumps(s, indent=2) if args.json else runs.render_stages(s) if args.stages else runs.render(s))
    return 0


def _runs_list(args: argparse.Namespace) -> int:
    from stoker.reports import catalog

    rows = catalog.list_runs()
    print(json.dumps(rows, indent=2) if args.json else catalog.render_runs(rows))
    return 0


def _lines(args: argparse.Namespace) -> int:
    from stoker.reports import catalog

    rows = catalog.line_nights(args.line)
    print(json.dumps(rows, indent=2) if args.json else catalog.render_line(args.line, rows))
    return 0


def _decide(args: argparse.Namespace) -> int:
    import getpass

    from stoker.layout import LineLayout
    from stoker.lines.gate import human_decision

    ds, _, corpus = args.night.partition(".")
    user = getpass.getuser()
    if args.choice != "hold":  # eval.reviewers of the night's corpus, when its config is here: the CLI's user too
        from stoker import paths
        from stoker.config.corpus import load_corpus
        from stoker.config.eval import check_decider

        config = paths.corpora_dir() / f"{corpus or args.line}.yaml"
        if config.is_file():
            check_decider(load_corpus(config).eval.reviewers, user, args.choice)
    decision = human_decision(LineLayout.of(args.line), ds, corpus or args.line, args.choice,
                              f"{user} (stoker lines decide)", args.why or "")
    print(f"night {ds}.{corpus or args.line} of line {args.line}: {decision['decision']} by {decision['by']}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from stoker.reports import check
    from stoker.stores.s3 import S3Settings

    conn = os.environ.get("AIRFLOW_CONN_KAFKA_DEFAULT")
    kafka = json.loads(conn).get("extra") if conn else kbroker.default_broker().client_config()
    found = check.check(args.corpus, args.ds, kafka=kafka, s3=S3Settings.from_env())
    print(json.dumps(check.as_json(found), indent=2) if args.json else check.render(args.corpus, found))
    return 0 if check.passed(found) else 1


def _gc(args: argparse.Namespace) -> int:
    from stoker.reports import gc

    try:
        removals = gc.removals(args.keep_runs, args.keep_checkpoints, args.keep_nights)
    except ValueError as e:
        print(f"stoker gc: {e}", file=sys.stderr)
        return 2
    text = json.dumps(gc.as_json(removals), indent=2) if args.json else gc.render(removals, args.apply)  # sizes first
    if args.apply:
        gc.apply(removals)
    print(text)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"stoker {version('stoker')}"
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "stoker (not installed: `make setup`)"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="stoker", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn, text in (("up", _up, "start Kafka, PostgreSQL and Airflow; print the UI address and login"),
                           ("down", _down, "stop exactly what `stoker up` started"),
                           ("status", _status, "pids and health of the local stack")):
        sub.add_parser(name, help=text).set_defaults(fn=fn)
    a = sub.add_parser("airflow", help="the airflow CLI with the local stack's environment "
                       "(e.g. stoker airflow backfill create --dag-id refresh_sample --from-date D --to-date D)")
    a.add_argument("args", nargs=argparse.REMAINDER)
    a.set_defaults(fn=_airflow)
    k = sub.add_parser("kafka", help="the embedded Kafka broker")
    k.add_argument("action", choices=["up", "down", "status"])
    k.add_argument("--secure", action="store_true",
                   help="serve SASL_SSL: TLS (a local CA), SCRAM-SHA-512 user 'stoker', ACLs; no plain-text listener")
    k.set_defaults(fn=_kafka)
    st = sub.add_parser("storage", help="local S3 and HDFS servers holding the sample corpus, for corpora/examples")
    st.add_argument("action", choices=["up", "down", "status"])
    st.add_argument("--ds", help="the night to copy the sample corpus to (default: today, UTC)")
    st.add_argument("--only", action="append", choices=["s3", "hdfs"], help="start only this one (repeatable)")
    st.set_defaults(fn=_storage)
    s = sub.add_parser("sample-corpus", help="make the sample corpus and its tokenizer")
    s.add_argument("--out")
    s.add_argument("--tokenizer-dir")
    s.add_argument("--vocab-size", type=int, default=8192)
    s.add_argument("--force", action="store_true")
    s.set_defaults(fn=_sample)
    _add_run_commands(sub)
    return ap


def _add_run_commands(sub: Any) -> None:
    """refresh, check, gc, runs, lines: a corpus's nights and what they left."""
    from stoker.lines.gate import CHOICES  # what a person may decide on a gated night: one list for both commands

    r = sub.add_parser("refresh", help="run one refresh of a corpus through Airflow")
    r.add_argument("corpus")
    r.add_argument("--ds", help="logical date YYYY-MM-DD (default: today, UTC)")
    r.add_argument("--param", "-p", action="append", default=[], metavar="NAME=VALUE",
                   help="a run param for this night only (docs/config.md, Run params), e.g. seq_len=512; checked "
                        "before anything starts")
    r.add_argument("--verbose", "-v", action="store_true", help="stream Airflow's, Spark's and the trainer's logs")
    r.add_argument("--decision", choices=tuple(CHOICES), default="hold",
                   help="what to do with the night if the gate holds it (a figure regressed): the figures are "
                        "printed, nothing waits for an answer (default: hold; `stoker lines decide` later)")
    r.set_defaults(fn=refresh)
    c = sub.add_parser("check", help="check a corpus and night before anything starts: config, recipe, tokenizer, "
                       "model line, source and drop, Kafka (seconds; exit 1 when something must be fixed)")
    c.add_argument("corpus")
    c.add_argument("--ds", help="the night YYYY-MM-DD (default: today, UTC)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=_check)
    g = sub.add_parser("gc", help="retention: old run folders, old nights' checkpoints (and nights); a dry run "
                       "unless --apply; never a line's head, its last join, a HOLD night or a running trainer")
    g.add_argument("--keep-runs", type=int, default=14, help="run folders kept per corpus, newest dates (14)")
    g.add_argument("--keep-checkpoints", type=int, default=3,
                   help="nights per line that keep their checkpoint (model + optimizer), newest joins (3)")
    g.add_argument("--keep-nights", type=int, help="nights kept per line, newest joins (default: all)")
    g.add_argument("--apply", action="store_true", help="remove what the plan lists")
    g.add_argument("--json", action="store_true")
    g.set_defaults(fn=_gc)
    runs_p = sub.add_parser("runs", help="run summaries")
    runs_sub = runs_p.add_subparsers(dest="runs_cmd", required=True)
    show = runs_sub.add_parser("show", help="print a run's summary")
    show.add_argument("run", nargs="?", help="<corpus> (its latest), <corpus>/<YYYY-MM-DD> or a run folder "
                      "(default: the latest run)")
    show.add_argument("--latest", action="store_true")
    show.add_argument("--json", action="store_true", help="the summary as JSON")
    show.add_argument("--stages", action="store_true", help="a table of the run's stages")
    show.set_defaults(fn=_runs)
    listing = runs_sub.add_parser("list", help="every run folder, failed and unfinished ones too, with why")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(fn=_runs_list)
    lines_p = sub.add_parser("lines", help="model lines")
    lines_sub = lines_p.add_subparsers(dest="lines_cmd", required=True)
    ls = lines_sub.add_parser("show", help="the nights of a model line, in join order, its head marked")
    ls.add_argument("line")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(fn=_lines)
    dec = lines_sub.add_parser("decide", help="a person's decision on a gated night: promote a held night, hold "
                               "it, or roll back a held night or the head (the head returns to the night before)")
    dec.add_argument("line")
    dec.add_argument("night", help="<YYYY-MM-DD>.<corpus> (or <YYYY-MM-DD> when the corpus is named as the line)")
    dec.add_argument("choice", choices=tuple(CHOICES))
    dec.add_argument("--why", help="recorded with the decision and shown on the model card")
    dec.set_defaults(fn=_decide)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except StokerError as e:
        print(f"stoker: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
