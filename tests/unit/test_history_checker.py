"""The network-fault test's history checker (tests/support/history.py) on made-up histories: each anomaly it
names is found, and a clean history has none. (It reads real topics in tests/faults/test_network_faults.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stoker.run.records import make_key
from tests.support.history import Read, anomalies, check

pytestmark = pytest.mark.unit


def _history(keys: list[tuple[int, int, int]]) -> list[Read]:
    """(partition, task, index) in log order; offsets counted per partition, a marker after each record."""
    at: dict[int, int] = {}
    out = []
    for p, task, index in keys:
        out.append(Read(p, at.get(p, 0), make_key(task, index)))
        at[p] = at.get(p, 0) + 2
    return out


CLEAN = [(0, 0, 0), (1, 0, 1), (0, 0, 2), (1, 1, 0), (0, 1, 1)]
TASKS = {0: 3, 1: 2}
MANIFEST = SimpleNamespace(sequences=5, partitions=[SimpleNamespace(partition=0, sequences=3),
                                                    SimpleNamespace(partition=1, sequences=2)])


def test_a_clean_history_has_no_anomaly():
    h = _history(CLEAN)
    assert anomalies(check(h, h, TASKS, MANIFEST)) == {}


@pytest.mark.parametrize(("committed", "tasks", "expected"), [
    ([(0, 0, 0), (1, 0, 1), (1, 1, 0), (0, 1, 1)], TASKS, {"lost": 1, "counts": 1}),  # task 0's last
    ([(0, 0, 0), (0, 0, 2), (1, 1, 0), (0, 1, 1)], TASKS, {"torn": 1, "counts": 1}),  # task 0's middle one
    ([*CLEAN, (1, 0, 1)], TASKS, {"duplicate": 1, "counts": 1}),
    ([*CLEAN, (1, 1, 2)], TASKS, {"aborted_read": 1, "counts": 1}),  # beyond task 1's count
    ([*CLEAN, (1, 7, 0)], TASKS, {"aborted_read": 1, "counts": 1}),  # no such task
    ([(0, 0, 2), (1, 0, 1), (0, 0, 0), (1, 1, 0), (0, 1, 1)], TASKS, {"out_of_order": 1}),
    (CLEAN, {0: 3, 1: 3}, {"lost": 1, "counts": 1}),  # a done record counts more than the manifest
])
def test_each_anomaly_is_named(committed, tasks, expected):
    h = _history(committed)
    assert anomalies(check(h, h, tasks, MANIFEST)) == expected


def test_a_committed_record_the_uncommitted_read_lacks_is_unreadable():
    h = _history(CLEAN)
    assert anomalies(check(h, h[:-1], TASKS, MANIFEST)) == {"unreadable": 1}
