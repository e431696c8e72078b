"""A night on a distributed Airflow: CeleryExecutor with a ``gpu`` queue, each component on a host of its
own (tests/support/hosts.py: separate hostnames, PID spaces and private disks), and a gpu host lost
mid-training.

Hosts: ``control`` (api-server, scheduler, dag-processor), ``triggerer``, ``worker-1`` (Celery, queue
``default``: the sensors and the Spark driver) and ``gpu-1``/``gpu-2`` (Celery, queue ``gpu``, one slot
each). Shared services on this machine's own namespaces: PostgreSQL (metadata and Celery results), Redis
(Celery's broker), docker-compose's 3-node Kafka cluster (RF 3, min ISR 2) and a Spark standalone master
with one worker. The shared folder (Stoker's state: corpora, run folders, the trainer's folder, the
line) is the same path on every host; each host's Airflow home and task logs are on its own disk.

The night runs end to end; then the gpu host that runs the trainer is lost (every process of it killed
at once) after its first checkpoint. The triggerer, on its own host, calls the trainer dead from its
heartbeat; the retry runs on the other gpu host from the last checkpoint; Kafka's ConsoleConsumer
confirms every sequence was trained exactly once.

The next night, only the trainer's launcher (``torch.distributed.run``) is killed on its gpu host, with that
host's Celery worker, so the retry lands on the other gpu host while the killed launcher's ranks could train on
where they are: they are stopped on their own host, one life writes the checkpoints, and every key is trained
once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stoker.layout import LineLayout, RunLayout, TrainerFiles
from stoker_local import services
from stoker_local.servers import free_ports
from stoker_local.stack_refresh import StackApi, start_night
from tests.support.hosts import Host, hosts_file
from tests.support.kafka_cluster import ComposeCluster
from tests.support.trainer_tools import committed_keys, resume_step
from training.metrics import read_log, trained_keys

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ["STOKER_HOME"]) / "distributed"  # PostgreSQL's user must reach it: not /tmp/pytest-*
DS = "2026-12-03"
DS2 = "2026-12-04"
"""The second night: only its trainer's launcher is killed, with its gpu host's worker."""
DAG = "refresh_dist"
KILL_AT_STEP = 14  # past the checkpoint at step 10, well before the end (about 45 steps)
CORPUS = """\
name: dist
description: The multi-host test's corpus.
source:
  uri: "{state}/data/dist/{ds}"
  poke_interval_s: 2
  timeout_s: 300
tokenizer:
  path: "{state}/tokenizers/sample-bpe-8192/tokenizer.json"
pack:
  seq_len: 64
topic:
  partitions: 2
  replication_factor: 3
  min_insync_replicas: 2
publish:
  spark_partitions: 2
schedule:
  cron: null
  retries: 1
  retry_delay_s: 2
train:
  recipe: dist
  world_size: 1
  log_keys: true
  max_restarts: 1
  restart_delay_s: 2
  timeout_s: 1200
  line: dist
"""
RECIPE = "base: debug_cpu\ncheckpoint_every: 10\n"


def airflow(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "airflow"), *args]


def celery_worker(queue: str, slots: int) -> list[str]:
    return airflow("celery", "worker", "--queues", queue, "--concurrency", str(slots), "--skip-serve-logs")


def prepare_shared(shared: Path, sample_corpus: dict[str, Path]) -> None:
    """What every host mounts: the corpus config, its recipe, the tokenizer and the night's drop."""
    from stoker_local.sample import texts

    (shared / "corpora" / "recipes").mkdir(parents=True)
    (shared / "corpora" / "dist.yaml").write_text(CORPUS)
    (shared / "corpora" / "recipes" / "dist.yaml").write_text(RECIPE)
    tok = shared / "tokenizers" / "sample-bpe-8192"
    tok.mkdir(parents=True)
    shutil.copy(sample_corpus["tokenizer"], tok / "tokenizer.json")
    every = list(texts(sample_corpus["data"]))
    for ds, docs in ((DS, every[:110]), (DS2, every[110:220])):
        drop = shared / "data" / "dist" / ds
        drop.mkdir(parents=True)
        (drop / "part-0.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
        (drop / "_SUCCESS").touch()


def start_redis(home: Path, port: int) -> subprocess.Popen:
    home.mkdir(parents=True)
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(home), "--logfile", str(home / "redis.log")],
                            start_new_session=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip() \
            != "PONG":
        assert proc.poll() is None and time.monotonic() < deadline, (home / "redis.log").read_text()
        time.sleep(0.2)
    return proc


