"""Every trigger survives the triggerer's serialise → import-by-classpath → rebuild round trip."""

import importlib

import pytest

from stoker_airflow.triggers.kafka import KafkaLagTrigger, KafkaPublishedTrigger

pytestmark = pytest.mark.unit


def _rebuild(trigger):
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    return cls(**kwargs), kwargs


@pytest.mark.parametrize(
    "trigger",
    [
        KafkaPublishedTrigger(topic="stoker.s.20261201.a1", expected={0: 12, "1": 9}, kafka_config_id="k",
                              poll_interval=3.0, deadline=1e9),
        KafkaLagTrigger(topic="stoker.s.20261201.a1", group_id="g", end={0: 10, 1: 11}, start={0: 0, 1: 1},
                        max_lag=2, tokens_per_message=256, kafka_config_id="k", poll_interval=7.0, deadline=2e9,
                        created_at="2026-12-01T02:00:00+00:00", retention_ms=604800000),
    ],
)
def test_serialize_round_trip(trigger):
    rebuilt, kwargs = _rebuild(trigger)
    assert type(rebuilt) is type(trigger)
    assert rebuilt.serialize() == trigger.serialize()
    assert all(isinstance(k, str) for v in kwargs.values() if isinstance(v, dict) for k in v)  # JSON-safe keys


def _trainer(tmp_path):
    """A stand-in launcher: a real process recorded as the trainer's, in a session of its own."""
    import sys

    from stoker.layout import TrainerFiles

    files = TrainerFiles(tmp_path / "trainer")
    proc = files.process.spawn([sys.executable, "-c", "import time; time.sleep(120)"], log=files.log)
    return files, proc


def test_a_trainer_killed_as_a_whole_is_noticed_without_an_exit_code(tmp_path):
    import json
    import signal

    from stoker_airflow.triggers.kafka import TRAINER_LOST, trainer_exit

    files, proc = _trainer(tmp_path)
    assert trainer_exit(str(files.rc)) is None  # running
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert trainer_exit(str(files.rc)) == TRAINER_LOST  # gone, no exit code written
    files.rc.write_text("3\n")
    assert trainer_exit(str(files.rc)) == 3
    files.rc.unlink()
    rec = json.loads(files.process.path.read_text())
    files.process.path.write_text(json.dumps({**rec, "host": "another-host"}))
    assert trainer_exit(str(files.rc)) is None  # a triggerer elsewhere cannot tell: it never calls it dead


def test_the_lag_trigger_reports_a_dead_trainer_while_kafka_is_unreachable(tmp_path, monkeypatch):
    import asyncio
    import json
    import signal
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DOWN", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": f"127.0.0.1:{port}"}}))
    files, proc = _trainer(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    trigger = KafkaLagTrigger(topic="stoker.s.20261201.a1", group_id="g", end={0: 10}, kafka_config_id="kafka_down",
                              poll_interval=1.0, rc_file=str(files.rc))

    async def first_event():
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(asyncio.wait_for(first_event(), timeout=60))
    assert event["status"] == "trainer_failed" and event["rc"] == -1


def test_retention_warns_then_fails_while_the_data_is_still_there():
    from datetime import UTC, datetime

    from stoker_airflow.triggers.kafka import retention_left, retention_status

    week = 7 * 24 * 3600 * 1000
    published = datetime(2026, 12, 1, tzinfo=UTC)
    at = published.timestamp()
    left = retention_left(published.isoformat(), week, at + 24 * 3600)  # a day after publication
    assert left == 6 * 24 * 3600
    assert retention_status(left, week, lag=10) is None
    assert retention_status(retention_left(published.isoformat(), week, at + 5.5 * 24 * 3600), week, 10) \
        == "retention_warning"  # under a quarter of the week left
    assert retention_status(retention_left(published.isoformat(), week, at + week / 1000 - 1800), week, 10) \
        == "retention_expiring"  # half an hour left: fail while the records are there
    assert retention_status(-5.0, week, lag=0) is None  # all consumed: nothing to lose
    assert retention_left("", week, at) is None and retention_left(published.isoformat(), 0, at) is None
    # retention.ms -1 keeps the records for ever: nothing expires, however late (it failed every night before)
    assert retention_left(published.isoformat(), -1, at + 365 * 24 * 3600) is None
    assert retention_status(retention_left(published.isoformat(), -1, at + 3600), -1, lag=10) is None


def test_the_lag_trigger_logs_a_changed_line_at_once_and_an_unchanged_one_once_a_minute():
    """It polls every 2 s so a dead trainer is noticed at once; a night of hours must not log every poll."""
    from stoker_airflow.triggers.kafka import PROGRESS_LOG_S, ProgressLog

    log = ProgressLog()
    polls = [(t * 2.0, "lag 40 messages" if t < 100 else "lag 20 messages") for t in range(200)]  # 400 s
    logged = [(t, line) for t, line in polls if log.due(line, t)]
    assert logged[0] == (0.0, "lag 40 messages") and (200.0, "lag 20 messages") in logged  # a change: at once
    assert [t for t, _ in logged] == [0.0, 60.0, 120.0, 180.0, 200.0, 260.0, 320.0, 380.0]  # 8 of 200 polls
    gaps = [b[0] - a[0] for a, b in zip(logged, logged[1:], strict=False) if a[1] == b[1]]
    assert gaps and all(g >= PROGRESS_LOG_S for g in gaps)


def test_the_lag_triggers_wait_ends_when_the_trainer_exits_not_a_poll_later(tmp_path):
    """The trainer's rc file appearing mid-wait ends the wait at once; one already there (a finished
    trainer whose offsets are still being read) does not turn the wait into a busy loop."""
    import asyncio
    import threading
    import time

    rc = tmp_path / "trainer.rc"
    trig = KafkaLagTrigger(topic="t", group_id="g", end={0: 1}, poll_interval=30.0, rc_file=str(rc))
    threading.Timer(0.3, lambda: rc.write_text("0\n")).start()
    t0 = time.monotonic()
    asyncio.run(trig._nap())
    assert 0.25 <= time.monotonic() - t0 < 2
    trig.poll_interval = 0.6
    t0 = time.monotonic()
    asyncio.run(trig._nap())  # the file exists from the start: a whole poll interval
    assert time.monotonic() - t0 >= 0.55
