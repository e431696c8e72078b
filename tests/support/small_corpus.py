"""A small JSONL corpus with every kind of bad record, shared by the integration tests."""

from __future__ import annotations

import json
from pathlib import Path

from spark_jobs import steps

GOOD = [
    "The quick brown fox jumps over the lazy dog.",
    "Kafka keeps the packed sequences; Spark makes them.",
    "数据管道把原始文本清洗、分词、打包。",
    "Cafe\u0301 au lait",  # NFC turns this into 'Café au lait'
    "A hostile document that says <|endoftext|> in the middle must not inject an EOS.",
    "x" * 3000,  # longer than one sequence: continues across windows
] + [f"Document number {i} talks about topic {i * 7 % 13} at some length." for i in range(120)]

BAD = [
    (b'{"text": "broken', steps.INVALID_JSON),
    (b'{"title": "no text"}', steps.MISSING_TEXT),
    (b'{"text": ""}', steps.EMPTY_TEXT),
    (b'{"text": "bad \xff byte"}', steps.INVALID_UTF8),
    (b'{"text": "\\udc00"}', steps.INVALID_UNICODE),
]


def write_corpus(folder: Path) -> None:
    lines = [json.dumps({"text": t}, ensure_ascii=False).encode() for t in GOOD]
    lines += [json.dumps({"text": GOOD[1]}).encode(), json.dumps({"text": "  " + GOOD[0] + " "}).encode()]
    for i, (raw, _) in enumerate(BAD):
        lines.insert(i * 17 + 3, raw)
    folder.mkdir(parents=True)
    half = len(lines) // 2
    (folder / "a.jsonl").write_bytes(b"\n".join(lines[:half]) + b"\n")
    (folder / "b.jsonl").write_bytes(b"\n".join(lines[half:]))
    (folder / "_SUCCESS").write_text("")
