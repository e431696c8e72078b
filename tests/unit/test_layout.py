"""The run layout: one owner for every name and path of a run, and the process records that find
a run's processes again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.layout import (
    RunLayout,
    TrainerFiles,
    all_trainers,
    consumer_group,
    earlier_attempts,
    run_of_topic,
    run_topic,
    tasks_topic,
)
from stoker.process import ProcessRecord, start_ticks
from stoker.run.manifest import Manifest
from stoker_airflow.launcher import TrainerLauncher

pytestmark = pytest.mark.unit


def test_a_run_and_its_trainer_live_under_one_folder(tmp_path):
    run = RunLayout.of("sample", "2026-12-01", root=tmp_path)
    assert run.run_dir == tmp_path / "sample" / "2026-12-01"
    assert run.manifest.parent == run.quarantine.parent == run.timings.parent == run.run_dir
    t = run.trainer("stoker.sample.20261201.a1")
    assert t.folder == run.run_dir / "train" / "stoker.sample.20261201.a1"
    assert {t.log.parent, t.rc.parent, t.checkpoints.parent, t.export.parent, t.summary.parent} == {t.folder}
    assert RunLayout.of_manifest(run.manifest) == run


def test_a_templated_date_gives_templated_paths():
    ds = "{{ dag_run.run_after.strftime('%Y-%m-%d') }}"
    assert str(RunLayout.of("c", ds, root="/r").manifest) == f"/r/c/{ds}/manifest.json"


def test_kafka_names():
    topic = run_topic("sample", "2026-12-01", 3)
    assert topic == "stoker.sample.20261201.a3"
    assert run_of_topic(topic) == "stoker.sample.20261201"
    assert tasks_topic(topic) == topic + ".tasks"
    assert consumer_group(topic) == "stoker-train." + topic


def test_earlier_attempts_are_other_attempts_of_the_same_run_only():
    topic = "stoker.s.20261201.a2"
    existing = ["stoker.s.20261201.a1", "stoker.s.20261201.a1.tasks", topic, topic + ".tasks",
                "stoker.s.20261202.a1", "stoker.s.20261201.a10x", "stoker.s2.20261201.a1"]
    assert earlier_attempts(topic, existing) == ["stoker.s.20261201.a1", "stoker.s.20261201.a1.tasks",
                                                 topic + ".tasks"]


def test_process_record_knows_its_process_and_stops_its_group(tmp_path):
    rec = ProcessRecord(tmp_path / "p.json")
    proc = rec.spawn(["/bin/sh", "-c", "sleep 60 & sleep 60"], log=tmp_path / "p.log")
    try:
        assert rec.pid() == proc.pid and rec.running()
        time.sleep(0.2)
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert children
        assert rec.stop(grace=5) is True
        proc.wait(timeout=10)
        assert all(start_ticks(c) is None for c in children)  # the whole group went
        assert not rec.running() and not rec.path.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_reused_pid_is_not_the_recorded_process(tmp_path):
    rec = ProcessRecord(tmp_path / "p.json")
    rec.path.write_text(f'{{"pid": {os.getpid()}, "start": 1}}')  # this pid, another start time
    assert rec.pid() is None
    rec.path.write_text("not json")
    assert rec.pid() is None


def _manifest(created_at: str) -> Manifest:
    return Manifest(run_id="c/2026-12-01", corpus="c", ds="2026-12-01", topic="stoker.c.20261201.a1",
                    partitions=[], seq_len=8, dtype="uint16", tokenizer_path="t", tokenizer_sha256="x",
                    vocab_size=10, docs_in=0, docs_kept=0, docs_dropped={}, tokens=0, padding_tokens=0,
                    sequences=0, source_uri="data", created_at=created_at)


def test_the_launcher_drops_state_of_another_publication_and_keeps_its_own(tmp_path):
    files = TrainerFiles(tmp_path / "train" / "stoker.c.20261201.a1")
    files.checkpoints.mkdir(parents=True)
    first, second = _manifest("2026-12-01T00:00:00"), _manifest("2026-12-01T00:05:00")
    files.publication.write_text(first.publication)
    TrainerLauncher(files).adopt_or_reset(first)
    assert files.checkpoints.exists()  # a retry of the same publication resumes its checkpoint
    TrainerLauncher(files).adopt_or_reset(second)
    assert not files.folder.exists()  # a re-publication never resumes offsets into the old data
    assert list(all_trainers(tmp_path / "none")) == []


def test_the_launcher_follows_a_trainer_until_its_exit_code(tmp_path):
    files = TrainerFiles(tmp_path / "t")
    launcher = TrainerLauncher(files)
    cmd = [sys.executable, "-c", "import time; time.sleep(1.5)"]
    launcher.start(_manifest("x"), cmd, {}, world_size=1)
    assert launcher.running()
    deadline = time.monotonic() + 30
    while launcher.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert files.exit_code() == 0 and not launcher.running()
    assert files.publication.read_text().strip() == _manifest("x").publication


def test_the_launcher_runs_the_trainer_as_a_module():
    cmd = TrainerLauncher(TrainerFiles(Path("/t"))).command("/r/manifest.json", "/r/plan.json", 2, "torchrun", [])
    assert cmd[cmd.index("-m", 3) + 1] == "training.train" and "--nproc_per_node" in cmd
    assert cmd[cmd.index("--plan") + 1] == "/r/plan.json" and "--recipe" not in cmd  # the plan names the recipe
    ds = TrainerLauncher(TrainerFiles(Path("/t"))).command("/r/manifest.json", "/r/plan.json", 2, "deepspeed", [])
    assert ds[ds.index("--module") + 1] == "training.train"


def test_several_nodes_get_a_launcher_each_joining_one_rendezvous(tmp_path):
    from stoker_airflow.launcher import Placement, supervise

    launcher = TrainerLauncher(TrainerFiles(tmp_path / "t"))
    cmds = launcher.commands("/r/manifest.json", "/r/plan.json",
                             Placement(world_size=4, nodes=["127.0.0.1", "gpu2"], node_shell="ssh -p 22 {host}"), [])
    local, remote = cmds
    assert local[local.index("--nnodes") + 1] == "2" and local[local.index("--nproc_per_node") + 1] == "2"
    assert local[local.index("--rdzv-endpoint") + 1].startswith("127.0.0.1:") and "c10d" in local
    assert remote[:4] == ["ssh", "-p", "22", "gpu2"] and "torch.distributed.run" in remote[4]
    assert local[local.index("--rdzv-endpoint") + 1] in remote[4]  # both nodes meet at the same place
    ds = launcher.commands("/r/manifest.json", "/r/plan.json",
                           Placement(world_size=4, nodes=["a", "b"], launcher="deepspeed"), [])
    assert len(ds) == 1 and (tmp_path / "t" / "hostfile").read_text() == "a slots=2\nb slots=2\n"
    # one launcher that fails stops the others, and its exit code is the task's
    rc = tmp_path / "rc"
    script = supervise([["sleep", "30"], ["sh", "-c", "exit 3"]], rc)
    started = time.monotonic()
    subprocess.run(["/bin/bash", "-c", script], check=True, timeout=20)
    assert rc.read_text().strip() == "3" and time.monotonic() - started < 10
    subprocess.run(["/bin/bash", "-c", supervise([["true"], ["true"]], rc)], check=True, timeout=20)
    assert rc.read_text().strip() == "0"


def test_a_remote_nodes_ranks_are_tagged_and_stopped_through_the_node_shell(tmp_path):
    """On another node the launcher's processes carry the trainer's tag too, and the stop before a relaunch
    runs `python -m stoker.process stop-tagged` there through `train.node_shell` (here a shell on this
    machine standing in for ssh: the command it is given is what ssh would run on the node)."""
    import os
    import sys
    import time

    from stoker.process import TAG_VAR, tagged
    from stoker_airflow.launcher import Placement

    launcher = TrainerLauncher(TrainerFiles(tmp_path / "t"))
    placement = Placement(world_size=2, nodes=["127.0.0.1", "gpu2"], node_shell="env NODE={host} bash -c")
    remote = launcher.commands("/r/manifest.json", "/r/plan.json", placement, [])[1]
    assert f"{TAG_VAR}={tmp_path / 't'}" in remote[-1]  # the remote launcher and its ranks are tagged
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                            env={**os.environ, TAG_VAR: str(tmp_path / "t")})  # a rank left running "there"
    deadline = time.monotonic() + 30  # until the child has exec'd, /proc shows the parent's environment
    while tagged(str(tmp_path / "t")) != [rank.pid] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tagged(str(tmp_path / "t")) == [rank.pid]
    launcher._stop_remote(placement, "gpu2", grace=5)
    assert rank.wait(timeout=30) != 0 and not tagged(str(tmp_path / "t"))


def test_each_python_environment_builds_its_torch_ops_in_a_folder_of_its_own(monkeypatch, tmp_path):
    # the ops' build commands name the venv's include paths: checkouts sharing a folder rebuilt each other's
    from stoker import paths

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path))
    mine = paths.torch_extensions_dir()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "another-checkout" / ".stoker" / "venv"))
    theirs = paths.torch_extensions_dir()
    assert mine.parent == theirs.parent == tmp_path / "torch-extensions" and mine != theirs
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "chosen"))
    assert paths.torch_extensions_dir() == tmp_path / "chosen"



def test_every_trainer_builds_its_torch_ops_with_the_environments_own_ninja(monkeypatch, tmp_path):
    # the stack's services run with PATH=/usr/bin:/bin (the system's ninja 1.11), the suite and `make run`
    # with the venv's bin first (ninja 1.13): the two hash a command differently, so each trainer rebuilt
    # DeepSpeed's shm op the other had built (30-50 s a start)
    from stoker import paths

    env_bin = str(Path(sys.executable).absolute().parent)
    build = paths.torch_build_env({"PATH": f"/usr/bin:/bin:{env_bin}"})
    assert build["PATH"] == f"{env_bin}:/usr/bin:/bin" and build["TORCH_EXTENSIONS_DIR"]
    # the launcher hands that to the ranks, whatever PATH its own process has
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    files = TrainerFiles(tmp_path / "t")
    launcher = TrainerLauncher(files)
    seen = tmp_path / "path.txt"
    cmd = [sys.executable, "-c", f"import os, shutil; open({str(seen)!r}, 'w').write(os.environ['PATH'] + "
           "'|' + str(shutil.which('ninja')))"]
    launcher.start(_manifest("x"), cmd, {}, world_size=1)
    deadline = time.monotonic() + 30
    while launcher.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    path, ninja = seen.read_text().split("|")
    assert path.split(":")[0] == env_bin
    if (Path(env_bin) / "ninja").exists():  # the environment's own, as `pip install deepspeed` left it
        assert ninja == str(Path(env_bin) / "ninja")
