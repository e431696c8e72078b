"""The pack pass's task: a feed's records, read again, tokenised, packed into sequences and published in
the task's Kafka transaction (spark_jobs/publish.py); no pyspark at import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stoker.config.corpus import CorpusConfig
from stoker.kafka.settings import with_password_file

ENCODE_BATCH = 1024
"""Documents a pack task hands the tokenizer at once."""


def pack_publish_batches(*, cfg: CorpusConfig, records: Any, tokenizer: Any, skips: Any, topic: str, run_id: str,
                         dtype: str, kafka_config: dict[str, Any], fail: tuple[int, int] | None, progress: Any = None,
                         task_partitions: int = 1, holdout_dir: str | None = None, decided: bool = False):
    """mapInArrow function of the pack pass: rows → kept records packed, published → a summary. ``kafka_config``
    travels pickled into every task (a ``sasl.password.file`` stays a path, read where it runs); held-out documents are
    packed apart into ``holdout_dir`` before the last commit; ``decided``: ``skips`` holds the filters' drops too."""
    seq_len, tx_ms, per_mille = cfg.pack.seq_len, cfg.publish.transaction_timeout_ms, cfg.eval.holdout_per_mille
    nparts, compression, per_mille = cfg.topic.partitions, cfg.topic.compression, per_mille if holdout_dir else 0
    c = cfg.clean
    read_acc, docs_acc, tokens_acc = (progress.bytes_read, progress.docs, progress.tokens) if progress else [None] * 3

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        from spark_jobs.publish import TaskSummary, publish_partition
        from spark_jobs.quality import filters_for
        from spark_jobs.steps import Packer, kept_texts
        from stoker.run.holdout import HoldoutPart

        ctx = TaskContext.get()
        assert ctx is not None, "runs inside a Spark task"
        sp, attempt = ctx.partitionId(), ctx.attemptNumber()
        encoder, parity, marks = task_tokenizer(cfg, tokenizer.value)
        skip, quality = skips.value, filters_for(cfg.quality)
        packer, hold = Packer(seq_len, *marks), HoldoutPart(packer=Packer(seq_len, *marks))  # held out: packed alike
        summary = TaskSummary(spark_partition=sp, attempt=attempt)

        def pack(texts: list[str], sources: list[str], held: list[bool], scrubbed: list[int], positions: list[int]):
            summary.add_scrubbed(scrubbed)
            encoded = encoder.encode_batch(texts)
            parity.check(texts, encoded, sources, positions)
            summary.parity_checked = parity.checked
            trained, per_source = [], summary.source_tokens
            for ids, src, text, h in zip(encoded, sources, texts, held, strict=True):
                if h:  # never published
                    hold.add(src, ids, text)
                    continue
                trained.append(ids)
                per_source[src] = per_source.get(src, 0) + len(ids) + 1  # + its EOS
            summary.docs += len(trained)
            yield from packer.add_batch(trained)
            if docs_acc is not None:
                docs_acc.add(len(texts))

        def sequences():
            for batch in kept_texts(records(batches, read_acc), c.normalization, c.min_chars, c.max_chars, skip,
                                    ENCODE_BATCH, per_mille, quality, decided):
                yield from pack(*batch)
            yield from packer.flush()
            summary.tokens, summary.padding = packer.tokens, packer.padding
            if tokens_acc is not None:
                tokens_acc.add(packer.tokens)
            if per_mille:  # before the last transaction commits: a committed task always has its file
                hold.write(Path(holdout_dir), sp, dtype)  # type: ignore[arg-type]

        fail_after = fail[1] if fail and fail[0] == sp and attempt == 0 else None
        config = with_password_file(kafka_config)  # here, in the task: no password travels in the closure
        for s in publish_partition(sequences(), config=config, topic=topic, kafka_partitions=nparts,
                                   spark_partition=sp, attempt=attempt, run_id=run_id, dtype=dtype,
                                   compression=compression, tx_timeout_ms=tx_ms, summary=summary,
                                   fail_after=fail_after, task_partitions=task_partitions):
            yield pa.RecordBatch.from_pydict({"summary": [s.to_json()]})
    return run


def task_tokenizer(cfg: CorpusConfig, shipped: tuple[str, str, str]) -> tuple[Any, Any, tuple[int, int]]:
    """A pack task's tokenizer from the job's broadcast (its JSON, digest and the backend the driver proved):
    the encoder, the check of every Nth document against the reference, and the (EOS, PAD) ids."""
    from spark_jobs.tokenization import token_id
    from spark_jobs.tokenizer_backends import TaskParity, encoders

    json_text, digest, backend = shipped
    encoder, reference = encoders(digest, json_text, backend)
    ref_tok = (reference or encoder).tok  # the reference tokenizers object names the special ids
    t = cfg.tokenizer
    return (encoder, TaskParity(reference, t.check_every),
            (token_id(ref_tok, t.eos_token, "eos_token"), token_id(ref_tok, t.pad_token, "pad_token")))
