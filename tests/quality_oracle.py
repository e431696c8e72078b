"""datatrove as the oracle of the quality filters (tests and benches): its own filter classes, configured as
a corpus's ``quality:`` block configures Stoker's."""

from __future__ import annotations

from stoker.config import parse_corpus
from stoker.quality import QualityConfig

ALL_ON = {"gopher_repetition": {"enabled": True}, "gopher_quality": {"enabled": True}, "c4": {"enabled": True},
          "fineweb": {"enabled": True}, "pii": {"emails": True, "ips": True}}


def quality(block: dict) -> QualityConfig:
    return parse_corpus({"name": "q", "source": {"uri": "/x"}, "tokenizer": {"path": "t.json"},
                         "quality": block}).quality


def oracle_chain(block: dict):
    """datatrove's filters for ``block``, in FineWeb's order, as one function text -> (text | None, reason)."""
    from datatrove.data import Document
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.formatters import PIIFormatter

    steps = []
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

    def run(i: int, text: str) -> tuple[str | None, str | None]:
        doc = Document(text=text, id=str(i))
        for step in steps:
            out = step.filter(doc)
            if out is not True:
                return None, (out[1] if isinstance(out, tuple) else "dropped")
        return formatter.format(doc.text), None
    return run
