"""Spark application: read → validate → normalise → dedup → tokenise → pack → publish → manifest.

Submitted with ``spark-submit spark_jobs/tokenize_publish.py --plan <run folder>/plan.json``
(Airflow's ``tokenize_publish`` task writes the plan, ``stoker.run.plan``, and submits through
``spark_default``). Kafka's client config
comes from ``$STOKER_KAFKA_CONFIG`` (JSON), never from the command line, so secrets stay out of
process listings.

Stages (``run_job``): ``prepare`` (preflight and the provenance scan) → ``stage`` (the index pass:
streaming, splittable read and parse, spark_jobs/read.py; exact dedup that shuffles hashes) →
``quarantine`` → ``pack_publish`` (the pack pass reads the records again and tokenises the kept
ones; no text is shuffled or persisted) → ``build_manifest``. Memory per task is bounded by a batch
whatever the file sizes; the driver logs the job's progress (spark_jobs/progress.py).

Delivery is exactly-once for read_committed consumers: Kafka transactions per Spark partition, each
with a done record, fenced on retry, a retry resuming after what was committed (spark_jobs/publish.py).
The manifest is written last and atomically: it is the commit point of the run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stoker import paths
from stoker.config.corpus import CorpusConfig
from stoker.exceptions import ConfigError
from stoker.files import sha256_file
from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.kafka.settings import config_from_env, with_password_file
from stoker.layout import RunLayout, tasks_topic
from stoker.run import holdout, records
from stoker.run.manifest import Manifest, PartitionRange, write_manifest
from stoker.run.plan import read_plan

log = logging.getLogger("stoker.tokenize_publish")

@dataclass(slots=True)
class RunInputs:
    """What a run reads and how it encodes: settled before any data moves."""

    run_id: str
    uri: str
    tokenizer_path: str
    tokenizer_sha256: str
    vocab_size: int
    dtype: str
    files: list[dict[str, Any]]
    """Lineage: every data file with its size, mtime, sha256 and (S3) ETag."""
    eos_id: int = -1
    pad_id: int = -1
    ds: str = ""
    """The night (YYYY-MM-DD)."""
    backend: dict[str, Any] = field(default_factory=dict)
    """The tokenizer backend chosen and proven before Spark (spark_jobs/tokenizer_backends.py ``Choice``)."""


@dataclass(slots=True)
class Staged:
    """Every input record, kept or dropped with a reason, as the index (no text) and the duplicates
    the dedup found; and the counts by source file and reason."""

    index: Any
    duplicates: Any
    """(source, pos, reason, detail, raw) of each duplicate; None without dedup."""
    by_source: dict[str, dict[str | None, int]]
    """source → reason (None = kept) → records."""
    persisted: list[Any]

    @property
    def counts(self) -> dict[str | None, int]:
        out: dict[str | None, int] = {}
        for reasons in self.by_source.values():
            for k, v in reasons.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def docs_in(self) -> int:
        return sum(self.counts.values())

    @property
    def dropped(self) -> dict[str, int]:
        return dict(sorted((k, v) for k, v in self.counts.items() if k is not None))

    def rejected(self):
        """The quarantine's rows: every record dropped, with its reason and place."""
        from pyspark.sql import functions as F

        cols = ["source", "pos", "reason", "detail", "raw"]
        out = self.index.filter(F.col("reason").isNotNull()).select(*cols)
        return out if self.duplicates is None else out.unionByName(self.duplicates.select(*cols))

    def unpersist(self) -> None:
        for frame in self.persisted:
            frame.unpersist()


