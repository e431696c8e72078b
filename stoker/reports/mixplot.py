"""A mixture night's realised shares for the run's page in the Airflow UI: one stacked bar per window of optimizer
steps (``mix.window_steps``) and one for the night, each component's label-token share a segment, the target
share a tick above it. Plain SVG, as :mod:`stoker.reports.dropplot`: the API server draws it without a plotting
library. The figures are the train summary's ``mixture`` block (training/data/mixture_source.py)."""

from __future__ import annotations

import html
from typing import Any

COLORS = ("#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#c62828", "#00838f", "#5d4037", "#9e9d24")


def mixture_svg(mix: dict[str, Any], width: int = 720, bar: int = 18) -> str:
    targets: dict[str, float] = mix["targets"]
    names = sorted(targets)
    color = {k: COLORS[i % len(COLORS)] for i, k in enumerate(names)}
    rows = [(f"steps {w['steps'][0]}-{w['steps'][1]}", w["token_shares"]) for w in mix["windows"]]
    rows.append(("the night", mix["realised"]["token_shares"]))
    label, right, top = 120, 20, 14
    span = width - label - right
    height = top + bar * len(rows) + 6
    out = [f"<svg role='img' aria-label='realised token shares per window of steps' width='{width}' "
           f"height='{height}' viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg' font-size='12' "
           "font-family='system-ui,sans-serif'>"]
    at = 0.0
    for k in names:  # the targets: a tick where each component's segment should end
        at += targets[k]
        x = label + round(span * at, 1)
        out.append(f"<line x1='{x}' y1='2' x2='{x}' y2='{height - 2}' stroke='#222' stroke-dasharray='3,3'>"
                   f"<title>{html.escape(f'target: up to {k}, {100 * at:.1f}%')}</title></line>")
    for i, (name, shares) in enumerate(rows):
        y, x = top + i * bar, float(label)
        out.append(f"<text x='{label - 8}' y='{y + bar - 5}' text-anchor='end'>{html.escape(name)}</text>")
        for k in names:
            share = float(shares.get(k, 0.0))
            w = round(span * share, 1)
            tip = html.escape(f"{k} in {name}: {100 * share:.2f}% of label tokens (target {100 * targets[k]:.2f}%)")
            out.append(f"<rect x='{x}' y='{y + 2}' width='{w}' height='{bar - 4}' fill='{color[k]}'>"
                       f"<title>{tip}</title></rect>")
            x += w
    out.append("</svg>")
    legend = " · ".join(f"<span style='color:{color[k]}'>■</span> {html.escape(k)} {100 * targets[k]:.1f}%"
                        for k in names)
    return "".join(out) + f"<p>{legend} (target; dashed: where each target share ends)</p>"
