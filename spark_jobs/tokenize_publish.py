"""Spark application: read → validate → normalise → dedup → tokenise → pack → publish → manifest.

Submitted with ``spark-submit spark_jobs/tokenize_publish.py --corpus corpora/<name>.yaml --ds ...``
(Airflow's ``tokenize_publish`` task does this through ``spark_default``). Kafka's client config
comes from ``$STOKER_KAFKA_CONFIG`` (JSON), never from the command line, so secrets stay out of
process listings.

Delivery is exactly-once for read_committed consumers: one Kafka transaction per Spark partition,
fenced on retry (spark_jobs/publish.py). The manifest is written last and atomically: it is the
commit point of the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stoker import kafka as skafka
from stoker import paths, records
from stoker.config import CorpusConfig, load_corpus
from stoker.exceptions import ConfigError
from stoker.layout import RunLayout, tasks_topic
from stoker.manifest import Manifest, PartitionRange, sha256_file, write_manifest

log = logging.getLogger("stoker.tokenize_publish")

PARSED_SCHEMA = "source string, line long, text string, reason string, detail string, raw binary, digest binary"


def parse_batches(fmt: str, text_field: str, normalization: str, min_chars: int, max_chars: int):
    """mapInArrow function: binaryFile rows (one per file) → one row per input line."""
    def run(batches):
        import pyarrow as pa

        from spark_jobs.steps import clean, corrupt_file, decompress, records_of

        cols = ["source", "line", "text", "reason", "detail", "raw", "digest"]
        for batch in batches:
            for path, content in zip(batch.column("path").to_pylist(), batch.column("content").to_pylist(),
                                     strict=True):
                rows: dict[str, list] = {c: [] for c in cols}
                data, why = decompress(path, content)
                parsed = ([corrupt_file(path, content, why or "")] if data is None else
                          (clean(p, normalization, min_chars, max_chars)
                           for p in records_of(path, data, fmt, text_field)))
                for p in parsed:
                    for c in cols:
                        rows[c].append(getattr(p, c))
                    if p.reason is None:
                        rows["raw"][-1] = None  # only the quarantine needs the raw bytes
                yield pa.RecordBatch.from_pydict(rows, schema=_parsed_arrow_schema())
    return run


def _parsed_arrow_schema():
    import pyarrow as pa

    return pa.schema([("source", pa.string()), ("line", pa.int64()), ("text", pa.string()),
                      ("reason", pa.string()), ("detail", pa.string()), ("raw", pa.binary()),
                      ("digest", pa.binary())])


def read_parsed(spark, cfg: CorpusConfig, uri: str):
    """One row per input line, each either kept (text) or dropped (reason)."""
    c = cfg.clean
    binary = spark.read.format("binaryFile").load(_spark_path(uri))
    fn = parse_batches(cfg.source.format, cfg.source.text_field, c.normalization, c.min_chars, c.max_chars)
    return binary.select("path", "content").mapInArrow(fn, PARSED_SCHEMA)


def mark_duplicates(parsed):
    """Exact dedup: of rows with the same digest the first by (source, line) is kept."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from spark_jobs.steps import DUPLICATE

    w = Window.partitionBy("digest").orderBy("source", "line")
    rank = F.when(F.col("reason").isNull(), F.row_number().over(w))
    return (parsed.withColumn("_rank", rank)
            .withColumn("reason", F.when(F.col("_rank") > 1, F.lit(DUPLICATE)).otherwise(F.col("reason")))
            .withColumn("detail", F.when(F.col("_rank") > 1, F.lit("same text as an earlier record"))
                        .otherwise(F.col("detail")))
            .drop("_rank"))


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


def preflight_source(spark, cfg: CorpusConfig, uri: str) -> dict[str, str]:
    """Configure Spark's Hadoop client for the source and prove the store answers before Spark
    reads: an unreachable store, a refused credential, a missing bucket or an empty drop raises a
    named error in seconds. Returns the ETags the store reported (S3), keyed without scheme."""
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
    return {_without_scheme(f.uri): f.etag for f in listed if f.etag}


def _without_scheme(uri: str) -> str:
    return uri.split("://", 1)[-1]


def _spark_path(uri: str) -> str:
    if "://" not in uri:
        return str(paths.resolve_local(uri))
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://"):]
    return uri


