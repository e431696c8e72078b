"""A night's drops for the run's page in the Airflow UI: a bar per reason, grouped and coloured by the step of
the Spark stage that dropped it, and a few quarantined records of each reason (``quarantine_samples.json``,
written by spark_jobs/quarantine.py). Plain SVG and HTML: the API server draws them without a plotting
library."""

from __future__ import annotations

import html
from typing import Any

from stoker.config.quality import FILTERS
from stoker.run.reasons import by_step

STEP_COLORS = {
    "read": "#6d4c41",
    "clean": "#546e7a",
    **{f.STEP: f.COLOR for f in FILTERS},  # each quality filter names its own
    "dedup": "#1565c0",
    "other": "#9e9e9e",
}


def drops_svg(dropped: dict[str, int], docs_in: int, width: int = 720, bar: int = 18) -> str:
    """One horizontal bar per drop reason, its length the count (on one scale), labelled with the count and its
    share of the night's records; the steps in the stage's order."""
    rows = [(step, reason, n) for step, reasons in by_step(dropped).items() for reason, n in reasons.items()]
    if not rows:
        return "<p>No record was dropped.</p>"
    label, right, top = 230, 150, 6
    height, most = top + bar * len(rows) + 6, max(n for *_, n in rows) or 1
    title = "records dropped by reason"
    out = [
        f"<svg role='img' aria-label='{title}' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        "xmlns='http://www.w3.org/2000/svg' font-size='12' font-family='system-ui,sans-serif'>"
    ]
    for i, (step, reason, n) in enumerate(rows):
        y, w = top + i * bar, max(1.0, round((width - label - right) * n / most, 1))
        share = f"{100 * n / docs_in:.2f}%" if docs_in else "-"
        tip = html.escape(f"{reason} ({step}): {n} of {docs_in} records, {share}")
        out.append(
            f"<text x='{label - 8}' y='{y + bar - 5}' text-anchor='end'>{html.escape(reason)}</text>"
            f"<rect x='{label}' y='{y + 2}' width='{w}' height='{bar - 4}' fill='{STEP_COLORS[step]}'>"
            f"<title>{tip}</title></rect>"
            f"<text x='{label + w + 6}' y='{y + bar - 5}'>{n:,} ({share})</text>"
        )
    out.append("</svg>")
    legend = " · ".join(f"<span style='color:{STEP_COLORS[s]}'>■</span> {s}" for s in by_step(dropped))
    return "".join(out) + f"<p>{legend}</p>"


def samples_html(payload: dict[str, Any] | None, dropped: dict[str, int]) -> str:
    """Per reason, its first quarantined records by place: source file, position, detail and the start of the
    record's bytes as text."""
    if payload is None:
        return "<p>This run has no quarantine samples (it ran before Stoker wrote them): see its quarantine.</p>"
    got = payload.get("samples") or {}
    parts = []
    for step, reasons in by_step(dropped).items():
        for reason in reasons:
            rows = got.get(reason) or []
            items = "".join(_sample(r) for r in rows) or "<li>none sampled</li>"
            parts.append(
                f"<h4 id='samples-{html.escape(reason)}'>{html.escape(reason)} "
                f"<small>({html.escape(step)}, first {len(rows)} of {dropped[reason]:,})</small></h4>"
                f"<ul>{items}</ul>"
            )
    return "".join(parts) or "<p>No record was dropped.</p>"


def _sample(r: dict[str, Any]) -> str:
    where = html.escape(f"{r['source']} at {r['pos']}")
    detail = f" — {html.escape(r['detail'])}" if r.get("detail") else ""
    if r.get("preview") is None:
        return f"<li><code>{where}</code>{detail}</li>"
    cut = f" … ({r['bytes']:,} bytes in all)" if r.get("cut") else f" ({r['bytes']:,} bytes)"
    return (
        f"<li><code>{where}</code>{detail}<pre class='sample'>{html.escape(r['preview'])}{html.escape(cut)}</pre></li>"
    )
