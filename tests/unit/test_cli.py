"""`stoker airflow backfill create` keeps a corpus's limit of refreshes at a time: Airflow's backfill
ignores the DAG's max_active_runs and would run up to 10 nights at once."""

from __future__ import annotations

import pytest

from stoker.config.corpus import load_corpus
from stoker.paths import corpora_dir
from stoker_local.cli import backfill_limits

pytestmark = pytest.mark.unit


def test_a_refresh_backfill_gets_the_corpus_limit():
    limit = load_corpus(corpora_dir() / "sample.yaml").schedule.max_active_runs
    argv = ["backfill", "create", "--dag-id", "refresh_sample", "--from-date", "2026-11-01", "--to-date", "2026-11-03"]
    assert backfill_limits(argv) == [*argv, "--max-active-runs", str(limit)]
    assert backfill_limits(["backfill", "create", "--dag-id=refresh_sample"])[-2:] == ["--max-active-runs", str(limit)]


@pytest.mark.parametrize("argv", [
    ["backfill", "create", "--dag-id", "refresh_sample", "--max-active-runs", "3"],  # the user's choice wins
    ["backfill", "create", "--dag-id", "other_dag"],
    ["backfill", "create", "--dag-id", "refresh_no_such_corpus"],
    ["dags", "list"],
])
def test_other_commands_pass_through_untouched(argv):
    assert backfill_limits(argv) == argv


def test_stoker_lines_decide_is_refused_to_a_user_the_corpus_reviewers_leave_out(tmp_path, monkeypatch, capsys):
    """The CLI's user is the deciding person: with eval.reviewers set, only they may promote or roll back."""
    import getpass
    import json

    from stoker_local.cli import main

    (tmp_path / "web.yaml").write_text(json.dumps({
        "name": "web", "source": {"uri": "/data/web"}, "tokenizer": {"path": "/t.json"},
        "eval": {"reviewers": [f"not-{getpass.getuser()}"]}}))
    monkeypatch.setenv("STOKER_CORPORA", str(tmp_path))
    assert main(["lines", "decide", "web", "2026-12-01.web", "promote"]) != 0
    assert f"user '{getpass.getuser()}' may not decide a held night of this corpus: eval.reviewers is" in \
        capsys.readouterr().err
