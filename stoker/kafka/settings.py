"""Stoker's own keys in a Kafka client config (a librdkafka dict): resolved before librdkafka sees it."""

from __future__ import annotations

from typing import Any

PASSWORD_FILE = "sasl.password.file"
"""A client config key of Stoker's, not librdkafka's: a file holding ``sasl.password`` (plain text,
or JSON with a ``password`` field, as ``stoker kafka up --secure`` writes), so the password stays
out of connections, environments and command lines; each client reads it where it runs."""


def with_password_file(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` with :data:`PASSWORD_FILE` replaced by the ``sasl.password`` it holds."""
    import json
    from pathlib import Path

    from stoker.exceptions import ConfigError

    if PASSWORD_FILE not in conf:
        return conf
    out = {k: v for k, v in conf.items() if k != PASSWORD_FILE}
    path = Path(str(conf[PASSWORD_FILE]))
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise ConfigError(f"{PASSWORD_FILE} = {str(path)!r}: cannot be read ({e.strerror}): mount or create it "
                          "where this client runs") from None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = text
    out["sasl.password"] = str(parsed["password"] if isinstance(parsed, dict) else parsed)
    return out


CALLBACK_KEYS = ("error_cb", "throttle_cb", "stats_cb", "log_cb", "oauth_cb", "on_commit")
"""librdkafka callbacks a connection may name by dotted path (as the Kafka provider allows)."""


def config_from_env(var: str = "STOKER_KAFKA_CONFIG", resolve_password: bool = True) -> dict[str, Any]:
    """The client config handed to a Spark job or a trainer in the environment (never on a command line).
    ``resolve_password=False`` keeps :data:`PASSWORD_FILE` a path: for a config that travels on (a Spark
    job's tasks), each task then reads the password where it runs and none is pickled into a task."""
    import json
    import os

    from stoker.exceptions import ConfigError

    raw = os.environ.get(var)
    if not raw:
        raise ConfigError(f"{var} is not set: it must hold the Kafka client config as JSON, "
                          'e.g. {"bootstrap.servers": "127.0.0.1:29092"}')
    try:
        conf = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{var} is not JSON: {e}") from None
    if not isinstance(conf, dict) or "bootstrap.servers" not in conf:
        raise ConfigError(f"{var} must be a JSON object with 'bootstrap.servers'")
    for key in CALLBACK_KEYS:  # dotted paths the Airflow side's allow-list accepted
        if isinstance(conf.get(key), str):
            conf[key] = _import_callable(conf[key])
    return with_password_file(conf) if resolve_password else conf


def _import_callable(path: str) -> Any:
    import importlib

    from stoker.exceptions import ConfigError

    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"Kafka callback {path!r} cannot be imported here ({e}): install the module that "
                          "defines it on this node too") from None