def pack_publish_batches(*, cfg: CorpusConfig, tokenizer_path: str, topic: str, run_id: str, dtype: str,
                         kafka_config: dict[str, Any], fail: tuple[int, int] | None):
    """mapInArrow function: the kept documents of one Spark partition → one summary row."""
    seq_len, tx_ms = cfg.pack.seq_len, cfg.publish.transaction_timeout_ms
    nparts, compression = cfg.topic.partitions, cfg.topic.compression
    eos, pad = cfg.tokenizer.eos_token, cfg.tokenizer.pad_token

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        from spark_jobs.publish import TaskSummary, publish_partition
        from spark_jobs.steps import Packer
        from spark_jobs.tokenization import encode_batch, load_tokenizer, token_id

        ctx = TaskContext.get()
        assert ctx is not None, "runs inside a Spark task"
        sp, attempt = ctx.partitionId(), ctx.attemptNumber()
        tok = load_tokenizer(tokenizer_path)
        packer = Packer(seq_len=seq_len, eos_id=token_id(tok, eos, "eos_token"),
                        pad_id=token_id(tok, pad, "pad_token"))
        summary = TaskSummary(spark_partition=sp, attempt=attempt)

        def sequences():
            for batch in batches:
                texts = batch.column("text").to_pylist()
                summary.docs += len(texts)
                for ids in encode_batch(tok, texts):
                    yield from packer.add(ids)
            yield from packer.flush()
            summary.tokens, summary.padding = packer.tokens, packer.padding

        fail_after = fail[1] if fail and fail[0] == sp and attempt == 0 else None
        for s in publish_partition(sequences(), config=kafka_config, topic=topic, kafka_partitions=nparts,
                                   spark_partition=sp, attempt=attempt, run_id=run_id, dtype=dtype,
                                   compression=compression, tx_timeout_ms=tx_ms, summary=summary,
                                   fail_after=fail_after):
            yield pa.RecordBatch.from_pydict({"summary": [s.to_json()]})
    return run


def topic_config(cfg: CorpusConfig) -> dict[str, str]:
    return {"min.insync.replicas": str(cfg.topic.min_insync_replicas),
            "retention.ms": str(cfg.topic.retention_ms),
            "compression.type": "producer"}


@dataclass(slots=True)
class RunInputs:
    """What a run reads and how it encodes: settled before any data moves."""

    run_id: str
    uri: str
    tokenizer_path: str
    vocab_size: int
    dtype: str
    files: list[dict[str, Any]]
    """Lineage: every data file with its size, mtime, sha256 and (S3) ETag."""


@dataclass(slots=True)
class Staged:
    """Every input record, kept or dropped with a reason, and the counts by reason."""

    frame: Any
    counts: dict[str | None, int]

    @property
    def docs_in(self) -> int:
        return sum(self.counts.values())

    @property
    def dropped(self) -> dict[str, int]:
        return dict(sorted((k, v) for k, v in self.counts.items() if k is not None))


def prepare(spark, cfg: CorpusConfig, ds: str, run: RunLayout, kafka_config: dict[str, Any]) -> RunInputs:
    """Fail in seconds, before a topic or manifest exists: tokenizer, Kafka, the store, the drop."""
    if run.manifest.exists():  # a re-run: no stage may trust the old manifest while this one publishes
        log.info("replacing the earlier manifest of %s", run.run_dir)
        run.manifest.unlink()
    uri = cfg.source.render(ds)
    tok_path = str(paths.resolve_local(cfg.tokenizer.path))
    if not Path(tok_path).is_file():
        raise ConfigError(f"tokenizer.path = {cfg.tokenizer.path!r}: no such file ({tok_path}); "
                          "run `stoker sample-corpus` or point the corpus at a tokenizer.json")
    from spark_jobs.tokenization import load_tokenizer

    vocab = load_tokenizer(tok_path).get_vocab_size()
    skafka.check_reachable(kafka_config)
    etags = preflight_source(spark, cfg, uri)
    files = lineage(spark, uri)
    for f in files:
        f["etag"] = etags.get(_without_scheme(f["path"]))
    return RunInputs(run_id=f"{cfg.name}/{ds}", uri=uri, tokenizer_path=tok_path, vocab_size=vocab,
                     dtype=records.dtype_for_vocab(vocab), files=files)


