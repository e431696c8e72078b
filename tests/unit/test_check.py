"""`stoker check <corpus> --ds D`: what a night needs, before anything starts; Kafka down is a warning."""

from __future__ import annotations

import json

import pytest

from stoker_local.cli import main

pytestmark = pytest.mark.unit
DOWN = {"bootstrap.servers": "127.0.0.1:29199"}  # nothing listens there (the tests' fixed ports are 29x92)

CORPUS = """\
name: web
source:
  uri: "{state}/drops/{ds}"
tokenizer:
  path: "{state}/tok.json"
"""


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_HOME", str(tmp_path))
    monkeypatch.setenv("STOKER_CORPORA", str(tmp_path / "corpora"))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": DOWN}))
    (tmp_path / "corpora").mkdir()
    (tmp_path / "corpora" / "web.yaml").write_text(CORPUS)
    (tmp_path / "tok.json").write_text(json.dumps({"model": {"vocab": {"a": 2, "b": 3}}, "added_tokens": [
        {"content": "<|endoftext|>", "id": 0}, {"content": "<|pad|>", "id": 1}]}))
    drop = tmp_path / "drops" / "2026-12-01"
    drop.mkdir(parents=True)
    (drop / "part-0.jsonl").write_text('{"text": "a b"}\n')
    (drop / "_SUCCESS").write_text("")
    return tmp_path


def _check(capsys, *argv: str) -> tuple[int, dict[str, dict]]:
    rc = main(["check", *argv, "--json"])
    return rc, {f["check"]: f for f in json.loads(capsys.readouterr().out)}


def test_a_ready_night_passes_with_kafka_down(home, capsys):
    rc, found = _check(capsys, "web", "--ds", "2026-12-01")
    assert rc == 0, found
    assert {k: f["status"] for k, f in found.items()} == {
        "corpus": "ok", "date": "ok", "recipe": "ok", "tokenizer": "ok", "line": "ok", "source": "ok", "kafka": "warn"}
    assert "1 data file(s)" in found["source"]["detail"] and "random weights" in found["line"]["detail"]
    assert "127.0.0.1:29199" in found["kafka"]["detail"]


def test_what_is_not_ready_fails_naming_what_to_fix(home, capsys):
    rc, found = _check(capsys, "web", "--ds", "2026-12-02")  # no drop for that night
    assert rc == 1 and found["source"]["status"] == "fail" and "not complete" in found["source"]["detail"]
    (home / "drops" / "2026-12-01" / "_SUCCESS").unlink()
    rc, found = _check(capsys, "web", "--ds", "2026-12-01")
    assert rc == 1 and "_SUCCESS" in found["source"]["detail"]
    rc, found = _check(capsys, "nosuch")
    assert rc == 1 and "no corpus 'nosuch'" in found["corpus"]["detail"] and "web" in found["corpus"]["detail"]
    rc, found = _check(capsys, "web", "--ds", "2026-12-32")
    assert rc == 1 and "YYYY-MM-DD" in found["date"]["detail"]
    (home / "corpora" / "web.yaml").write_text(CORPUS + "pack:\n  seq_len: 1\n")
    rc, found = _check(capsys, "web", "--ds", "2026-12-01")
    assert rc == 1 and "pack.seq_len" in found["corpus"]["detail"]
    (home / "corpora" / "web.yaml").write_text(CORPUS.replace("<|pad|>", "x") + "tokenizer_extra: 1\n")
    rc, found = _check(capsys, "web", "--ds", "2026-12-01")
    assert rc == 1 and found["corpus"]["status"] == "fail"


def test_a_tokenizer_without_the_pad_token_fails(home, capsys):
    (home / "corpora" / "web.yaml").write_text(CORPUS + '  pad_token: "<pad>"\n')
    rc, found = _check(capsys, "web", "--ds", "2026-12-01")
    assert rc == 1 and "tokenizer.pad_token = '<pad>'" in found["tokenizer"]["detail"]
