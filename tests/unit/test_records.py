import numpy as np
import pytest

from stoker.exceptions import RecordError
from stoker.run import records

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("dtype,top", [("uint16", 65535), ("uint32", 2**32 - 1)])
def test_round_trip_keeps_ids_boundaries_and_padding(dtype, top):
    tokens = np.array([0, 1, 2, top, 7, 8], dtype=np.int64)
    value = records.encode_value(tokens, dtype)
    assert len(value) == len(tokens) * records.DTYPES[dtype].itemsize
    headers = records.encode_headers("sample/2026-12-01", dtype, doc_starts=[0, 3], valid=5)
    seq = records.decode(value, headers, seq_len=5)
    assert seq.tokens.tolist() == tokens.tolist()
    assert seq.doc_starts.tolist() == [0, 3]
    assert seq.valid == 5 and seq.n_real == 5
    assert seq.run_id == "sample/2026-12-01"
    assert not seq.tokens.flags.writeable  # a zero-copy view of the message bytes


def test_without_optional_headers_every_token_is_real():
    value = records.encode_value([5, 6, 7], "uint16")
    seq = records.decode(value, records.encode_headers("r", "uint16"))
    assert seq.valid is None and seq.n_real == 3 and seq.doc_starts.size == 0


def test_dtype_for_vocab_picks_the_narrowest():
    assert records.dtype_for_vocab(8192) == "uint16"
    assert records.dtype_for_vocab(65536) == "uint16"
    assert records.dtype_for_vocab(65537) == "uint32"
    with pytest.raises(RecordError):
        records.dtype_for_vocab(0)


def test_ids_that_do_not_fit_are_refused():
    with pytest.raises(RecordError, match="does not fit uint16"):
        records.encode_value([1, 70000], "uint16")
    with pytest.raises(RecordError, match="does not fit"):
        records.encode_value([-1], "uint32")


def test_decode_rejects_foreign_or_torn_messages():
    good = records.encode_value([1, 2, 3], "uint16")
    with pytest.raises(RecordError, match="schema"):
        records.decode(good, [("stoker.config.schema", b"99"), ("stoker.dtype", b"uint16")])
    with pytest.raises(RecordError, match="dtype"):
        records.decode(good, [("stoker.config.schema", b"1"), ("stoker.dtype", b"int8")])
    with pytest.raises(RecordError, match="whole number"):
        records.decode(good[:-1], records.encode_headers("r", "uint16"))
    with pytest.raises(RecordError, match="seq_len"):
        records.decode(good, records.encode_headers("r", "uint16"), seq_len=5)


def test_keys_are_deterministic_and_parse_back():
    key = records.make_key(3, 12)
    assert key == b"p00003-s000000012"
    assert records.parse_key(key) == (3, 12)
    with pytest.raises(RecordError):
        records.parse_key(b"garbage")


def test_done_record_keys_are_distinct_past_a_hundred_thousand_tasks_and_unchanged_below():
    """The done record's key was the first six bytes of a sequence key: task 100,000's was task 10,000's, so a
    retry of one could take the other's done record and skip publishing its data (issue 33)."""
    keys = [records.done_key(t) for t in range(0, 250_000, 7)] + [records.done_key(10_000), records.done_key(100_000)]
    assert len(set(keys[:-2])) == len(keys[:-2])
    assert records.done_key(100_000) != records.done_key(10_000) and records.done_key(123_456) == b"p123456"
    for t in (0, 3, 10_000, 99_999):  # what a done record of an earlier Stoker was keyed by
        assert records.done_key(t) == records.make_key(t, 0)[:6]
