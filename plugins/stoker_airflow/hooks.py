"""``kafka_default`` → a librdkafka client config. Fails fast on a connection that cannot work."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from stoker.exceptions import ConfigError


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
