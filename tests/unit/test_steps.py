import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=150, deadline=None)
@given(docs=st.lists(st.lists(st.integers(1, 60_000), max_size=30), max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=6), seq_len=st.integers(2, 17), arrays=st.booleans())
def test_packing_in_batches_is_packing_one_document_at_a_time(docs, cuts, seq_len, arrays):
    """The batch path against a reference model: the documents joined with EOS, cut into windows of
    seq_len + 1, the last padded; each window names the documents that start in it."""
    packer = steps.Packer(seq_len=seq_len, eos_id=0, pad_id=65_535)
    bounds = sorted({0, len(docs), *(min(c, len(docs)) for c in cuts)})
    batches = [docs[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    as_input = (lambda d: np.asarray(d, dtype=np.uint32)) if arrays else list
    out = [w for b in batches for w in packer.add_batch([as_input(d) for d in b])] + list(packer.flush())
    stream = [t for d in docs for t in [*d, 0]]
    w = seq_len + 1
    windows = [stream[i:i + w] for i in range(0, len(stream), w)]
    starts, at = [], 0
    for d in docs:
        starts.append(at)
        at += len(d) + 1
    assert [x.tokens[: x.valid or w].tolist() for x in out] == windows
    assert [x.doc_starts for x in out] == [[s - i * w for s in starts if i * w <= s < (i + 1) * w]
                                           for i in range(len(windows))]
    assert all(x.valid is None for x in out[:-1]) and (not out or out[-1].valid in (None, len(windows[-1])))
    assert packer.tokens == len(stream) and packer.padding == w * len(windows) - len(stream)


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


_JSON_LINES = st.one_of(
    st.binary(max_size=60),
    st.builds(lambda v: json.dumps({"text": v}, ensure_ascii=False).encode("utf-8", "surrogatepass"),
              st.text(max_size=40)),
    st.builds(lambda v, a: json.dumps({"text": v}, ensure_ascii=a).encode(), st.text(max_size=40), st.booleans()),
    st.builds(lambda k, v: json.dumps({k: v}).encode(), st.sampled_from(["text", "body"]),
              st.one_of(st.none(), st.integers(), st.floats(allow_nan=True), st.lists(st.integers(), max_size=3))),
    st.sampled_from([b'{"text": "\\ud800"}', b'{"text": "caf\xe9"}', b'\xef\xbb\xbf{"text": "bom"}', b'[1]',
                     b'{"text": "a"} x', b'{"text": NaN}', b'{"text": "a", "text": 1}', b'{"text": 1e999}',
                     b'{"text": 123456789012345678901234567890}', b'{"text": "\\ud83d\\ude00"}', b'"text"']),
)


@settings(max_examples=400, deadline=None)
@given(raw=_JSON_LINES, fmt=st.sampled_from(["jsonl", "text"]))
def test_the_fast_json_path_keeps_and_drops_exactly_as_the_exact_one(raw, fmt):
    assert steps.parse_line("f", 0, raw, fmt, "text") == steps._parse_line_exactly("f", 0, raw, fmt, "text")
