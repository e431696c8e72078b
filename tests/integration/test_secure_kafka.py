"""`stoker kafka up --secure`: SASL_SSL only (TLS from a local CA, SCRAM-SHA-512, ACLs). The pipeline's
user reaches its own topics; a wrong password, an untrusted certificate or a plain-text client is
refused, the first two with a clear message in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from stoker.exceptions import StokerError
from stoker.kafka import topics as ktopics
from stoker.kafka.settings import config_from_env

pytestmark = pytest.mark.integration


def test_the_pipeline_user_reaches_its_topics_and_nothing_else(secure_kafka):
    topic = f"stoker.secure.{time.time_ns()}.a1"
    ktopics.create_topic(secure_kafka, topic, 2)
    assert topic in ktopics.list_topics(secure_kafka, "stoker.secure.")
    with pytest.raises(StokerError, match="TOPIC_AUTHORIZATION_FAILED"):  # ACLs: only stoker* names
        ktopics.create_topic(secure_kafka, f"other.{time.time_ns()}", 1)
    ktopics.delete_topics(secure_kafka, [topic])


@pytest.mark.parametrize("change, message", [
    ({"sasl.password": "not-the-password"}, "refused the credentials of user 'stoker' (SCRAM-SHA-512)"),
    ({"ssl.ca.location": "/etc/ssl/certs/ca-certificates.crt"},
     "TLS handshake failed, this client does not trust the broker's certificate"),
])
def test_a_wrong_password_or_an_untrusted_certificate_is_a_clear_error_in_seconds(secure_kafka, change, message):
    t0 = time.monotonic()
    with pytest.raises(StokerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ktopics.check_reachable({**secure_kafka, **change}, timeout=30)
    assert time.monotonic() - t0 < 10  # not the 30 s timeout


def test_plain_text_gets_nothing(secure_kafka):
    with pytest.raises(StokerError, match="did not answer"):
        ktopics.check_reachable({"bootstrap.servers": secure_kafka["bootstrap.servers"]}, timeout=3)


def test_status_names_the_settings_not_the_password(secure_kafka):
    import os
    from pathlib import Path

    from stoker_local import broker as stack

    b = stack.Broker(home=Path(os.environ["STOKER_HOME"]) / "kafka-secure",
                     port=int(secure_kafka["bootstrap.servers"].rsplit(":", 1)[1]), secure=True)
    status = stack.status(b)
    assert status["running"] and status["security_protocol"] == "SASL_SSL"
    assert status["client_config"]["sasl.username"] == "stoker"
    assert secure_kafka["sasl.password"] not in json.dumps(status)
    out = subprocess.run([sys.executable, "-m", "stoker_local.cli", "kafka", "--help"], capture_output=True, text=True)
    assert "--secure" in out.stdout


def test_a_password_file_stands_for_the_password(secure_kafka, tmp_path, monkeypatch):
    """``sasl.password.file`` in the connection: the password stays out of the connection and the job's
    environment; each client reads it where it runs (a plain file, or the JSON `stoker kafka up
    --secure` writes)."""
    from stoker.exceptions import ConfigError
    from stoker.paths import write_private

    plain, as_json = tmp_path / "password", tmp_path / "credentials.json"
    write_private(plain, secure_kafka["sasl.password"] + "\n")
    write_private(as_json, json.dumps({"user": "stoker", "password": secure_kafka["sasl.password"]}))
    base = {k: v for k, v in secure_kafka.items() if k != "sasl.password"}
    for f in (plain, as_json):
        monkeypatch.setenv("STOKER_KAFKA_CONFIG", json.dumps({**base, "sasl.password.file": str(f)}))
        assert ktopics.check_reachable(config_from_env(), timeout=10) == 1
    monkeypatch.setenv("STOKER_KAFKA_CONFIG", json.dumps({**base, "sasl.password.file": str(tmp_path / "gone")}))
    with pytest.raises(ConfigError, match="sasl.password.file = .*gone.*cannot be read"):
        config_from_env()
