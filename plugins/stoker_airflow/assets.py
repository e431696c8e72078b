"""What the DAG files share at parse time: the Kafka connection every task uses, the night's date as a template,
and the corpus's sequences asset that its refresh updates and a mixture line's DAG is scheduled on. Wiring only,
no I/O (DAG files import it)."""

from __future__ import annotations

from airflow.sdk import Asset

from stoker.layout import topic_prefix

KAFKA_CONN = "kafka_default"
"""The Kafka connection every task uses (the provider's ``kafka`` type; its extra is the client config)."""

_WHEN = "(dag_run.logical_date or dag_run.run_after)"  # `logical_date` is undefined without one
DS = "{{ " + _WHEN + ".strftime('%Y-%m-%d') }}"
"""The run's date: the logical date, or the run_after date of a run triggered without one."""
NIGHT_DS = "{{ dag_run.partition_key or " + _WHEN + ".strftime('%Y-%m-%d') }}"
"""A line's night: the partition key of the publication that started the run (the corpus's date), else as ``DS``."""


def sequences_asset(corpus: str) -> Asset:
    """The corpus's published nights: its publish task updates it, keyed by the night's date. The URI names the
    Kafka connection in its host part (no connection lookup at parse time)."""
    return Asset(name=f"stoker.{corpus}.sequences", uri=f"kafka://{KAFKA_CONN}/{topic_prefix(corpus)}",
                 group="sequences")
