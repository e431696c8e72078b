"""The run page's drop chart and quarantine samples: a bar per reason in the stage's order with its count and
share, every reason listed with what was sampled, and the records' text escaped (a hostile corpus's markup is
shown, never run)."""

from __future__ import annotations

import re

import pytest

from spark_jobs.quarantine import _first_per_reason, preview
from stoker.reports.dropplot import drops_svg, samples_html

pytestmark = pytest.mark.unit

DROPPED = {"duplicate": 4, "invalid_json": 2, "gopher_short_doc": 30, "language": 10, "too_short": 1}


def test_a_bar_per_reason_in_the_stages_order_with_its_count_and_share():
    svg = drops_svg(DROPPED, docs_in=200)
    labels = re.findall(r"text-anchor='end'>([a-z_]+)</text>", svg)
    assert labels == ["invalid_json", "too_short", "language", "gopher_short_doc", "duplicate"]
    widths = dict(zip(labels, (float(w) for w in re.findall(r"<rect x='\d+' y='[\d.]+' width='([\d.]+)'", svg)),
                      strict=True))
    assert widths["gopher_short_doc"] == 720 - 230 - 150  # the largest spans the plot, the others on its scale
    assert round(widths["gopher_short_doc"] / widths["language"], 2) == 3.0
    assert "30 (15.00%)" in svg and "1 (0.50%)" in svg
    assert "aria-label='records dropped by reason'" in svg
    assert drops_svg({}, docs_in=5) == "<p>No record was dropped.</p>"


def test_samples_are_listed_per_reason_escaped_and_a_duplicate_shows_its_place_only():
    payload = {"per_reason": 3, "samples": {
        "invalid_json": [preview("s3://b/part-0.jsonl", 10, "Expecting value", b"<script>alert(1)</script>")],
        "duplicate": [preview("s3://b/part-1.jsonl", 99, "same text as s3://b/part-0.jsonl at 0", None)],
        "gopher_short_doc": [preview("f", 0, "12 words < min_doc_words 50", b"\xffab" + b"x" * 700)],
    }}
    page = samples_html(payload, DROPPED)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "s3://b/part-1.jsonl at 99</code> — same text as s3://b/part-0.jsonl at 0</li>" in page
    assert "\ufffdab" + "x" * 597 + " … (703 bytes in all)" in page
    # every dropped reason has its heading, also one nothing was sampled for
    assert re.findall(r"<h4 id='samples-([a-z_]+)'", page) == [
        "invalid_json", "too_short", "language", "gopher_short_doc", "duplicate"]
    assert "language <small>(language_id, first 0 of 10)</small></h4><ul><li>none sampled</li>" in page
    assert "without" not in samples_html(payload, {}) and "before Stoker" in samples_html(None, DROPPED)


def test_a_partition_keeps_the_first_records_of_each_reason_by_place():
    rows = [{"source": s, "pos": p, "reason": r, "detail": "", "raw": b"x"}
            for s, p, r in [("b", 5, "x"), ("a", 9, "x"), ("b", 1, "x"), ("a", 10, "y"), ("a", 2, "x"), ("c", 0, "x")]]
    got = sorted((reason, src, pos) for reason, src, pos, *_ in _first_per_reason(iter(rows), 3))
    assert got == [("x", "a", 2), ("x", "a", 9), ("x", "b", 1), ("y", "a", 10)]
