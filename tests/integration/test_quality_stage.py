"""The quality filters inside the Spark job, against a real broker: a mixed night's documents are kept,
dropped and scrubbed as datatrove decides (its filters run here as the oracle on the same texts), every drop
is counted under datatrove's reason and quarantined with its exact bytes, and the topic holds exactly the
tokens of the kept, scrubbed texts."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import unicodedata
from collections import Counter

import pytest
from test_tokenize_publish import _documents_from_topic  # tests/integration

from spark_jobs import steps
from spark_jobs.tokenization import load_tokenizer
from spark_jobs.tokenize_publish import run_job
from stoker.kafka import offsets as koffsets
from stoker.run.reasons import filter_reason, step_of
from tests.support.quality_oracle import ALL_ON, oracle_chain, quality

pytestmark = pytest.mark.integration


def _expected(docs: list[str], min_chars: int) -> tuple[list[str], Counter, int]:
    """What the stage should keep (in order, after exact dedup of the final texts) and drop, by reason, and how many
    of the kept documents datatrove's PII formatter changed."""
    theirs, dropped, kept, seen, scrubbed = oracle_chain(ALL_ON), Counter(), [], set(), 0
    for i, raw in enumerate(docs):
        text = unicodedata.normalize("NFC", raw).strip()
        if not text:
            dropped[steps.EMPTY_TEXT] += 1
            continue
        if len(text) < min_chars:
            dropped[steps.TOO_SHORT] += 1
            continue
        out, reason = theirs(i, text)
        if reason is not None:
            dropped[reason] += 1
        elif hashlib.sha256(out.encode()).digest() in seen:
            dropped[steps.DUPLICATE] += 1
        else:
            seen.add(hashlib.sha256(out.encode()).digest())
            kept.append(out)
            scrubbed += theirs.scrubbed
    return kept, dropped, scrubbed


@pytest.mark.parametrize("decided", [True, False], ids=["filtered-skipped-by-place", "filtered-again"])
def test_a_night_is_filtered_and_scrubbed_as_datatrove_decides_and_every_drop_is_counted_and_quarantined(
        spark, kafka_config, small_cfg, tmp_path, monkeypatch, caplog, decided):
    """``decided``: the pack pass skips the records the filters dropped by place, and only changes the kept ones'
    text; else (a night with more drops than the driver should ship) it runs the filters' decisions again."""
    from spark_jobs import read

    if not decided:
        monkeypatch.setattr(read, "FILTERED_SKIPS", 0)
    caplog.set_level("INFO", logger="stoker")
    from stoker_local.mixed_sample import documents

    base = [text for _, text in documents(400, seed=3)]
    # a kept document again, so the exact dedup has a copy to drop on every machine (the sample itself may hold one)
    again = next(t for t in base if not _expected([t], small_cfg.clean.min_chars)[1])
    docs = base + ["   ", "the " * 60, again]
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "part-00000.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    (folder / "_SUCCESS").write_text("")
    cfg = dataclasses.replace(small_cfg, source=dataclasses.replace(small_cfg.source, uri=str(folder)),
                              quality=quality(ALL_ON))
    topic = f"stoker.config.quality.20261201.a{2 - decided}"
    m = run_job(spark, cfg, ds="2026-12-01", topic=topic, run_dir=tmp_path / "run", kafka_config=kafka_config)

    kept, dropped, scrubbed = _expected(docs, cfg.clean.min_chars)
    assert any(("records the quality filters dropped left out by place" in r.message) == decided
               for r in caplog.records if r.message.startswith("pack pass:")), "the pack pass's skips"
    assert (m.docs_in, m.docs_kept) == (len(docs), len(kept))
    assert m.docs_dropped == dict(sorted(dropped.items()))
    # the night exercises the filters: drops by at least four of the five (which documents the mixed sample holds
    # varies a little with the standard library's docstrings, so no single reason is required)
    assert len({step_of(r) for r in m.docs_dropped if filter_reason(r)}) >= 4, m.docs_dropped

    rows = [json.loads(line) for f in (tmp_path / "run" / "quarantine").glob("part-*.json") for line in f.open()]
    assert Counter(r["reason"] for r in rows) == Counter(m.docs_dropped)
    lines = [json.dumps({"text": t}).encode() for t in docs]
    copies = [r for r in rows if r["reason"] == steps.DUPLICATE]
    # a duplicate's row names its place and the kept copy's; its bytes stay at that place in the source
    assert {(r["pos"], r["detail"].rsplit(" at ", 1)[1]) for r in copies} >= {
        (sum(len(b) + 1 for b in lines[:-1]), str(sum(len(b) + 1 for b in lines[:docs.index(again)])))}
    assert all("raw_base64" not in r and r["detail"].startswith("same text as ") for r in copies)
    assert all(base64.b64decode(r["raw_base64"]) in set(lines) for r in rows if r["reason"] != steps.DUPLICATE)
    assert all(r["detail"] for r in rows if r["reason"] != steps.EMPTY_TEXT)

    # the run's page shows the first three of each reason by place, its text from the exact bytes
    shown = json.loads((tmp_path / "run" / "quarantine_samples.json").read_text())["samples"]
    assert set(shown) == set(m.docs_dropped)
    for reason, got in shown.items():
        first = sorted((r for r in rows if r["reason"] == reason), key=lambda r: (r["source"], r["pos"]))[:3]
        assert [(g["source"], g["pos"], g["detail"]) for g in got] == [
            (r["source"], r["pos"], r["detail"]) for r in first]
        for g, r in zip(got, first, strict=True):
            if "raw_base64" not in r:  # a duplicate: its place only
                assert g["preview"] is None
            else:
                assert base64.b64decode(r["raw_base64"]).decode().startswith(g["preview"])

    tok = load_tokenizer(m.tokenizer_path)
    published, _ = _documents_from_topic(koffsets.read_all(kafka_config, topic), tok.token_to_id("<|endoftext|>"))
    expected = [tuple(e.ids) for e in tok.encode_batch(kept, add_special_tokens=False)]
    assert Counter(published) == Counter(expected)
    assert any("email@example.com" in t for t in kept) and not any("@uni-x.edu" in t for t in kept)
    # the documents scrubbed are counted once (the pack pass's final done records), as many as datatrove changed
    assert m.scrubbed["docs"] == scrubbed > 0 and m.scrubbed["addresses"] >= scrubbed, (m.scrubbed, scrubbed)
