"""The quarantine: every dropped record with its reason, its place and its exact bytes (``quarantine/``), and
the first few of each reason by place (``quarantine_samples.json``), small enough for the run's page to show
without reading the quarantine itself."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

from stoker.files import atomic_write_json
from stoker.layout import RunLayout

SAMPLES_PER_REASON = 3
"""Quarantined records shown per reason on the run's page."""
PREVIEW_CHARS = 600
"""A sample's text is cut here (its bytes in ``quarantine/`` are whole)."""


def write_quarantine(rejected: Any, run: RunLayout) -> Path:
    """``rejected``: a frame of (source, pos, reason, detail, raw). A duplicate's raw is null: its bytes stay
    at its place in the source, and its detail names the kept copy."""
    from pyspark.sql import functions as F

    (
        rejected.select("source", "pos", "reason", "detail", F.base64("raw").alias("raw_base64"))
        .coalesce(1)
        .write.mode("overwrite")
        .json(str(run.quarantine))
    )
    atomic_write_json(run.quarantine_samples, samples(rejected))
    return run.quarantine


def _first_per_reason(rows: Any, n: int) -> list[tuple[str, str, int, str, bytes | None]]:
    """One partition's first ``n`` records of each reason by (source, pos)."""
    best: dict[str, list[tuple[str, int, str, bytes | None]]] = {}
    for r in rows:
        kept = best.setdefault(r["reason"], [])
        if len(kept) < n or (r["source"], r["pos"]) < kept[-1][:2]:
            bisect.insort(kept, (r["source"], r["pos"], r["detail"] or "", r["raw"]), key=lambda k: k[:2])
            del kept[n:]
    return [(reason, *item) for reason, kept in best.items() for item in kept]


def samples(rejected: Any, n: int = SAMPLES_PER_REASON) -> dict[str, Any]:
    """The first ``n`` records of each reason by (source, pos): one pass, no shuffle (each partition keeps its
    first ``n`` per reason, the driver the first of those)."""
    picked = (
        rejected.select("source", "pos", "reason", "detail", "raw")
        .rdd.mapPartitions(lambda rows: _first_per_reason(rows, n))
        .collect()
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for reason, source, pos, detail, raw in sorted(picked, key=lambda r: (r[0], r[1], r[2])):
        if len(out.setdefault(reason, [])) < n:
            out[reason].append(preview(source, pos, detail, raw))
    return {"per_reason": n, "samples": dict(sorted(out.items()))}


def preview(source: str, pos: int, detail: str, raw: bytes | None) -> dict[str, Any]:
    """A sample as the page shows it: its place, detail and the start of its bytes as text (bad UTF-8 shown as
    U+FFFD); a duplicate has no bytes here."""
    text = None if raw is None else bytes(raw).decode("utf-8", errors="replace")
    return {
        "source": source,
        "pos": pos,
        "detail": detail,
        "bytes": None if raw is None else len(raw),
        "preview": None if text is None else text[:PREVIEW_CHARS],
        "cut": text is not None and len(text) > PREVIEW_CHARS,
    }
