"""The local stack of ``make up``: the whole thing a user runs, on 127.0.0.1, started by the project.

* the embedded Kafka broker (:mod:`stoker_local.broker`);
* PostgreSQL as Airflow's metadata database (Debian's server binaries; its data under the state
  folder; run as the ``postgres`` user when we are root, because PostgreSQL refuses to run as root);
* Airflow 3's api-server (UI + REST + execution API), scheduler (LocalExecutor), dag-processor and
  triggerer, with the repo's dags/ and plugins/, the connections ``kafka_default`` and
  ``spark_default`` from the environment, and the UI behind the simple auth manager's login.

Every process is started in a session of its own (``setsid``) and recorded in ``<state>/stack/pids``
with its start time, so ``down`` stops exactly what ``up`` started — the whole process group and
every descendant, TERM first and KILL after a grace period — and never a process that merely reused
a pid. ``down`` also stops detached trainers of this state folder (they resume from their last
checkpoint when the refresh is retried).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker import layout, paths
from stoker.exceptions import StackError
from stoker.process import ProcessRecord
from stoker_local import broker as kbroker

AIRFLOW_COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server")
ADMIN_USER = "admin"


@dataclass(frozen=True, slots=True)
class LocalStack:
    home: Path
    api_port: int = 8080
    pg_port: int = 29432
    parallelism: int = 4

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def pid_dir(self) -> Path:
        return self.home / "pids"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def pg_data(self) -> Path:
        return self.home / "postgres"

    @property
    def passwords_file(self) -> Path:
        return self.home / "passwords.json"

    def broker(self) -> kbroker.Broker:
        return kbroker.default_broker()


def default_stack() -> LocalStack:
    """Ports from ``STOKER_API_PORT`` (8080) and ``STOKER_PG_PORT`` (29432); ``STOKER_PARALLELISM``."""
    return LocalStack(home=paths.state_dir() / "stack", api_port=int(os.environ.get("STOKER_API_PORT", 8080)),
                 pg_port=int(os.environ.get("STOKER_PG_PORT", 29432)),
                 parallelism=int(os.environ.get("STOKER_PARALLELISM", 4)))


def _secrets(s: LocalStack) -> dict[str, str]:
    """Generated once per state folder, mode 0600: database password, JWT and session keys."""
    path = s.home / "secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    s.home.mkdir(parents=True, exist_ok=True)
    data = {"pg_password": secrets.token_urlsafe(18), "jwt_secret": secrets.token_urlsafe(32),
            "api_secret_key": secrets.token_urlsafe(32)}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    return data


def admin_password(s: LocalStack) -> str:
    """The UI login's password: ``STOKER_ADMIN_PASSWORD`` if set, else generated once and kept in
    ``<state>/stack/passwords.json`` (the simple auth manager reads the same file)."""
    wanted = os.environ.get("STOKER_ADMIN_PASSWORD")
    current: dict[str, str] = {}
    if s.passwords_file.exists():
        current = json.loads(s.passwords_file.read_text() or "{}")
    if wanted and current.get(ADMIN_USER) != wanted or ADMIN_USER not in current:
        current[ADMIN_USER] = wanted or secrets.token_urlsafe(12)
        s.home.mkdir(parents=True, exist_ok=True)
        tmp = s.passwords_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(current, f)
        os.replace(tmp, s.passwords_file)
    return current[ADMIN_USER]


def db_url(s: LocalStack, driver: str = "psycopg2") -> str:
    return f"postgresql+{driver}://airflow:{_secrets(s)['pg_password']}@127.0.0.1:{s.pg_port}/airflow"


def airflow_stack_env(s: LocalStack) -> dict[str, str]:
    """The environment every Airflow component of the stack runs with."""
    from stoker_local.airflow_env import airflow_env

    sec = _secrets(s)
    env = airflow_env(s.broker().bootstrap)
    env.update({
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url(s),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # sized for a small machine: a Spark job and a 2-rank trainer already fill 2 cores
        "AIRFLOW__CORE__PARALLELISM": str(s.parallelism),
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(s.parallelism),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{s.api_url}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(s.api_port),
        "AIRFLOW__API__BASE_URL": s.api_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": sec["api_secret_key"],
        "AIRFLOW__API_AUTH__JWT_SECRET": sec["jwt_secret"],
        "AIRFLOW__CORE__AUTH_MANAGER": "stoker_airflow.auth.StokerAuthManager",  # SimpleAuthManager + DAG lists
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(s.passwords_file),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "20",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
        "AIRFLOW__TRIGGERER__CAPACITY": "50",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(paths.state_dir() / "airflow" / "logs"),
    })
    return env


def _record(s: LocalStack, name: str) -> ProcessRecord:
    return ProcessRecord(s.pid_dir / f"{name}.json")


def _recorded(s: LocalStack, name: str) -> int | None:
    """The pid of a component this stack started, if that very process still runs."""
    return _record(s, name).pid()


def _spawn(s: LocalStack, name: str, cmd: list[str], env: dict[str, str], preexec: list[str] | None = None) -> int:
    return _record(s, name).spawn([*(preexec or []), *cmd], log=s.log_dir / f"{name}.log", env=env, cwd=s.home).pid


def _log_tail(s: LocalStack, name: str, lines: int = 25) -> str:
    try:
        return "\n".join((s.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- PostgreSQL ------------------------------------------------------------------------------------
def _pg_bin(tool: str) -> str:
    found = shutil.which(tool)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"), key=lambda p: int(p.parts[-3]))
    if versions:
        return str(versions[-1])
    raise StackError(f"PostgreSQL's {tool} not found: install the server (Debian: apt-get install postgresql); "
                     "`make setup` does it when run as root")


def _as_pg_user() -> list[str]:
    """PostgreSQL refuses to run as root: drop to the ``postgres`` user Debian's package creates."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


