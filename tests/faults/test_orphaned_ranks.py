"""Only the launcher killed (SIGKILL to ``torchrun``, as the OOM killer or a careless ``kill`` does): torch
elastic started each rank in a session of its own, so the ranks outlive it, out of reach of the launcher's
process group. The supervising shell stops them (they carry the trainer's tag) before it writes the exit code,
and a relaunch stops whatever is left, so two trainers never share a checkpoint folder and consumer group,
and the night still trains every sequence of the manifest exactly once (Kafka's own ConsoleConsumer as the
reference)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from stoker.kafka import offsets as koffsets
from stoker.kafka.lag import compute_lag
from stoker.layout import RunLayout
from stoker.process import tagged
from stoker_airflow.launcher import Placement, TrainerLauncher
from tests.support.trainer_tools import await_step, committed_keys, publish_run, write_plan
from training.metrics import trained_keys

pytestmark = pytest.mark.faults


def _wait_exit(launcher: TrainerLauncher, timeout: float = 600) -> int:
    deadline = time.monotonic() + timeout
    while launcher.files.exit_code() is None or launcher.files.process.running():
        assert time.monotonic() < deadline, launcher.log_tail()
        time.sleep(0.2)
    return int(launcher.files.exit_code())


def _start(launcher: TrainerLauncher, m, manifest, kafka_config) -> None:
    placement = Placement(world_size=2)
    plan = write_plan(Path(manifest))
    cmd = launcher.commands(str(manifest), str(plan), placement,
                            ["--micro-batch-size", "2", "--checkpoint-every", "4",
                             "--log-keys", str(launcher.files.keys_log)])
    launcher.start(m, cmd, {"STOKER_KAFKA_CONFIG": json.dumps(kafka_config)}, 2)


def test_ranks_orphaned_by_a_killed_launcher_are_stopped_before_the_relaunch(kafka_config, sample_corpus, tmp_path):
    run = RunLayout(tmp_path / "run")
    m = publish_run(kafka_config, sample_corpus["tokenizer"], run.run_dir, partitions=4, per_partition=41)
    launcher = TrainerLauncher(run.trainer(m.topic))
    _start(launcher, m, run.manifest, kafka_config)
    shell = psutil.Process(launcher.pid())
    await_step(launcher.files.folder, 10, SimpleNamespace(poll=lambda: None if shell.is_running() else -1,
                                                         returncode=None))  # past the checkpoint at step 8
    torchrun = next(p for p in shell.children() if "torch.distributed.run" in p.cmdline())  # an argument, not the
    # shell script's text, which the heartbeat's subshell carries too
    ranks = [p for p in torchrun.children(recursive=True) if "training.train" in " ".join(p.cmdline())]
    assert len(ranks) == 2
    torchrun.kill()
    # the shell saw its launcher die, stopped the ranks it orphaned (they carry its tag), then wrote the exit
    # code: a retry on any host that reads the code relaunches beside nothing
    assert _wait_exit(launcher) != 0
    assert not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in ranks)
    assert not tagged(str(launcher.files.folder)) and not launcher.running()
    assert launcher.stop(Placement(world_size=2), grace=10) == []  # the retry's first act: nothing left

    _start(launcher, m, run.manifest, kafka_config)
    assert _wait_exit(launcher) == 0, launcher.log_tail()
    trained = trained_keys(launcher.files)
    assert not [k for k, n in Counter(trained).items() if n > 1], "a sequence was trained twice"
    reference = committed_keys(kafka_config["bootstrap.servers"], m.topic)
    assert sorted(trained) == sorted(k.decode() for k in reference) and len(reference) == m.sequences
    group = json.loads(launcher.files.summary.read_text())["group_id"]
    ends = koffsets.committed_offsets(kafka_config, group, m.topic, m.end_offsets())
    assert compute_lag(m.end_offsets(), ends).lag == 0
