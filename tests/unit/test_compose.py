"""docker-compose.yaml, checked as far as possible without a Docker engine: the file parses, every
service's command is one its program accepts, ports and volumes hang together, the Kafka cluster's
settings make a 3-node KRaft quorum with RF 3 and min.insync.replicas 2, and every setting the
containers get is one Airflow or Stoker actually reads. (tests/integration/test_compose_kafka.py
runs that Kafka cluster's settings on real brokers.)"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
MOUNT = "/opt/stoker"  # where the repo is mounted in the containers
ENV = {"STOKER_JWT_SECRET": "j" * 32, "STOKER_API_SECRET_KEY": "k" * 32}  # what a user must export
AIRFLOW_COMPONENTS = ["airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"]
KAFKA = ["kafka-1", "kafka-2", "kafka-3"]
SECURE = ["kafka-secure-setup", "kafka-secure", "kafka-secure-users"]
WORKERS = ["airflow-worker", "airflow-worker-gpu"]
CELERY = ["redis", *WORKERS]


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``."""
    def sub(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\?)([^}]*))?\}", sub, text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(interpolate((REPO / "docker-compose.yaml").read_text(), ENV))


def env_of(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def code_text() -> str:
    return "\n".join(p.read_text() for d in ("stoker", "stoker_local", "plugins", "dags", "spark_jobs", "training")
                     for p in (REPO / d).rglob("*.py"))


def test_the_secrets_must_be_given():
    with pytest.raises(KeyError, match="STOKER_JWT_SECRET"):
        interpolate((REPO / "docker-compose.yaml").read_text(), {"STOKER_API_SECRET_KEY": "x"})


def test_the_services(compose):
    services = compose["services"]
    assert {"postgres", *KAFKA, "spark-master", "spark-worker", "seaweedfs", "airflow-init",
            *AIRFLOW_COMPONENTS, *SECURE, *CELERY} == set(services)
    # the SASL_SSL node and the Celery workers are opt-in: `docker compose up` alone starts none of them
    assert {n for n, svc in services.items() if svc.get("profiles")} == {*SECURE, *CELERY}
    assert all(services[n]["profiles"] == ["secure"] for n in SECURE)
    assert all(services[n]["profiles"] == ["celery"] for n in CELERY)
    for name, svc in services.items():
        image = svc["image"]
        if image == "stoker:dev":
            assert "build" in svc, f"{name}: the project's image must be built"
        else:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), f"{name}: {image}"
        for dep, cond in (svc.get("depends_on") or {}).items() if isinstance(svc.get("depends_on"), dict) else []:
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"


def test_the_image_installs_the_lock_with_the_makefiles_uv(compose):
    build = compose["services"]["airflow-scheduler"]["build"]
    assert build["context"] == "."
    dockerfile = build["dockerfile_inline"]
    uv = re.search(r"^UV_VER\s*:=\s*(\S+)", (REPO / "Makefile").read_text(), re.M).group(1)
    assert f"uv=={uv}" in dockerfile and "-r /tmp/requirements.lock" in dockerfile
    assert "COPY requirements.lock" in dockerfile and (REPO / "requirements.lock").is_file()
    assert "openjdk-17" in dockerfile  # Spark needs a JVM
    assert "python:3.11" in dockerfile
    # s3:// corpora: the S3A jars where stoker.connectors looks for them, from the same pom as `make setup`
    from stoker.stores.connectors import HADOOP_VERSION

    pom = "stoker/stores/connectors/pom.xml"
    assert f"COPY {pom}" in dockerfile and (REPO / pom).is_file()
    assert f"-DoutputDirectory=/opt/stoker-cache/s3a-{HADOOP_VERSION}/jars" in dockerfile
    assert "STOKER_CACHE=/opt/stoker-cache" in dockerfile


def test_airflow_commands_are_real_cli_commands(compose):
    from airflow.cli.cli_parser import get_parser

    parser = get_parser()
    for name in [*AIRFLOW_COMPONENTS]:
        cmd = compose["services"][name]["command"]
        assert cmd[0] == "airflow", name
        args = parser.parse_args(cmd[1:])  # unknown subcommands or flags exit with an error
        assert callable(args.func)
    init = compose["services"]["airflow-init"]["command"]
    assert "airflow db migrate" in init[-1] and "stoker_local.cli sample-corpus" in init[-1]
    # the model lines' pools, by the Airflow package's own module (a cluster installs no local stack)
    assert init[-1].index("airflow db migrate") < init[-1].index("python -m stoker_airflow.pools")
    from stoker_airflow.pools import sync_line_pools

    assert callable(sync_line_pools)
    from stoker_local.cli import build_parser

    build_parser().parse_args(["sample-corpus"])


