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


def test_split_lines_numbers_from_one_and_ignores_the_final_newline():
    assert list(steps.split_lines(b"a\r\nb\n\nc\n")) == [(1, b"a"), (2, b"b"), (3, b""), (4, b"c")]
    assert list(steps.split_lines(b"")) == []


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


def test_decompress_by_suffix_and_a_corrupt_file_is_one_quarantined_record():
    import gzip

    import zstandard

    data = b'{"text": "a"}\n{"text": "b"}\n'
    assert steps.decompress("x.jsonl", data) == (data, None)
    assert steps.decompress("x.jsonl.gz", gzip.compress(data)) == (data, None)
    assert steps.decompress("x.jsonl.zst", zstandard.ZstdCompressor().compress(data)) == (data, None)
    # a streamed zstd frame (no content size in the header) too
    streamed = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert steps.decompress("x.jsonl.zstd", streamed) == (data, None)

    truncated = gzip.compress(data)[:-12]
    out, why = steps.decompress("/in/x.jsonl.gz", truncated)
    assert out is None and why.startswith("gzip: ")
    rec = steps.corrupt_file("/in/x.jsonl.gz", truncated, why)
    assert (rec.reason, rec.line, rec.raw) == (steps.CORRUPT_FILE, 0, truncated)
    assert f"({len(truncated)} bytes)" in rec.detail
    assert steps.decompress("x.zst", b"not zstd at all")[0] is None


def test_parquet_rows_are_records_numbered_from_one():
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": ["first doc", None, "third", ""], "id": [1, 2, 3, 4]}), buf)
    recs = list(steps.records_of("/in/a.parquet", buf.getvalue(), "parquet", "text"))
    assert [(r.line, r.text, r.reason) for r in recs] == [
        (1, "first doc", None), (2, None, steps.MISSING_TEXT), (3, "third", None), (4, "", None)]
    assert recs[1].raw == b'{"text": null}'  # what the quarantine keeps of a bad row
    assert steps.clean(recs[3], "NFC", 1, 100).reason == steps.EMPTY_TEXT

    wrong = list(steps.records_of("/in/a.parquet", buf.getvalue(), "parquet", "body"))
    assert {r.reason for r in wrong} == {steps.MISSING_TEXT} and len(wrong) == 4
    assert "absent (columns: text, id)" in wrong[0].detail
    broken = list(steps.records_of("/in/b.parquet", buf.getvalue()[:-30], "parquet", "text"))
    assert [r.reason for r in broken] == [steps.CORRUPT_FILE]
