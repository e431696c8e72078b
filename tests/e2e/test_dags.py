"""The DAGs as Airflow sees them: every DAG file imports cleanly and light, and ``dag.test()``
runs refresh_sample end to end against the real broker and Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stoker.kafka.lag import compute_lag
from stoker.layout import RunLayout
from stoker.run.manifest import read_manifest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def test_every_dag_imports_without_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags.get("refresh_sample")
    assert dag is not None
    order = [t.task_id for t in dag.topological_sort()]
    assert order == ["await_source", "publish.tokenize_publish", "publish.await_published", "training.train",
                     "training.await_consumed", "training.evaluate", "training.review", "report"]
    assert set(dag.task_group.children) == {"await_source", "publish", "training", "report"}
    # lineage: source -> tokenize_publish -> topic -> train; the model is await_consumed's outlet
    tasks = dag.task_dict
    # the source asset is the data's URI, shared by every corpus that reads it
    assert [a.name for a in tasks["publish.tokenize_publish"].inlets] == [
        f"file://{Path(os.environ['STOKER_HOME']) / 'data' / 'sample'}/"]
    assert [a.name for a in tasks["publish.tokenize_publish"].outlets] == ["stoker.sample.sequences"]
    # the topic asset names the Kafka connection, not an address read at parse time
    assert tasks["publish.tokenize_publish"].outlets[0].uri == "kafka://kafka_default/stoker.sample"
    assert [a.name for a in tasks["training.train"].inlets] == ["stoker.sample.sequences"]
    assert [a.name for a in tasks["training.await_consumed"].outlets] == ["stoker.sample.model"]
    assert {link.name for link in tasks["report"].operator_extra_links} == {"Run summary", "Loss curve"}
    assert dag.default_args["retries"] == 2 and dag.default_args["retry_exponential_backoff"] is True
    # a trainer that dies is relaunched by the train task's own retries, promptly and a bounded number of times
    assert tasks["training.train"].retries == 3 and tasks["training.train"].retry_exponential_backoff is False
    assert set(dag.params) == {"source_uri", "seq_len", "spark_partitions", "review"}
    for name, param in dag.params.items():  # the trigger form shows a title and a description for each
        assert param.schema.get("title") and len(param.description or "") > 40, name
    assert dag.doc_md and "refresh" in dag.doc_md.lower()


def test_dag_module_imports_no_heavy_library():
    code = ("import sys, dags.refresh_dags, dags.line_dags; "
            "print([m for m in ('pyspark', 'torch', 'deepspeed', 'transformers', 'tokenizers', 'pandas', 'pyarrow')"
            " if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


BAG = """
import json
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder="dags")
print("BAG=" + json.dumps({"dags": sorted(bag.dags), "errors": bag.import_errors}))
"""


def test_a_bad_corpus_config_is_an_import_error_and_the_others_stay(tmp_path):
    folder = tmp_path / "corpora"
    folder.mkdir()
    text = (REPO / "corpora" / "sample.yaml").read_text()
    (folder / "sample.yaml").write_text(text.replace("seq_len: 256", "seq_len: 1"))
    (folder / "other.yaml").write_text(text.replace("name: sample", "name: other"))
    env = {**os.environ, "STOKER_CORPORA": str(folder)}
    out = subprocess.run([sys.executable, "-c", BAG], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    bag = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("BAG="))[4:])
    assert "refresh_other" in bag["dags"] and "refresh_sample" not in bag["dags"]  # the good corpus keeps its DAG
    errors = "\n".join(bag["errors"].values())
    assert f"{folder / 'sample.yaml'}" in errors and "pack.seq_len = 1: must be in [2, 1048576]" in errors


DAG_TEST = """
import json, sys
from datetime import datetime, timezone
import dags.refresh_dags as m
run = m.refresh_sample.test(logical_date=datetime(2026, 12, 1, tzinfo=timezone.utc), run_conf={"review": "hold"})
print("STATE=" + json.dumps(str(run.state)))
from airflow.models.asset import AssetEvent, AssetModel
from airflow.utils.session import create_session
with create_session() as session:  # what the publish task told Airflow: the corpus's night, keyed by its date
    rows = session.query(AssetEvent, AssetModel).join(AssetModel, AssetEvent.asset_id == AssetModel.id).filter(
        AssetModel.name == "stoker.sample.sequences").all()
    print("EVENTS=" + json.dumps([{"key": e.partition_key, **e.extra} for e, _ in rows]))
