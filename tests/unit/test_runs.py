import pytest

from stoker.reports.runs import record_stage, stage_seconds

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


def _empty_night(tmp_path, **extra):
    from stoker.run.manifest import Manifest, PartitionRange, write_manifest

    m = Manifest(run_id="c/2026-12-01", corpus="c", ds="2026-12-01", topic="stoker.c.20261201.a1",
                 partitions=[PartitionRange(partition=0, start_offset=0, end_offset=0, sequences=0)],
                 seq_len=8, dtype="uint16", tokenizer_path="/t.json", tokenizer_sha256="ab" * 32, vocab_size=100,
                 docs_in=3, docs_kept=0, docs_dropped={"invalid_json": 2, "too_short": 1}, tokens=0,
                 padding_tokens=0, sequences=0, source_uri="/drops/2026-12-01", quarantine_path="/q", **extra)
    write_manifest(tmp_path, m)
    return m


def test_the_scrubbed_documents_are_shown_only_when_the_night_scrubbed(tmp_path):
    from stoker.reports.runs import render, summary

    _empty_night(tmp_path / "off")
    assert summary(tmp_path / "off")["scrubbed"] is None and "docs scrubbed" not in render(summary(tmp_path / "off"))
    _empty_night(tmp_path / "on", scrubbed={"docs": 2, "addresses": 3})
    s = summary(tmp_path / "on")
    assert s["scrubbed"] == {"docs": 2, "addresses": 3}
    assert "  docs scrubbed    2  (3 e-mail or IP addresses replaced)" in render(s)


def test_a_night_with_no_usable_document_skips_training_and_the_report_says_why(tmp_path):
    from airflow.sdk.exceptions import AirflowSkipException

    from stoker.reports.runs import render, summary
    from stoker_airflow.operators.train import DeepSpeedTrainOperator

    _empty_night(tmp_path)
    text = render(summary(tmp_path))
    assert "training         skipped: no usable document in /drops/2026-12-01: 3 records read, 0 kept " \
           "(2 invalid_json, 1 too_short)" in text
    op = DeepSpeedTrainOperator(task_id="train", manifest_path=str(tmp_path / "manifest.json"))
    with pytest.raises(AirflowSkipException, match="no usable document"):
        op.execute({})
    assert not (tmp_path / "train").exists()  # no trainer was started


def test_the_summarys_last_loss_is_not_one_nearly_empty_final_step():
    from training.progress import LAST_STEPS, Progress, StepStats

    p = Progress(publication="c/2026-12-01@t")
    for step in range(1, 31):
        p.update(StepStats(step=step, loss=9.0 - step * 0.1, rows=8, tokens=1000, seconds=0.1, data_wait=0.0))
    p.update(StepStats(step=31, loss=9.5, rows=1, tokens=10, seconds=0.1, data_wait=0.0))  # a padded tail
    assert p.first_loss == pytest.approx(8.9)
    expected = (sum((9.0 - s * 0.1) * 1000 for s in range(31 - LAST_STEPS + 1, 31)) + 9.5 * 10) / (
        1000 * (LAST_STEPS - 1) + 10)
    assert p.last_loss == pytest.approx(expected) and p.last_loss < 6.5
    again = Progress(publication=p.publication)
    again.load_state_dict(p.state_dict())  # a resumed session continues the same window
    assert again.recent == p.recent and again.last_loss == p.last_loss
