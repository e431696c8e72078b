"""Which library turns a night's texts into ids, and the proof that it gives the reference's ids.

The reference is Hugging Face ``tokenizers``: the corpus's ``tokenizer.json`` means what it does there. A
fast backend (``fastokens``, a Rust re-implementation of the same JSON, ~40x ``tokenizers`` on one core
here, BENCHMARKS.md) may encode instead, chosen per tokenizer by :func:`choose`, only when all three hold:

1. **Features proven.** Every part of the JSON is one the parity tests (``tests/unit/test_tokenizer_backends.py``)
   cover for the installed version: the model type and its options, each normalizer and pre-tokenizer, the added
   tokens' flags, no truncation or padding. Anything else (a WordPiece or Unigram model, a BERT normalizer,
   NFKC, Metaspace, an added token that strips) names itself in the manifest's reason and the night runs on
   ``tokenizers``.
2. **Ids equal before Spark starts**, on the shipped hostile texts (:func:`hostile_texts`: NUL, controls, CJK,
   emoji sequences, combining marks, very long words and runs, every added token's text in context) and on a
   fixed sample of the night's own documents (:func:`night_sample`, the first kept documents in file order).
3. **Ids equal inside the pack tasks**: every ``tokenizer.check_every``-th document of a task, its first
   included, is encoded by both (:class:`TaskParity`); a difference fails the task and names the document.

``tokenizer.backend`` picks: ``auto`` (the above; a failed proof falls back, saying why), ``fastokens`` (a
failed proof is an error), ``tokenizers`` (the reference only). The manifest records which ran and why.
Special tokens inside the data are text on every backend (``encode_special_tokens`` / ``split_special_tokens``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import metadata
from typing import Any

import numpy as np

from stoker.config.corpus import TOKENIZER_BACKENDS as BACKENDS

REFERENCE = "tokenizers"
FAST = "fastokens"

PROVEN_NORMALIZERS = frozenset({"NFC", "Lowercase", "Prepend", "Replace", "Sequence"})
"""Normalizer types whose fastokens output the parity tests compare with ``tokenizers``' (Llama-2's
Prepend + Replace, NFC + Lowercase); NFD, NFKC, NFKD, Strip and the BERT normalizer are not proven."""
PROVEN_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Sequence", "Digits"})
"""GPT-2's ByteLevel regex, Llama-3's and Qwen's Split + ByteLevel, Digits; Metaspace, Whitespace and the BERT
pre-tokenizer are not proven."""
PROVEN_BPE = {"dropout": (None,), "continuing_subword_prefix": (None, ""), "end_of_word_suffix": (None, "")}
"""BPE options and the values proven; byte_fallback, fuse_unk and ignore_merges are proven either way."""

SAMPLE_DOCS = 512
"""Documents of the night the driver compares before Spark starts."""
SAMPLE_BYTES = 16 << 20
"""At most this much of the night is read for them (the first files, in order)."""


@dataclass(slots=True)
class Choice:
    """The backend a night runs on and why; the manifest's ``tokenizer_backend``."""

    name: str
    version: str
    reason: str
    wanted: str = "auto"
    checked_docs: int = 0
    """Texts the driver compared before Spark (hostile + the night's sample); the tasks' checks are summed later."""
    check_every: int = 0
    unproven: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def version_of(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def unproven_features(spec: dict[str, Any]) -> list[str]:
    """The parts of a ``tokenizer.json`` (parsed) the fast backend's parity is not proven for; empty: all proven."""
    out: list[str] = []
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        out.append(f"model type {model.get('type')!r} (proven: BPE)")
    else:
        for key, allowed in PROVEN_BPE.items():
            if model.get(key) not in allowed:
                out.append(f"BPE {key} = {model.get(key)!r}")
    out += _walk(spec.get("normalizer"), "normalizer", PROVEN_NORMALIZERS, "normalizers")
    out += _walk(spec.get("pre_tokenizer"), "pre_tokenizer", PROVEN_PRE_TOKENIZERS, "pretokenizers")
    for key in ("truncation", "padding"):
        if spec.get(key) is not None:
            out.append(f"{key} is set (a night's ids are never truncated or padded)")
    for tok in spec.get("added_tokens") or []:
        flags = [f for f in ("single_word", "lstrip", "rstrip") if tok.get(f)]
        if flags:
            out.append(f"added token {tok.get('content')!r} with {', '.join(flags)}")
    return out


def _walk(part: dict[str, Any] | None, what: str, proven: frozenset[str], children: str) -> list[str]:
    if part is None:
        return []
    kind = part.get("type")
    if kind not in proven:
        return [f"{what} {kind!r}"]
    if kind == "Sequence":
        return [u for p in part.get(children) or [] for u in _walk(p, what, proven, children)]
    if kind == "Replace" and "String" not in (part.get("pattern") or {}):
        return [f"{what} Replace with a regex pattern"]
    return []


HOSTILE = [
    "", " ", "  leading and trailing  ", "\n", "\r\n\r\n", "\t\tindented\n\tcode()", "a\x00b\x00\x00c",
    "\x01\x02\x1b[31mred\x1b[0m\x7f", "\ufeffbyte order mark", "zero\u200bwidth\u200djoiner\u2060",
    "数据管道把原始文本清洗、分词、打包，然后发布到 Kafka。", "大規模言語モデルの学習には、重複を除いたテキスト。",
    "한국어 문장도 바이트 단위로 처리합니다.", "مرحبا بالعالم", "שלום עולם", "Привет, мир! Ёлка", "ΑΒΓ αβγ ς",
    "🙂👍🏽👨‍👩‍👧‍👦🏳️‍🌈 🇯🇵 emoji sequences", "e\u0301 e\u0301\u0302\u0303\u0304 Cafe\u0301", "a" + "\u0301" * 300,
    "ﬁ ﬂ Ⅻ ① ｆｕｌｌ　ｗｉｄｔｈ", "x" * 5000, "ab" * 3000, "🙂" * 500, "数" * 2000, " " * 1000 + "end",
    "1234567890 3.14159 1e-10 0xDEADBEEF 1,000,000", "'s 've 're 'll 'd 'm 't 'S 'LL", "don't won't it's",
    "http://example.com/a?b=c&d=e#f user@example.com", "<html><body>&amp; &lt;tag&gt;</body></html>",
    "def f(x):\n    return x ** 2  # comment\n", "\\u0000 \\n literal escapes", "\ud7ff\ue000\uffff\U0010ffff",
    "mixed中文and English和日本語テキスト", "tab\tseparated\tvalues\n1\t2\t3", "!!!???...---___***",
    "UPPER lower MiXeD CamelCaseWord snake_case_word kebab-case-word",
]
"""Texts that have broken tokenizer ports before: controls and NUL, CJK and right-to-left scripts, emoji
ZWJ sequences and flags, combining marks alone and in runs, compatibility characters, very long runs of one
character (a byte-level BPE's worst case), contractions (the split regexes' first alternatives), code."""


def hostile_texts(spec: dict[str, Any]) -> list[str]:
    """:data:`HOSTILE` and every added token's text in context (alone, inside words, repeated, beside
    spaces and newlines): a document that says ``<|endoftext|>`` must come out as that text's ids."""
    out = list(HOSTILE)
    for tok in spec.get("added_tokens") or []:
        t = tok.get("content") or ""
        out += [t, f"a{t}b", f" {t} ", f"{t}{t}", f"\n{t}\n", f"text before {t}text after", f"{t[:-1]}",
                f"{t} {t[1:]}"]
    return out


class Encoder:
    """One backend's ``encode_batch``: per text, its ids without special tokens (a list or a uint32 array)."""

    name = REFERENCE

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def encode_batch(self, texts: list[str]) -> list[Any]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]


