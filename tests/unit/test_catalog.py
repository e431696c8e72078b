"""What users ask the state folder: every run (failed and unfinished ones with why), a corpus's latest
run by its name, the nights of a line with its head; `stoker --version`."""

from __future__ import annotations

import json

import pytest

from stoker.files import atomic_write_json
from stoker.layout import LineLayout, RunLayout
from stoker.reports.runs import record_stage
from stoker.run.manifest import Manifest, PartitionRange, write_manifest
from stoker_local.cli import main

pytestmark = pytest.mark.unit


def _published(corpus: str, ds: str, sequences: int = 10) -> RunLayout:
    run = RunLayout.of(corpus, ds)
    write_manifest(run.run_dir, Manifest(
        run_id=f"{corpus}/{ds}", corpus=corpus, ds=ds, topic=f"stoker.{corpus}.{ds.replace('-', '')}.a1",
        partitions=[PartitionRange(partition=0, start_offset=0, end_offset=sequences, sequences=sequences)],
        seq_len=8, dtype="uint16", tokenizer_path="/t.json", tokenizer_sha256="ab" * 32, vocab_size=100,
        docs_in=5, docs_kept=5, docs_dropped={}, tokens=80, padding_tokens=0, sequences=sequences,
        source_uri="/d", quarantine_path="/q"))
    return run


def test_runs_list_names_every_run_and_why_the_failed_ones_failed(home, capsys):
    _published("web", "2026-12-01")
    failed = _published("web", "2026-12-02")
    files = failed.trainer("stoker.web.20261202.a1")
    files.folder.mkdir(parents=True)
    atomic_write_json(files.failure, {"message": "partition 1: offset 0 is gone (earliest now 20)"})
    stuck = RunLayout.of("web", "2026-12-03")
    record_stage(stuck.run_dir, "await_source", "start", now=1.0)
    record_stage(stuck.run_dir, "await_source", "end", now=2.0)
    record_stage(stuck.run_dir, "tokenize_publish", "start", now=3.0)
    assert main(["runs", "list", "--json"]) == 0
    rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert [rows[r]["state"] for r in sorted(rows)] == ["published", "failed", "not published"]
    assert "offset 0 is gone" in rows["web/2026-12-02"]["why"]
    assert "tokenize_publish started and never ended" in rows["web/2026-12-03"]["why"]
    assert main(["runs", "list"]) == 0
    assert "web/2026-12-03" in capsys.readouterr().out


def test_runs_show_of_a_corpus_is_its_latest_published_run(home, capsys):
    import os

    old = _published("sample", "2026-12-01", sequences=7)
    _published("sample", "2026-12-02", sequences=9)
    os.utime(old.manifest, (2e9, 2e9))  # the newest manifest, whatever its date: the latest run
    assert main(["runs", "show", "sample", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "sample/2026-12-01"
    assert main(["runs", "show", "nosuch"]) == 2
    assert "stoker runs list" in capsys.readouterr().err


def test_lines_show_lists_the_nights_in_join_order_with_the_head(home, capsys):
    from test_line_rules import _join  # tests/unit: a night planned and promoted as the train task does

    line = LineLayout.of("shared")
    _join(line, home, "2026-12-01", corpus="web")
    _join(line, home, "2026-12-01", corpus="code")
    _join(line, home, "2026-11-20", corpus="web")  # older than the head: a branch
    assert main(["lines", "show", "shared", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["night"], r["role"], r["parent"], r["head"]) for r in rows] == [
        ("2026-12-01.web", "head", "random", False), ("2026-12-01.code", "head", "2026-12-01.web", True),
        ("2026-11-20.web", "branch", "random", False)]
    assert main(["lines", "show", "shared"]) == 0
    assert "* 2026-12-01.code" in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("stoker 0.")


def test_ctrl_c_in_refresh_stops_the_trainer_it_started(home, monkeypatch, capsys):
    """The trainer runs detached (a session of its own, each rank too): Ctrl-C reaches `airflow dags test`
    and Spark, not it. The refresh stops it before it returns."""
    import os
    import subprocess

    from stoker.process import TAG_VAR, start_ticks
    from stoker_local import refresh as cli

    run = RunLayout.of("sample", "2026-12-01")
    files = run.trainer("stoker.sample.20261201.a1")
    files.folder.mkdir(parents=True)
    shell = files.process.spawn(["sleep", "600"], log=files.log)
    rank = subprocess.Popen(["sleep", "600"], env={**os.environ, TAG_VAR: str(files.folder)}, start_new_session=True)
    from test_restarts import _await_tagged  # tests/unit

    _await_tagged(str(files.folder), rank.pid)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.kbroker, "up", lambda *a, **k: None)
    monkeypatch.setattr(cli, "refresh_env", lambda log: dict(os.environ))  # the stack's database: not here
    monkeypatch.setattr("stoker_local.progress.follow", interrupted)
    assert main(["refresh", "sample", "--ds", "2026-12-01"]) == 130
    rank.wait(timeout=20)
    assert start_ticks(shell.pid) is None and rank.returncode is not None
    assert "interrupted" in capsys.readouterr().err


def test_ctrl_c_gives_back_the_line_lease_of_the_interrupted_night(home, monkeypatch):
    """`airflow dags test` leaves an interrupted task `running` in the database (no scheduler marks it over):
    its lease would keep the line's next night waiting forever."""
    import os

    from stoker.lines.lease import LeaseHolder, lease_holder, take_lease
    from stoker_local import refresh as cli

    corpora = home / "corpora"
    corpora.mkdir()
    (corpora / "web.yaml").write_text('name: web\nsource:\n  uri: "/d/{ds}"\ntokenizer:\n  path: "/t.json"\n'
                                      "train:\n  line: shared\n")
    monkeypatch.setenv("STOKER_CORPORA", str(corpora))
    line = LineLayout.of("shared")
    take_lease(line, LeaseHolder(dag_id="refresh_web", run_id="manual__2026-12-01", task_id="training.train",
                                 corpus="web", ds="2026-12-01", topic="t"), holder_alive=lambda h: True)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.kbroker, "up", lambda *a, **k: None)
    monkeypatch.setattr(cli, "refresh_env", lambda log: dict(os.environ))
    monkeypatch.setattr("stoker_local.progress.follow", interrupted)
    assert main(["refresh", "web", "--ds", "2026-12-02"]) == 130
    assert lease_holder(line) is not None  # another night's: not this refresh's to give back
    assert main(["refresh", "web", "--ds", "2026-12-01"]) == 130
    assert lease_holder(line) is None