def host_env(stack: services.LocalStack, shared: Path, kafka: ComposeCluster, spark_url: str,
             redis_port: int) -> dict[str, str]:
    """Every host's environment: one Airflow deployment (CeleryExecutor, PostgreSQL, Redis) on its own
    disk (AIRFLOW_HOME under ``local/``), Stoker's state on the shared folder."""
    env = {**os.environ, **services.airflow_stack_env(stack)}
    env.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
    local = ROOT / "local"
    env.update({
        "STOKER_HOME": str(shared), "STOKER_CORPORA": str(shared / "corpora"),
        "AIRFLOW_HOME": str(local / "airflow"), "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(local / "airflow" / "logs"),
        "TMPDIR": str(local / "tmp"),
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + services.db_url(stack),
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "socket.gethostname",
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                  "extra": {"bootstrap.servers": kafka.client["bootstrap.servers"]}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": spark_url,
                                                  "extra": {"spark-binary": "spark-submit"}}),
    })
    return env


@pytest.fixture(scope="module")
def deployment(sample_corpus):
    """The shared services, then the five hosts; everything stopped at the end (the hosts by SIGKILL of
    their init, which leaves nothing of them behind)."""
    from stoker_local.servers.spark import SparkStandalone

    if ROOT.exists():
        shutil.rmtree(ROOT)
    shared = ROOT / "shared"
    prepare_shared(shared, sample_corpus)
    hosts_file(ROOT / "hosts", ["control", "triggerer", "worker-1", "gpu-1", "gpu-2"])
    base = free_ports(3)
    stack = services.LocalStack(home=ROOT / "services", api_port=base, pg_port=base + 1, parallelism=8)
    kafka, spark, redis, hosts = ComposeCluster(ROOT / "kafka"), None, None, []
    try:
        services._pg_up(stack)
        redis = start_redis(ROOT / "redis", base + 2)
        kafka.start()
        spark = SparkStandalone(ROOT / "spark", workers=1, cores=1, memory="2g").start()
        env = host_env(stack, shared, kafka, spark.url, base + 2)
        outside = ROOT / "services" / "airflow"  # `airflow db migrate` runs as compose's airflow-init does
        services._prepare_db({**env, "AIRFLOW_HOME": str(outside),
                              "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(outside / "logs")}, print)
        components = {"control": {c: services._airflow_cmd(c, stack) for c in ("api-server", "scheduler",
                                                                              "dag-processor")},
                      "triggerer": {"triggerer": airflow("triggerer")},
                      "worker-1": {"celery-worker": celery_worker("default", 2)},
                      "gpu-1": {"celery-worker": celery_worker("gpu", 1)},
                      "gpu-2": {"celery-worker": celery_worker("gpu", 1)}}
        hosts = [Host(name, ROOT, cmds, env, keep_alive=name.startswith("gpu")).start()
                 for name, cmds in components.items()]
        yield {h.name: h for h in hosts}, stack, kafka, shared
    finally:
        for h in reversed(hosts):
            h.stop()
        for stop in (spark.stop if spark else None, kafka.stop, redis.kill if redis else None):
            if stop:
                stop()
        services._record(stack, "postgres").stop(sig=2)


def wait_for(pred, what: str, hosts: dict[str, Host], timeout: float = 600, every: float = 2.0):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        dead = [f"{h.name}: {c}" for h in hosts.values() if h.lost_at is None
                for c in h.started if not h.alive()]
        assert not dead, f"{dead} exited while waiting for {what}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s\n" + "\n".join(
            f"--- {h.name}/{c}\n{h.log_tail(c, 30)}" for h in hosts.values() for c in h.started)
        time.sleep(every)


def lose_the_trainers_host(files: TrainerFiles, hosts: dict[str, Host], lost: dict) -> None:
    """Once the trainer has checkpointed and trained past KILL_AT_STEP, lose the host it runs on."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        steps = [r["step"] for r in read_log(files.metrics)] if files.metrics.exists() else []
        if steps and max(steps) >= KILL_AT_STEP and resume_step(files.folder) >= 10:
            host = hosts[json.loads(files.process.path.read_text())["host"]]
            lost.update(host=host.name, pids=len(host.pids()), step=max(steps), at=host.lose())
            return
        time.sleep(0.2)


def launched(run: RunLayout) -> TrainerFiles | None:
    """The night's trainer folder, once a launcher is recorded in it."""
    found = [TrainerFiles(d) for d in sorted(run.train_dir.glob("*"))] if run.train_dir.is_dir() else []
    return next((f for f in found if f.process.path.exists()), None)


def task_log(host: Host, task_id: str, attempt: int) -> str:
    """A try's log as the host that ran it wrote it on its own disk ("" where it ran no part of it)."""
    found = list((host.disk / "airflow" / "logs").rglob(f"task_id={task_id}/attempt={attempt}.log"))
    return found[0].read_text(errors="replace") if found else ""


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def trained_once(run: RunLayout, files: TrainerFiles, kafka: ComposeCluster) -> str:
    """Every sequence of the night trained exactly once (Kafka's ConsoleConsumer as the reference), by a trainer
    that resumed from a checkpoint; its log."""
    from stoker.run.manifest import read_manifest

    m = read_manifest(run.manifest)
    published = committed_keys(kafka.client["bootstrap.servers"], m.topic)  # Kafka's own reader
    trained = trained_keys(files)
    assert not [k for k, n in Counter(trained).items() if n > 1], "a sequence was trained twice"
    assert sorted(trained) == sorted(k.decode() for k in published) and len(published) == m.sequences
    log = files.log.read_text(errors="replace")
    assert "resumed from" in log, log[-3000:]
    return log


def run_night(api: StackApi, run: RunLayout, ds: str, hosts: dict[str, Host],
              fault: Callable[[TrainerFiles], None]) -> tuple[str, dict[str, dict]]:
    """Night ``ds`` (its run folder ``run``) triggered on the stack, ``fault(trainer files)`` done once its trainer
    is launched; the run must succeed. Its run id and task instances."""
    def killer() -> None:
        fault(wait_for(lambda: launched(run), "a launched trainer", hosts, timeout=900, every=0.5))

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    run_id = start_night(api, DAG, ds, {}, print)
    state = wait_for(lambda: (s := api.call("GET", f"/dags/{DAG}/dagRuns/{run_id}")["state"]) in ("success",
                     "failed") and s, "the night to finish", hosts, timeout=1500, every=3)
    thread.join(timeout=5)
    tis = {t["task_id"]: t for t in api.call("GET", f"/dags/{DAG}/dagRuns/{run_id}/taskInstances")["task_instances"]}
    logs = "\n".join(f"--- {h.name}/{c}\n{h.log_tail(c, 40)}" for h in hosts.values() for c in h.started)
    where = {k: (t["state"], t["hostname"], t["try_number"]) for k, t in tis.items()}
    assert state == "success", f"{where}\n{logs}"
    return run_id, tis


def test_a_night_runs_across_hosts_and_its_training_survives_losing_its_gpu_host(deployment):
    hosts, stack, kafka, shared = deployment
    api = StackApi(stack)
    wait_for(lambda: services._all_healthy(services.health(stack)), "a healthy Airflow", hosts, timeout=300)
    wait_for(lambda: DAG in {d["dag_id"] for d in api.call("GET", "/dags")["dags"]}, f"{DAG} parsed", hosts)
    run = RunLayout.of("dist", DS, root=shared / "runs")
    lost: dict = {}
    run_id, tis = run_night(api, run, DS, hosts, lambda files: lose_the_trainers_host(files, hosts, lost))
    assert lost, "the trainer's host was never lost"

    # where each task ran: the Spark driver on the default worker, training on gpu hosts
    assert tis["publish.tokenize_publish"]["hostname"] == "worker-1"
    on_gpu = ("training.train", "training.evaluate")  # the evaluation loads models: the gpu queue too
    ran = {k: t for k, t in tis.items() if t["hostname"]}  # the review step never runs when evaluate skips
    assert {t["hostname"] for k, t in ran.items() if k not in on_gpu} <= {"worker-1"}
    assert tis["training.review"]["state"] == "skipped"
    assert tis["training.evaluate"]["hostname"] in {"gpu-1", "gpu-2"}
    tries = api.call("GET", f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/training.train/tries")["task_instances"]
    first, last = sorted(tries, key=lambda t: t["try_number"])[0], tis["training.train"]
    survivor = ({"gpu-1", "gpu-2"} - {lost["host"]}).pop()
    # try 1 launched the trainer on the lost host and deferred; with that host gone, it resumed on the other
    # gpu host (a try's hostname is the host that ran it last) and failed; try 2 ran there too
    assert first["state"] == "failed" and first["hostname"] == survivor, tries
    assert last["try_number"] == 2 and last["hostname"] == survivor and last["state"] == "success", last
    assert "trainer started" in task_log(hosts[lost["host"]], "training.train", 1)
    assert "trainer started" in task_log(hosts[survivor], "training.train", 2)
    assert "trainer started" not in task_log(hosts[survivor], "training.train", 1)

    # the retry resumed from the checkpoint the lost host left, and trained every sequence exactly once
    files = launched(run)
    assert json.loads(files.process.path.read_text())["host"] == survivor
    log = trained_once(run, files, kafka)
    assert "at step 10" in log, log[-3000:]
    assert (LineLayout.of("dist", root=shared / "lines").folder).is_dir()

    # each host's disk is its own: a task's log is on the disk of the host that ran it, and only there
    logs_of = {h: {p.name for p in (hosts[h].disk / "airflow" / "logs").rglob("task_id=*")} for h in hosts}
    assert "task_id=publish.tokenize_publish" in logs_of["worker-1"]
    assert "task_id=training.train" in logs_of[survivor] and "task_id=training.train" not in logs_of["worker-1"]
    assert not logs_of["control"]
    trigger_logs = list((hosts["triggerer"].disk / "airflow" / "logs").rglob("*.log"))
    assert trigger_logs and all(".trigger." in p.name for p in trigger_logs)  # the triggerer ran triggers only
    assert not any((ROOT / "local").iterdir())  # outside every host, the private mount point is empty

    # how long the failure took to notice, and the relaunch
    failed_at, relaunched_at = ts(first["end_date"]), files.process.path.stat().st_mtime
    figures = {"lost_host": lost["host"], "lost_processes": lost["pids"], "lost_at_step": lost["step"],
               "death_to_failed_try_s": round(failed_at - lost["at"], 1),
               "failed_try_to_relaunch_s": round(relaunched_at - failed_at, 1),
               "retry_delay_s": 2, "heartbeat_s": 5.0, "stale_after_s": 7.5, "trigger_poll_s": 2}
    print("DISTRIBUTED=" + json.dumps(figures))
    (Path(os.environ["STOKER_HOME"]) / "artifacts").mkdir(exist_ok=True)
    (Path(os.environ["STOKER_HOME"]) / "artifacts" / "distributed.json").write_text(json.dumps(figures, indent=2))
    assert lost["pids"] >= 3  # the Celery worker, its task supervisor or pool, the trainer's launcher and rank
    assert figures["death_to_failed_try_s"] < 60, figures


def kill_the_launcher_only(files: TrainerFiles, hosts: dict[str, Host], killed: dict) -> None:
    """Once the trainer has checkpointed and trained past KILL_AT_STEP: on its host, SIGKILL the Celery worker
    (every process there that is not the trainer's nor the host's own: the retry must run elsewhere) and then the
    launcher alone."""
    import psutil

    from stoker.process import tagged

    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        steps = [r["step"] for r in read_log(files.metrics)] if files.metrics.exists() else []
        if steps and max(steps) >= KILL_AT_STEP and resume_step(files.folder) >= 10:
            host = hosts[json.loads(files.process.path.read_text())["host"]]
            trainer = set(tagged(str(files.folder)))
            ranks = [p for p in trainer if "training.train" in psutil.Process(p).cmdline()
                     and "torch.distributed.run" not in psutil.Process(p).cmdline()]
            for pid in (p for p in host.pids() if p not in trainer and p != host.init):
                with contextlib.suppress(psutil.Error):
                    if psutil.Process(pid).cmdline() != ["sleep", "infinity"]:  # the host's own keep-alive stays
                        psutil.Process(pid).kill()
            launcher = next(p for p in trainer if "torch.distributed.run" in psutil.Process(p).cmdline())
            psutil.Process(launcher).kill()
            killed.update(host=host.name, ranks=ranks, step=max(steps), at=time.time())
            return
        time.sleep(0.2)


def test_ranks_of_a_launcher_killed_alone_are_stopped_on_their_host_when_the_retry_runs_on_another(deployment):
    """Before, the retry on the other gpu host cleared the record of a trainer it could not see and relaunched
    beside the orphaned ranks: two lives trained the night from one checkpoint folder and consumer group."""
    import psutil

    from stoker.process import tagged

    hosts, stack, kafka, shared = deployment
    for name in ("gpu-1", "gpu-2"):  # the host the night before lost comes back
        if not hosts[name].alive():
            hosts[name].init, hosts[name].lost_at = None, None
            hosts[name].start()
    api = StackApi(stack)
    run = RunLayout.of("dist", DS2, root=shared / "runs")
    killed: dict = {}
    run_night(api, run, DS2, hosts, lambda files: kill_the_launcher_only(files, hosts, killed))
    assert killed and killed["ranks"], "the launcher was never killed"
    other = ({"gpu-1", "gpu-2"} - {killed["host"]}).pop()
    files = launched(run)
    assert json.loads(files.process.path.read_text())["host"] == other  # the relaunch ran on the other host
    # the killed launcher's ranks were stopped where they ran, before anything was relaunched
    assert not [p for p in killed["ranks"] if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not set(tagged(str(files.folder))) & set(hosts[killed["host"]].pids())
    trained_once(run, files, kafka)
    line = LineLayout.of("dist", root=shared / "lines")
    from stoker.lines import ledger

    assert ledger.head(line)["ds"] == DS2  # the night joined and was decided (no held-out set: eval.ungated)