def lineage(spark, uri: str) -> list[dict[str, Any]]:
    """Every file read, with its size and content checksum (computed where the bytes are)."""
    from pyspark.sql import functions as F

    try:
        files = [r.asDict() for r in spark.read.format("binaryFile").load(_spark_path(uri))
                 .select("path", "length", "modificationTime", F.sha2("content", 256).alias("sha256"))
                 .orderBy("path").collect()]
    except Exception as e:  # noqa: BLE001 - Py4J/Spark errors: name the source, keep the JVM's first line
        from stoker.exceptions import SourceError

        first = next((line.strip() for line in str(e).splitlines() if "Exception" in line), str(e)[:300])
        raise SourceError(f"{uri}: Spark cannot read it ({first[:400]}): the store answered the preflight but not "
                          "Spark's own client; check the hdfs:// RPC port or the S3A settings", transient=True) from e
    if not files:
        raise ConfigError(f"source.uri = {uri!r}: no data files found (files starting with _ or . are ignored)")
    return files


def stage(spark, cfg: CorpusConfig, uri: str) -> Staged:
    """Read, validate, normalise and (optionally) dedup: every record kept or dropped with a reason."""
    from pyspark import StorageLevel

    parsed = read_parsed(spark, cfg, uri)
    frame = (mark_duplicates(parsed) if cfg.clean.dedup else parsed).persist(StorageLevel.MEMORY_AND_DISK)
    counts = {r["reason"]: r["count"] for r in frame.groupBy("reason").count().collect()}
    return Staged(frame=frame, counts=counts)


def quarantine(staged: Staged, run: RunLayout) -> Path:
    """Rejected records with their exact raw bytes and where they came from (file, line)."""
    from pyspark.sql import functions as F

    (staged.frame.filter(F.col("reason").isNotNull())
     .select("source", "line", "reason", "detail", F.base64("raw").alias("raw_base64"))
     .coalesce(1).write.mode("overwrite").json(str(run.quarantine)))
    return run.quarantine


def pack_publish(staged: Staged, cfg: CorpusConfig, inputs: RunInputs, topic: str, kafka_config: dict[str, Any],
                 fail: tuple[int, int] | None) -> list[Any]:
    """Tokenise, pack and publish the kept documents, one Kafka transaction per Spark partition."""
    from pyspark.sql import functions as F

    from spark_jobs.publish import TaskSummary

    # The topic name belongs to this attempt: anything under it is left from an earlier run of the
    # same name (a re-run date, a reset metadata DB) and must not mix with this run's sequences.
    skafka.recreate_topic(kafka_config, topic, cfg.topic.partitions, cfg.topic.replication_factor,
                          topic_config(cfg))
    skafka.recreate_topic(kafka_config, tasks_topic(topic), 1, cfg.topic.replication_factor,
                          {"min.insync.replicas": str(cfg.topic.min_insync_replicas)})
    kept = (staged.frame.filter(F.col("reason").isNull()).select("digest", "source", "line", "text")
            .repartition(cfg.publish.spark_partitions, "digest").sortWithinPartitions("source", "line"))
    fn = pack_publish_batches(cfg=cfg, tokenizer_path=inputs.tokenizer_path, topic=topic, run_id=inputs.run_id,
                              dtype=inputs.dtype, kafka_config=kafka_config, fail=fail)
    return [TaskSummary.from_json(r["summary"]) for r in kept.mapInArrow(fn, "summary string").collect()]


def build_manifest(spark, cfg: CorpusConfig, ds: str, topic: str, inputs: RunInputs, staged: Staged,
                   summaries: list[Any], quarantine_path: Path, kafka_config: dict[str, Any], t0: float) -> Manifest:
    per_part = {p: 0 for p in range(cfg.topic.partitions)}
    for s in summaries:
        for k, v in s.per_partition.items():
            per_part[int(k)] += v
    ends = skafka.stable_end_offsets(kafka_config, topic)
    starts = skafka.start_offsets(kafka_config, topic)
    return Manifest(
        run_id=inputs.run_id, corpus=cfg.name, ds=ds, topic=topic,
        partitions=[PartitionRange(partition=p, start_offset=starts[p], end_offset=ends[p], sequences=per_part[p])
                    for p in sorted(per_part)],
        seq_len=cfg.pack.seq_len, dtype=inputs.dtype, tokenizer_path=inputs.tokenizer_path,
        tokenizer_sha256=sha256_file(inputs.tokenizer_path), vocab_size=inputs.vocab_size,
        docs_in=staged.docs_in, docs_kept=staged.counts.get(None, 0), docs_dropped=staged.dropped,
        tokens=sum(s.tokens for s in summaries), padding_tokens=sum(s.padding for s in summaries),
        sequences=sum(s.sequences for s in summaries), source_uri=inputs.uri,
        source_files=[{"path": f["path"], "bytes": f["length"], "sha256": f["sha256"],
                       "mtime": f["modificationTime"].isoformat(), **({"etag": f["etag"]} if f["etag"] else {})}
                      for f in inputs.files],
        spark_app_id=spark.sparkContext.applicationId,
        quarantine_path=str(quarantine_path), created_at=datetime.now(UTC).isoformat(timespec="microseconds"),
        seconds=round(time.monotonic() - t0, 3),
    )


