"""The run page's chart of a mixture night's realised shares (stoker/reports/mixplot.py): a stacked bar per window
and for the night, each segment as wide as its share, and a tick where each target share ends."""

from __future__ import annotations

import re

import pytest

from stoker.reports.mixplot import mixture_svg

pytestmark = pytest.mark.unit


def test_each_segment_is_as_wide_as_its_share_and_the_targets_are_marked():
    mix = {"targets": {"web": 0.6, "code": 0.3, "papers": 0.1}, "window_steps": 100,
           "windows": [{"steps": [1, 100], "token_shares": {"web": 0.5, "code": 0.4, "papers": 0.1}},
                       {"steps": [101, 150], "token_shares": {"web": 0.7, "code": 0.2, "papers": 0.1}}],
           "realised": {"token_shares": {"web": 0.6, "code": 0.3, "papers": 0.1}}}
    svg = mixture_svg(mix, width=720)
    span = 720 - 120 - 20
    widths = [float(w) for w in re.findall(r"<rect x='[\d.]+' y='\d+' width='([\d.]+)'", svg)]
    assert len(widths) == 9  # 3 components x (2 windows + the night); sorted by name: code, papers, web
    assert widths[:3] == [round(span * s, 1) for s in (0.4, 0.1, 0.5)]
    assert "code in steps 101-150: 20.00% of label tokens (target 30.00%)" in svg
    ticks = [float(x) for x in re.findall(r"<line x1='([\d.]+)'", svg)]
    assert ticks == [120 + round(span * a, 1) for a in (0.3, 0.4, 1.0)]
    assert "steps 1-100" in svg and "the night" in svg