def prepare(spark, cfg: CorpusConfig, ds: str, run: RunLayout, kafka_config: dict[str, Any]) -> RunInputs:
    """Fail in seconds, before a topic or manifest exists: tokenizer, Kafka, the store, the drop;
    then the provenance scan (one streaming pass per file, in parallel)."""
    from spark_jobs import tokenizer_backends
    from spark_jobs.read import opener_for, preflight_source, scan

    if run.manifest.exists():  # a re-run: no stage may trust the old manifest while this one publishes
        log.info("replacing the earlier manifest of %s", run.run_dir)
        run.manifest.unlink()
    shutil.rmtree(run.holdout, ignore_errors=True)  # an earlier run's held-out files, of another partitioning
    uri = cfg.source.render(ds)
    tok_path = str(paths.resolve_local(cfg.tokenizer.path))
    if not Path(tok_path).is_file():
        raise ConfigError(f"tokenizer.path = {cfg.tokenizer.path!r}: no such file ({tok_path}); "
                          "run `stoker sample-corpus` or point the corpus at a tokenizer.json")
    from spark_jobs.tokenization import load_tokenizer, special_ids

    tok = load_tokenizer(tok_path)
    vocab, (eos, pad) = tok.get_vocab_size(), special_ids(tok, cfg.tokenizer, tok_path)
    ktopics.check_reachable(kafka_config)
    listed = preflight_source(spark, cfg, uri)
    t0 = time.monotonic()
    opener = opener_for(cfg, listed)
    files = scan(spark, listed, opener, cfg.source.format)
    log.info("provenance scan: %d files, %.1f MB in %.1f s", len(files), sum(f["bytes"] for f in files) / 1e6,
             time.monotonic() - t0)
    t0 = time.monotonic()
    sample = tokenizer_backends.night_sample(cfg, files, opener)
    choice = tokenizer_backends.choose(Path(tok_path).read_text(), cfg.tokenizer.backend, sample,
                                       cfg.tokenizer.check_every)
    log.info("tokenizer backend: %s %s (%s) in %.1f s", choice.name, choice.version, choice.reason,
             time.monotonic() - t0)
    return RunInputs(run_id=f"{cfg.name}/{ds}", ds=ds, uri=uri, tokenizer_path=tok_path,
                     tokenizer_sha256=sha256_file(tok_path), vocab_size=vocab,
                     dtype=records.dtype_for_vocab(vocab), files=files, eos_id=eos, pad_id=pad,
                     backend=choice.to_dict())


def stage(spark, cfg: CorpusConfig, inputs: RunInputs, progress: Any = None) -> Staged:
    """The index pass: read, validate, normalise and (optionally) dedup; every record kept or
    dropped with a reason. What is persisted is the index (place, reason, digest), never text."""
    from pyspark import StorageLevel

    from spark_jobs.read import find_duplicates, read_index

    index = read_index(spark, cfg, inputs.files, progress).persist(StorageLevel.DISK_ONLY)
    index.count()  # read once, now: the counts, the dedup and the quarantine all read it from disk
    persisted = [index]
    dups = None
    if cfg.clean.dedup:
        dups = find_duplicates(index, persisted).persist(StorageLevel.MEMORY_AND_DISK)
        persisted.append(dups)
    if cfg.quality.near_dedup.enabled:  # after the exact dedup: a near-duplicate is never also a duplicate
        from spark_jobs.near_dedup import near_duplicates

        dups = near_duplicates(spark, cfg, index, dups, inputs.ds, persisted)
    by_source: dict[str, dict[str | None, int]] = {}
    for r in index.groupBy("source", "reason").count().collect():
        by_source.setdefault(r["source"], {})[r["reason"]] = r["count"]
    for r in (dups.groupBy("source", "reason").count().collect() if dups is not None else []):
        by_source[r["source"]][None] -= r["count"]  # counted as kept by the index pass
        by_source[r["source"]][r["reason"]] = r["count"]
    return Staged(index=index, duplicates=dups, by_source=by_source, persisted=persisted)


def quarantine(staged: Staged, run: RunLayout) -> Path:
    """Rejected records with their exact raw bytes and where they came from (file, pos), and a few of each
    reason for the run's page (spark_jobs/quarantine.py)."""
    from spark_jobs.quarantine import write_quarantine

    return write_quarantine(staged.rejected(), run)


