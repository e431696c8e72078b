"""The read side of the job as DataFrames: preflight, the provenance scan, streaming parse, dedup.

Task-side logic (opening, splitting, decompressing, parsing) lives in :mod:`spark_jobs.streams`
and :mod:`spark_jobs.steps`, which import no pyspark.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from spark_jobs.hadoop import configure_hadoop, spark_path
from spark_jobs.streams import Opener, Pin, scan_batches, scan_file, split_tasks, task_json
from stoker.config.corpus import CorpusConfig
from stoker.exceptions import ConfigError, SourceError

log = logging.getLogger("stoker.tokenize_publish")

INDEX_SCHEMA = ("source string, pos long, reason string, detail string, raw binary, digest binary, "
                "bands array<long>")
INDEX_COLUMNS = ["source", "pos", "reason", "detail", "raw", "digest"]
"""The index's columns from a record; ``bands`` (near-dedup's band keys of a kept text, else null) follows."""
"""The index of a run: every record, where it is, kept or why not, and the digest of its clean text.
No text: the pack pass reads the records again from the files (or Spark's Parquet reader)."""
BATCH_ROWS = 8192
BATCH_BYTES = 16 << 20
"""An index task hands Spark a batch at whichever limit comes first: memory is bounded by these."""


def canonical(path: str) -> str:
    """One spelling per file: ``file:/abs`` (Spark writes ``file:///abs``), percent-escapes undone."""
    import urllib.parse

    if path.startswith("file:"):
        rest = urllib.parse.unquote(path[len("file:"):])
        while rest.startswith("//"):
            rest = rest[1:]
        return "file:" + rest
    return urllib.parse.unquote(path)


def preflight_source(spark, cfg: CorpusConfig, uri: str) -> list[dict[str, Any]]:
    """Configure Spark's Hadoop client for the source and prove both the store's own API and Spark's
    client answer before anything is read: an unreachable store, a refused credential, a missing
    bucket or an empty drop raises a named error in seconds. Returns the data files listed."""
    from stoker.stores.drops import open_store
    from stoker.stores.local import is_data_path
    from stoker.stores.s3 import S3Settings

    configure_hadoop(spark, uri)
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


def opener_for(cfg: CorpusConfig, files: list[dict[str, Any]] | None = None) -> Opener:
    """The store's settings for the tasks: S3 from this driver's environment (the operator filled it
    from the Airflow connection), WebHDFS from the corpus config; each listed file pinned to what the
    listing saw (size, mtime, ETag)."""
    from stoker.stores.drops import scheme_of
    from stoker.stores.s3 import S3Settings

    s3 = S3Settings.from_env() if scheme_of(cfg.source.uri) in ("s3", "s3a") else None
    pins = {f["path"]: Pin(int(f["bytes"]), f.get("mtime"), f.get("etag")) for f in files or []}
    return Opener(s3=s3, webhdfs_url=cfg.source.webhdfs_url, pins=pins)


# below this many stored bytes the driver hashes the files itself: a Spark job's start and its Python workers'
# boot (~5 s measured on a night of a few files) cost more than hashing them in one process (~300 MB/s)
DRIVER_SCAN_BYTES = 32 << 20


def scan(spark, files: list[dict[str, Any]], opener: Opener, fmt: str,
         driver_bytes: int = DRIVER_SCAN_BYTES) -> list[dict[str, Any]]:
    """Lineage in one streaming pass per file, in parallel (files binned by size, two bins a core, not a
    task per file): size, sha256 and, for a compressed file, whether it decompresses. Memory per task
    is a 1 MiB chunk. A small night (under ``driver_bytes``) is scanned by the driver, with the
    same code and the same store settings."""
    if sum(int(f["bytes"]) for f in files) < driver_bytes:
        return sorted(({**f, **scan_file(f["path"], opener, fmt)} for f in files), key=lambda f: f["path"])
    bins: list[list[str]] = [[] for _ in range(min(len(files), 2 * spark.sparkContext.defaultParallelism))]
    load = [0] * len(bins)
    for f in sorted(files, key=lambda f: -int(f["bytes"])):  # the largest first, each to the least loaded
        i = load.index(min(load))
        bins[i].append(f["path"])
        load[i] += int(f["bytes"])
    rdd = spark.sparkContext.parallelize([(json.dumps(b),) for b in bins], max(1, len(bins)))
    rows = spark.createDataFrame(rdd, "paths string").mapInArrow(scan_batches(opener, fmt), "scan string").collect()
    scanned = {s["path"]: s for s in (json.loads(r["scan"]) for r in rows)}
    return sorted(({**f, **scanned[f["path"]]} for f in files), key=lambda f: f["path"])


@dataclass(frozen=True, slots=True)
class Feed:
    """Where a run's records come from: the input rows of a Spark stage, and how a task turns its
    rows into records. Both passes use the same feed, so they see the same records in the same order."""

    frame: Any
    records: Callable[..., Iterator[Any]]
    """``records(arrow_batches, bytes_read_accumulator=None)`` → :class:`spark_jobs.steps.Parsed`."""


def line_records(cfg: CorpusConfig, opener: Opener) -> Callable[..., Iterator[Any]]:
    """JSONL/text: each row is one task's splits (byte ranges, or whole compressed files)."""
    fmt, field, max_bytes = cfg.source.format, cfg.source.text_field, cfg.clean.max_chars * 4 + 4  # UTF-8: 4 B/char

    def records(batches: Iterator[Any], read_acc: Any = None) -> Iterator[Any]:
        from spark_jobs.streams import Split, split_records

        for batch in batches:
            for task in batch.column("splits").to_pylist():
                for split in json.loads(task):
                    yield from split_records(Split(**split), fmt, field, max_bytes, opener)
                    if read_acc is not None:
                        read_acc.add(split["end"] - split["start"])
    return records


def parquet_records(text_field: str, absent: str) -> Callable[..., Iterator[Any]]:
    """Parquet: projected rows (source, pos, value) from Spark's reader."""
    def records(batches: Iterator[Any], read_acc: Any = None) -> Iterator[Any]:
        from spark_jobs.steps import parquet_record

        for batch in batches:
            cols = (batch.column(k).to_pylist() for k in ("source", "pos", "value"))
            for source, pos, value in zip(*cols, strict=True):
                yield parquet_record(canonical(source), pos, value, text_field, absent)
    return records


def task_feed(spark, cfg: CorpusConfig, files: list[dict[str, Any]]) -> Feed:
    """One row, so one Spark partition, per planned task (streams.split_tasks)."""
    tasks = split_tasks(files, cfg.source.split_bytes, cfg.publish.spark_partitions)
    rdd = spark.sparkContext.parallelize([(i, task_json(t)) for i, t in enumerate(tasks)], max(1, len(tasks)))
    log.info("reading %d files as %d tasks (%d splits of up to %d MiB)", len(files), len(tasks),
             sum(len(t) for t in tasks), cfg.source.split_bytes >> 20)
    return Feed(spark.createDataFrame(rdd, "task int, splits string"), line_records(cfg, opener_for(cfg, files)))


def parquet_feed(spark, cfg: CorpusConfig, files: list[dict[str, Any]]) -> Feed:
    """Parquet through Spark's own reader: only the text column (and each row's file and index) is
    read, row groups spread over tasks. The split of the files into tasks depends on the files and
    ``publish.spark_partitions`` only (not on the cluster's cores), so a re-run packs alike."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    spark.conf.set("spark.sql.files.minPartitionNum", str(cfg.publish.spark_partitions))
    df = spark.read.parquet(*[f["path"] for f in files])
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
    return Feed(rows, parquet_records(field, absent))


def feeds(spark, cfg: CorpusConfig, files: list[dict[str, Any]]) -> list[Feed]:
    """A run's feeds; the first holds every record that can be kept. A file that is no Parquet is
    one ``corrupt_file`` record, read by a task of its own."""
    if cfg.source.format != "parquet":
        return [task_feed(spark, cfg, files)]
    good, bad = [f for f in files if not f.get("corrupt")], [f for f in files if f.get("corrupt")]
    return ([parquet_feed(spark, cfg, good)] if good else []) + ([task_feed(spark, cfg, bad)] if bad else [])


def index_batches(records: Callable[..., Iterator[Any]], cfg: CorpusConfig, progress: Any = None):
    """mapInArrow function of the index pass: a feed's rows → one index row per record."""
    c = cfg.clean
    read_acc, docs_acc = (progress.bytes_read, progress.docs) if progress is not None else (None, None)

    def run(batches):
        import pyarrow as pa

        from spark_jobs.quality import filters_for, minhasher_for
        from spark_jobs.steps import clean

        schema = pa.schema([("source", pa.string()), ("pos", pa.int64()), ("reason", pa.string()),
                            ("detail", pa.string()), ("raw", pa.binary()), ("digest", pa.binary()),
                            ("bands", pa.list_(pa.int64()))])
        rows: dict[str, list] = {k: [] for k in schema.names}
        size = 0
        quality, hasher = filters_for(cfg.quality), minhasher_for(cfg.quality)
        for p in records(batches, read_acc):
            p = clean(p, c.normalization, c.min_chars, c.max_chars, quality=quality)
            p.raw = p.raw if p.reason is not None else None  # only the quarantine needs the raw bytes
            for k in INDEX_COLUMNS:
                rows[k].append(getattr(p, k))
            rows["bands"].append(hasher.bands(p.text) if hasher is not None and p.reason is None else None)
            size += len(p.raw or b"") + len(p.source)
            if len(rows["pos"]) >= BATCH_ROWS or size >= BATCH_BYTES:
                if docs_acc is not None:
                    docs_acc.add(len(rows["pos"]))
                yield pa.RecordBatch.from_pydict(rows, schema=schema)
                rows, size = {k: [] for k in schema.names}, 0
        if docs_acc is not None:
            docs_acc.add(len(rows["pos"]))
        yield pa.RecordBatch.from_pydict(rows, schema=schema)
    return run


def read_index(spark, cfg: CorpusConfig, files: list[dict[str, Any]], progress: Any = None):
    """Every input record, each either kept or dropped with its reason (no text)."""
    if progress is not None:
        progress.total_bytes = sum(f["bytes"] for f in files)
    out = None
    for feed in feeds(spark, cfg, files):
        frame = feed.frame.mapInArrow(index_batches(feed.records, cfg, progress), INDEX_SCHEMA)
        out = frame if out is None else out.unionByName(frame)
    return out


BROADCAST_DUPLICATES = 500_000
"""Up to this many duplicated texts, their first places are broadcast to the tasks (the index is not shuffled)."""


def find_duplicates(index, persisted: list[Any]):
    """Exact dedup that shuffles hashes, not texts: of kept records with the same digest the first by
    (source, pos) stays; the others are returned as ``duplicate`` records (source, pos, reason,
    detail, raw). Frames it persists are added to ``persisted``."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_jobs.steps import DUPLICATE

    kept = index.filter(F.col("reason").isNull())
    groups = (kept.select("digest", F.struct("source", "pos").alias("at"))
              .groupBy("digest").agg(F.count("*").alias("n"), F.min("at").alias("first"))
              .filter(F.col("n") > 1)
              .select("digest", F.col("first.source").alias("_src"), F.col("first.pos").alias("_pos"))
              .persist(StorageLevel.MEMORY_AND_DISK))
    persisted.append(groups)
    n = groups.count()
    log.info("dedup: %d texts occur more than once", n)
    rows = kept.join(F.broadcast(groups) if n <= BROADCAST_DUPLICATES else groups, "digest")
    return (rows.filter(~((F.col("source") == F.col("_src")) & (F.col("pos") == F.col("_pos"))))
            .select("source", "pos", F.lit(DUPLICATE).alias("reason"),
                    F.concat(F.lit("same text as "), F.col("_src"), F.lit(" at "), F.col("_pos").cast("string"))
                    .alias("detail"), F.lit(None).cast("binary").alias("raw")))


FILTERED_SKIPS = 2_000_000
"""Up to this many records dropped by the quality filters, the pack pass skips them by place and runs only the
filters' text changes on the rest; above it, the pack pass runs the filters' decisions again (the same result,
slower) rather than ship more places through the driver."""


def pack_skips(index, duplicates, by_source: dict[str, dict[str | None, int]], quality: bool) -> tuple[Any, bool]:
    """What the pack pass leaves out by place, and whether the quality filters' decisions are in it: the
    duplicates, and with ``quality`` on, the records its filters dropped (up to :data:`FILTERED_SKIPS`)."""
    from pyspark.sql import functions as F

    from spark_jobs.steps import Skips
    from stoker.run.reasons import filter_reason

    places = duplicates.select("source", "pos") if duplicates is not None else None
    reasons = sorted({r for counts in by_source.values() for r in counts if r is not None and filter_reason(r)})
    filtered = sum(n for counts in by_source.values() for r, n in counts.items() if r in reasons)
    decided = quality and filtered <= FILTERED_SKIPS
    if decided and reasons:
        dropped = index.filter(F.col("reason").isin(reasons)).select("source", "pos")
        places = dropped if places is None else places.unionByName(dropped)
    elif quality:
        log.info("pack pass: %d records dropped by the quality filters > %d: their decisions run again",
                 filtered, FILTERED_SKIPS)
    return (duplicate_skips(places) if places is not None else Skips()), decided


def duplicate_skips(duplicates) -> Any:
    """The places of ``duplicates`` (a frame with source and pos), for the pack pass to leave out: 8 bytes each
    through the driver."""
    import numpy as np

    from spark_jobs.steps import Skips

    table = duplicates.select("source", "pos").toArrow()
    sources = table.column("source").combine_chunks().dictionary_encode()
    return Skips.of(sources.dictionary.to_pylist(), np.asarray(sources.indices, dtype=np.int64),
                    np.asarray(table.column("pos"), dtype=np.int64))
