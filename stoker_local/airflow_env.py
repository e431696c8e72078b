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
from stoker_local.broker import default_broker

SPARK_MASTER = "local[*,4]"
"""local mode with up to 4 attempts per task: plain local[*] never retries a failed task."""


def airflow_env(kafka_bootstrap: str | None = None) -> dict[str, str]:
    home = paths.state_dir() / "airflow"
    root = paths.project_root()
    venv_bin = str(Path(sys.executable).absolute().parent)
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
    from stoker_local.storage import local_s3_connection_env

    env.update(local_s3_connection_env())  # `stoker storage up`'s S3, as aws_default, while it runs
    return {k: os.environ.get(k, v) if k != "PATH" else v for k, v in env.items()}


LEGACY_ASSET_NAMES = "stoker.%.source"
"""How source assets were named before they were named by their URI (two corpora reading the same
data now share one asset; Airflow deactivates an asset whose URI another active one holds)."""


def retire_legacy_assets() -> int:
    """Deactivate the source assets of an earlier Stoker in this metadata DB, so the DAGs' new ones can
    activate. The scheduler does this itself (its orphan pass); ``airflow dags test`` does not."""
    from airflow.models.asset import AssetActive
    from airflow.utils.session import create_session

    with create_session() as s:
        return int(s.query(AssetActive).filter(AssetActive.name.like(LEGACY_ASSET_NAMES))
                   .delete(synchronize_session=False))


if __name__ == "__main__" and sys.argv[1:] == ["retire-legacy-assets"]:
    print(f"retired {retire_legacy_assets()} legacy asset(s)")