def test_airflow_settings_are_real_options(compose):
    from airflow.configuration import conf

    documented = conf.configuration_description  # every option Airflow and its providers document
    for name in [*AIRFLOW_COMPONENTS, "airflow-init", *WORKERS]:
        for key in env_of(compose["services"][name]):
            m = re.fullmatch(r"AIRFLOW__([A-Z_]+?)__([A-Z_]+)", key)
            if m:
                section, option = m.group(1).lower(), m.group(2).lower()
                assert option in documented.get(section, {}).get("options", {}), f"{name}: {key} is no Airflow option"


def test_every_component_shares_the_metadata_db_and_the_api(compose):
    envs = [env_of(compose["services"][n]) for n in [*AIRFLOW_COMPONENTS, "airflow-init", *WORKERS]]
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__API_AUTH__JWT_SECRET",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "AIRFLOW_CONN_KAFKA_DEFAULT", "AIRFLOW__CORE__EXECUTOR",
                "AIRFLOW__CELERY__BROKER_URL", "AIRFLOW__CELERY__RESULT_BACKEND"):
        assert len({e[key] for e in envs}) == 1, key
    env = envs[0]
    pg = env_of(compose["services"]["postgres"])
    url = f"postgresql+psycopg2://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == url
    api = compose["services"]["airflow-api-server"]["command"]
    port = api[api.index("--port") + 1]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"http://airflow-api-server:{port}/execution/"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == f"{MOUNT}/dags"
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == f"{MOUNT}/plugins"


def test_connections_point_at_the_services(compose, monkeypatch):
    from airflow.models.connection import Connection

    env = env_of(compose["services"]["airflow-scheduler"])
    kafka = Connection.from_json(env["AIRFLOW_CONN_KAFKA_DEFAULT"], conn_id="kafka_default")
    advertised = [env_of(compose["services"][k])["KAFKA_ADVERTISED_LISTENERS"] for k in KAFKA]
    internal = sorted(re.search(r"INTERNAL://([\w-]+:\d+)", a).group(1) for a in advertised)
    assert sorted(kafka.extra_dejson["bootstrap.servers"].split(",")) == internal
    assert sorted(env["STOKER_KAFKA_BOOTSTRAP"].split(",")) == internal

    spark = Connection.from_json(env["AIRFLOW_CONN_SPARK_DEFAULT"], conn_id="spark_default")
    master = compose["services"]["spark-master"]["command"]
    assert spark.host == f"spark://{master[master.index('--host') + 1]}"
    assert str(spark.port) == master[master.index("--port") + 1]
    worker = compose["services"]["spark-worker"]["command"]
    assert f"spark://{master[master.index('--host') + 1]}:{spark.port}" in worker
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", env["AIRFLOW_CONN_SPARK_DEFAULT"])
    resolved = SparkSubmitHook(conn_id="spark_default")._connection  # what spark-submit gets as --master
    assert resolved["master"] == f"spark://{master[master.index('--host') + 1]}:{spark.port}"
    assert resolved["deploy_mode"] == "client"  # the driver runs in the scheduler, beside the task

    aws = Connection.from_json(env["AIRFLOW_CONN_AWS_DEFAULT"], conn_id="aws_default")
    weed = compose["services"]["seaweedfs"]
    s3_port = next(a.split("=")[1] for a in weed["command"] if a.startswith("-s3.port="))
    assert aws.extra_dejson["endpoint_url"] == f"http://seaweedfs:{s3_port}"
    identities = json.loads(compose["configs"]["seaweedfs-s3"]["content"])["identities"]
    creds = identities[0]["credentials"][0]
    assert (creds["accessKey"], creds["secretKey"]) == (aws.login, aws.password)


