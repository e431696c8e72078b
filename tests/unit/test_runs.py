import pytest

from stoker.runs import record_stage, stage_seconds

pytestmark = pytest.mark.unit


def test_stage_time_spans_retries_of_one_run_and_resets_for_another(tmp_path):
    record_stage(tmp_path, "train", "start", now=100.0, run="r1")
    record_stage(tmp_path, "train", "start", now=150.0, run="r1")  # a retry or a deferral resuming
    record_stage(tmp_path, "train", "end", now=170.0, run="r1")
    assert stage_seconds(tmp_path) == {"train": 70.0}
    record_stage(tmp_path, "train", "start", now=500.0, run="r2")  # the date re-run
    assert stage_seconds(tmp_path) == {}
    record_stage(tmp_path, "train", "end", now=510.0, run="r2")
    assert stage_seconds(tmp_path) == {"train": 10.0}
