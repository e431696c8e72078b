"""The Spark job's secrets (Kafka client config, S3 credentials) never reach a command line: on YARN
and Kubernetes masters, where the provider's hook would turn environment variables into ``--conf``
arguments, they go in a file only this user can read, shipped with ``--files``."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
SECRET = "s3cr3t-" + "x" * 16


@pytest.fixture()
def corpus(tmp_path) -> str:
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"name": "c", "source": {"uri": str(tmp_path)}, "tokenizer": {"path": str(tok)}}))
    return str(cfg)


@pytest.mark.parametrize("master, shipped", [("yarn", True), ("k8s://https://kube:6443", True),
                                             ("local[2]", False), ("spark://master", False)])
def test_secrets_reach_the_job_but_no_command_line(corpus, monkeypatch, master, shipped):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from stoker_airflow.operators.publish import SECRETS_FILE, TokenizePublishOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_T", json.dumps({"conn_type": "spark", "host": master}))
    op = TokenizePublishOperator(task_id="t", corpus_path=corpus, ds="2026-12-01", conn_id="spark_t")
    op.application_args = ["--plan", "plan.json"]
    secrets = {"STOKER_KAFKA_CONFIG": json.dumps({"bootstrap.servers": "b:9093", "sasl.password": SECRET}),
               "AWS_SECRET_ACCESS_KEY": SECRET}
    folder = op.hand_over(secrets)
    try:
        # YARN/k8s: the hook turns env_vars into --conf arguments; (its Kubernetes side needs the
        # kubernetes client to build the command: not installed here)
        assert SECRET not in json.dumps(op.env_vars or {}) or not shipped
        if "k8s" not in master:
            hook = SparkSubmitHook(conn_id="spark_t", files=op.files, env_vars=op.env_vars,
                                   application_args=op.application_args)
            cmd = " ".join(hook._build_spark_submit_command("job.py"))  # what `ps` shows of spark-submit
            assert SECRET not in cmd
        assert (folder is not None) is shipped
        if shipped:
            f = folder / SECRETS_FILE
            assert stat.S_IMODE(f.stat().st_mode) == 0o600 and json.loads(f.read_text()) == secrets
            assert str(f) in op.files and op.application_args[-2:] == ["--secrets-file", str(f)]
            assert SECRET not in json.dumps(op.env_vars or {})
        else:
            assert op.env_vars["AWS_SECRET_ACCESS_KEY"] == SECRET and not op.files  # spark-submit's own env
    finally:
        if folder is not None:
            import shutil

            shutil.rmtree(folder)


def test_the_job_reads_its_secrets_file(tmp_path, monkeypatch):
    from stoker.paths import load_private_env as load_secrets

    f = tmp_path / "stoker-secrets.json"
    f.write_text(json.dumps({"STOKER_KAFKA_CONFIG": '{"bootstrap.servers": "b:1"}', "AWS_SECRET_ACCESS_KEY": SECRET}))
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # YARN cluster mode: --files lands in the driver's working folder
    load_secrets("/on/the/airflow/worker/stoker-secrets.json")
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        load_secrets(str(Path("/x/nowhere.json")))


def test_a_password_file_is_read_in_the_spark_task_and_no_password_is_pickled(tmp_path, monkeypatch):
    """The job's client config names ``sasl.password.file``: the driver reads it for its own clients, but the
    pack pass's task function, which Spark pickles into every task, carries the path, never the password."""
    from pyspark.serializers import CloudPickleSerializer

    from spark_jobs.pack import pack_publish_batches
    from stoker.config.corpus import parse_corpus
    from stoker.kafka.settings import config_from_env, with_password_file
    from stoker.paths import write_private

    write_private(tmp_path / "credentials.json", json.dumps({"password": SECRET}))
    conf = {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL",
            "sasl.password.file": str(tmp_path / "credentials.json")}
    monkeypatch.setenv("STOKER_KAFKA_CONFIG", json.dumps(conf))
    assert config_from_env()["sasl.password"] == SECRET  # what a driver or a trainer uses itself
    travelling = config_from_env(resolve_password=False)  # what the job's main hands its tasks
    cfg = parse_corpus({"name": "c", "source": {"uri": str(tmp_path)}, "tokenizer": {"path": "t.json"}})
    fn = pack_publish_batches(cfg=cfg, records=None, tokenizer=None, skips=None, topic="t", run_id="c/d",
                              dtype="uint16", kafka_config=travelling, fail=None)
    pickled = CloudPickleSerializer().dumps(fn)
    assert SECRET.encode() not in pickled and b"credentials.json" in pickled
    assert with_password_file(travelling)["sasl.password"] == SECRET  # what the task does where it runs
