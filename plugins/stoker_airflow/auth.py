"""The local stack's auth manager: Airflow's SimpleAuthManager (users, passwords and roles from
``[core] simple_auth_manager_users``) with per-user DAG lists, which SimpleAuthManager lacks and a
production deployment gets from its own auth manager (FAB's DAG-level permissions, Keycloak's).

``[stoker] dag_access`` (``AIRFLOW__STOKER__DAG_ACCESS``) is a JSON object: user name → the DAG ids they
may see at all. A user it names is refused every other DAG, whatever their role allows (the UI, the REST
API and the run pages of :mod:`stoker_airflow.web` ask the same :meth:`is_authorized_dag`); a user it does
not name keeps what their role gives. Admins are limited too when named.
"""

from __future__ import annotations

import json
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


def dag_access() -> dict[str, set[str]]:
    """``[stoker] dag_access``: user → the DAG ids they may see (checked: an object of lists of names)."""
    from airflow.configuration import conf

    raw = conf.get("stoker", "dag_access", fallback="") or "{}"
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"[stoker] dag_access = {raw!r} is not JSON ({e}): write an object of user -> [dag ids], "
                         'e.g. {"analyst": ["refresh_sample"]}') from None
    if not isinstance(data, dict) or not all(isinstance(v, list) and all(isinstance(d, str) for d in v)
                                             for v in data.values()):
        raise ValueError(f"[stoker] dag_access = {raw!r}: must be an object of user -> [dag ids]")
    return {str(user): set(dags) for user, dags in data.items()}


class StokerAuthManager(SimpleAuthManager):
    """SimpleAuthManager, with ``[stoker] dag_access``'s per-user DAG lists (see the module)."""

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        allowed = dag_access().get(user.get_name())
        if allowed is not None and details is not None and details.id and details.id not in allowed:
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
