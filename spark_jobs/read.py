"""The read side of the job as DataFrames: preflight, the lineage scan, streaming parse, dedup.

Task-side logic (opening, splitting, decompressing, parsing) lives in :mod:`spark_jobs.reading`
and :mod:`spark_jobs.steps`, which import no pyspark.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from spark_jobs.reading import Opener, Split, plan_splits, scan_batches, split_records, split_rows
from stoker import paths
from stoker.config import CorpusConfig
from stoker.exceptions import ConfigError, SourceError

log = logging.getLogger("stoker.tokenize_publish")

PARSED_SCHEMA = "source string, pos long, text string, reason string, detail string, raw binary, digest binary"
COLUMNS = ["source", "pos", "text", "reason", "detail", "raw", "digest"]
BATCH_ROWS = 2048
BATCH_BYTES = 16 << 20
"""A parse task hands Spark a batch at whichever limit comes first: memory is bounded by these."""


def canonical(path: str) -> str:
    """One spelling per file: ``file:/abs`` (Spark writes ``file:///abs``), percent-escapes undone."""
    import urllib.parse

    if path.startswith("file:"):
        rest = urllib.parse.unquote(path[len("file:"):])
        while rest.startswith("//"):
            rest = rest[1:]
        return "file:" + rest
    return urllib.parse.unquote(path)


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
    from stoker.sources import S3Settings, scheme_of

    scheme = scheme_of(uri)
    if scheme in ("s3", "s3a"):
        return S3Settings.from_env().hadoop_conf()
    if scheme == "hdfs":  # an unreachable NameNode fails in seconds, not after 45 s of retries
        return {"ipc.client.connect.max.retries": "2", "ipc.client.connect.timeout": "5000",
                "ipc.client.connect.max.retries.on.timeouts": "2", "dfs.client.retry.policy.enabled": "false"}
    return {}


def preflight_source(spark, cfg: CorpusConfig, uri: str) -> list[dict[str, Any]]:
    """Configure Spark's Hadoop client for the source and prove both the store's own API and Spark's
    client answer before anything is read: an unreachable store, a refused credential, a missing
    bucket or an empty drop raises a named error in seconds. Returns the data files listed."""
    from stoker.sources import S3Settings, is_data_path, open_store

    hconf = spark.sparkContext._jsc.hadoopConfiguration()
    wanted = source_hadoop_conf(uri)
    if any(hconf.get(k) not in (None, v) for k, v in wanted.items()):
        # Hadoop caches one FileSystem per scheme and bucket, built with the settings it first saw:
        # in a long-lived session (notebook, tests) a changed endpoint or key must not reuse it
        spark.sparkContext._jvm.org.apache.hadoop.fs.FileSystem.closeAll()
    for k, v in wanted.items():
        hconf.set(k, v)
    store = open_store(uri, s3=S3Settings.from_env(), webhdfs_url=cfg.source.webhdfs_url)
    listed = [f for f in store.list_files(uri) if is_data_path(uri, f.uri)]
    if not listed:
        raise ConfigError(f"source.uri = {uri!r}: no data files found (files starting with _ or . are ignored): "
                          "is this the right night's folder?")
    if "://" in uri:
        _probe_spark_client(spark, spark_path(listed[0].uri), uri)
    return [{"path": spark_path(f.uri), "bytes": f.size, "etag": f.etag, "mtime": f.mtime} for f in listed]


def _probe_spark_client(spark, path: str, uri: str) -> None:
    """Spark's own Hadoop client (Parquet reads, the lineage of a cluster) reaches the store too."""
    jvm = spark.sparkContext._jvm
    try:
        p = jvm.org.apache.hadoop.fs.Path(path)
        p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).getFileStatus(p)
    except Exception as e:  # noqa: BLE001 - Py4J/Hadoop errors: name the source, keep the JVM's first line
        first = next((line.strip() for line in str(e).splitlines() if "Exception" in line), str(e)[:300])
        raise SourceError(f"{uri}: Spark cannot read it ({first[:400]}): the store answered the preflight but not "
                          "Spark's own client; check the hdfs:// RPC port or the S3A settings", transient=True) from e