class FastEncoder(Encoder):
    """fastokens' flat batch encode: every text's ids in one buffer, no Python int per token; each
    document's ids are a view of it."""

    name = FAST

    def encode_batch(self, texts: list[str]) -> list[Any]:
        flat, offsets = self.tok.encode_batch_flat(texts, add_special_tokens=False, split_special_tokens=True)
        ids, at = np.frombuffer(flat, np.uint32), np.frombuffer(offsets, np.uint64).tolist()
        return [ids[at[i]:at[i + 1]] for i in range(len(texts))]


def reference_encoder(json_text: str) -> Encoder:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json_text)
    tok.encode_special_tokens = True  # special tokens inside the data are encoded as text
    return Encoder(tok)


def fast_encoder(json_text: str) -> Encoder:
    import fastokens

    return FastEncoder(fastokens.Tokenizer.from_json_str(json_text))


@lru_cache(maxsize=4)
def encoders(digest: str, json_text: str, backend: str) -> tuple[Encoder, Encoder | None]:
    """(the encoder a task uses, the reference that checks it or None), once per Python worker and tokenizer."""
    ref = reference_encoder(json_text)
    return (ref, None) if backend == REFERENCE else (fast_encoder(json_text), ref)


def same_ids(a: Any, b: Any) -> bool:
    return len(a) == len(b) and bool(np.array_equal(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)))


def first_difference(a: Any, b: Any) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))[0]
    return int(diff[0]) if len(diff) else n


