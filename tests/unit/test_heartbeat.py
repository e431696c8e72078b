"""Liveness that crosses hosts: a triggerer on another host than the trainer's cannot check a pid, so
the launcher's supervising shell beats a heartbeat in the shared trainer folder. A trainer whose host
is lost (every process of it gone at once) is called lost once the heartbeat is stale; a live one on
another host is followed, never called dead or launched twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from stoker import process
from stoker.layout import TrainerFiles
from stoker.process import Heartbeat

pytestmark = pytest.mark.unit


def _wait(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_heartbeat_is_fresh_until_its_staleness_limit(tmp_path):
    beat = Heartbeat(tmp_path / "heartbeat.json")
    assert beat.fresh() is None  # none yet: cannot be told
    beat.path.write_text(json.dumps({"host": "gpu-1", "pid": 7, "beat": 3, "at": 1000.0}))
    assert beat.fresh(now=1000.0 + process.HEARTBEAT_STALE_S) is True
    assert beat.fresh(now=1000.1 + process.HEARTBEAT_STALE_S) is False


def test_a_host_is_lost_only_after_two_stale_readings_of_the_same_beat_and_the_staleness_is_a_setting(
        tmp_path, monkeypatch):
    """One stale reading can be a shared folder that cached the file (NFS: 3-60 s), not a lost host: it takes two
    readings of the same beat, a staleness apart, to call the trainer lost; a new beat in between clears the
    first. A deployment sets the staleness with STOKER_HEARTBEAT_STALE_S."""
    beat = Heartbeat(tmp_path / "heartbeat.json")
    monkeypatch.setenv(process.STALE_ENV, "0.3")
    assert process.staleness() == 0.3
    beat.path.write_text(json.dumps({"host": "gpu-1", "pid": 7, "beat": 3, "at": time.time()}))
    assert beat.lost() is False
    beat.path.write_text(json.dumps({"host": "gpu-1", "pid": 7, "beat": 3, "at": time.time() - 1}))
    assert beat.lost() is None  # the first stale reading: not yet
    beat.path.write_text(json.dumps({"host": "gpu-1", "pid": 7, "beat": 4, "at": time.time() - 1}))
    assert beat.lost() is None  # another beat, stale too: it beat meanwhile, the count starts again
    time.sleep(0.35)
    assert beat.lost() is True  # the same beat, stale a staleness later
    monkeypatch.setenv(process.STALE_ENV, "60")  # a deployment on NFS
    assert beat.lost() is False and beat.fresh() is True


def _as_if_on_another_host(files: TrainerFiles) -> None:
    rec = json.loads(files.process.path.read_text())
    files.process.path.write_text(json.dumps({**rec, "host": "gpu-worker-2", "pid": 1, "start": 1}))


def test_a_trainer_on_a_lost_host_is_called_lost_and_a_live_one_followed(tmp_path, monkeypatch):
    from stoker_airflow.launcher import TrainerLauncher, supervise
    from stoker_airflow.triggers.kafka import TRAINER_LOST, trainer_exit

    monkeypatch.setattr(process, "HEARTBEAT_STALE_S", 1.0)
    files = TrainerFiles(tmp_path / "train" / "stoker.web.20261201.a1")
    files.folder.mkdir(parents=True)
    script = supervise([["sleep", "600"]], files.rc, files.heartbeat, heartbeat_s=0.2)
    proc = files.process.spawn(["/bin/bash", "-c", script], log=files.log)
    beat = Heartbeat(files.heartbeat)
    _wait(lambda: (beat.read() or {}).get("beat", 0) >= 3)  # it beats on
    assert beat.read()["host"] == os.uname().nodename
    _as_if_on_another_host(files)  # the triggerer's host sees neither the pid nor the process
    assert files.process.alive() is None  # without a heartbeat: cannot be told (never called dead)
    assert trainer_exit(str(files.rc)) is None and TrainerLauncher(files).running()  # followed, not relaunched
    assert f"on host {os.uname().nodename}, pid {proc.pid} there, last heartbeat" in TrainerLauncher(files).where()
    os.killpg(proc.pid, signal.SIGKILL)  # the host is lost: every process at once, no exit code written
    proc.wait()
    last = beat.read()["beat"]
    _wait(lambda: trainer_exit(str(files.rc)) == TRAINER_LOST, timeout=5)
    assert beat.read()["beat"] == last and not files.rc.exists() and not TrainerLauncher(files).running()


def test_the_heartbeat_ends_with_its_shell_and_an_exit_code_wins(tmp_path):
    from stoker_airflow.launcher import supervise
    from stoker_airflow.triggers.kafka import trainer_exit

    files = TrainerFiles(tmp_path / "t")
    files.folder.mkdir()
    script = supervise([["bash", "-c", "sleep 0.5; exit 3"]], files.rc, files.heartbeat, heartbeat_s=2)
    shell = subprocess.Popen(["/bin/bash", "-c", script], start_new_session=True)
    assert shell.wait(timeout=30) == 0 and trainer_exit(str(files.rc)) == 3
    with pytest.raises(ProcessLookupError):  # nothing of the heartbeat outlives the shell (not even its sleep)
        os.killpg(shell.pid, 0)
    last = Heartbeat(files.heartbeat).read()["beat"]
    time.sleep(0.4)
    assert Heartbeat(files.heartbeat).read()["beat"] == last
    assert not list(Path(files.folder).glob("*.tmp"))
    for cmds in ([["true"]], [["true"], ["true"]]):  # one launcher or several: the shell stops its heartbeat
        script = supervise(cmds, files.rc, files.heartbeat, heartbeat_s=2)
        shell = subprocess.Popen(["/bin/bash", "-c", script], start_new_session=True)
        assert shell.wait(timeout=30) == 0 and trainer_exit(str(files.rc)) == 0
        with pytest.raises(ProcessLookupError):
            os.killpg(shell.pid, 0)


def test_another_hosts_pid_is_never_taken_for_a_process_of_this_host(tmp_path):
    """A retry on another gpu worker reads the lost host's record: its pid there may be a live process
    here (PID namespaces number from 1; hosts booted alike share start times). Nothing of this host is
    followed or stopped for it."""
    files = TrainerFiles(tmp_path / "t")
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        files.process.write(sleeper.pid)
        assert files.process.pid() == sleeper.pid  # this host's: followed
        _as_if_on_another_host(files)
        rec = json.loads(files.process.path.read_text())
        rec.update(pid=sleeper.pid, start=process.start_ticks(sleeper.pid))
        files.process.path.write_text(json.dumps(rec))
        assert files.process.pid() is None and not files.process.stop(grace=1)
        assert sleeper.poll() is None  # not stopped: it was never the recorded process
    finally:
        sleeper.kill()
        sleeper.wait()