"""


def test_refresh_sample_end_to_end(kafka_config, sample_corpus, airflow_db):
    from stoker.kafka import offsets as koffsets

    out = subprocess.run([sys.executable, "-c", DAG_TEST], cwd=REPO, env=os.environ.copy(),
                         capture_output=True, text=True, timeout=900)
    assert 'STATE="success"' in out.stdout, out.stdout[-4000:] + out.stderr[-4000:]
    run_dir = RunLayout.of("sample", "2026-12-01").run_dir
    m = read_manifest(run_dir)
    # the publish task updated the corpus's sequences asset for the night: keyed by its date, naming its manifest
    events = json.loads(out.stdout.split("EVENTS=", 1)[1].splitlines()[0])
    want = {"key": "2026-12-01", "run_id": "sample/2026-12-01", "manifest": str(RunLayout(run_dir).manifest),
            "topic": m.topic, "sequences": m.sequences}
    assert want in [{k: e.get(k) for k in want} for e in events], events
    assert m.docs_in == m.docs_kept + sum(m.docs_dropped.values())
    assert {"duplicate", "invalid_json", "invalid_utf8", "missing_text", "empty_text"} <= set(m.docs_dropped)
    assert m.end_offsets() == koffsets.end_offsets(kafka_config, m.topic)
    assert len(koffsets.read_all(kafka_config, m.topic)) == m.sequences > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["sequences"] == m.sequences
    assert {"await_source", "tokenize_publish", "await_published", "train", "await_consumed"} <= set(
        summary["stage_seconds"])
    # the trainer consumed the whole run: consumed = published, the group's lag is 0
    training = summary["training"]
    assert training["sequences_consumed"] == training["sequences_published"] == m.sequences
    assert training["world_size"] == 2 and training["last_loss"] < training["first_loss"]
    committed = koffsets.committed_offsets(kafka_config, f"stoker-train.{m.topic}", m.topic, m.end_offsets())
    assert compute_lag(m.end_offsets(), committed).lag == 0
    assert Path(training["loss_curve"]).stat().st_size > 0
    assert "done: tokenise, pack, publish" in json.loads(RunLayout(run_dir).spark_progress.read_text())["line"]
    # the trainer named its start-up phases; the last one before step 1:
    assert json.loads(RunLayout(run_dir).trainer(m.topic).phase.read_text())["phase"] == "reading the first batch"
    cli = subprocess.run([sys.executable, "-m", "stoker_local.cli", "runs", "show", "sample/2026-12-01", "--json"],
                         capture_output=True, text=True, check=True, env=os.environ.copy())
    shown = json.loads(cli.stdout)
    assert shown["docs_kept"] == m.docs_kept
    # 5 documents a thousand held out and scored; the line's first night (random weights) has nothing to beat
    night = shown["eval"]["sets"]["night"]["all"]
    assert night["docs"] == m.holdout["docs"] > 0 and 0 < night["bpb"] < 20 and "delta" not in night
    assert shown["eval"]["decision"]["decision"] == "promoted"


DAG_TEST_S3 = """
import json
from datetime import datetime, timezone
import dags.refresh_dags as m
# publish only: the trainer's side of a run is the same whatever the source (test above)
run = m.refresh_sample_s3.test(logical_date=datetime(2026, 12, 1, tzinfo=timezone.utc),
                               mark_success_pattern=r"training\\..*|report")
print("STATE=" + json.dumps(str(run.state)))
"""


class _ProcessListings:
    """Samples every process's command line (what `ps` shows anyone on the machine) twice a second."""

    def __init__(self) -> None:
        import threading

        self.seen: set[str] = set()
        self.samples = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._halt.wait(0.5):
            for p in psutil.process_iter(["cmdline"]):
                self.seen.add(" ".join(p.info["cmdline"] or []))
            self.samples += 1

    def stop(self) -> int:
        self._halt.set()
        self._thread.join()
        return self.samples

    @property
    def text(self) -> str:
        return "\n".join(sorted(self.seen))


def _files_holding(needle: str, roots: list[Path]) -> list[str]:
    """Files under ``roots`` whose bytes contain ``needle``."""
    raw = needle.encode()
    return [str(p) for root in roots if root.exists() for p in root.rglob("*")
            if p.is_file() and raw in p.read_bytes()]


