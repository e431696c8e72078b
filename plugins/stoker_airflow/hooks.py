"""Connections → client settings: ``kafka_default`` through the Kafka provider's hook, and an s3://
source's endpoint and credentials. Both fail fast on a connection that cannot work."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.sdk import BaseHook

from stoker.exceptions import ConfigError
from stoker.stores.s3 import S3Settings


class StokerKafkaHook(KafkaBaseHook):
    """The Apache Kafka provider's hook for a ``kafka`` connection (its form, its extra = the client
    config, its OAuth callbacks: Google Managed Kafka, Amazon MSK IAM, allow-listed dotted paths),
    with the two shapes of that config Stoker needs."""

    def client_config(self) -> dict[str, Any]:
        """For a client in this process: callbacks resolved into callables."""
        from stoker.kafka.settings import with_password_file

        try:
            return with_password_file(self._build_config())
        except ValueError as e:
            raise ConfigError(f"connection {self.kafka_config_id!r}: {e}: set its extra to the Kafka client "
                              'config JSON, e.g. {"bootstrap.servers": "127.0.0.1:29092"}') from None

    def subprocess_config(self) -> dict[str, Any]:
        """For a Spark job or a trainer (``STOKER_KAFKA_CONFIG``): plain JSON, callbacks still as the
        dotted paths the provider's allow-list accepted (``stoker.kafka.settings.config_from_env`` imports
        them there), and ``sasl.password.file`` still a path, read where the job runs. Managed-auth
        token callbacks cannot cross a process boundary: use the client's own SASL settings for
        those clusters."""
        self.client_config()  # the same checks: bootstrap.servers set, every callback allow-listed
        return dict(self.get_connection(self.kafka_config_id).extra_dejson)


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
