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
