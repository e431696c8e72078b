"""`stoker gc`: old run folders and old nights' checkpoints go (dry run first); a line's head, its last
join, a held night and a running trainer's run never do; the line still plans after it."""

from __future__ import annotations

import json
import os

import pytest
from test_line_rules import _join  # tests/unit: a night planned and promoted as the train task does

from stoker.layout import LineLayout, RunLayout
from stoker.lines.ledger import head
from stoker.lines.parents import choose_parent
from stoker.reports.gc import HOLD, freed_bytes, removals
from stoker_local.cli import main

pytestmark = pytest.mark.unit


def _run(corpus: str, ds: str, mb: int = 1) -> RunLayout:
    run = RunLayout.of(corpus, ds)
    folder = run.trainer(f"stoker.{corpus}.{ds}.a1").checkpoints / "step00000010"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"x" * (mb << 20))
    return run


def test_old_runs_go_but_a_running_trainers_stays(home, capsys):
    runs = [_run("web", f"2026-12-0{d}") for d in (1, 2, 3, 4)]
    live = runs[0].trainer("stoker.web.2026-12-01.a1")
    proc = live.process.spawn(["sleep", "600"], log=live.log)
    try:
        assert main(["gc", "--keep-runs", "2", "--json"]) == 0
        listed = [r["path"] for r in json.loads(capsys.readouterr().out)]
        assert listed == [str(runs[1].run_dir)]  # the 1st trains still, the 3rd and 4th are the newest two
        assert all(r.run_dir.exists() for r in runs)  # a dry run
        assert main(["gc", "--keep-runs", "2", "--apply"]) == 0
        assert "1.0 MB freed" in capsys.readouterr().out
        assert [r.run_dir.exists() for r in runs] == [True, False, True, True]
    finally:
        proc.kill()
    assert main(["gc", "--keep-runs", "0"]) == 2


def test_old_nights_lose_their_checkpoint_never_the_head_the_last_join_or_a_held_one(home):
    line = LineLayout.of("shared")
    for ds, corpus in (("2026-12-01", "web"), ("2026-12-02", "web"), ("2026-12-03", "web"), ("2026-12-04", "web"),
                       ("2026-11-20", "web")):  # the last: older than the head, a branch that joined last
        _join(line, home, ds, corpus=corpus)
    _join(line, home, "2026-12-05", corpus="code", decided=False)  # pending, then a branch joined after it
    _join(line, home, "2026-11-19", corpus="web")
    (line.night("2026-12-01", "web").folder / HOLD).write_text("the model we shipped\n")
    top = head(line)
    gone = removals(keep_checkpoints=1)
    assert sorted((r.what, r.path) for r in gone) == sorted(
        ("checkpoint", str(line.night(ds, "web").checkpoint)) for ds in ("2026-11-20", "2026-12-02", "2026-12-03"))
    whole = removals(keep_checkpoints=1, keep_nights=2)
    assert {(r.what, r.path.rsplit("/", 1)[-1]) for r in whole} == {
        ("night", "2026-12-02.web"), ("night", "2026-12-03.web"), ("night", "2026-11-20.web")}  # kept: 11-19
    # (joined last), 12-05.code (pending: a person may still promote it), 12-04 (the head)
    from stoker.reports.gc import apply

    apply(whole)
    assert [n.folder.name for n in line.nights()] == ["2026-11-19.web", "2026-12-01.web", "2026-12-04.web",
                                                      "2026-12-05.code"]
    assert head(line) == top and choose_parent(line, "2026-12-05", "web", "random", "branch").ds == "2026-12-04"


def test_freed_bytes_count_a_hard_link_once_and_only_when_every_link_goes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "f").write_bytes(b"x" * 1000)
    os.link(a / "f", b / "f")
    assert freed_bytes(a) == 0 and freed_bytes(a, b) == 1000


def test_a_run_training_on_another_host_or_still_publishing_stays(home):
    """A trainer recorded on another host is alive by its heartbeat (a pid of another host means nothing here),
    and a run with a plan and no manifest yet may be publishing: neither goes. Before, liveness was this host's
    pid alone, and gc removed the run folder a gpu host was training from."""
    import socket
    import time

    from stoker.reports.gc import TRAINER_GONE_S

    runs = [_run("web", f"2026-12-0{d}") for d in (1, 2, 3, 4, 5)]
    remote = runs[0].trainer("stoker.web.2026-12-01.a1")
    remote.process.path.write_text(json.dumps({"pid": 1, "start": 1, "host": "gpu-2." + socket.gethostname()}))
    remote.heartbeat.write_text(json.dumps({"host": "gpu-2", "pid": 1, "beat": 9, "at": time.time()}))
    runs[1].plan.write_text("{}")  # its Spark stage is at work: no manifest yet
    listed = [r.path for r in removals(keep_runs=2)]
    assert listed == [str(runs[2].run_dir)]
    remote.heartbeat.write_text(json.dumps({"host": "gpu-2", "pid": 1, "beat": 9,
                                            "at": time.time() - 2 * TRAINER_GONE_S}))  # that host is gone
    old = time.time() - 7 * 3600
    os.utime(runs[1].plan, (old, old))  # a publication that died hours ago
    assert [r.path for r in removals(keep_runs=2)] == [str(r.run_dir) for r in runs[:3]]
