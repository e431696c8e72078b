"""The environment of the embedded Airflow: AIRFLOW_HOME under the state folder, the repo's
dags/ and plugins/, and the connections ``kafka_default`` and ``spark_default`` set by the
project through ``AIRFLOW_CONN_*`` variables (never in DAG code). Values already set in the
environment win, so a deployment points the same DAGs at real clusters."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from stoker import paths
from stoker.local.broker import default_broker

SPARK_MASTER = "local[*,4]"
"""local mode with up to 4 attempts per task: plain local[*] never retries a failed task."""


def airflow_env(kafka_bootstrap: str | None = None) -> dict[str, str]:
    home = paths.state_dir() / "airflow"
    root = paths.project_root()
    venv_bin = str(Path(sys.executable).parent)
    bootstrap = kafka_bootstrap or os.environ.get("STOKER_KAFKA_BOOTSTRAP") or default_broker().bootstrap
    env = {
        "STOKER_HOME": str(paths.state_dir()),
        "STOKER_PROJECT": str(root),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "60",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                  "extra": {"bootstrap.servers": bootstrap}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": SPARK_MASTER,
                                                  "extra": {"spark-binary": "spark-submit"}}),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
    }
    from stoker.local.storage import local_s3_connection_env

    env.update(local_s3_connection_env())  # `stoker storage up`'s S3, as aws_default, while it runs
    return {k: os.environ.get(k, v) if k != "PATH" else v for k, v in env.items()}
