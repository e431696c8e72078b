"""Who may read a run's pages (plugins/stoker_airflow/web.py): Airflow's auth manager decides, per DAG. Real
Airflow in this process: the local stack's auth manager (SimpleAuthManager with per-user DAG lists), its JWTs,
and the plugin's FastAPI app over HTTP. A user limited to another DAG gets 403 on every page of
``refresh_authsample``'s runs, JSON and images included, and the index does not list them; a Viewer of every DAG
reads them; no token is 401. (The browser's view of the same pages, cookie and all, is tests/stack.)"""

from __future__ import annotations

import json
import secrets

import pytest

pytestmark = pytest.mark.integration
CORPUS, DS = "authsample", "2026-12-01"


@pytest.fixture()
def app(monkeypatch, tmp_path, airflow_db):  # its JWTs are checked against the DB (revoked tokens)
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    from stoker.layout import RunLayout
    from stoker.run.manifest import Manifest, PartitionRange, write_manifest
    from stoker_airflow.web import create_app

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", "stoker_airflow.auth.StokerAuthManager")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,everyone:viewer,other:viewer")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp_path / "passwords.json"))
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_urlsafe(64))
    monkeypatch.setenv("AIRFLOW__STOKER__DAG_ACCESS", json.dumps({"other": ["refresh_sample"]}))
    airflow_app.purge_cached_app()
    manager = airflow_app.init_auth_manager()
    run = RunLayout.of(CORPUS, DS)
    write_manifest(run.run_dir, Manifest(
        run_id=f"{CORPUS}/{DS}", corpus=CORPUS, ds=DS, topic="stoker.authsample.20261201.a1",
        partitions=[PartitionRange(partition=0, start_offset=0, end_offset=0, sequences=0)], seq_len=8,
        dtype="uint16", tokenizer_path="/t.json", tokenizer_sha256="ab" * 32, vocab_size=100, docs_in=1,
        docs_kept=0, docs_dropped={"invalid_json": 1}, tokens=0, padding_tokens=0, sequences=0,
        source_uri="/drops/x", quarantine_path="/q"))
    run.quarantine_samples.write_text(json.dumps({"invalid_json": [{"file": "f", "bytes": "secret raw bytes"}]}))

    def token(name: str, role: str) -> str:
        return manager.generate_jwt(SimpleAuthManagerUser(username=name, role=role))

    yield TestClient(create_app()), token, manager
    airflow_app.purge_cached_app()


PAGES = [f"/runs/{CORPUS}/{DS}", f"/runs/{CORPUS}/{DS}/summary.json", f"/runs/{CORPUS}/{DS}/loss.png",
         f"/dag-runs/refresh_{CORPUS}/manual__2026-12-01", f"/dag-runs/refresh_{CORPUS}/manual__2026-12-01/loss.png"]


def test_a_user_limited_to_another_dag_gets_403_on_every_run_page(app):
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    client, token, manager = app
    other = {"Authorization": f"Bearer {token('other', 'viewer')}"}
    for page in PAGES:
        res = client.get(page, headers=other)
        assert res.status_code == 403, (page, res.status_code, res.text)
        assert f"may not read DAG 'refresh_{CORPUS}'" in res.json()["detail"] and "secret raw bytes" not in res.text
    index = client.get("/", headers=other)
    assert index.status_code == 200 and f"{CORPUS}/{DS}" not in index.text
    # Airflow's own UI and REST API filter their DAG lists the same way (the base manager asks is_authorized_dag)
    dags = {f"refresh_{CORPUS}", "refresh_sample"}
    def readable(name: str) -> set[str]:
        return manager.filter_authorized_dag_ids(dag_ids=dags, user=SimpleAuthManagerUser(username=name, role="viewer"))

    assert readable("other") == {"refresh_sample"} and readable("everyone") == dags


def test_a_viewer_of_every_dag_reads_them_and_no_token_is_401(app):
    client, token, _ = app
    everyone = {"Authorization": f"Bearer {token('everyone', 'viewer')}"}
    assert client.get(f"/runs/{CORPUS}/{DS}/summary.json", headers=everyone).json()["run_id"] == f"{CORPUS}/{DS}"
    assert client.get(f"/runs/{CORPUS}/{DS}", headers=everyone).status_code == 200
    assert f"{CORPUS}/{DS}" in client.get("/", headers=everyone).text
    assert client.get(f"/runs/{CORPUS}/{DS}/loss.png", headers=everyone).status_code == 404  # not trained: no curve
    assert client.get(f"/runs/{CORPUS}/{DS}").status_code == 401
    admin = {"Authorization": f"Bearer {token('admin', 'admin')}"}
    assert client.get(f"/runs/{CORPUS}/{DS}", headers=admin).status_code == 200
