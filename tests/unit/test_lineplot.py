"""The run page's plot of a model line: each night's held-out figure, coloured by its decision, the head
ringed, the blessed nights joined; no figures, a sentence instead."""

from __future__ import annotations

import re

import pytest

from stoker.reports.lineplot import COLORS, line_svg

pytestmark = pytest.mark.unit


def _row(night: str, bpb, decision: str | None, head: bool = False, by: str = "gate") -> dict:
    return {"night": night, "bpb": bpb, "decision": decision, "decided_by": by, "head": head}


def test_each_night_is_a_point_coloured_by_its_decision_and_the_head_is_ringed():
    rows = [_row("2026-12-01.a", 3.2, "promoted"), _row("2026-12-02.a", 3.9, "held", by="ann (Airflow review)"),
            _row("2026-12-03.<b>", 3.0, "promoted", head=True), _row("2026-12-04.a", float("nan"), "held")]
    svg = line_svg("l", rows)
    assert svg.startswith("<svg role='img' aria-label='held-out bits per byte of line l&#x27;s nights'")
    fills = re.findall(r"<circle [^>]*r='5' fill='([^']+)'", svg)
    assert fills == [COLORS["promoted"], COLORS["held"], COLORS["promoted"]]  # no point for a NaN figure
    assert svg.count("r='8'") == 1 and "2026-12-03.&lt;b&gt;" in svg  # the head; names escaped
    assert "2026-12-02.a: 3.9000 bits/byte, held by ann (Airflow review)" in svg
    # the blessed nights are joined: the lowest figure at the bottom, the highest at the top
    points = re.search(r"<polyline[^>]*points='([^']+)'", svg).group(1).split()
    assert len(points) == 2 and float(points[1].split(",")[1]) > float(points[0].split(",")[1])
    assert ">3.900</text>" in svg and ">3.000</text>" in svg


def test_a_line_without_figures_says_so():
    assert line_svg("l", [_row("2026-12-01.a", None, None)]) == "<p>No night of line l has held-out figures yet.</p>"
