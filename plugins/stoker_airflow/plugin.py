"""The Airflow plugin: run summaries in the UI (a nav entry and a tab on every DAG run)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from stoker_airflow.web import create_app


class StokerPlugin(AirflowPlugin):
    name = "stoker"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/stoker", "name": "Stoker runs"}]
    external_views = [
        {"name": "Stoker runs", "href": "/stoker/", "destination": "nav", "url_route": "stoker-runs"},
        {"name": "Run summary", "href": "/stoker/dag-runs/{DAG_ID}/{RUN_ID}", "destination": "dag_run",
         "url_route": "stoker-run-summary"},
    ]
