"""Spark's Hadoop client and the names it uses, for the source and the near-dedup index alike (a local folder, S3A,
HDFS); no pyspark at import."""

from __future__ import annotations

from stoker import paths


def spark_path(uri: str) -> str:
    """The name Spark and the lineage use: ``file:/abs`` for local files, ``s3a://`` for S3."""
    if "://" not in uri:
        return "file:" + str(paths.resolve_local(uri))
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://"):]
    return uri


def source_hadoop_conf(uri: str) -> dict[str, str]:
    """Hadoop settings for reading ``uri``: S3A's endpoint and credentials (from the environment
    the operator filled from its Airflow connection), short bounded retries for HDFS RPC."""
    from stoker.stores.drops import scheme_of
    from stoker.stores.s3 import S3Settings

    scheme = scheme_of(uri)
    if scheme in ("s3", "s3a"):
        return S3Settings.from_env().hadoop_conf()
    if scheme == "hdfs":  # an unreachable NameNode fails in seconds, not after 45 s of retries
        return {"ipc.client.connect.max.retries": "2", "ipc.client.connect.timeout": "5000",
                "ipc.client.connect.max.retries.on.timeouts": "2", "dfs.client.retry.policy.enabled": "false"}
    return {}


def configure_hadoop(spark, uri: str) -> None:
    """Spark's Hadoop client set up for ``uri``'s store (:func:`source_hadoop_conf`)."""
    hconf = spark.sparkContext._jsc.hadoopConfiguration()
    wanted = source_hadoop_conf(uri)
    if any(hconf.get(k) not in (None, v) for k, v in wanted.items()):
        # Hadoop caches one FileSystem per scheme and bucket, built with the settings it first saw:
        # in a long-lived session (notebook, tests) a changed endpoint or key must not reuse it
        spark.sparkContext._jvm.org.apache.hadoop.fs.FileSystem.closeAll()
    for k, v in wanted.items():
        hconf.set(k, v)