def test_an_s3_corpus_waits_for_its_night_then_publishes_exactly_it(kafka_config, sample_corpus, airflow_db,
                                                                     seaweed, tmp_path):
    """corpora/examples/sample_s3.yaml through Airflow, credentials from the aws_default connection:
    await_source waits while 2026-12-01 has no marker, the run proceeds when it appears, and
    publishes that night (not 2026-11-30's), every file in the lineage."""
    import contextlib
    import hashlib
    import queue
    import threading
    import time

    from stoker.kafka import offsets as koffsets

    root = f"s3://corpora/{tmp_path.name}"
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    text = (REPO / "corpora" / "examples" / "sample_s3.yaml").read_text()
    (corpora / "sample_s3.yaml").write_text(text.replace("s3://corpora/sample/{ds}", root + "/{ds}")
                                            .replace("poke_interval_s: 5", "poke_interval_s: 1"))
    store = seaweed.store()
    files = sorted(p for p in sample_corpus["data"].iterdir() if p.suffix == ".jsonl")
    for p in files[:1]:
        store.put(f"{root}/2026-11-30/{p.name}", p.read_bytes())
    store.put(f"{root}/2026-11-30/_SUCCESS", b"")
    for p in files:  # the night's data is there, its marker not yet
        store.put(f"{root}/2026-12-01/{p.name}", p.read_bytes())

    env = {**os.environ, "STOKER_CORPORA": str(corpora),
           "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(seaweed.connection())}
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        env.pop(k, None)  # only the connection may tell the job where the store is
    proc = subprocess.Popen([sys.executable, "-c", DAG_TEST_S3], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    listings = _ProcessListings()  # every command line on the machine while the run goes
    listings.start()
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    out: list[str] = []
    waiting = f"waiting for {root}/2026-12-01/_SUCCESS"
    deadline = time.monotonic() + 300
    try:
        while not any(waiting in line for line in out):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(out)[-4000:]
            with contextlib.suppress(queue.Empty):
                out.append(lines.get(timeout=1))
        assert not any("tokenize_publish" in line and "starting" in line for line in out)
        store.put(f"{root}/2026-12-01/_SUCCESS", b"")  # the night's export finishes
        proc.wait(timeout=600)
    finally:
        proc.kill()
    time.sleep(0.5)
    while not lines.empty():
        out.append(lines.get())
    log = "".join(out)
    assert 'STATE="success"' in log, log[-4000:]
    assert f"complete: {root}/2026-12-01/_SUCCESS present" in log
    # the secret key appears in no command line, process listing, Airflow or task log, or the metadata DB
    # (rendered templates included)
    secret = seaweed.connection()["password"]
    assert listings.stop() > 10, "the process listing was not sampled"
    assert secret not in listings.text and secret not in log
    run_dir = RunLayout.of("sample_s3", "2026-12-01").run_dir
    assert not _files_holding(secret, [Path(os.environ["AIRFLOW_HOME"]), run_dir])

    m = read_manifest(RunLayout.of("sample_s3", "2026-12-01").run_dir)
    assert m.source_uri == f"{root}/2026-12-01"
    assert [Path(f["path"]).name for f in m.source_files] == [p.name for p in files]
    for f, p in zip(m.source_files, files, strict=True):
        assert f["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest() and f["bytes"] == p.stat().st_size
    assert m.docs_in == m.docs_kept + sum(m.docs_dropped.values()) > 0
    assert len(koffsets.read_all(kafka_config, m.topic)) == m.sequences > 0


DAG_TEST_PUBLISH = """
import json, sys
from datetime import datetime, timezone
import dags.refresh_dags as m
run = m.refresh_sample.test(logical_date=datetime.fromisoformat(sys.argv[1]).replace(tzinfo=timezone.utc),
                            mark_success_pattern=r"training\\..*|report")
print("STATE=" + json.dumps(str(run.state)))
"""


def test_a_refresh_through_a_spark_standalone_cluster_publishes_what_local_mode_does(kafka_config, sample_corpus,
                                                                                    airflow_db, tmp_path):
    """The same job, unchanged, on a real cluster manager: spark_default points at a standalone master
    with two workers (pyspark's own jars, started here). The night publishes the same sequences as a
    local-mode run of the same files, and holds out the same documents (the executors write the held-out
    files); the tokenizer reaches the executors with the job."""
    from stoker.kafka import offsets as koffsets
    from stoker_local.servers.spark import SparkStandalone

    corpora = tmp_path / "corpora"  # the sample, holding out 2% of its documents
    corpora.mkdir()
    (corpora / "sample.yaml").write_text((REPO / "corpora" / "sample.yaml").read_text()
                                         .replace("holdout_per_mille: 5", "holdout_per_mille: 20"))

    def publish(ds: str, env: dict[str, str]) -> Any:
        out = subprocess.run([sys.executable, "-c", DAG_TEST_PUBLISH, ds], cwd=REPO, capture_output=True,
                             env={**env, "STOKER_CORPORA": str(corpora)}, text=True, timeout=900)
        assert 'STATE="success"' in out.stdout, out.stdout[-4000:] + out.stderr[-4000:]
        return read_manifest(RunLayout.of("sample", ds).run_dir)

    local = publish("2026-12-05", os.environ.copy())
    with SparkStandalone(tmp_path / "spark", workers=2, cores=1, memory="2g") as cluster:
        conn = json.dumps({"conn_type": "spark", "host": cluster.url, "extra": {"spark-binary": "spark-submit"}})
        remote = publish("2026-12-06", {**os.environ, "AIRFLOW_CONN_SPARK_DEFAULT": conn})
    assert remote.holdout["docs"] == local.holdout["docs"] > 0
    held = [sorted(p.read_bytes() for p in RunLayout.of("sample", ds).holdout.glob("part-*.npz"))
            for ds in ("2026-12-05", "2026-12-06")]
    assert held[0] == held[1]  # the same documents, packed the same way, wherever the tasks ran
    assert local.spark_app_id.startswith("local-") and remote.spark_app_id.startswith("app-")  # a standalone app
    assert (remote.docs_in, remote.docs_kept, remote.docs_dropped, remote.tokens, remote.sequences) == \
        (local.docs_in, local.docs_kept, local.docs_dropped, local.tokens, local.sequences)
    assert [(f["path"], f["sha256"], f["tokens"]) for f in remote.source_files] == \
        [(f["path"], f["sha256"], f["tokens"]) for f in local.source_files]
    pairs = {(m.key(), m.value()) for m in koffsets.read_all(kafka_config, remote.topic)}
    assert pairs == {(m.key(), m.value()) for m in koffsets.read_all(kafka_config, local.topic)}


def _drop_folder(tmp_path: Path) -> Path:
    """A folder of this test's own for a drop a run's ``source_uri`` may point at: under the state folder's
    ``drops/``, the sample corpus's ``source.allowed_uri_prefixes``."""
    from stoker import paths

    return paths.state_dir() / "drops" / tmp_path.name


DAG_TEST_SECURE = """
import json, sys
from datetime import datetime, timezone
import dags.refresh_dags as m
# a smaller drop of the same kinds of records: this test is about the connection, not the volume
run = m.refresh_sample.test(logical_date=datetime(2026, 12, 9, tzinfo=timezone.utc),
                            run_conf={"source_uri": sys.argv[1], "review": "hold"})
print("STATE=" + json.dumps(str(run.state)))
"""


def test_a_whole_refresh_runs_over_sasl_ssl_and_its_password_shows_nowhere(secure_kafka, sample_corpus, airflow_db,
                                                                           tmp_path):
    """Spark's producer, the sensors and the trainer all go through the SASL_SSL broker (the only one
    this run is told about), the connection naming a ``sasl.password.file`` as the README advises; the
    password is in no command line, log, metadata DB, run file or Spark event log (each Spark task reads
    the file where it runs: none is pickled into a task)."""
    from stoker.kafka import offsets as koffsets
    from stoker.paths import write_private

    password_file, events = tmp_path / "credentials.json", tmp_path / "spark-events"
    write_private(password_file, json.dumps({"password": secure_kafka["sasl.password"]}))
    extra = {k: v for k, v in secure_kafka.items() if k != "sasl.password"}
    extra["sasl.password.file"] = str(password_file)
    (tmp_path / "spark-conf").mkdir()
    events.mkdir()
    (tmp_path / "spark-conf" / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir file://{events}\n")
    env = {**os.environ, "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": extra}),
           "SPARK_CONF_DIR": str(tmp_path / "spark-conf")}
    from stoker_local import sample

    drop = _drop_folder(tmp_path)
    sample.write_corpus(drop, shards=2, max_docstring_bytes=120_000)
    listings = _ProcessListings()
    listings.start()
    out = subprocess.run([sys.executable, "-c", DAG_TEST_SECURE, str(drop)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    log = out.stdout + out.stderr
    assert 'STATE="success"' in out.stdout, log[-4000:]
    run_dir = RunLayout.of("sample", "2026-12-09").run_dir
    m = read_manifest(run_dir)
    assert len(koffsets.read_all(secure_kafka, m.topic)) == m.sequences > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["training"]["sequences_consumed"] == m.sequences
    # the run conf reached the job through the run plan, and the summary says what the run changed
    from stoker.run.plan import read_plan

    plan = read_plan(RunLayout.of("sample", "2026-12-09").plan)
    assert plan.source_uri == str(drop) == m.source_uri and plan.topic == m.topic
    assert summary["params"]["source_uri"] == str(drop)
    password = secure_kafka["sasl.password"]
    assert listings.stop() > 10, "the process listing was not sampled"
    assert password not in listings.text and password not in log
    assert not _files_holding(password, [Path(os.environ["AIRFLOW_HOME"]), run_dir])
    assert list(events.iterdir()) and not _files_holding(password, [events])  # the job's event log


DAG_TEST_NIGHT = """
import json, sys
from datetime import datetime, timezone
import dags.refresh_dags as m
run = m.refresh_sample.test(logical_date=datetime.fromisoformat(sys.argv[1]).replace(tzinfo=timezone.utc),
                            run_conf={"source_uri": sys.argv[2], "review": "hold"})
print("STATE=" + json.dumps(str(run.state)))
"""


def test_nights_with_no_held_out_document_are_decided_by_the_rule_and_the_next_continues_them(
        kafka_config, sample_corpus, airflow_db, tmp_path):
    """``holdout_per_mille: 0`` (the default): the evaluate task was skipped, the night joined with no decision and
    was the head for good, ungated. Now ``eval.ungated`` (promote) decides it, its record says the rule did, and
    the next night continues it."""
    from stoker.layout import LineLayout
    from stoker.lines import ledger
    from stoker.lines.nights import read_night
    from stoker_local import sample

    line = f"ungated{os.getpid()}"
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    (corpora / "sample.yaml").write_text((REPO / "corpora" / "sample.yaml").read_text()
                                         .replace("holdout_per_mille: 5", "holdout_per_mille: 0")
                                         .replace("  recipe: debug_cpu", f"  recipe: debug_cpu\n  line: {line}"))
    env = {**os.environ, "STOKER_CORPORA": str(corpora)}
    drop = _drop_folder(tmp_path)  # a small drop; each night is the same documents again
    sample.write_corpus(drop, shards=1, max_docstring_bytes=40_000)
    for ds in ("2026-12-21", "2026-12-22"):
        out = subprocess.run([sys.executable, "-c", DAG_TEST_NIGHT, ds, str(drop)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=900)
        assert 'STATE="success"' in out.stdout, (out.stdout + out.stderr)[-4000:]
        assert read_manifest(RunLayout.of("sample", ds).run_dir).holdout.get("docs", 0) == 0
    layout = LineLayout.of(line)
    first, second = (read_night(layout.night(ds, "sample")) for ds in ("2026-12-21", "2026-12-22"))
    assert (first["decision"]["decision"], first["decision"]["by"]) == ("promoted", "rule")
    assert first["decision"]["rule"] == "eval.ungated: promote"
    assert (second["parent"]["kind"], second["parent"]["ds"]) == ("night", "2026-12-21")
    assert ledger.head(layout)["ds"] == "2026-12-22" and ledger.state(second) == "promoted"


def test_a_state_folder_of_an_earlier_stoker_gives_up_its_old_source_asset(airflow_db):
    """Source assets were once named ``stoker.<corpus>.source``; such an active asset holds the URI the
    DAG's asset now needs, and `dags test` (no scheduler orphan pass) would run with it inactive."""
    from airflow.models.asset import AssetActive, AssetModel
    from airflow.utils.session import create_session

    from stoker_local.airflow_env import retire_legacy_assets

    old = [("stoker.old.source", "file:///data/old"), ("stoker.old.model", "file:///runs/old")]
    with create_session() as s:
        for name, uri in old:
            s.query(AssetActive).filter_by(name=name).delete()
            if not s.query(AssetModel).filter_by(name=name).count():
                s.add(AssetModel(name=name, uri=uri, group="asset"))
        s.flush()
        s.add_all([AssetActive(name=name, uri=uri) for name, uri in old])
    assert retire_legacy_assets() >= 1
    with create_session() as s:
        names = {a.name for a in s.query(AssetActive).filter(AssetActive.name.like("stoker.old.%"))}
    assert names == {"stoker.old.model"}