def run_job(spark, cfg: CorpusConfig, *, ds: str, topic: str, run_dir: Path, kafka_config: dict[str, Any],
            fail: tuple[int, int] | None = None) -> Manifest:
    """read → quarantine → dedup → pack+publish → manifest (the commit point, written last)."""
    t0 = time.monotonic()
    run = RunLayout(Path(run_dir))
    inputs = prepare(spark, cfg, ds, run, kafka_config)
    staged = stage(spark, cfg, inputs.uri)
    quarantined = quarantine(staged, run)
    summaries = pack_publish(staged, cfg, inputs, topic, kafka_config, fail)
    staged.frame.unpersist()
    manifest = build_manifest(spark, cfg, ds, topic, inputs, staged, summaries, quarantined, kafka_config, t0)
    if sum(s.docs for s in summaries) != manifest.docs_kept:
        raise RuntimeError(f"published {sum(s.docs for s in summaries)} docs but kept {manifest.docs_kept}")
    write_manifest(run.run_dir, manifest)  # the commit point
    return manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="corpora/<name>.yaml")
    ap.add_argument("--ds", required=True, help="logical date YYYY-MM-DD (selects {ds} in source.uri)")
    ap.add_argument("--topic", required=True, help="run-scoped topic, e.g. stoker.sample.20261201.a1")
    ap.add_argument("--run-dir", required=True, help="where the manifest and quarantine go")
    ap.add_argument("--source-uri", help="override source.uri for this run")
    ap.add_argument("--seq-len", type=int, help="override pack.seq_len for this run")
    ap.add_argument("--spark-partitions", type=int, help="override publish.spark_partitions for this run")
    ap.add_argument("--fail-first-attempt", metavar="SPARK_PARTITION:AFTER",
                    help="testing: fail the first attempt of a Spark partition after AFTER sequences")
    return ap.parse_args(argv)


def apply_overrides(cfg: CorpusConfig, args: argparse.Namespace) -> CorpusConfig:
    """Per-run overrides (the DAG's params form); the config classes re-validate them."""
    if args.source_uri:
        cfg.source = dataclasses.replace(cfg.source, uri=args.source_uri)
    if args.seq_len:
        cfg.pack = dataclasses.replace(cfg.pack, seq_len=args.seq_len)
    if args.spark_partitions:
        cfg.publish = dataclasses.replace(cfg.publish, spark_partitions=args.spark_partitions)
    return cfg


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    cfg = apply_overrides(load_corpus(args.corpus), args)
    fail = tuple(int(x) for x in args.fail_first_attempt.split(":")) if args.fail_first_attempt else None
    builder = (SparkSession.builder.appName(f"stoker-tokenize-publish-{cfg.name}-{args.ds}")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "2048")
             # one task per core already: the tokenizer's own thread pool would oversubscribe them
             # (measured: 0.76x of raw encode_batch with it, 0.99x without; BENCHMARKS.md)
             .config("spark.executorEnv.TOKENIZERS_PARALLELISM", "false"))
    uri = cfg.source.render(args.ds)
    if uri.startswith(("s3://", "s3a://")) and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # a plain `python` launch starts the JVM here; under spark-submit the operator gave --jars
        from stoker.connectors import s3a_jars

        builder = builder.config("spark.jars", ",".join(str(j) for j in s3a_jars()))
    spark = builder.getOrCreate()
    try:
        m = run_job(spark, cfg, ds=args.ds, topic=args.topic, run_dir=Path(args.run_dir),
                    kafka_config=skafka.config_from_env(), fail=fail)  # type: ignore[arg-type]
    finally:
        spark.stop()
    log.info("published %d sequences (%d tokens) of %d/%d docs to %s", m.sequences, m.tokens,
             m.docs_kept, m.docs_in, m.topic)
    print(json.dumps({"manifest": str(RunLayout(Path(args.run_dir)).manifest), "sequences": m.sequences}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
