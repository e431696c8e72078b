import pytest

from stoker.exceptions import StokerError
from stoker.kafka.lag import compute_lag

pytestmark = pytest.mark.unit


def test_lag_per_partition_in_messages_and_tokens():
    r = compute_lag(end={0: 100, 1: 50}, committed={0: 40, 1: None}, start={0: 0, 1: 10}, tokens_per_message=256)
    assert [(p.partition, p.lag) for p in r.partitions] == [(0, 60), (1, 40)]
    assert r.lag == 100 and r.lag_tokens == 100 * 256
    assert r.total_messages == 140
    assert r.consumed_fraction == pytest.approx(40 / 140)
    assert "p0=60" in r.describe() and "28.6% consumed" in r.describe()


def test_caught_up_group_has_zero_lag():
    r = compute_lag(end={0: 7, 1: 9}, committed={0: 7, 1: 9})
    assert r.lag == 0 and r.consumed_fraction == 1.0


def test_committed_before_the_run_start_counts_from_the_start():
    r = compute_lag(end={0: 20}, committed={0: 3}, start={0: 10})
    assert r.lag == 10


def test_committed_past_the_end_is_an_error_not_negative_lag():
    with pytest.raises(StokerError, match="past the end offset 5"):
        compute_lag(end={0: 5}, committed={0: 9})


def test_empty_run_is_fully_consumed():
    assert compute_lag(end={}, committed={}).consumed_fraction == 1.0