def opener_for(cfg: CorpusConfig) -> Opener:
    """The store's settings for the tasks: S3 from this driver's environment (the operator filled it
    from the Airflow connection), WebHDFS from the corpus config."""
    from stoker.sources import S3Settings, scheme_of

    s3 = S3Settings.from_env() if scheme_of(cfg.source.uri) in ("s3", "s3a") else None
    return Opener(s3=s3, webhdfs_url=cfg.source.webhdfs_url)


def scan(spark, files: list[dict[str, Any]], opener: Opener, fmt: str) -> list[dict[str, Any]]:
    """Lineage in one streaming pass per file, in parallel: size, sha256 and, for a compressed file,
    whether it decompresses. Memory per task is a 1 MiB chunk."""
    rdd = spark.sparkContext.parallelize([(f["path"],) for f in files], max(1, len(files)))
    rows = spark.createDataFrame(rdd, "path string").mapInArrow(scan_batches(opener, fmt), "scan string").collect()
    scanned = {s["path"]: s for s in (json.loads(r["scan"]) for r in rows)}
    return sorted(({**f, **scanned[f["path"]]} for f in files), key=lambda f: f["path"])


def parse_splits(cfg: CorpusConfig, max_bytes: int, progress: Any = None):
    """mapInArrow function: split rows (one per task) → one row per record, in bounded batches."""
    src, c, opener = cfg.source, cfg.clean, opener_for(cfg)
    read_acc, docs_acc = (progress.bytes_read, progress.docs) if progress is not None else (None, None)

    def run(batches):
        import pyarrow as pa

        from spark_jobs.steps import clean

        rows: dict[str, list] = {k: [] for k in COLUMNS}
        size = 0
        for batch in batches:
            for split in batch.to_pylist():
                for p in split_records(Split(**split), src.format, src.text_field, max_bytes, opener):
                    p = clean(p, c.normalization, c.min_chars, c.max_chars)
                    for k in COLUMNS:
                        rows[k].append(getattr(p, k))
                    if p.reason is None:
                        rows["raw"][-1] = None  # only the quarantine needs the raw bytes
                    size += len(p.text or "") + len(p.raw or b"")
                    if len(rows["pos"]) >= BATCH_ROWS or size >= BATCH_BYTES:
                        if docs_acc is not None:
                            docs_acc.add(len(rows["pos"]))
                        yield pa.RecordBatch.from_pydict(rows, schema=parsed_arrow_schema())
                        rows, size = {k: [] for k in COLUMNS}, 0
                if read_acc is not None:
                    read_acc.add(split["end"] - split["start"])
        if rows["pos"]:
            if docs_acc is not None:
                docs_acc.add(len(rows["pos"]))
            yield pa.RecordBatch.from_pydict(rows, schema=parsed_arrow_schema())
    return run


def parsed_arrow_schema():
    import pyarrow as pa

    return pa.schema([("source", pa.string()), ("pos", pa.int64()), ("text", pa.string()),
                      ("reason", pa.string()), ("detail", pa.string()), ("raw", pa.binary()),
                      ("digest", pa.binary())])


def read_lines(spark, cfg: CorpusConfig, files: list[dict[str, Any]], progress: Any = None):
    """JSONL/text: one task per split (byte range, or a whole compressed file), records streamed."""
    splits = split_rows(plan_splits(files, cfg.source.split_bytes))
    rdd = spark.sparkContext.parallelize([tuple(s.values()) for s in splits], max(1, len(splits)))
    df = spark.createDataFrame(rdd, "path string, start long, end long, corrupt string")
    max_bytes = cfg.clean.max_chars * 4 + 4  # UTF-8: at most 4 bytes a character
    log.info("reading %d files as %d splits of up to %d MiB", len(files), len(splits), cfg.source.split_bytes >> 20)
    return df.mapInArrow(parse_splits(cfg, max_bytes, progress), PARSED_SCHEMA)


