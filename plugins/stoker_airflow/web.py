"""Run summaries and loss curves in the Airflow UI: a FastAPI app the API server mounts at ``/stoker``.

* ``/stoker/``                               every run of every corpus, newest first
* ``/stoker/runs/<corpus>/<ds>``             one run's summary (HTML): its drop reasons (a chart) and a few
                                             quarantined records of each, its loss curve, its line's nights
* ``/stoker/runs/<corpus>/<ds>/summary.json`` the same as JSON (``stoker runs show --json``)
* ``/stoker/runs/<corpus>/<ds>/loss.png``    the trainer's loss curve
* ``/stoker/dag-runs/<dag_id>/<run_id>``     the run of an Airflow DAG run (the "Run summary" tab)

Every route requires a logged-in Airflow user (the UI's session cookie or a bearer token), and a run's pages
a user whom Airflow's auth manager lets read that corpus's DAG's task logs (a run page shows quarantined raw
records, as sensitive as the logs): 403 otherwise, in the browser and over REST alike. The index lists only
the runs of DAGs the user may read. The auth manager decides (SimpleAuthManager's roles, FAB's or Keycloak's
per-DAG permissions; the local stack's :class:`stoker_airflow.auth.StokerAuthManager` adds per-user DAG lists).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from stoker.layout import RunLayout

_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")


async def require_login(request: Request) -> Any:
    """A logged-in Airflow user: a bearer token, else the UI's session cookie (401/403 otherwise)."""
    from airflow.api_fastapi.core_api.security import COOKIE_NAME_JWT_TOKEN, resolve_user_from_token

    auth = request.headers.get("authorization", "")
    token = auth[7:] if auth.lower().startswith("bearer ") else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    user = await resolve_user_from_token(token)
    request.state.stoker_user = user
    return user


def may_read(user: Any, dag_id: str) -> bool:
    """Whether the auth manager lets ``user`` read ``dag_id``'s task logs (what a run page shows)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.TASK_LOGS,
                                                details=DagDetails(id=dag_id), user=user)


def require_dag(request: Request, dag_id: str) -> None:
    if not may_read(request.state.stoker_user, dag_id):
        raise HTTPException(403, f"user {request.state.stoker_user.get_name()!r} may not read DAG {dag_id!r}'s "
                                 "runs: its task logs are not theirs to see (ask an admin for access to the DAG)")


def _corpus_run(request: Request, corpus: str, ds: str) -> Path:
    """A run's folder, for a user who may read its corpus's DAG."""
    from stoker.run.plan import refresh_dag

    if not (_SAFE.match(corpus) and _SAFE.match(ds)):
        raise HTTPException(400, f"bad run reference {corpus!r}/{ds!r}")
    require_dag(request, refresh_dag(corpus))
    return _run_dir(corpus, ds)


def _run_dir(corpus: str, ds: str) -> Path:
    if not (_SAFE.match(corpus) and _SAFE.match(ds)):
        raise HTTPException(400, f"bad run reference {corpus!r}/{ds!r}")
    run = RunLayout.of(corpus, ds)
    if not run.manifest.is_file():
        raise HTTPException(404, f"run {corpus}/{ds} has no manifest yet ({run.run_dir}): it has not published")
    return run.run_dir


def run_for_dag_run(dag_id: str, run_id: str) -> Path | None:
    """The run folder a DAG run wrote: its stage timings carry the Airflow run id."""
    import json

    from stoker import paths
    from stoker.run.plan import corpus_of, line_of

    line = line_of(dag_id)
    corpora = [corpus_of(dag_id) or dag_id] if line is None else _line_corpora(line)
    for run in sorted((RunLayout(d) for c in corpora for d in (paths.runs_dir() / c).glob("*")), reverse=True,
                      key=lambda r: r.run_dir.name):
        try:
            data = json.loads(run.timings.read_text())
        except (OSError, ValueError):
            continue
        if any(isinstance(row, dict) and row.get("run") == run_id for row in data.values()):
            return run.run_dir
    return None


def _line_corpora(line: str) -> list[str]:
    """The corpora a mixture line's nights may be recorded under (their lead): its mix's."""
    from stoker import paths
    from stoker.config.line import lines_dir, load_line
    from stoker.exceptions import StokerError

    try:
        return sorted(load_line(lines_dir(paths.corpora_dir()) / f"{line}.yaml").mix.shares)
    except StokerError:
        return []


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}pre{background:#f6f8fa;"
        "padding:1rem;overflow:auto}table{border-collapse:collapse}td,th{padding:.3rem .8rem;"
        "border-bottom:1px solid #ddd;text-align:left}img{max-width:100%}pre.sample{max-height:12rem;"
        "white-space:pre-wrap;margin:.3rem 0}</style></head>"
        f"<body><h2>{html.escape(title)}</h2>{body}</body></html>")


def _summary_html(run_dir: Path) -> HTMLResponse:
    from stoker.reports.runs import render, summary

    s = summary(run_dir)
    corpus, ds = run_dir.parent.name, run_dir.name
    body = f"<pre>{html.escape(render(s))}</pre>"
    if s.get("training") and s["training"].get("loss_curve"):
        body += f"<h3>Loss</h3><img alt='loss curve' src='/stoker/runs/{corpus}/{ds}/loss.png'>"
    else:
        body += "<p>Training has not finished yet: the loss curve appears when it has.</p>"
    mix = (s.get("training") or {}).get("mixture")
    if mix:  # a mixture night: what the model saw of each corpus, per window of steps
        from stoker.reports.mixplot import mixture_svg

        body += f"<h3>Mixture: label-token shares per {mix['window_steps']} optimizer steps</h3>" + mixture_svg(mix)
    body += _drops_html(run_dir, s)
    line = ((s.get("training") or {}).get("line") or {}).get("line")
    if line:
        from stoker.reports.catalog import line_nights
        from stoker.reports.lineplot import line_svg

        body += (f"<h3>Line {html.escape(line)}: each night's held-out bits per byte</h3>"
                 + line_svg(line, line_nights(line)))
    body += (f"<p><a href='/stoker/runs/{corpus}/{ds}/summary.json'>summary.json</a> · "
             "<a href='/stoker/'>all runs</a></p>")
    return _page(f"Run {corpus}/{ds}", body)


def _drops_html(run_dir: Path, s: dict) -> str:
    """The night's drop reasons as a chart, then a few quarantined records of each."""
    import json

    from stoker.reports.dropplot import drops_svg, samples_html

    try:
        samples = json.loads(RunLayout(run_dir).quarantine_samples.read_text())
    except (OSError, ValueError):
        samples = None
    dropped = s["docs_dropped"]
    return (f"<h3>Dropped records: {sum(dropped.values()):,} of {s['docs_in']:,}</h3>"
            + drops_svg(dropped, s["docs_in"])
            + "<h3>Quarantined samples</h3>" + samples_html(samples, dropped))


