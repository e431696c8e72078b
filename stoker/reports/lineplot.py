"""A model line's nights as a small SVG chart, for the run's page in the Airflow UI: each night's bits per byte
on its own held-out documents, coloured by the gate's (or a person's) decision, the blessed nights joined by a
line, the head ringed. Plain SVG text: the API server draws it without a plotting library."""

from __future__ import annotations

import html
import math
from typing import Any

COLORS = {"promoted": "#2e7d32", "held": "#ef6c00", "rolled_back": "#c62828"}
"""A decision's colour; any other (a branch, pending, passed over) is grey."""


def _figure(row: dict[str, Any]) -> float | None:
    v = row.get("bpb")
    return float(v) if isinstance(v, float | int) and math.isfinite(v) else None


def line_svg(line: str, rows: list[dict[str, Any]], width: int = 720, height: int = 240) -> str:
    """``rows``: :func:`stoker.reports.catalog.line_nights` of ``line``, in join order."""
    points = [(i, r, v) for i, r in enumerate(rows) if (v := _figure(r)) is not None]
    if not points:
        return f"<p>No night of line {html.escape(line)} has held-out figures yet.</p>"
    left, right, top, bottom = 60, 20, 20, 60
    lo, hi = min(v for *_, v in points), max(v for *_, v in points)
    span = (hi - lo) or 1.0

    def xy(i: int, v: float) -> tuple[float, float]:
        x = left + (width - left - right) * (i / max(1, len(rows) - 1) if len(rows) > 1 else 0.5)
        return round(x, 1), round(top + (height - top - bottom) * (hi - v) / span, 1)

    title = f"held-out bits per byte of line {line}'s nights"
    out = [f"<svg role='img' aria-label='{html.escape(title)}' width='{width}' height='{height}' "
           f"viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg' font-size='11' "
           "font-family='system-ui,sans-serif'>",
           f"<line x1='{left}' y1='{height - bottom}' x2='{width - right}' y2='{height - bottom}' stroke='#999'/>",
           f"<text x='4' y='{top + 4}'>{hi:.3f}</text><text x='4' y='{height - bottom}'>{lo:.3f}</text>"]
    blessed = [xy(i, v) for i, r, v in points if r.get("decision") == "promoted"]
    if len(blessed) > 1:
        out.append("<polyline fill='none' stroke='#2e7d32' stroke-width='1.5' points='"
                   + " ".join(f"{x},{y}" for x, y in blessed) + "'/>")
    for i, r, v in points:
        x, y = xy(i, v)
        decision = r.get("decision") or "-"
        who = r.get("decided_by") or "gate"
        tip = html.escape(f"{r['night']}: {v:.4f} bits/byte, {decision} by {who}")
        if r.get("head"):
            out.append(f"<circle cx='{x}' cy='{y}' r='8' fill='none' stroke='#1565c0' stroke-width='2'/>")
        out.append(f"<circle cx='{x}' cy='{y}' r='5' fill='{COLORS.get(decision, '#9e9e9e')}'><title>{tip}</title>"
                   "</circle>")
        out.append(f"<text x='{x}' y='{height - bottom + 14}' text-anchor='end' transform='rotate(-30 {x} "
                   f"{height - bottom + 14})'>{html.escape(str(r['night']))}</text>")
    out.append("</svg>")
    legend = " · ".join(f"<span style='color:{c}'>●</span> {d}" for d, c in COLORS.items())
    return "".join(out) + f"<p>{legend} · ringed: the head. Lower is better.</p>"