def _pg_env(s: LocalStack) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "STOKER_HOME": str(paths.state_dir())}


def _pg_init(s: LocalStack) -> None:
    if (s.pg_data / "PG_VERSION").exists():
        return
    s.pg_data.mkdir(parents=True, exist_ok=True)
    pwfile = s.pg_data.parent / "pg_pwfile"
    pwfile.write_text(_secrets(s)["pg_password"] + "\n")
    try:
        if os.geteuid() == 0:
            shutil.chown(s.pg_data, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
            probe = subprocess.run([*_as_pg_user(), "test", "-w", str(s.pg_data)], env=_pg_env(s))
            if probe.returncode != 0:
                raise StackError(f"the postgres user cannot reach {s.pg_data}: a folder above it is not "
                                 "traversable (chmod o+x it) or clone the repo under a world-readable path")
        os.chmod(s.pg_data, 0o700)
        res = subprocess.run([*_as_pg_user(), _pg_bin("initdb"), "-D", str(s.pg_data), "-U", "airflow",
                              f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8", "--no-instructions"],
                             env=_pg_env(s), capture_output=True, text=True, timeout=180)
    finally:
        pwfile.unlink(missing_ok=True)
    if res.returncode != 0:
        shutil.rmtree(s.pg_data, ignore_errors=True)
        raise StackError(f"initdb in {s.pg_data} failed: {res.stdout}{res.stderr}")


def _pg_connect(s: LocalStack, dbname: str, timeout: float = 3.0) -> Any:
    import psycopg2

    return psycopg2.connect(host="127.0.0.1", port=s.pg_port, user="airflow", dbname=dbname,
                            password=_secrets(s)["pg_password"], connect_timeout=int(max(1, timeout)))


def _pg_up(s: LocalStack, timeout: float = 60.0) -> bool:
    """Start PostgreSQL unless it runs; make the ``airflow`` database. True if this call started it."""
    import psycopg2

    if _recorded(s, "postgres") is None:
        if kbroker.port_open(s.pg_port):
            raise StackError(f"port {s.pg_port} is in use by a process this stack did not start: stop it or set "
                             "STOKER_PG_PORT")
        _pg_init(s)
        _spawn(s, "postgres", [_pg_bin("postgres"), "-D", str(s.pg_data), "-p", str(s.pg_port),
                               "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                               "-c", "max_connections=200", "-c", "shared_buffers=64MB"],
               _pg_env(s), preexec=_as_pg_user())
        started = True
    else:
        started = False
    deadline = time.monotonic() + timeout
    while True:
        if _recorded(s, "postgres") is None:
            raise StackError(f"PostgreSQL exited at start:\n{_log_tail(s, 'postgres')}")
        try:
            conn = _pg_connect(s, "postgres")
            break
        except psycopg2.OperationalError as e:
            if time.monotonic() > deadline:
                raise StackError(f"PostgreSQL did not answer on 127.0.0.1:{s.pg_port} in {timeout:.0f}s: {e}") from None
            time.sleep(0.5)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = 'airflow'")
        if cur.fetchone() is None:
            cur.execute("CREATE DATABASE airflow")
    conn.close()
    return started


# -- Airflow ---------------------------------------------------------------------------------------
def _airflow_cmd(component: str, s: LocalStack) -> list[str]:
    base = [str(Path(sys.executable).parent / "airflow")]
    if component == "api-server":
        return [*base, "api-server", "--host", "127.0.0.1", "--port", str(s.api_port), "--workers", "1"]
    return [*base, component]


def health(s: LocalStack, timeout: float = 3.0) -> dict[str, Any] | None:
    import httpx

    try:
        r = httpx.get(f"{s.api_url}/api/v2/monitor/health", timeout=timeout)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _all_healthy(h: dict[str, Any] | None) -> bool:
    if not h:
        return False
    return all((h.get(k) or {}).get("status") == "healthy"
               for k in ("metadatabase", "scheduler", "triggerer", "dag_processor") if k in h)


def up(s: LocalStack | None = None, timeout: float = 240.0, log: Any = print) -> LocalStack:
    """Start what is not running (Kafka, PostgreSQL, Airflow's four components) and wait until the
    API server reports every component healthy. Idempotent."""
    s = s or default_stack()
    s.home.mkdir(parents=True, exist_ok=True)
    admin_password(s)
    started = _read_started(s)
    b = s.broker()
    if kbroker.status(b)["running"]:
        log(f"kafka       already running on {b.bootstrap}")
    else:
        kbroker.up(b)
        started.add("kafka")
        log(f"kafka       up on {b.bootstrap}")
    _write_started(s, started)
    if _pg_up(s):
        started.add("postgres")
        log(f"postgres    up on 127.0.0.1:{s.pg_port} (data in {s.pg_data})")
    _write_started(s, started)
    env = {**os.environ, **airflow_stack_env(s)}
    env.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    missing = [c for c in AIRFLOW_COMPONENTS if _recorded(s, c) is None]
    if missing and kbroker.port_open(s.api_port) and "api-server" in missing:
        raise StackError(f"port {s.api_port} is in use by a process this stack did not start: stop it or "
                         "set STOKER_API_PORT")
    _prepare_db(env, log, migrate=bool(missing))
    for c in AIRFLOW_COMPONENTS:
        if c in missing:
            _spawn(s, c, _airflow_cmd(c, s), env)
            started.add(c)
    _write_started(s, started)
    deadline = time.monotonic() + timeout
    while not _all_healthy(health(s)):
        dead = [c for c in AIRFLOW_COMPONENTS if _recorded(s, c) is None]
        if dead:
            raise StackError(f"airflow {dead[0]} exited at start (log {s.log_dir / dead[0]}.log):\n"
                             f"{_log_tail(s, dead[0])}")
        if time.monotonic() > deadline:
            raise StackError(f"Airflow was not healthy within {timeout:.0f}s: {health(s)}; logs in {s.log_dir}")
        time.sleep(1.0)
    log(f"airflow     {', '.join(AIRFLOW_COMPONENTS)} healthy (logs in {s.log_dir})")
    return s


def _prepare_db(env: dict[str, str], log: Any, migrate: bool = True) -> None:
    """Migrate the metadata database and make the model lines' pools."""
    if migrate:
        res = subprocess.run([env["PATH"].split(os.pathsep)[0] + "/airflow", "db", "migrate"], env=env,
                             capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise StackError(f"airflow db migrate failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
        log("airflow     metadata database migrated")
    res = subprocess.run([sys.executable, "-m", "stoker_airflow.pools"], env=env,
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise StackError(f"creating the model lines' pools failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    log(f"airflow     {res.stdout.strip()}")


def refresh_env(s: LocalStack | None = None, log: Any = print) -> dict[str, str]:
    """The environment of ``stoker refresh``'s ``airflow dags test``: the stack's metadata database (PostgreSQL,
    started if need be), so ``make up``'s UI lists ``make run``'s nights and a line's pool holds across both."""
    s = s or default_stack()
    if scheduler_up(s):  # `stoker refresh` hands the night to it (stoker_local/stack_refresh.py)
        raise StackError("the local stack is up (`make up`): its scheduler runs the nights, not a `dags test`")
    if _pg_up(s):
        _write_started(s, _read_started(s) | {"postgres"})
        log(f"postgres    up on 127.0.0.1:{s.pg_port} (data in {s.pg_data}); `make down` stops it")
    env = {**os.environ, **airflow_stack_env(s)}
    env.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    _prepare_db(env, log)
    return env


def scheduler_up(s: LocalStack | None = None) -> bool:
    return _recorded(s or default_stack(), "scheduler") is not None


def _read_started(s: LocalStack) -> set[str]:
    try:
        return set(json.loads((s.home / "started.json").read_text()))
    except (OSError, ValueError):
        return set()


def _write_started(s: LocalStack, started: set[str]) -> None:
    (s.home / "started.json").write_text(json.dumps(sorted(started)))


def down(s: LocalStack | None = None, log: Any = print) -> list[str]:
    """Stop exactly what ``up`` started (and detached trainers of this state folder), newest first."""
    s = s or default_stack()
    stopped = []
    for c in ("api-server", "scheduler", "triggerer", "dag-processor"):
        if _record(s, c).stop():
            stopped.append(c)
    for t in layout.all_trainers():
        if t.process.stop():
            stopped.append(f"trainer {t.folder.name}")
            log(f"stopped trainer in {t.folder} (it resumes from its last checkpoint when the run is retried)")
    if _record(s, "postgres").stop(sig=signal.SIGINT):  # fast shutdown: roll back open transactions
        stopped.append("postgres")
    started = _read_started(s)
    if "kafka" in started and kbroker.down(s.broker()):
        stopped.append("kafka")
    _write_started(s, set())
    log(f"stopped: {', '.join(stopped)}" if stopped else "nothing of the stack was running")
    return stopped


def status(s: LocalStack | None = None) -> dict[str, Any]:
    s = s or default_stack()
    comps: dict[str, Any] = {c: _recorded(s, c) for c in ("postgres", *AIRFLOW_COMPONENTS)}
    h = health(s) if comps["api-server"] else None
    return {"ui": s.api_url, "kafka": kbroker.status(s.broker()), "pids": comps, "health": h}