def create_app() -> FastAPI:
    app = FastAPI(title="Stoker runs", dependencies=[Depends(require_login)])

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request) -> HTMLResponse:
        from stoker.reports.runs import all_runs, summary
        from stoker.run.plan import refresh_dag

        rows: list[str] = []
        readable: dict[str, bool] = {}  # corpus -> the user may read its DAG (asked once per corpus)
        for d in all_runs():
            corpus = d.parent.name
            if readable.setdefault(corpus, may_read(request.state.stoker_user, refresh_dag(corpus))) is False:
                continue
            try:
                s = summary(d)
            except Exception:  # noqa: BLE001 - a run still publishing has no manifest
                continue
            t = s.get("training") or {}
            ref = html.escape(f"{d.parent.name}/{d.name}")
            rows.append(f"<tr><td><a href='/stoker/runs/{ref}'>{ref}</a></td>"
                        f"<td>{html.escape(s['topic'])}</td><td>{s['sequences']}</td>"
                        f"<td>{t.get('sequences_consumed', '-')}</td><td>{t.get('last_loss') or '-'}</td></tr>")
        table = ("<table><tr><th>run</th><th>topic</th><th>sequences</th><th>consumed</th><th>last loss</th></tr>"
                 + "".join(rows) + "</table>") if rows else "<p>No run has published yet.</p>"
        return _page("Stoker runs", table)

    @app.get("/runs/{corpus}/{ds}", response_class=HTMLResponse)
    def run_page(request: Request, corpus: str, ds: str) -> HTMLResponse:
        return _summary_html(_corpus_run(request, corpus, ds))

    @app.get("/runs/{corpus}/{ds}/summary.json")
    def run_json(request: Request, corpus: str, ds: str) -> JSONResponse:
        from stoker.reports.runs import summary

        return JSONResponse(summary(_corpus_run(request, corpus, ds)))

    @app.get("/runs/{corpus}/{ds}/loss.png")
    def loss_png(request: Request, corpus: str, ds: str) -> FileResponse:
        from stoker.reports.runs import summary

        t = summary(_corpus_run(request, corpus, ds)).get("training") or {}
        if not t.get("loss_curve") or not Path(t["loss_curve"]).is_file():
            raise HTTPException(404, f"run {corpus}/{ds} has no loss curve yet: training has not finished")
        return FileResponse(t["loss_curve"], media_type="image/png")

    @app.get("/dag-runs/{dag_id}/{run_id}/loss.png")
    def dag_run_loss(request: Request, dag_id: str, run_id: str) -> FileResponse:
        require_dag(request, dag_id)
        d = run_for_dag_run(dag_id, run_id)
        if d is None:
            raise HTTPException(404, f"{dag_id} {run_id} has not published yet")
        return loss_png(request, d.parent.name, d.name)

    @app.get("/dag-runs/{dag_id}/{run_id}", response_class=HTMLResponse)
    def dag_run_page(request: Request, dag_id: str, run_id: str) -> HTMLResponse:
        require_dag(request, dag_id)
        d = run_for_dag_run(dag_id, run_id)
        if d is None or not RunLayout(d).manifest.is_file():
            return _page(f"{dag_id} {run_id}", "<p>This run has not published yet: its summary appears once "
                         "tokenize_publish has written the manifest.</p>")
        return _summary_html(d)

    return app
