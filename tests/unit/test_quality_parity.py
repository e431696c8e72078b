"""The quality filters against datatrove, the oracle: the same mixed documents through datatrove's own
filters and through Stoker's must give the same keep/drop decision, the same reason and the same kept text,
filter by filter and as FineWeb's chain. (`make bench-quality` runs the same on 10,000 documents and times both.)"""

from __future__ import annotations

import unicodedata
from collections import Counter

import pytest

from spark_jobs.quality import FILTERS, Filters, Verdict
from stoker.config.quality import FILTERS as FILTER_CONFIGS
from stoker.run.reasons import STEPS, step_of
from tests.support.quality_oracle import ALL_ON, oracle_chain, quality

pytestmark = pytest.mark.unit

N_DOCS = 1_000

@pytest.fixture(scope="module")
def docs() -> list[tuple[str, str]]:
    from stoker_local.mixed_sample import documents

    out = []
    for kind, text in documents(N_DOCS, seed=1):
        text = unicodedata.normalize("NFC", text).strip()  # what the Spark stage hands the filters
        if text:
            out.append((kind, text))
    return out


def compare(block: dict, docs: list[tuple[str, str]]) -> tuple[Counter, list]:
    mine, theirs = Filters(quality(block)), oracle_chain(block)
    reasons: Counter = Counter()
    differ = []
    for i, (kind, text) in enumerate(docs):
        v: Verdict = mine.apply(text)
        expected_text, expected_reason = theirs(i, text)
        reasons[v.reason or "kept"] += 1
        if (v.text, v.reason) != (expected_text, expected_reason):
            differ.append((kind, text[:200], (v.reason, expected_reason)))
    return reasons, differ


@pytest.mark.parametrize("name", [f.STEP for f in FILTER_CONFIGS])
def test_each_filter_keeps_and_drops_what_datatroves_does_for_the_same_reason(docs, name):
    reasons, differ = compare({name: {"enabled": True}}, docs)
    assert not differ, f"{len(differ)} of {len(docs)} differ from datatrove, e.g. {differ[:3]}"
    assert reasons["kept"] and len(reasons) >= 2, reasons  # the sample exercises the filter both ways
    # every reason it dropped by is one its config names, so the run's counts find its step
    assert set(reasons) - {"kept"} <= set(getattr(quality({}), name).REASONS), reasons
    assert {step_of(r) for r in set(reasons) - {"kept"}} == {name}


def test_every_filter_config_has_its_class_in_the_stage_in_the_same_order():
    assert [f.config for f in FILTERS] == list(FILTER_CONFIGS)
    assert [f.STEP for f in FILTER_CONFIGS] == [name for name in STEPS if name not in ("read", "clean", "dedup")]
    assert len({r for f in FILTER_CONFIGS for r in f.REASONS}) == sum(len(f.REASONS) for f in FILTER_CONFIGS)


def test_fineweb_chain_with_scrubbing_matches_datatrove_document_for_document(docs):
    reasons, differ = compare(ALL_ON, docs)
    assert not differ, f"{len(differ)} of {len(docs)} differ from datatrove, e.g. {differ[:3]}"
    assert reasons["kept"] >= 20 and sum(reasons.values()) - reasons["kept"] > len(docs) // 2, reasons


def test_a_kept_text_transformed_again_is_the_text_the_chain_kept(docs):
    """The pack pass runs only the text changes (C4's lines, scrubbing) on what the index pass kept."""
    f = Filters(quality(ALL_ON))
    kept = [(text, v.text) for _, text in docs if (v := f.apply(text)).text is not None]
    assert len(kept) >= 20 and sum(a != b for a, b in kept) >= 5  # C4 or the scrubbing changed some
    assert [f.transform(text).text for text, _ in kept] == [out for _, out in kept]


def test_scrubbing_replaces_public_addresses_and_keeps_private_ones():
    f = Filters(quality({"pii": {"emails": True, "ips": True}}))
    v = f.apply("Mail bob.smith@uni-x.edu, host 8.8.8.8, router 192.168.1.1, local 127.0.0.1.")
    assert v.text == "Mail email@example.com, host 22.214.171.124, router 192.168.1.1, local 127.0.0.1."
    assert v.scrubbed == 2
    # an address that is its replacement already changes nothing and is not counted
    again = f.apply(f"Mail {v.text}, or bob@uni-x.edu")
    assert again.text == f"Mail {v.text}, or email@example.com" and again.scrubbed == 1


def test_no_text_crashes_a_filter_and_every_drop_is_named():
    f = Filters(quality(ALL_ON))
    for text in ["x", "...", "#", "\n\n\n.", "- \n- \n-", "{", "IS_ALPHA", "。" * 50, "a" * 5000, "1 2 3 4 5 6 7 8"]:
        v = f.apply(text)
        assert (v.text is None) == (v.reason is not None) and (v.reason is None or v.detail), (text, v)


def test_the_punctuation_tables_are_datatroves():
    from datatrove.utils.text import PUNCTUATION, TERMINAL_PUNCTUATION

    from spark_jobs import punctuation

    assert frozenset(PUNCTUATION) == punctuation.PUNCTUATION
    assert sorted(punctuation.TERMINAL_PUNCTUATION) == sorted(TERMINAL_PUNCTUATION)
