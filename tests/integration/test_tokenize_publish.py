"""The Spark job against a real broker: counts add up, every sequence decodes back to the kept
documents' tokens, offsets match the manifest, and a failed Spark task neither loses nor
duplicates a sequence."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from spark_jobs import steps
from spark_jobs.streams import BOM
from spark_jobs.tokenization import load_tokenizer
from spark_jobs.tokenize_publish import run_job
from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.layout import RunLayout, tasks_topic
from stoker.reports.runs import training_skipped
from stoker.run import records
from stoker.run.manifest import read_manifest
from stoker_airflow.launcher import TrainerLauncher
from tests.support.small_corpus import BAD, GOOD

pytestmark = pytest.mark.integration


def _expected_docs(tokenizer_path: str) -> list[tuple[int, ...]]:
    tok = load_tokenizer(tokenizer_path)
    import unicodedata

    texts = dict.fromkeys(unicodedata.normalize("NFC", t).strip() for t in GOOD)  # dedup, first kept
    return [tuple(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def _documents_from_topic(msgs, eos: int) -> tuple[list[tuple[int, ...]], dict[int, list[int]]]:
    """Rebuild documents: per Spark partition, sequences in key order, real tokens, split at EOS."""
    by_part: dict[int, list] = defaultdict(list)
    for m in msgs:
        by_part[records.parse_key(m.key())[0]].append(m)
    docs, order = [], {}
    for sp, ms in sorted(by_part.items()):
        ms.sort(key=lambda m: records.parse_key(m.key())[1])
        order[sp] = [records.parse_key(m.key())[1] for m in ms]
        seqs = [records.decode(m.value(), m.headers(), seq_len=64) for m in ms]
        stream = np.concatenate([s.tokens[: s.n_real] for s in seqs]).tolist()
        assert stream[-1] == eos
        doc: list[int] = []
        starts = {i * 65 + int(s) for i, seq in enumerate(seqs) for s in seq.doc_starts}
        for pos, t in enumerate(stream):
            if not doc:
                assert pos in starts, f"a document starts at {pos} but no doc boundary header says so"
            if t == eos:
                docs.append(tuple(doc))
                doc = []
            else:
                doc.append(t)
    return docs, order


def test_counts_decode_and_offsets(spark, kafka_config, small_cfg, tmp_path):
    run_dir = tmp_path / "run"
    topic = "stoker.test.20261201.a1"
    m = run_job(spark, small_cfg, ds="2026-12-01", topic=topic, run_dir=run_dir, kafka_config=kafka_config)

    # counts add up: every line read is kept or dropped with a reason
    assert m.docs_in == len(GOOD) + 2 + len(BAD)
    assert m.docs_dropped == dict(sorted(Counter([r for _, r in BAD] + [steps.DUPLICATE] * 2).items()))
    assert m.docs_kept == len(GOOD)
    assert read_manifest(run_dir) == m
    # the fast backend encoded the night, proven before Spark and checked in every task; the ids below are
    # compared with the reference's
    assert m.tokenizer_backend["name"] == "fastokens", m.tokenizer_backend
    assert m.tokenizer_backend["checked_docs"] > len(GOOD) and m.tokenizer_backend["checked_in_tasks"] >= 2
    from stoker.reports.runs import render, summary

    assert "  tokenizer        fastokens 0.3." in render(summary(run_dir))  # what `stoker runs show` prints

    # the quarantine holds every rejected record with its reason and exact bytes
    rows = [json.loads(line) for f in (run_dir / "quarantine").glob("part-*.json") for line in f.open()]
    assert Counter(r["reason"] for r in rows) == Counter(m.docs_dropped)
    import base64

    assert {base64.b64decode(r["raw_base64"]) for r in rows if r["reason"] != "duplicate"} == {b for b, _ in BAD}

    # every published sequence decodes back to exactly the tokens of the kept documents
    msgs = koffsets.read_all(kafka_config, topic)
    assert len(msgs) == m.sequences
    tok = load_tokenizer(m.tokenizer_path)
    docs, order = _documents_from_topic(msgs, tok.token_to_id("<|endoftext|>"))
    assert Counter(docs) == Counter(_expected_docs(m.tokenizer_path))
    assert all(idx == list(range(len(idx))) for idx in order.values())  # no gap in any partition's keys
    assert m.tokens == sum(len(d) + 1 for d in docs)

    # manifest offsets are the topic's end offsets, and per-partition counts are what a consumer sees
    assert m.end_offsets() == koffsets.end_offsets(kafka_config, topic)
    seen = Counter(msg.partition() for msg in msgs)
    assert {p.partition: p.sequences for p in m.partitions} == {p: seen.get(p, 0) for p in range(4)}
    # nothing else under the run's name but its task log (the operator deletes it once the manifest is written)
    left = ktopics.list_topics(kafka_config, "stoker.test.20261201.")
    assert not [t for t in left if t not in (topic, tasks_topic(topic))]


def _held_out_docs(folder: Path) -> tuple[list[tuple[int, ...]], Counter]:
    """The documents of a run's held-out files (their flattened tokens cut by ``doc_tokens``), and their
    UTF-8 bytes per source file."""
    from stoker.run.holdout import read_part

    docs: list[tuple[int, ...]] = []
    nbytes: Counter = Counter()
    for path in sorted(folder.glob("part-*.npz")):
        part = read_part(path)
        flat, at = part["tokens"].reshape(-1).tolist(), 0
        for n, b, code in zip(part["doc_tokens"], part["doc_bytes"], part["doc_source"], strict=True):
            docs.append(tuple(flat[at:at + int(n) - 1]))  # the EOS aside
            at += int(n)
            nbytes[str(part["sources"][code])] += int(b)
    return docs, nbytes


def test_held_out_documents_never_reach_the_topic_and_the_manifest_accounts_for_them(spark, kafka_config, small_cfg,
                                                                                      tmp_path):
    import unicodedata

    from stoker.run.holdout import held_out

    small_cfg.eval = dataclasses.replace(small_cfg.eval, holdout_per_mille=100)
    topic = "stoker.test.20261212.a1"
    m = run_job(spark, small_cfg, ds="2026-12-12", topic=topic, run_dir=tmp_path / "run", kafka_config=kafka_config)
    tok = load_tokenizer(m.tokenizer_path)
    published, _ = _documents_from_topic(koffsets.read_all(kafka_config, topic), tok.token_to_id("<|endoftext|>"))
    held, nbytes = _held_out_docs(RunLayout(tmp_path / "run").holdout)

    # chosen by the digest of the clean text: the same documents a run of any shape would hold out
    texts = list(dict.fromkeys(unicodedata.normalize("NFC", t).strip() for t in GOOD))
    chosen = [t for t in texts if held_out(hashlib.sha256(t.encode()).digest(), 100)]
    assert 0 < len(chosen) < len(texts)
    assert Counter(held) == Counter(tuple(e.ids) for e in tok.encode_batch(chosen, add_special_tokens=False))
    assert not set(held) & set(published)  # never trained on
    assert Counter(published) + Counter(held) == Counter(_expected_docs(m.tokenizer_path))  # nothing lost
    # the manifest: kept = published + held out; tokens and sequences are the training ones
    h = m.holdout
    assert (h["per_mille"], h["docs"], m.docs_kept) == (100, len(chosen), len(GOOD))
    assert h["bytes"] == sum(len(t.encode()) for t in chosen) == sum(nbytes.values())
    assert {r["path"]: r["bytes"] for r in h["sources"]} == dict(nbytes)
    assert h["tokens"] == sum(len(d) + 1 for d in held) and m.tokens == sum(len(d) + 1 for d in published)
    assert m.sequences == len(koffsets.read_all(kafka_config, topic)) and h["sequences"] >= 1
    assert read_manifest(tmp_path / "run").holdout == h


def test_failed_spark_task_is_retried_without_loss_or_duplicates(spark, kafka_config, small_cfg, tmp_path):
    topic = "stoker.test.20261202.a1"
    small_cfg.eval = dataclasses.replace(small_cfg.eval, holdout_per_mille=100)  # the retry holds out the same
    # the first attempt of Spark partition 1 dies after producing 2 sequences
    m = run_job(spark, small_cfg, ds="2026-12-02", topic=topic, run_dir=tmp_path / "run",
                kafka_config=kafka_config, fail=(1, 2))
    committed = koffsets.read_all(kafka_config, topic)
    everything = koffsets.read_all(kafka_config, topic, committed_only=False)
    keys = [msg.key() for msg in committed]
    assert len(keys) == len(set(keys)) == m.sequences  # each sequence exactly once
    tasks = {records.parse_key(k)[0] for k in keys}
    assert tasks == set(range(len(tasks))) and len(tasks) >= small_cfg.publish.spark_partitions
    # the failed attempt really wrote records: they are in the log, aborted, invisible to read_committed
    assert len(everything) > len(committed)
    assert Counter(msg.key() for msg in everything).most_common(1)[0][1] == 2

    # a clean run of the same data publishes the same sequences (keys and bytes)
    clean = run_job(spark, small_cfg, ds="2026-12-03", topic="stoker.test.20261203.a1", run_dir=tmp_path / "c",
                    kafka_config=kafka_config)
    clean_msgs = koffsets.read_all(kafka_config, clean.topic)
    assert sorted((x.key(), x.value()) for x in clean_msgs) == sorted((x.key(), x.value()) for x in committed)
    assert m.holdout["docs"] > 0 and {k: v for k, v in m.holdout.items() if k != "path"} == {
        k: v for k, v in clean.holdout.items() if k != "path"}
    parts = [sorted(RunLayout(tmp_path / d).holdout.iterdir()) for d in ("run", "c")]
    assert [p.read_bytes() for p in parts[0]] == [p.read_bytes() for p in parts[1]]


def test_rerun_under_the_same_topic_replaces_it(spark, kafka_config, small_cfg, tmp_path):
    topic = "stoker.test.20261204.a1"
    first = run_job(spark, small_cfg, ds="2026-12-04", topic=topic, run_dir=tmp_path / "run",
                    kafka_config=kafka_config)
    published = sorted((x.key(), x.value()) for x in koffsets.read_all(kafka_config, topic))
    # a trainer had checkpointed offsets into the first publication of this topic name
    trainer = RunLayout(tmp_path / "run").trainer(topic)
    trainer.checkpoints.mkdir(parents=True)
    (trainer.checkpoints / "latest").write_text("step00000007")
    trainer.publication.write_text(first.publication)
    again = run_job(spark, small_cfg, ds="2026-12-04", topic=topic, run_dir=tmp_path / "run",
                    kafka_config=kafka_config)
    msgs = koffsets.read_all(kafka_config, topic)
    assert len(msgs) == again.sequences == first.sequences
    # a re-run of the night publishes the same sequences under the same keys, as a new publication
    assert sorted((x.key(), x.value()) for x in msgs) == published
    assert again.publication != first.publication
    # ...and the train task's launcher drops its checkpoints with the old data: the next trainer starts anew
    TrainerLauncher(trainer).adopt_or_reset(again)
    assert not trainer.folder.exists()


def test_compressed_files_read_like_plain_ones_and_every_file_is_in_the_lineage(spark, kafka_config, small_cfg,
                                                                                 tmp_path):
    import gzip
    import hashlib

    import zstandard

    folder = Path(small_cfg.source.uri)
    a, b = folder / "a.jsonl", folder / "b.jsonl"
    (folder / "a.jsonl.gz").write_bytes(gzip.compress(a.read_bytes()))
    (folder / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b.read_bytes()))
    a.unlink()
    b.unlink()
    (folder / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "lost"}\n' * 50)[:-20])  # truncated in transit
    topic = "stoker.test.20261205.a1"
    m = run_job(spark, small_cfg, ds="2026-12-05", topic=topic, run_dir=tmp_path / "run", kafka_config=kafka_config)

    # the same documents as the plain files, plus the corrupt file counted as one dropped record
    assert m.docs_in == len(GOOD) + 2 + len(BAD) + 1
    assert m.docs_dropped[steps.CORRUPT_FILE] == 1 and m.docs_kept == len(GOOD)
    msgs = koffsets.read_all(kafka_config, topic)
    docs, _ = _documents_from_topic(msgs, load_tokenizer(m.tokenizer_path).token_to_id("<|endoftext|>"))
    assert Counter(docs) == Counter(_expected_docs(m.tokenizer_path))
    rows = [json.loads(line) for f in (tmp_path / "run" / "quarantine").glob("part-*.json") for line in f.open()]
    corrupt = [r for r in rows if r["reason"] == steps.CORRUPT_FILE]
    assert len(corrupt) == 1 and corrupt[0]["source"].endswith("c.jsonl.gz") and "gzip" in corrupt[0]["detail"]

    # lineage: every data file with its size and sha256 (markers like _SUCCESS are not data)
    listed = {Path(f["path"].removeprefix("file:")).name: f for f in m.source_files}
    assert set(listed) == {"a.jsonl.gz", "b.jsonl.zst", "c.jsonl.gz"}
    for name, f in listed.items():
        content = (folder / name).read_bytes()
        assert (f["bytes"], f["sha256"]) == (len(content), hashlib.sha256(content).hexdigest())
    # a night this small is scanned by the driver; a big one by Spark tasks: both say the same
    from spark_jobs.read import opener_for, scan

    pinned = [{"path": f["path"], "bytes": f["bytes"]} for f in m.source_files]  # sizes pinned, not times
    by_tasks = scan(spark, pinned, opener_for(small_cfg, pinned), "jsonl", driver_bytes=0)
    assert by_tasks == scan(spark, pinned, opener_for(small_cfg, pinned), "jsonl")
    assert [(f["sha256"], f.get("corrupt") is None) for f in by_tasks] == [
        (f["sha256"], f.get("corrupt") is None) for f in sorted(m.source_files, key=lambda f: f["path"])]


def test_parquet_source_reads_one_document_per_row(spark, kafka_config, small_cfg, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "parquet"
    folder.mkdir()
    texts = [*GOOD, GOOD[1], "  " + GOOD[0] + " "]  # two duplicates after normalisation, as in the JSONL corpus
    half = len(texts) // 2
    pq.write_table(pa.table({"text": [*texts[:half], None], "id": list(range(half + 1))}), folder / "part-0.parquet")
    pq.write_table(pa.table({"text": [*texts[half:], ""]}), folder / "part-1.parquet")
    (folder / "_SUCCESS").write_text("")
    small_cfg.source = dataclasses.replace(small_cfg.source, uri=str(folder), format="parquet")
    topic = "stoker.test.20261206.a1"
    m = run_job(spark, small_cfg, ds="2026-12-06", topic=topic, run_dir=tmp_path / "run", kafka_config=kafka_config)

    assert m.docs_in == len(texts) + 2
    assert m.docs_dropped == {steps.DUPLICATE: 2, steps.EMPTY_TEXT: 1, steps.MISSING_TEXT: 1}
    msgs = koffsets.read_all(kafka_config, topic)
    docs, _ = _documents_from_topic(msgs, load_tokenizer(m.tokenizer_path).token_to_id("<|endoftext|>"))
    assert Counter(docs) == Counter(_expected_docs(m.tokenizer_path))


def test_a_big_file_split_over_many_tasks_publishes_what_one_task_does(spark, kafka_config, small_cfg, tmp_path):
    """A 2 GB-class file in miniature: split_bytes of 1 KiB cuts each file into many byte ranges (one Spark
    task each). The records, counts, quarantine and published sequences equal the one-split run's;
    a byte-order mark at the start of a file is its encoding, not part of its first record."""
    folder = Path(small_cfg.source.uri)
    a = folder / "a.jsonl"
    a.write_bytes(BOM + a.read_bytes())
    whole = run_job(spark, small_cfg, ds="2026-12-07", topic="stoker.test.20261207.a1", run_dir=tmp_path / "whole",
                    kafka_config=kafka_config)
    small_cfg.source = dataclasses.replace(small_cfg.source, split_bytes=1024)
    split = run_job(spark, small_cfg, ds="2026-12-07", topic="stoker.test.20261207.a2", run_dir=tmp_path / "split",
                    kafka_config=kafka_config)
    assert sum(-(-f["bytes"] // 1024) for f in split.source_files) >= 8  # really cut into many tasks
    assert (split.docs_in, split.docs_kept, split.docs_dropped) == (whole.docs_in, whole.docs_kept,
                                                                    whole.docs_dropped)
    assert split.docs_in == len(GOOD) + 2 + len(BAD) and split.docs_kept == len(GOOD)  # the BOM line kept
    # the same documents, token for token (packed into other windows: each task packs its own records)
    eos = load_tokenizer(whole.tokenizer_path).token_to_id("<|endoftext|>")
    docs = [Counter(_documents_from_topic(koffsets.read_all(kafka_config, m.topic), eos)[0]) for m in (whole, split)]
    assert docs[0] == docs[1] == Counter(_expected_docs(whole.tokenizer_path))
    assert split.tokens == whole.tokens and split.sequences >= whole.sequences

    def quarantined(run):
        rows = [json.loads(line) for f in (run / "quarantine").glob("part-*.json") for line in f.open()]
        return sorted((r["source"], r["pos"], r["reason"], r.get("raw_base64", "")) for r in rows)
    assert quarantined(tmp_path / "split") == quarantined(tmp_path / "whole")

    # per source file: what came in, what was kept or dropped, and the tokens: the totals are the sums
    for m in (whole, split):
        assert sum(f["docs_in"] for f in m.source_files) == m.docs_in
        assert sum(f["docs_kept"] for f in m.source_files) == m.docs_kept
        assert sum(f["tokens"] for f in m.source_files) == m.tokens
        assert all(f["docs_in"] == f["docs_kept"] + sum(f["docs_dropped"].values()) for f in m.source_files)


def test_a_night_with_no_usable_document_publishes_an_empty_run(spark, kafka_config, small_cfg, tmp_path):
    """Every record dropped: the job still ends with a manifest of 0 sequences that accounts for each one
    (the train task then skips, and the report says why)."""
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(b"\n".join(raw for raw, _ in BAD) + b"\n")
    small_cfg.source = dataclasses.replace(small_cfg.source, uri=str(folder))
    m = run_job(spark, small_cfg, ds="2026-12-10", topic="stoker.test.20261210.a1", run_dir=tmp_path / "run",
                kafka_config=kafka_config)
    assert (m.sequences, m.docs_kept, m.docs_in) == (0, 0, len(BAD))
    assert m.docs_dropped == dict(sorted(Counter(r for _, r in BAD).items()))
    assert koffsets.read_all(kafka_config, m.topic) == []
    assert "no usable document" in (training_skipped(m) or "")


def test_a_tokenizer_over_65536_ids_publishes_uint32_and_trains_end_to_end(spark, kafka_config, small_cfg, tmp_path):
    """DeepSeek-V3's tokenizer has 129,280 ids: records are uint32 from the packer to the trainer, and the
    EOS/PAD ids the packer used reach the trainer through the manifest."""
    from tokenizers import Tokenizer

    from tests.support.trainer_tools import keys_by_step, launch_trainer, wait_trainer

    tok = Tokenizer.from_file(small_cfg.tokenizer.path)
    tok.add_tokens([f"<w{i}>" for i in range(70_000)])  # ids 8192 .. 78191
    big = tmp_path / "big-tokenizer.json"
    tok.save(str(big))
    folder = tmp_path / "night"
    folder.mkdir()
    high = [f"<w{60_000 + i}>" for i in range(200)]
    (folder / "part-0.jsonl").write_text("".join(json.dumps({"text": f"doc {i} {w} and <w69999>"}) + "\n"
                                                 for i, w in enumerate(high)))
    (folder / "_SUCCESS").write_text("")
    cfg = dataclasses.replace(small_cfg, source=dataclasses.replace(small_cfg.source, uri=str(folder)),
                              tokenizer=dataclasses.replace(small_cfg.tokenizer, path=str(big)))
    topic = "stoker.test.20261211.a1"
    m = run_job(spark, cfg, ds="2026-12-11", topic=topic, run_dir=tmp_path / "run", kafka_config=kafka_config)
    assert m.dtype == "uint32" and m.vocab_size == tok.get_vocab_size() > 65_536
    assert (m.eos_id, m.pad_id) == (tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>"))
    ids = {int(t) for msg in koffsets.read_all(kafka_config, topic)
           for t in records.decode(msg.value(), msg.headers(), seq_len=m.seq_len).tokens}
    assert tok.token_to_id("<w69999>") in ids and {tok.token_to_id(w) for w in high} <= ids  # nothing wrapped

    out = tmp_path / "train"
    wait_trainer(launch_trainer(tmp_path / "run" / "manifest.json", out, kafka_config, 1), out)
    trained = [k for ks in keys_by_step(out).values() for k in ks]
    assert len(trained) == len(set(trained)) == m.sequences
    assert json.loads((out / "train_summary.json").read_text())["sequences_consumed"] == m.sequences


def test_a_file_rewritten_between_the_passes_fails_the_attempt(spark, kafka_config, small_cfg, tmp_path):
    """The index pass and the pack pass read each file again: one re-delivered in between (other bytes
    under the same name) must not get the index's skips applied to other records, nor be described by
    the manifest's sha256. The pack pass sees the file is not the one listed and fails the attempt,
    naming it; no manifest is written."""
    from spark_jobs.tokenize_publish import pack_publish, prepare, stage

    run = RunLayout(tmp_path / "run")
    topic = "stoker.test.20261205.a1"
    inputs = prepare(spark, small_cfg, "2026-12-05", run, kafka_config)
    staged = stage(spark, small_cfg, inputs)
    victim = sorted(Path(small_cfg.source.uri).glob("*.jsonl"))[0]
    victim.write_bytes(json.dumps({"text": "a re-delivered first line"}).encode() + b"\n" + victim.read_bytes())
    with pytest.raises(Exception, match=rf"{victim.name} changed while this run read it \(\d+ bytes, modified "):
        pack_publish(spark, staged, small_cfg, inputs, topic, kafka_config, fail=None)
    assert not run.manifest.exists()
    ktopics.delete_topics(kafka_config, [topic, tasks_topic(topic)])
