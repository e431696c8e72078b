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