def describe_mismatch(text: str, fast: Any, ref: Any, where: str) -> str:
    i = first_difference(fast, ref)
    return (f"{where}: {FAST} {version_of(FAST)} and {REFERENCE} {version_of(REFERENCE)} give other ids for "
            f"the text {text[:80]!r}{'…' if len(text) > 80 else ''} ({len(text)} chars): from token {i}, "
            f"{list(np.asarray(fast[i:i + 5]).tolist())} against {list(np.asarray(ref[i:i + 5]).tolist())} "
            f"({len(fast)} and {len(ref)} ids). Set tokenizer.backend: tokenizers for this corpus and report "
            "the text to the fast backend's authors")


def choose(json_text: str, wanted: str, sample: list[str], check_every: int) -> Choice:
    """The backend for a tokenizer, proven on the hostile texts and ``sample`` (the night's documents)."""
    from stoker.exceptions import ConfigError

    if wanted not in BACKENDS:
        raise ConfigError(f"tokenizer.backend = {wanted!r}: must be one of {', '.join(BACKENDS)}")
    ref_version = version_of(REFERENCE)
    if wanted == REFERENCE:
        return Choice(REFERENCE, ref_version, "tokenizer.backend: tokenizers", wanted=wanted)

    def fallback(reason: str, unproven: list[str] | None = None) -> Choice:
        if wanted == FAST:
            raise ConfigError(f"tokenizer.backend = {FAST!r} cannot be proven for this tokenizer: {reason}; "
                              "use auto (falls back to tokenizers) or tokenizers")
        return Choice(REFERENCE, ref_version, reason, wanted=wanted, unproven=unproven or [])

    if not version_of(FAST):
        return fallback(f"{FAST} is not installed")
    spec = json.loads(json_text)
    unproven = unproven_features(spec)
    if unproven:
        return fallback(f"features not proven for {FAST}: {'; '.join(unproven)}", unproven)
    try:
        fast = fast_encoder(json_text)
    except Exception as e:  # noqa: BLE001 - its loader names what it lacks; the night runs on the reference
        return fallback(f"{FAST} cannot load it: {e}")
    ref = reference_encoder(json_text)
    texts = hostile_texts(spec) + list(sample)
    for start in range(0, len(texts), 256):
        batch = texts[start:start + 256]
        for i, (a, b) in enumerate(zip(fast.encode_batch(batch), ref.encode_batch(batch), strict=True)):
            if not same_ids(a, b):
                what = "a hostile text" if start + i < len(texts) - len(sample) else "a document of the night"
                return fallback(describe_mismatch(batch[i], a, b, f"before Spark, {what}"))
    return Choice(FAST, version_of(FAST), f"features proven and ids equal on {len(texts)} texts "
                  f"({len(sample)} of the night)", wanted=wanted, checked_docs=len(texts), check_every=check_every)


class TaskParity:
    """Inside a pack task: every ``every``-th document (the task's first included) encoded again by the
    reference; a difference raises :class:`stoker.exceptions.TokenizerMismatch` naming the document."""

    def __init__(self, reference: Encoder | None, every: int) -> None:
        self.reference, self.every, self.seen, self.checked = reference, max(1, every), 0, 0

    def check(self, texts: list[str], ids: list[Any], sources: list[str], positions: list[int]) -> None:
        if self.reference is None:
            return
        picked = list(range((-self.seen) % self.every, len(texts), self.every))
        self.seen += len(texts)
        if not picked:
            return
        ref = self.reference.encode_batch([texts[i] for i in picked])
        self.checked += len(picked)
        for i, r in zip(picked, ref, strict=True):
            if not same_ids(ids[i], r):
                from stoker.exceptions import TokenizerMismatch

                raise TokenizerMismatch(describe_mismatch(texts[i], ids[i], r,
                                                          f"document (source, pos) = ({sources[i]!r}, {positions[i]})"))


def night_sample(cfg: Any, files: list[dict[str, Any]], opener: Any, n: int = SAMPLE_DOCS,
                 max_bytes: int = SAMPLE_BYTES) -> list[str]:
    """The first ``n`` documents of the night that clean (its files in path order, at most ``max_bytes``
    read), as the tokenizer will see them. A Parquet night has none here: its tasks' checks cover it."""
    from spark_jobs.steps import clean
    from spark_jobs.streams import Split, split_records

    if cfg.source.format == "parquet":
        return []
    c, out, read = cfg.clean, [], 0
    for f in sorted(files, key=lambda f: f["path"]):
        if f.get("corrupt") is not None:
            continue
        for p in split_records(Split(f["path"], 0, int(f["bytes"])), cfg.source.format, cfg.source.text_field,
                               c.max_chars * 4 + 4, opener):
            read += len(p.raw or b"") or len(p.text or "")
            p = clean(p, c.normalization, c.min_chars, c.max_chars, digest=False)
            if p.reason is None and p.text:
                out.append(p.text)
            if len(out) >= n or read >= max_bytes:
                return out
    return out
