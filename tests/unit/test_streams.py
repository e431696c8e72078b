"""Streaming, splittable reads without Spark: splits partition a file's records exactly, compressed
files stream, and every record keeps its raw bytes and byte offset."""

from __future__ import annotations

import gzip
import json
import random

import pytest
import zstandard

from spark_jobs import steps
from spark_jobs.streams import BOM, Split, scan_file, split_records, split_tasks

pytestmark = pytest.mark.unit


def _records(path, size: int, split_bytes: int, max_bytes: int = 1 << 20, fmt: str = "jsonl"):
    files = [{"path": str(path), "bytes": size, **scan_file(str(path))}]
    return [r for t in split_tasks(files, split_bytes) for s in t for r in split_records(s, fmt, "text", max_bytes)]


@pytest.mark.parametrize("split_bytes", [1, 2, 3, 7, 64, 1000, 1 << 20])
def test_splits_partition_the_records_exactly(tmp_path, split_bytes):
    rng = random.Random(split_bytes)
    lines = [json.dumps({"text": "x" * rng.randrange(0, 40) + str(i)}).encode() for i in range(200)]
    lines[5] = b""  # a blank line is a record too
    lines[9] = b'{"text": "crlf"}\r'
    content = b"\n".join(lines) + b"\n"
    path = tmp_path / "a.jsonl"
    path.write_bytes(content)
    got = _records(path, len(content), split_bytes)
    offsets = [0]
    for raw in lines[:-1]:
        offsets.append(offsets[-1] + len(raw) + 1)
    assert [r.pos for r in got] == offsets  # every record once, at the byte offset of its first byte
    assert [r.raw for r in got] == [raw.removesuffix(b"\r") for raw in lines]
    assert got[5].reason == steps.INVALID_JSON and got[9].text == "crlf"


def test_a_last_line_without_newline_and_a_bom_at_the_start(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_bytes(BOM + b'{"text": "first"}\n{"text": "last"}')
    got = _records(path, path.stat().st_size, 5)
    assert [(r.text, r.reason) for r in got] == [("first", None), ("last", None)]
    assert got[0].raw == b'{"text": "first"}'  # the mark is the file's encoding, not the record's


def test_invalid_utf8_is_detected_not_replaced(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"good line\nbad \xff\xfe line\n")
    got = _records(path, path.stat().st_size, 4, fmt="text")
    assert [r.reason for r in got] == [None, steps.INVALID_UTF8]
    assert got[1].raw == b"bad \xff\xfe line"


def test_a_line_over_the_limit_is_dropped_without_being_held(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "ok"}\n' + b'{"text": "' + b"y" * 5000 + b'"}\n{"text": "after"}\n')
    got = _records(path, path.stat().st_size, 1 << 20, max_bytes=100)
    assert [r.reason for r in got] == [None, steps.TOO_LONG, None]
    assert got[2].text == "after" and got[2].pos == 15 + 5000 + 13
    assert len(got[1].raw) == 101


def test_compressed_files_stream_and_a_corrupt_one_is_one_record(tmp_path):
    body = b"".join(json.dumps({"text": f"doc {i}"}).encode() + b"\n" for i in range(1000))
    gz, zst, bad = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.zst", tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(body))
    zst.write_bytes(zstandard.ZstdCompressor().compress(body))
    bad.write_bytes(gzip.compress(body)[:-20])  # truncated in transit
    for p in (gz, zst):
        got = _records(p, p.stat().st_size, 10)  # never split: one stream per file
        assert [r.text for r in got] == [f"doc {i}" for i in range(1000)]
    scan = scan_file(str(bad))
    assert scan["corrupt"] and "gzip" in scan["corrupt"] and scan["bytes"] == bad.stat().st_size
    got = _records(bad, bad.stat().st_size, 10)
    assert len(got) == 1 and got[0].reason == steps.CORRUPT_FILE and got[0].raw == bad.read_bytes()[:4096]


def test_tasks_cut_big_files_group_small_ones_and_cover_every_byte_once():
    files = [{"path": "big.jsonl", "bytes": 1000}, {"path": "c.jsonl.zst", "bytes": 300}]
    files += [{"path": f"s{i}.jsonl", "bytes": 10} for i in range(30)]
    tasks = split_tasks(files, split_bytes=256, min_tasks=2)
    covered: dict[str, list[tuple[int, int]]] = {}
    for t in tasks:
        for s in t:
            covered.setdefault(s.path, []).append((s.start, s.end))
    for f in files:  # every byte of every file in exactly one task, in order
        spans = covered[f["path"]]
        assert spans[0][0] == 0 and spans[-1][1] == f["bytes"]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert covered["c.jsonl.zst"] == [(0, 300)]  # a compressed file is never cut
    assert len(tasks) == 8  # 1600 bytes: 7 shares of at most 256, rounded up to a multiple of 2
    assert len(covered["big.jsonl"]) == 5  # cut at every 200 bytes
    assert max(len(t) for t in tasks) >= 10  # small files share a task: not 30 tiny transactions
    assert split_tasks(files, 256, 2) == tasks  # the plan is a function of the files and settings


def test_a_small_drop_still_gets_min_tasks():
    tasks = split_tasks([{"path": "a.jsonl", "bytes": 4000}], split_bytes=64 << 20, min_tasks=4)
    assert [t for t in tasks] == [[Split("a.jsonl", i * 1000, (i + 1) * 1000)] for i in range(4)]
