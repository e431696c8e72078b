"""The ``quality:`` block: what is on by default, the errors a bad value gives, and how a night's drops are
grouped by the step that dropped them."""

from __future__ import annotations

import pytest

from stoker.config.corpus import load_corpus
from stoker.exceptions import ConfigError
from stoker.paths import REPO_ROOT
from stoker.run.reasons import by_step, step_of
from tests.support.quality_oracle import quality

pytestmark = pytest.mark.unit


def test_nothing_is_filtered_or_scrubbed_unless_a_corpus_turns_it_on():
    q = quality({})
    assert not q.active and not q.filters_on
    assert not load_corpus(REPO_ROOT / "corpora" / "sample.yaml").quality.active
    assert quality({"pii": {"emails": True}}).active and not quality({"pii": {"emails": True}}).filters_on


@pytest.mark.parametrize("block, names", [
    ({"gopher_quality": {"min_alpha_words_ratio": 1.5}}, "quality.gopher_quality.min_alpha_words_ratio = 1.5"),
    ({"fineweb": {"short_line_thr": -0.1}}, "quality.fineweb.short_line_thr = -0.1"),
    ({"c4": {"min_num_sentences": -3}}, "quality.c4.min_num_sentences = -3"),
    ({"language": "xx"}, "quality.language = 'xx'"),
    ({"language_id": {"languages": ["EN"]}}, "quality.language_id.languages = ['EN']"),
    ({"language_id": {"threshold": 2}}, "quality.language_id.threshold = 2"),
    ({"gopher_quality": {"min_doc_words": 10, "max_doc_words": 5}}, "quality.gopher_quality.min_doc_words = 10"),
    ({"c4": {"enabled": "yes"}}, "quality.c4.enabled = 'yes'"),
    ({"fineweb": {"enable": True}}, "quality.fineweb: unknown key(s) ['enable']"),
])
def test_a_bad_value_names_the_field_the_value_and_the_limit(block, names):
    with pytest.raises(ConfigError) as e:
        quality(block)
    assert names in str(e.value)


def test_drops_are_grouped_by_the_step_that_made_them_in_the_stages_order():
    dropped = {"duplicate": 2, "gopher_short_doc": 5, "invalid_json": 1, "top_2_gram": 3, "dup_line_frac": 1,
               "line_punct_ratio": 4, "curly_bracket": 1, "empty_text": 1, "duplicated_5_n_grams": 2, "empty": 1}
    grouped = by_step(dropped)
    assert list(grouped) == ["read", "clean", "gopher_repetition", "gopher_quality", "c4", "fineweb", "dedup"]
    assert grouped["gopher_repetition"] == {"dup_line_frac": 1, "duplicated_5_n_grams": 2, "top_2_gram": 3}
    assert sum(n for reasons in grouped.values() for n in reasons.values()) == sum(dropped.values())
    assert step_of("empty") == "fineweb" and step_of("empty_text") == "clean" and step_of("new_reason") == "other"


def test_the_web_example_runs_finewebs_chain_with_scrubbing():
    example = load_corpus(REPO_ROOT / "corpora" / "examples" / "web_quality.yaml").quality
    assert example.filters_on and example.pii.emails and example.pii.ips
    assert all(f.enabled for f in (example.language_id, example.gopher_repetition, example.gopher_quality,
                                   example.c4, example.fineweb))
    assert example.language_id.languages == ["en"] and example.language_id.threshold == 0.65
    assert not example.c4.filter_no_terminal_punct  # FineWeb's setting


def test_a_night_whose_drop_rate_jumps_above_its_recent_nights_is_flagged_and_the_step_named():
    from stoker.run.reasons import drop_rate_alarm

    usual = [({"invalid_json": 2, "gopher_short_doc": 100 + i, "duplicate": 5}, 1000) for i in range(10)]
    calm = drop_rate_alarm({"invalid_json": 3, "gopher_short_doc": 110, "duplicate": 4}, 1000, usual)
    assert calm["flagged"] is False and calm["recent_nights"] == 7 and 0.1 < calm["recent_median"] < 0.12
    jump = drop_rate_alarm({"invalid_json": 2, "gopher_short_doc": 104, "near_duplicate": 400}, 1000, usual)
    assert jump["flagged"] and "dedup rose most (+39.5 points)" in jump["why"] and "50.6% of records" in jump["why"]
    young = drop_rate_alarm({"invalid_json": 900}, 1000, usual[:2])  # too few nights to compare with
    assert young["flagged"] is False and young["recent_nights"] == 2
    assert drop_rate_alarm({}, 0, usual)["flagged"] is False  # an empty night is no jump


def test_the_pack_pass_takes_every_reason_but_reading_cleaning_and_dedup_for_a_filters_drop():
    from stoker.run.reasons import filter_reason

    assert all(filter_reason(r) for r in ("language", "gopher_short_doc", "top_2_gram", "curly_bracket",
                                          "line_punct_ratio", "a_reason_of_a_later_filter"))
    assert not any(filter_reason(r) for r in ("invalid_json", "too_short", "empty_text", "duplicate",
                                              "near_duplicate"))
