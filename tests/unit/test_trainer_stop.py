"""A trainer is stopped on whichever host it runs (issue 32). A retry on another gpu worker used to clear the
record of a trainer it could not see and relaunch beside it: a launcher killed alone left its ranks training
on its host, and a falsely stale heartbeat left the whole trainer there. Now the supervising shell on the
trainer's own host stops what its launcher left before it writes the exit code, obeys a stop request written
in the shared trainer folder and confirms it; a trainer that still beats and does not answer is never
relaunched beside (the try fails, its record kept). The processes here are real; "another host" is the
record's host name, as a worker on another machine reads it (tests/distributed runs real separate hosts)."""

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
from stoker.process import TAG_VAR, Heartbeat, tagged
from stoker_airflow.launcher import TrainerLauncher, TrainerNotStopped, supervise

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def _wait(pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _start(files: TrainerFiles, cmd: list[str], watch: bool = True) -> subprocess.Popen:
    """``cmd`` under a supervising shell as the launcher starts a trainer: tagged, beating every 0.2 s."""
    files.folder.mkdir(parents=True, exist_ok=True)
    script = supervise([cmd], files.rc, files.heartbeat, heartbeat_s=0.2, files=files if watch else None)
    proc = files.process.spawn(["/bin/bash", "-c", script], log=files.log, cwd=REPO,
                               env={**os.environ, TAG_VAR: str(files.folder)})
    _wait(lambda: (Heartbeat(files.heartbeat).read() or {}).get("beat", 0) >= 2)
    return proc


def _as_if_on_another_host(files: TrainerFiles) -> None:
    rec = json.loads(files.process.path.read_text())
    files.process.path.write_text(json.dumps({**rec, "host": "gpu-2", "pid": 1, "start": 1}))


def test_ranks_a_killed_launcher_left_are_stopped_by_its_supervisor_before_it_writes_the_exit_code(tmp_path):
    files = TrainerFiles(tmp_path / "t")
    # the launcher starts a rank in a session of its own (as torch elastic does), then dies
    _start(files, ["bash", "-c", "setsid sleep 600 & sleep 1; kill -9 $$"])
    _wait(lambda: files.exit_code() is not None)
    assert files.exit_code() != 0 and not tagged(str(files.folder))  # an exit code: nothing of it runs here


def test_a_trainer_on_another_host_is_stopped_there_by_its_supervisor_which_confirms(tmp_path):
    files = TrainerFiles(tmp_path / "t")
    proc = _start(files, ["bash", "-c", "setsid sleep 600 & wait"])
    _wait(lambda: len(tagged(str(files.folder))) >= 3)
    _as_if_on_another_host(files)  # what a retry on another gpu worker reads: a pid it cannot see
    assert not files.process.stop() and files.process.path.is_file()  # nothing stopped from here: the record kept
    left = TrainerLauncher(files).stop(grace=2)
    assert not tagged(str(files.folder)), "the trainer still runs on its host"
    confirmed = json.loads(files.stop_confirmed.read_text())
    assert confirmed["host"] == os.uname().nodename and len(confirmed["stopped"]) >= 3
    assert not files.process.path.exists() and not files.stop_request.exists() and left == []
    proc.wait(timeout=10)


def test_a_trainer_that_still_beats_and_does_not_answer_is_never_relaunched_beside(tmp_path):
    files = TrainerFiles(tmp_path / "t")
    proc = _start(files, ["sleep", "600"], watch=False)  # a supervisor that cannot obey (an older Stoker's)
    try:
        _as_if_on_another_host(files)
        with pytest.raises(TrainerNotStopped, match=r"runs on host gpu-2, which still beats .* did not confirm"):
            TrainerLauncher(files).stop_elsewhere(grace=0, window=1.5)
        assert files.process.path.is_file() and files.stop_request.is_file()  # the record is kept
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_host_whose_heartbeat_is_silent_for_the_whole_window_is_lost_and_its_record_cleared(tmp_path):
    files = TrainerFiles(tmp_path / "t")
    files.folder.mkdir()
    files.process.path.write_text(json.dumps({"pid": 1, "start": 1, "host": "gpu-2"}))
    files.heartbeat.write_text(json.dumps({"host": "gpu-2", "pid": 1, "beat": 7, "at": time.time() - 60}))
    how = TrainerLauncher(files).stop_elsewhere(grace=0, window=1.0)
    assert "host gpu-2 is lost: its heartbeat did not move" in how and not files.process.path.exists()
    # an exit code written there: its supervisor stopped its host's processes first
    files.process.path.write_text(json.dumps({"pid": 1, "start": 1, "host": "gpu-2"}))
    files.rc.write_text("1\n")
    assert "exited (code 1)" in TrainerLauncher(files).stop_elsewhere() and process.ProcessRecord(
        files.process.path)._read() is None
