"""Spark's connectors to object stores, resolved from Maven Central by ``make setup``.

``pom.xml`` here names hadoop-aws (the S3A filesystem) at the Hadoop version pyspark ships and the
AWS SDK v2 modules it needs; ``make setup`` copies them into ``~/.cache/stoker/s3a-<version>/jars``.
HDFS needs nothing extra: pyspark's own Hadoop client speaks it.
"""

from __future__ import annotations

from pathlib import Path

from stoker import paths
from stoker.exceptions import SourceError

HADOOP_VERSION = "3.5.0"
"""Must equal pyspark's (``pyspark/jars/hadoop-client-api-<version>.jar``) and pom.xml's."""


def s3a_dir() -> Path:
    return paths.cache_dir() / f"s3a-{HADOOP_VERSION}" / "jars"


def s3a_jars() -> list[Path]:
    """The S3A connector's jars, or a :class:`SourceError` saying how to get them."""
    jars = sorted(s3a_dir().glob("*.jar"))
    if not any(j.name == f"hadoop-aws-{HADOOP_VERSION}.jar" for j in jars):
        raise SourceError(f"s3:// sources need the S3A connector, which is not in {s3a_dir()}: run `make setup` "
                          "(it copies hadoop-aws and the AWS SDK's S3 modules from Maven Central)")
    return jars


def spark_hadoop_version() -> str | None:
    """The Hadoop client version pyspark ships (its hadoop-client-api jar), if pyspark is installed."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    for jar in (Path(list(spec.submodule_search_locations)[0]) / "jars").glob("hadoop-client-api-*.jar"):
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    return None
