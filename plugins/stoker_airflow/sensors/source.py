"""``await_source``: the night's drop is complete in its store (a success marker or a data file).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from stoker import paths


class SourceReadySensor(BaseSensorOperator):
    """Waits until a night's drop is complete: its ``success_marker`` exists (or, with no marker,
    any data file) in a local folder, an S3 prefix or an HDFS folder.

    Runs in ``reschedule`` mode: between pokes the task holds no worker slot. A store that cannot
    answer fails the poke at once with the reason: a refused credential or a missing bucket fails
    the task for good (no retry can fix it); an unreachable, throttled or failing store (or a
    standby NameNode) fails this try, and the DAG's retries try again.

    A run's ``source_uri`` that the corpus does not allow (``source.allowed_uri_prefixes``) fails the
    task for good before its first poke: nothing of the night runs.
    """

    template_fields: Sequence[str] = ("uri", "ds")

    def __init__(self, *, uri: str, ds: str | None = None, success_marker: str | None = "_SUCCESS",
                 aws_conn_id: str = "aws_default", webhdfs_url: str | None = None, corpus_uri: str | None = None,
                 allowed_uri_prefixes: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.uri = uri
        self.corpus_uri = corpus_uri
        """The corpus config's own ``source.uri``; with it, ``uri`` must be it or an allowed override."""
        self.allowed_uri_prefixes = list(allowed_uri_prefixes)
        """The source URI; with ``ds``, its ``{ds}``/``{ds_nodash}`` select that night (as the job does)."""
        self.ds = ds
        self.success_marker = success_marker
        self.aws_conn_id = aws_conn_id
        self.webhdfs_url = webhdfs_url

    def _store(self) -> Any:
        from stoker.stores.drops import open_store, scheme_of
        from stoker_airflow.hooks import s3_settings

        uri = self._uri()
        s3 = s3_settings(self.aws_conn_id) if scheme_of(uri) in ("s3", "s3a") else None
        return open_store(uri, s3=s3, webhdfs_url=self.webhdfs_url)

    def _uri(self) -> str:
        """The watched folder; a local one resolved against the project (never the worker's CWD)."""
        from stoker.config.corpus import render_uri
        from stoker.stores.drops import scheme_of

        uri = render_uri(self.uri, self.ds) if self.ds else self.uri
        return uri if scheme_of(uri) != "file" else str(paths.resolve_local(uri))

    def _watched(self) -> str:
        from stoker.stores.drops import join

        uri = self._uri()
        return join(uri, self.success_marker) if self.success_marker else uri

    def poke(self, context: Any) -> bool:
        from stoker.exceptions import SourceError
        from stoker.stores.drops import drop_status

        uri = self._uri()
        try:
            ready, seen = drop_status(self._store(), uri, self.success_marker)
        except SourceError as e:
            if e.transient:
                raise  # unreachable, throttled, a standby NameNode: this try fails, a retry pokes again
            raise AirflowFailException(str(e)) from None
        self.log.info("%s: %s", uri, "complete: " + seen if ready else seen)
        return ready

    def execute(self, context: Any) -> Any:
        if self.corpus_uri is not None:
            from stoker.config.corpus import check_source_override
            from stoker.exceptions import ConfigError

            try:
                check_source_override(self.corpus_uri, self.allowed_uri_prefixes, self.uri)
            except ConfigError as e:
                raise AirflowFailException(str(e)) from None
        try:
            return super().execute(context)
        except AirflowSensorTimeout:
            what = self.success_marker or "any data file"
            raise AirflowSensorTimeout(
                f"source {self._watched()}: no {what} after {self.timeout:.0f}s: the night's drop is "
                "incomplete; check the upstream export, or raise source.timeout_s in the corpus config"
            ) from None
