import numpy as np
import pytest

from spark_jobs import steps

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "raw,reason",
    [
        (b'{"text": "hello"}', None),
        (b'{"text": "caf\xe9"}', steps.INVALID_UTF8),
        (b'{"text": "unterminated', steps.INVALID_JSON),
        (b"[1, 2]", steps.INVALID_JSON),
        (b"", steps.INVALID_JSON),
        (b'{"body": "x"}', steps.MISSING_TEXT),
        (b'{"text": 5}', steps.MISSING_TEXT),
        (b'{"text": "\\ud800 lone surrogate"}', steps.INVALID_UNICODE),
    ],
)
def test_parse_line_gives_each_bad_record_its_reason(raw, reason):
    p = steps.parse_line("f.jsonl", 3, raw, "jsonl", "text")
    assert p.reason == reason
    assert (p.text is None) == (reason is not None)
    if reason:
        assert p.raw == raw and p.detail  # the quarantine keeps the exact bytes and why


def test_clean_normalises_strips_and_checks_length():
    p = steps.parse_line("f", 1, '{"text": "  Cafe\u0301  "}'.encode(), "jsonl", "text")
    kept = steps.clean(p, "NFC", 1, 100)
    assert kept.text == "Caf\u00e9" and kept.reason is None and len(kept.digest) == 32
    assert steps.clean(p, "NFC", 10, 100).reason == steps.TOO_SHORT
    assert steps.clean(p, "NFC", 1, 3).reason == steps.TOO_LONG
    blank = steps.parse_line("f", 2, b'{"text": " \\n "}', "jsonl", "text")
    assert steps.clean(blank, "NFC", 1, 100).reason == steps.EMPTY_TEXT


def test_packer_keeps_every_token_in_order_with_eos_between_documents():
    docs = [list(range(1, 6)), list(range(10, 23)), [30], list(range(40, 47))]
    packer = steps.Packer(seq_len=7, eos_id=0, pad_id=99)
    out = [s for d in docs for s in packer.add(d)] + list(packer.flush())
    assert all(len(s.tokens) == 8 for s in out)
    assert all(s.valid is None for s in out[:-1])
    stream = np.concatenate([s.tokens[: s.valid or len(s.tokens)] for s in out]).tolist()
    expected = [t for d in docs for t in [*d, 0]]
    assert stream == expected
    assert packer.tokens == len(expected)
    assert packer.padding == 8 * len(out) - len(expected)
    assert out[-1].tokens[out[-1].valid:].tolist() == [99] * packer.padding
    # each document start is recorded in the window where it begins
    starts = [i * 8 + s for i, seq in enumerate(out) for s in seq.doc_starts]
    assert starts == [0, 6, 20, 22]


def test_packer_exact_fit_needs_no_padding():
    packer = steps.Packer(seq_len=3, eos_id=0, pad_id=9)
    out = list(packer.add([1, 2, 3])) + list(packer.flush())
    assert len(out) == 1 and out[0].tokens.tolist() == [1, 2, 3, 0] and packer.padding == 0


def test_a_parquet_row_is_a_record_and_a_bad_one_keeps_its_value():
    ok = steps.parquet_record("/in/a.parquet", 0, "first doc", "text")
    assert (ok.pos, ok.text, ok.reason) == (0, "first doc", None)
    null = steps.parquet_record("/in/a.parquet", 1, None, "text")
    assert (null.reason, null.raw) == (steps.MISSING_TEXT, b'{"text": null}')  # what the quarantine keeps
    assert steps.parquet_record("/in/a.parquet", 2, 7, "text").detail == "column 'text' is int"
    assert steps.clean(steps.parquet_record("f", 3, "", "text"), "NFC", 1, 100).reason == steps.EMPTY_TEXT
    absent = steps.parquet_record("f", 0, None, "body", absent="absent (columns: text, id)")
    assert "absent (columns: text, id)" in absent.detail


def test_skips_find_exactly_the_duplicates_places():
    names = ["file:/a.jsonl", "file:/b.jsonl"]
    skips = steps.Skips.of(names, np.array([1, 0, 1, 0]), np.array([70, 5, 3, 900]))
    assert len(skips) == 4
    assert {("file:/a.jsonl", 5), ("file:/a.jsonl", 900), ("file:/b.jsonl", 3), ("file:/b.jsonl", 70)} == {
        k for k in [(n, p) for n in [*names, "file:/c"] for p in range(1000)] if k in skips}
    assert ("file:/a.jsonl", 6) not in steps.Skips()


def test_a_pack_task_tokenises_the_kept_records_less_the_duplicates_in_batches():
    recs = [steps.parse_line("f", i * 10, raw, "jsonl", "text") for i, raw in
            enumerate([b'{"text": "a b"}', b'{"text": "  "}', b'{"text": "c d"}', b'broken', b'{"text": "e"}'])]
    skips = steps.Skips.of(["f"], np.array([0]), np.array([20]))  # "c d" at byte 20 is a duplicate
    got = list(steps.kept_texts(recs, "NFC", 1, 100, skips, batch=1))
    assert got == [(["a b"], ["f"], [False], [0], [0]), (["e"], ["f"], [False], [0], [40])]


def test_a_pack_task_counts_the_addresses_scrubbed_in_each_kept_text():
    from spark_jobs.quality import Filters
    from stoker.config.corpus import parse_corpus

    quality = Filters(parse_corpus({"name": "q", "source": {"uri": "/x"}, "tokenizer": {"path": "t.json"},
                                    "quality": {"pii": {"emails": True, "ips": True}}}).quality)
    lines = [b'{"text": "write a@b.org or c@d.org"}', b'{"text": "no address"}', b'{"text": "host 8.8.8.8"}',
             b'{"text": "email@example.com"}']  # already the replacement: not scrubbed
    recs = [steps.parse_line("f", i, raw, "jsonl", "text") for i, raw in enumerate(lines)]
    got = [(t, n) for ts, _, _, ns, _ in steps.kept_texts(recs, "NFC", 1, 100, steps.Skips(), 2, quality=quality)
           for t, n in zip(ts, ns, strict=True)]
    assert got == [("write email@example.com or email@example.com", 2), ("no address", 0),
                   ("host 22.214.171.124", 1), ("email@example.com", 0)]