def test_stoker_settings_are_read_by_the_code_and_the_corpora_load(compose):
    from stoker.config.corpus import load_all

    code = code_text()
    for name, svc in compose["services"].items():
        for key in env_of(svc):
            if key.startswith("STOKER_"):
                assert f'"{key}"' in code, f"{name}: {key} is not read by any Stoker code"
    env = env_of(compose["services"]["airflow-scheduler"])
    corpora = REPO / env["STOKER_CORPORA"].removeprefix(MOUNT + "/")
    cfgs = load_all(corpora)
    assert cfgs, f"no corpora in {corpora}"
    for cfg in cfgs:  # the cluster has 3 brokers: full replication, writes need 2 in sync
        assert (cfg.topic.replication_factor, cfg.topic.min_insync_replicas) == (3, 2), cfg.name
        assert cfg.topic.partitions % cfg.train.world_size == 0


def kafka_properties(svc: dict[str, Any]) -> dict[str, str]:
    """What the apache/kafka image makes of its KAFKA_* variables: KAFKA_FOO_BAR → foo.bar."""
    return {k.removeprefix("KAFKA_").lower().replace("_", "."): v for k, v in env_of(svc).items()
            if k.startswith("KAFKA_")}


def test_kafka_is_a_three_node_kraft_quorum_with_rf3_and_min_isr2(compose):
    props = {k: kafka_properties(compose["services"][k]) for k in KAFKA}
    voters = {}
    for entry in props["kafka-1"]["controller.quorum.voters"].split(","):
        node, hostport = entry.split("@")
        voters[node] = hostport
    assert sorted(voters) == ["1", "2", "3"]
    cluster_ids = {env_of(compose["services"][k])["CLUSTER_ID"] for k in KAFKA}
    assert len(cluster_ids) == 1  # one cluster, formatted with one id: a UUID as Kafka writes them
    import base64

    assert len(base64.urlsafe_b64decode(cluster_ids.pop() + "==")) == 16
    for name, p in props.items():
        assert p["process.roles"] == "broker,controller"
        assert voters[p["node.id"]].split(":")[0] == compose["services"][name]["hostname"] == name
        assert p["controller.quorum.voters"] == props["kafka-1"]["controller.quorum.voters"]
        listeners = dict(x.split("://") for x in p["listeners"].split(","))
        assert listeners["CONTROLLER"] == ":" + voters[p["node.id"]].split(":")[1]
        advertised = dict(x.split("://") for x in p["advertised.listeners"].split(","))
        assert advertised["INTERNAL"] == f"{name}:{listeners['INTERNAL'].lstrip(':')}"
        ext_port = advertised["EXTERNAL"].split(":")[1]
        assert f"127.0.0.1:{ext_port}:{ext_port}" in compose["services"][name]["ports"]
        assert (p["default.replication.factor"], p["min.insync.replicas"]) == ("3", "2")
        assert (p["offsets.topic.replication.factor"], p["transaction.state.log.replication.factor"],
                p["transaction.state.log.min.isr"]) == ("3", "3", "2")
        assert p["auto.create.topics.enable"] == "false"
        assert int(p["transaction.max.timeout.ms"]) >= 900_000  # publish.transaction_timeout_ms's upper bound
    assert len({p["node.id"] for p in props.values()}) == 3


def test_ports_are_unique_and_local(compose):
    seen: dict[str, str] = {}
    for name, svc in compose["services"].items():
        for spec in svc.get("ports", []):
            ip, host, _container = str(spec).split(":")
            assert ip == "127.0.0.1", f"{name}: {spec} would listen on every interface"
            assert host not in seen, f"{name} and {seen[host]} both publish {host}"
            seen[host] = name
    assert seen["8080"] == "airflow-api-server"


def test_volumes_mount_the_repo_and_share_the_state(compose):
    declared = set(compose["volumes"])
    mounts: dict[str, dict[str, str]] = {}
    for name, svc in compose["services"].items():
        mounts[name] = {}
        for v in svc.get("volumes", []):
            src, dst = v.split(":")[:2]
            if src.startswith((".", "/")):
                assert (REPO / src).resolve().exists(), f"{name}: bind source {src} missing"
            else:
                assert src in declared, f"{name}: volume {src} is not declared"
            mounts[name][src] = dst
    for name in [*AIRFLOW_COMPONENTS, "airflow-init", "spark-master", "spark-worker", *WORKERS]:
        assert mounts[name]["."] == MOUNT, name
        # the Spark driver (in the scheduler) and executors (worker) see the same files at the same path
        assert mounts[name]["stoker-state"] == env_of(compose["services"]["airflow-scheduler"])["STOKER_HOME"]
    for d in ("dags", "plugins", "spark_jobs", "training", "stoker"):
        assert (REPO / d).is_dir()