def pack_publish(spark, staged: Staged, cfg: CorpusConfig, inputs: RunInputs, topic: str,
                 kafka_config: dict[str, Any], fail: tuple[int, int] | None, progress: Any = None,
                 task_config: dict[str, Any] | None = None, holdout_dir: Path | None = None) -> list[Any]:
    """The pack pass: read the records again, tokenise, pack and publish the kept ones, one Kafka
    transaction per task, or several for a task that publishes longer than half the transaction timeout (a
    whole compressed file). A task packs its records in file order, so a re-run of the night publishes
    the same sequences under the same keys. ``task_config``: the client config the tasks get (default
    ``kafka_config``), a ``sasl.password.file`` still a path."""
    from spark_jobs.pack import pack_publish_batches
    from spark_jobs.publish import TaskSummary, task_partitions
    from spark_jobs.read import feeds, pack_skips

    # The topic name belongs to this attempt: anything under it is left from an earlier run of the
    # same name (a re-run date, a reset metadata DB) and must not mix with this run's sequences.
    feed = feeds(spark, cfg, inputs.files)[0]
    done_parts = task_partitions(feed.frame.rdd.getNumPartitions())
    koffsets.recreate_topic(kafka_config, topic, cfg.topic.partitions, cfg.topic.replication_factor,
                          cfg.topic.settings())
    koffsets.recreate_topic(kafka_config, tasks_topic(topic), done_parts, cfg.topic.replication_factor,
                          {"min.insync.replicas": str(cfg.topic.min_insync_replicas)})
    skips, decided = pack_skips(staged.index, staged.duplicates, staged.by_source, cfg.quality.active)
    log.info("pack pass: %d %s left out by place", len(skips),
             "duplicates and records the quality filters dropped" if decided else "duplicates")
    # the tokenizer travels with the job (a broadcast), so executors on other hosts need no shared path
    sc = spark.sparkContext
    tokenizer = sc.broadcast((Path(inputs.tokenizer_path).read_text(), inputs.tokenizer_sha256,
                              inputs.backend.get("name", "tokenizers")))
    fn = pack_publish_batches(cfg=cfg, records=feed.records, tokenizer=tokenizer, skips=sc.broadcast(skips),
                              topic=topic, run_id=inputs.run_id, dtype=inputs.dtype,
                              kafka_config=task_config or kafka_config, fail=fail, progress=progress, decided=decided,
                              task_partitions=done_parts, holdout_dir=str(holdout_dir) if holdout_dir else None)
    summaries = [TaskSummary.from_json(r["summary"]) for r in feed.frame.mapInArrow(fn, "summary string").collect()]
    for s in summaries:
        if s.reused:
            log.info("task %d: an earlier attempt had committed; attempt %d reused its done record (%d sequences)",
                     s.spark_partition, s.attempt, s.sequences)
        elif s.resumed:
            log.info("task %d: attempt %d resumed after the %d sequences an earlier attempt committed (%d in all, "
                     "%d transactions)", s.spark_partition, s.attempt, s.resumed, s.sequences, s.transactions)
    return summaries


