"""``kafka_default`` → a librdkafka client config. Fails fast on a connection that cannot work."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from stoker.exceptions import ConfigError
from stoker.sources import S3Settings


class StokerKafkaHook(BaseHook):
    """Reads a Kafka connection (the Apache Kafka provider's type: the extra *is* the client config,
    e.g. ``{"bootstrap.servers": "broker:9092", "security.protocol": "SASL_SSL", ...}``)."""

    conn_name_attr = "kafka_config_id"
    default_conn_name = "kafka_default"
    conn_type = "kafka"
    hook_name = "Stoker Kafka"

    def __init__(self, kafka_config_id: str = default_conn_name) -> None:
        super().__init__()
        self.kafka_config_id = kafka_config_id

    def get_config(self) -> dict[str, Any]:
        conn = self.get_connection(self.kafka_config_id)
        config = dict(conn.extra_dejson)
        if not config.get("bootstrap.servers"):
            raise ConfigError(
                f"connection {self.kafka_config_id!r} has no 'bootstrap.servers' in its extra: set it to the "
                "Kafka client config JSON, e.g. {\"bootstrap.servers\": \"127.0.0.1:39092\"}"
            )
        return config


def s3_settings(aws_conn_id: str | None) -> S3Settings:
    """An s3:// source's endpoint and credentials: the Airflow connection ``aws_conn_id`` (the
    Amazon provider's shape: login = access key id, password = secret key, extra ``endpoint_url``,
    ``region_name``, ``aws_session_token``) when it exists, else the usual AWS environment."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    if aws_conn_id:
        try:
            conn = BaseHook.get_connection(aws_conn_id)
        except AirflowNotFoundException:
            pass
        else:
            return S3Settings.from_connection(conn.login, conn.password, conn.extra_dejson)
    return S3Settings.from_env()