def test_spark_master_and_worker_run_classes_pyspark_ships(compose):
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    core = next(jars.glob("spark-core_*.jar"))
    names = set(zipfile.ZipFile(core).namelist())
    for svc in ("spark-master", "spark-worker"):
        cmd = compose["services"][svc]["command"]
        assert cmd[0] == "spark-class"
        assert cmd[1].replace(".", "/") + ".class" in names, f"{svc}: {cmd[1]} is not in {core.name}"
    assert (Path(pyspark.__file__).parent / "bin" / "spark-class").is_file()


def test_the_fault_suite_finds_coordinators_as_kafka_hashes_their_keys():
    """``String.hashCode`` and ``Utils.abs``: which __transaction_state / __consumer_offsets partition
    (so which broker) coordinates a transactional id or a group."""
    from tests.support.kafka_cluster import _java_abs, _java_hash

    assert _java_hash("") == 0 and _java_hash("hello") == 99162322
    assert _java_hash("polygenelubricants") == -(1 << 31) and _java_abs(-(1 << 31)) == 0
    assert _java_hash("\U0001F600") == 55357 * 31 + 56832  # UTF-16 code units, as Java counts them
    # values printed by Java 17's String.hashCode()
    assert _java_hash("stoker:stoker.cluster.20261201.a2:p0") == -1722328889
    assert _java_hash("stoker-train.stoker.sample.20261201.a1") == -2014183887


def test_the_celery_profile_runs_train_on_a_gpu_worker_and_the_rest_on_the_default_one():
    """`STOKER_EXECUTOR=CeleryExecutor docker compose --profile celery up`: every component runs the
    CeleryExecutor with Redis as its broker and PostgreSQL as its result backend; the workers' commands are
    ones Airflow's CLI accepts under that executor (the celery commands exist only then), the gpu worker
    takes the corpora's train.queue one task at a time, the default worker Airflow's default queue."""
    import os
    import subprocess
    import sys

    from stoker.config.corpus import load_all

    compose = yaml.safe_load(interpolate((REPO / "docker-compose.yaml").read_text(),
                                         {**ENV, "STOKER_EXECUTOR": "CeleryExecutor"}))
    services = compose["services"]
    env = env_of(services["airflow-worker"])
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://redis:6379/0" and "healthcheck" in services["redis"]
    pg = env_of(services["postgres"])
    backend = env["AIRFLOW__CELERY__RESULT_BACKEND"]
    assert backend == (f"db+postgresql+psycopg2://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/"
                       f"{pg['POSTGRES_DB']}")
    import sqlalchemy

    sqlalchemy.create_engine(backend.removeprefix("db+"))  # its driver is installed (no connection is made)
    commands = [services[w]["command"] for w in WORKERS]
    check = ("import json, sys; from airflow.cli.cli_parser import get_parser; p = get_parser(); "
             "[p.parse_args(c[1:]) for c in json.loads(sys.argv[1])]")
    out = subprocess.run([sys.executable, "-c", check, json.dumps(commands)], capture_output=True, text=True,
                         env={**os.environ, "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    queues = {w: c[c.index("--queues") + 1] for w, c in zip(WORKERS, commands, strict=True)}
    corpora = REPO / env["STOKER_CORPORA"].removeprefix(MOUNT + "/")
    assert queues["airflow-worker-gpu"] == "gpu" and {c.train.queue for c in load_all(corpora)} == {"gpu"}
    gpu = services["airflow-worker-gpu"]["command"]
    assert gpu[gpu.index("--concurrency") + 1] == "1"  # one trainer per GPU worker
    from airflow.configuration import conf

    assert queues["airflow-worker"] == conf.get("operators", "default_queue") == "default"
    # the Spark driver runs on the default worker: executors reach it by that service's name
    assert env["SPARK_LOCAL_HOSTNAME"] == "airflow-worker" == services["airflow-worker"]["hostname"]