def build_manifest(spark, cfg: CorpusConfig, ds: str, topic: str, inputs: RunInputs, staged: Staged,
                   summaries: list[Any], quarantine_path: Path, kafka_config: dict[str, Any], t0: float) -> Manifest:
    per_part = {p: 0 for p in range(cfg.topic.partitions)}
    for s in summaries:
        for k, v in s.per_partition.items():
            per_part[int(k)] += v
    ends = koffsets.stable_end_offsets(kafka_config, topic)
    starts = koffsets.start_offsets(kafka_config, topic)
    return Manifest(
        run_id=inputs.run_id, corpus=cfg.name, ds=ds, topic=topic,
        partitions=[PartitionRange(partition=p, start_offset=starts[p], end_offset=ends[p], sequences=per_part[p])
                    for p in sorted(per_part)],
        seq_len=cfg.pack.seq_len, dtype=inputs.dtype, tokenizer_path=inputs.tokenizer_path,
        tokenizer_sha256=inputs.tokenizer_sha256, vocab_size=inputs.vocab_size,
        docs_in=staged.docs_in, docs_kept=staged.counts.get(None, 0), docs_dropped=staged.dropped,
        tokens=sum(s.tokens for s in summaries), padding_tokens=sum(s.padding for s in summaries),
        sequences=sum(s.sequences for s in summaries), source_uri=inputs.uri,
        source_files=source_accounting(inputs.files, staged, summaries),
        spark_app_id=spark.sparkContext.applicationId,
        quarantine_path=str(quarantine_path), created_at=datetime.now(UTC).isoformat(timespec="microseconds"),
        retention_ms=cfg.topic.retention_ms, eos_id=inputs.eos_id, pad_id=inputs.pad_id,
        seconds=round(time.monotonic() - t0, 3),
        tokenizer_backend={**inputs.backend, "checked_in_tasks": sum(s.parity_checked for s in summaries)},
        scrubbed={"docs": sum(s.scrubbed_docs for s in summaries),
                  "addresses": sum(s.scrubbed_addresses for s in summaries)}
        if cfg.quality.pii.emails or cfg.quality.pii.ips else {},
    )


def source_accounting(files: list[dict[str, Any]], staged: Staged, summaries: list[Any]) -> list[dict[str, Any]]:
    """Per source file: lineage (size, sha256, mtime, ETag) and what became of its records (the run's
    realised mixture). The totals of the manifest are these sums."""
    tokens: dict[str, int] = {}
    for s in summaries:
        for src, n in s.source_tokens.items():
            tokens[src] = tokens.get(src, 0) + n
    out = []
    for f in files:
        reasons = staged.by_source.get(f["path"], {})
        row = {"path": f["path"], "bytes": f["bytes"], "sha256": f["sha256"],
               "docs_in": sum(reasons.values()), "docs_kept": reasons.get(None, 0),
               "docs_dropped": dict(sorted((k, v) for k, v in reasons.items() if k is not None)),
               "tokens": tokens.get(f["path"], 0)}
        if f.get("mtime") is not None:
            row["mtime"] = datetime.fromtimestamp(f["mtime"], UTC).isoformat()
        for k in ("etag", "decompressed_bytes", "corrupt"):
            if f.get(k) is not None:
                row[k] = f[k]
        out.append(row)
    unknown = set(staged.by_source) - {f["path"] for f in files}
    if unknown:
        raise RuntimeError(f"records from files outside the lineage: {sorted(unknown)[:3]}")
    return out