def parse_parquet(cfg: CorpusConfig, absent: str):
    """mapInArrow function: projected Parquet rows (source, pos, value) → parsed records."""
    src, c = cfg.source, cfg.clean

    def run(batches):
        import pyarrow as pa

        from spark_jobs.steps import clean, parquet_record

        for batch in batches:
            rows: dict[str, list] = {k: [] for k in COLUMNS}
            for source, pos, value in zip(*(batch.column(k).to_pylist() for k in ("source", "pos", "value")),
                                          strict=True):
                record = parquet_record(canonical(source), pos, value, src.text_field, absent)
                p = clean(record, c.normalization, c.min_chars, c.max_chars)
                for k in COLUMNS:
                    rows[k].append(getattr(p, k))
                if p.reason is None:
                    rows["raw"][-1] = None
            yield pa.RecordBatch.from_pydict(rows, schema=parsed_arrow_schema())
    return run


def read_parquet(spark, cfg: CorpusConfig, files: list[dict[str, Any]], progress: Any = None):
    """Parquet through Spark's own reader: only the text column (and each row's file and index) is
    read, row groups spread over tasks. A file that is no Parquet is one ``corrupt_file`` record."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    good, bad = [f for f in files if not f.get("corrupt")], [f for f in files if f.get("corrupt")]
    parts = [read_lines(spark, cfg, bad)] if bad else []
    if good:
        df = spark.read.parquet(*[f["path"] for f in good])
        field, absent = cfg.source.text_field, ""
        fields = {f.name: f.dataType for f in df.schema.fields}
        if fields.get(field) == StringType():
            value = F.col(f"`{field}`")
        else:
            absent = (f"of type {fields[field].simpleString()}" if field in fields
                      else f"absent (columns: {', '.join(df.columns)})")
            value = F.lit(None).cast("string")
        rows = df.select(F.col("_metadata.file_path").alias("source"), F.col("_metadata.row_index").alias("pos"),
                         value.alias("value"))
        parts.append(rows.mapInArrow(parse_parquet(cfg, absent), PARSED_SCHEMA))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def read_parsed(spark, cfg: CorpusConfig, files: list[dict[str, Any]], progress: Any = None):
    """Every input record, each either kept (text) or dropped (reason)."""
    if progress is not None:
        progress.total_bytes = sum(f["bytes"] for f in files)
    if cfg.source.format == "parquet":
        return read_parquet(spark, cfg, files, progress)
    return read_lines(spark, cfg, files, progress)


BROADCAST_DUPLICATES = 500_000
"""Up to this many duplicated texts, their first places are broadcast to the tasks (no text moves)."""


def mark_duplicates(parsed):
    """Exact dedup that shuffles hashes, not texts: of records with the same digest the first by
    (source, pos) is kept; the others become ``duplicate``."""
    from pyspark.sql import functions as F

    from spark_jobs.steps import DUPLICATE

    firsts = (parsed.filter(F.col("reason").isNull()).select("digest", F.struct("source", "pos").alias("at"))
              .groupBy("digest").agg(F.count("*").alias("n"), F.min("at").alias("first"))
              .filter(F.col("n") > 1)
              .select("digest", F.col("first.source").alias("_src"), F.col("first.pos").alias("_pos"))).cache()
    small = firsts.count() <= BROADCAST_DUPLICATES
    joined = parsed.join(F.broadcast(firsts) if small else firsts, "digest", "left")
    dup = (F.col("reason").isNull() & F.col("_src").isNotNull()
           & ~((F.col("source") == F.col("_src")) & (F.col("pos") == F.col("_pos"))))
    return (joined.withColumn("reason", F.when(dup, F.lit(DUPLICATE)).otherwise(F.col("reason")))
            .withColumn("detail", F.when(dup, F.concat(F.lit("same text as "), F.col("_src"), F.lit(" at "),
                                                       F.col("_pos").cast("string")))
                        .otherwise(F.col("detail")))
            .select(*COLUMNS))
