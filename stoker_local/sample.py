"""The sample corpus and its tokenizer, made offline from text any Python install carries.

Documents are docstrings of the standard library, licence texts found in the Python installation,
and CJK text (CPython's ``test/cjkencodings`` files when installed, plus a few sentences kept
here). A handful of deliberately bad records exercise validation: a broken JSON line, a missing
text field, an empty text, invalid UTF-8, a non-object line and a non-string text. Output is
deterministic for a given Python installation. Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import pkgutil
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

from stoker.files import atomic_write_json, sha256_file

EOS = "<|endoftext|>"
PAD = "<|pad|>"

CJK_SENTENCES = [
    "数据管道把原始文本清洗、分词、打包，然后发布到 Kafka，训练节点从中读取数据并断点续训。",
    "大規模言語モデルの学習には、重複を除いた高品質なテキストが大量に必要です。",
    "한국어 문장도 토크나이저가 바이트 단위로 처리할 수 있어야 합니다.",
    "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
    "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。",
]

BAD_LINES: list[tuple[bytes, str]] = [
    (b'{"id": "bad-json", "text": "this line never closes', "invalid_json"),
    (b'{"id": "no-text", "body": "the text lives under another key"}', "missing_text"),
    (b'{"id": "empty", "text": ""}', "empty_text"),
    (b'{"id": "blank", "text": "   \\n\\t  "}', "empty_text"),
    (b'{"id": "bad-utf8", "text": "caf\xe9 au lait \xff\xfe"}', "invalid_utf8"),
    (b'["not", "an", "object"]', "invalid_json"),
    (b'{"id": "num", "text": 12345}', "missing_text"),
]
"""Deliberately bad records and the drop reason the pipeline must give each."""

_SKIP_PREFIXES = ("test", "idlelib", "tkinter", "turtle", "lib2to3", "ensurepip", "venv", "this", "antigravity")


def _stdlib_modules() -> list[str]:
    names = set(sys.stdlib_module_names)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for top in sorted(names):  # one level of submodules, listed without importing anything
        if (stdlib / top).is_dir():
            names.update(f"{top}.{m.name}" for m in pkgutil.iter_modules([str(stdlib / top)]))
    return sorted(n for n in names if not n.startswith(("_",) + _SKIP_PREFIXES)
                  and ".test" not in n and not n.endswith("__main__"))


def _docstrings(max_bytes: int) -> Iterator[dict]:
    total = 0
    for name in _stdlib_modules():
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                mod = importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - some modules exit or need a display at import
            continue
        members = [("", mod)] + sorted(
            (k, v) for k, v in vars(mod).items() if inspect.isclass(v) or inspect.isfunction(v)
        )
        for attr, obj in members:
            doc = inspect.getdoc(obj) if attr else (mod.__doc__ or "")
            if not doc:
                continue
            yield {"id": f"py:{name}{'.' + attr if attr else ''}", "text": doc, "source": "docstring"}
            total += len(doc.encode())
            if total >= max_bytes:
                return


def _licences() -> Iterator[dict]:
    roots = {Path(sys.base_prefix), Path(sysconfig.get_paths()["stdlib"]), Path("/usr/share/common-licenses")}
    seen: set[Path] = set()
    for root in sorted(roots):
        if not root.is_dir():
            continue
        pattern = "*" if root.name == "common-licenses" else "LICENSE*"
        for p in sorted(root.glob(pattern)):
            if p.is_file() and p not in seen and p.stat().st_size < 200_000:
                seen.add(p)
                text = p.read_text(encoding="utf-8", errors="replace")
                yield {"id": f"licence:{p.name}", "text": text, "source": "licence"}


def _cjk() -> Iterator[dict]:
    for i, s in enumerate(CJK_SENTENCES):
        yield {"id": f"cjk:kept:{i}", "text": s, "source": "cjk"}
    folder = Path(sysconfig.get_paths()["stdlib"]) / "test" / "cjkencodings"
    for p in sorted(folder.glob("*-utf8.txt")) if folder.is_dir() else []:
        yield {"id": f"cjk:{p.stem}", "text": p.read_text(encoding="utf-8", errors="replace"), "source": "cjk"}


def documents(max_docstring_bytes: int = 2_500_000) -> list[dict]:
    docs = [*_docstrings(max_docstring_bytes), *_licences(), *_cjk()]
    # two exact duplicates on purpose, so dedup has something to drop on every machine
    docs += [dict(docs[0], id=docs[0]["id"] + ":dup"), dict(docs[-1], id=docs[-1]["id"] + ":dup")]
    return docs


def write_corpus(out: Path, shards: int = 4, max_docstring_bytes: int = 2_500_000) -> dict:
    """Write ``shards`` JSONL files with the bad lines spread among them, then ``_SUCCESS``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "_SUCCESS").unlink(missing_ok=True)
    docs = documents(max_docstring_bytes)
    lines: list[bytes] = [json.dumps(d, ensure_ascii=False).encode("utf-8") for d in docs]
    for i, (bad, _reason) in enumerate(BAD_LINES):
        lines.insert((i * 7919) % len(lines), bad)
    per = -(-len(lines) // shards)
    files = []
    for s in range(shards):
        path = out / f"part-{s:05d}.jsonl"
        path.write_bytes(b"\n".join(lines[s * per:(s + 1) * per]) + b"\n")
        files.append(path.name)
    (out / "_SUCCESS").write_text("")
    return {"path": str(out), "files": files, "lines": len(lines), "bad_lines": len(BAD_LINES),
            "bytes": sum((out / f).stat().st_size for f in files)}


def texts(corpus: Path) -> Iterator[str]:
    """The non-blank texts of a JSONL corpus folder (bad lines skipped)."""
    for p in sorted(corpus.glob("*.jsonl")):
        for raw in p.read_bytes().splitlines():
            try:
                text = json.loads(raw.decode("utf-8")).get("text")
            except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                continue
            if isinstance(text, str) and text.strip():
                yield text


def train_tokenizer(corpus: Path, out: Path, vocab_size: int = 8192) -> dict:
    """A byte-level BPE (GPT-2 style) trained on ``corpus``; writes tokenizer.json and its sha256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, PAD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(corpus), trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    tok.save(str(path))
    digest = sha256_file(path)
    (out / "tokenizer.sha256").write_text(f"{digest}  tokenizer.json\n")
    info = {"path": str(path), "sha256": digest, "vocab_size": tok.get_vocab_size()}
    atomic_write_json(out / "info.json", info)
    return info