def run_job(spark, cfg: CorpusConfig, *, ds: str, topic: str, run_dir: Path, kafka_config: dict[str, Any],
            fail: tuple[int, int] | None = None) -> Manifest:
    """read → quarantine → dedup → pack+publish → manifest (the commit point, written last).
    ``kafka_config`` may name a ``sasl.password.file``: the driver reads it for its own clients, the tasks
    get the path and read it themselves."""
    from spark_jobs.progress import JobProgress

    t0 = time.monotonic()
    run = RunLayout(Path(run_dir))
    for_tasks, kafka_config = kafka_config, with_password_file(kafka_config)
    run.spark_progress.unlink(missing_ok=True)  # an earlier attempt's is not this one's
    with JobProgress(spark, out=run.spark_progress) as progress:
        inputs = prepare(spark, cfg, ds, run, kafka_config)
        progress.set_phase("read, validate, dedup")
        staged = stage(spark, cfg, inputs, progress)
        quarantined = quarantine(staged, run)
        progress.set_phase("tokenise, pack, publish")
        summaries = pack_publish(spark, staged, cfg, inputs, topic, kafka_config, fail, progress, task_config=for_tasks,
                                 holdout_dir=run.holdout if cfg.eval.holdout_per_mille else None)
    from spark_jobs.publish import verify_published

    t1 = time.monotonic()
    verify_published(kafka_config, topic, summaries)  # an independent read: no loss, no duplicate
    log.info("verified %d sequences of %d tasks in %s by a read_committed read in %.1f s",
             sum(s.sequences for s in summaries), len(summaries), topic, time.monotonic() - t1)
    manifest = build_manifest(spark, cfg, ds, topic, inputs, staged, summaries, quarantined, kafka_config, t0)
    if cfg.eval.holdout_per_mille:
        manifest.holdout = holdout.account(run.holdout, cfg.eval.holdout_per_mille)
    published, held = sum(s.docs for s in summaries), manifest.holdout.get("docs", 0)
    if published + held != manifest.docs_kept:
        raise RuntimeError(f"published {published} docs and held out {held} but kept {manifest.docs_kept}")
    if cfg.quality.near_dedup.enabled:  # only a verified night with its manifest is an earlier night of the index
        from spark_jobs.near_dedup import index_folder, write_index

        write_index(staged.index, staged.duplicates, index_folder(cfg), ds, cfg.name)  # a re-run replaces it
    staged.unpersist()
    write_manifest(run.run_dir, manifest)  # the commit point
    return manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True, help="the run plan (<run folder>/plan.json, stoker.run.plan.RunPlan): the "
                    "corpus config with the run's params, its date and topic; the manifest and quarantine go "
                    "next to it")
    ap.add_argument("--secrets-file", help="a JSON object of environment entries (the Kafka client config, S3 "
                    "credentials) for YARN and Kubernetes masters, shipped with --files; a missing path is looked "
                    "for by name in the working folder")
    ap.add_argument("--fail-first-attempt", metavar="SPARK_PARTITION:AFTER",
                    help="testing: fail the first attempt of a Spark partition after AFTER sequences; AFTER = "
                         "'committed' kills its Python worker (SIGKILL) right after its commit")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.secrets_file:
        paths.load_private_env(args.secrets_file)
    plan = read_plan(args.plan)
    cfg, ds, run_dir = plan.corpus, plan.ds, Path(args.plan).parent
    fail: tuple[int, int] | None = None
    if args.fail_first_attempt:
        from spark_jobs.publish import KILL_AFTER_COMMIT

        part, after = args.fail_first_attempt.split(":")
        fail = (int(part), KILL_AFTER_COMMIT if after == "committed" else int(after))
    builder = (SparkSession.builder.appName(f"stoker-tokenize-publish-{cfg.name}-{ds}")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "2048")
             # one task per core already: the tokenizer's own thread pool would oversubscribe them
             # (measured: 0.76x of raw encode_batch with it, 0.99x without; BENCHMARKS.md)
             .config("spark.executorEnv.TOKENIZERS_PARALLELISM", "false")
             # and the fast backend's (rayon) pool alike
             .config("spark.executorEnv.RAYON_NUM_THREADS", "1"))
    from stoker.stores.drops import uses_s3

    if uses_s3(cfg) and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # a plain `python` launch starts the JVM here; under spark-submit the operator gave --jars
        from stoker.stores.connectors import s3a_jars

        builder = builder.config("spark.jars", ",".join(str(j) for j in s3a_jars()))
    spark = builder.getOrCreate()
    try:
        m = run_job(spark, cfg, ds=ds, topic=plan.topic, run_dir=run_dir,
                    kafka_config=config_from_env(resolve_password=False), fail=fail)
    finally:
        spark.stop()
    log.info("published %d sequences (%d tokens) of %d/%d docs to %s", m.sequences, m.tokens,
             m.docs_kept, m.docs_in, m.topic)
    print(json.dumps({"manifest": str(RunLayout(run_dir).manifest), "sequences": m.sequences}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
