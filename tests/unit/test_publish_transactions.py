"""The publisher's producers, one per transaction, as pure logic: which producer each transaction runs on, and
what is done with one after a failure. (That each gets a fresh epoch from a real broker is
tests/integration/test_done_records.py.)"""

from __future__ import annotations

import pytest

from spark_jobs.publish import TaskSummary, _Transactions

pytestmark = pytest.mark.unit


class Producer:
    """Records the calls the publisher makes; ``commit_fails`` makes its commit raise (a commit timed out)."""

    def __init__(self, log: list[tuple[int, str]], number: int, commit_fails: bool = False) -> None:
        self.log, self.number, self.commit_fails = log, number, commit_fails

    def __getattr__(self, name: str):
        def call(*args, **kwargs):
            self.log.append((self.number, name))
            if name == "commit_transaction" and self.commit_fails:
                raise TimeoutError("commit timed out: its outcome is unknown")
        return call


def _transactions(fail_commit_of: int | None = None) -> tuple[_Transactions, list[tuple[int, str]]]:
    log: list[tuple[int, str]] = []
    made: list[Producer] = []

    def make() -> Producer:
        made.append(Producer(log, len(made), commit_fails=len(made) == fail_commit_of))
        return made[-1]
    return _Transactions(make, "t", 0, 0, 1, 2_000), log


def _done(n: int) -> TaskSummary:
    return TaskSummary(spark_partition=0, attempt=0, committed=n, final=False)


def test_each_transaction_begins_on_a_producer_initialised_for_it():
    tx, log = _transactions()
    tx.fresh()  # the fencing producer takes the first transaction
    for n in range(3):
        tx.open()
        tx.commit(_done(n))
    assert tx.count == 3 and tx.epochs == 3
    for producer in range(3):
        calls = [name for number, name in log if number == producer]
        assert calls == ["init_transactions", "begin_transaction", "produce", "commit_transaction", "purge", "close"]


def test_a_producer_whose_commit_failed_is_never_used_again_not_even_to_abort():
    tx, log = _transactions(fail_commit_of=1)
    tx.open()
    tx.commit(_done(1))
    tx.open()
    with pytest.raises(TimeoutError):
        tx.commit(_done(2))
    tx.abandon()  # what publish_partition does on the way out
    assert [name for number, name in log if number == 1][-1] == "purge"  # dropped, not closed: close() aborts
    assert (1, "abort_transaction") not in log and (1, "close") not in log and tx.producer is None


def test_a_failure_inside_an_open_transaction_aborts_it_on_its_sound_producer():
    tx, log = _transactions()
    tx.open()
    tx.abandon()
    assert log[-2:] == [(0, "abort_transaction"), (0, "purge")]
