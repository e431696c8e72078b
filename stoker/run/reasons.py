"""Drop reasons: the step of the Spark stage behind each reason code, a night's drops grouped by
step, and the alarm for a night whose drop rate jumps.
"""

from __future__ import annotations

from stoker.config.quality import FILTERS

STEPS: dict[str, tuple[str, ...]] = {
    "read": ("invalid_utf8", "invalid_json", "missing_text", "invalid_unicode", "corrupt_file"),
    "clean": ("empty_text", "too_short", "too_long"),
    **{f.STEP: f.REASONS for f in FILTERS},
    "dedup": ("duplicate", "near_duplicate"),
}
"""The step of the Spark stage behind each drop reason, in the stage's order: reading, cleaning, the quality
filters (each names its own reasons: :data:`stoker.config.quality.FILTERS`), dedup."""


def step_of(reason: str) -> str:
    """The step of :data:`STEPS` that drops by ``reason``; ``other`` for a reason no step names."""
    for step, reasons in STEPS.items():
        if reason in reasons:
            return step
    return "other"


def filter_reason(reason: str) -> bool:
    """Whether ``reason`` is a drop of the ``quality:`` filters (any step but reading, cleaning and dedup: an
    unknown reason counts as one, so the pack pass never takes such a record for kept)."""
    return step_of(reason) not in ("read", "clean", "dedup")


def by_step(dropped: dict[str, int]) -> dict[str, dict[str, int]]:
    """A night's drop counts grouped by the step that dropped them, in the stage's order."""
    out: dict[str, dict[str, int]] = {}
    for reason, n in sorted(dropped.items(), key=lambda kv: (_ORDER.index(step_of(kv[0])), kv[0])):
        out.setdefault(step_of(reason), {})[reason] = n
    return out


_ORDER = [*STEPS, "other"]


ALARM_NIGHTS, ALARM_MIN_NIGHTS, ALARM_FLOOR = 7, 3, 0.10


def drop_rate_alarm(dropped: dict[str, int], docs_in: int, earlier: list[tuple[dict[str, int], int]]) -> dict:
    """Whether a night's drop rate jumps far above its corpus's recent nights (``earlier``: their drops by reason
    and records read, newest last; the last ``ALARM_NIGHTS`` count). Flagged when the rate exceeds the recent
    median by more than max(``ALARM_FLOOR``, 3 x the median absolute deviation), with at least
    ``ALARM_MIN_NIGHTS`` earlier nights to compare with; the step whose share rose most is named."""
    import statistics

    def rate(d: dict[str, int], n: int) -> float:
        return sum(d.values()) / n if n else 0.0

    recent = [(d, n) for d, n in earlier if n][-ALARM_NIGHTS:]
    now = rate(dropped, docs_in)
    out: dict = {"rate": round(now, 4), "recent_nights": len(recent), "flagged": False}
    if len(recent) < ALARM_MIN_NIGHTS or not docs_in:
        return out
    rates = [rate(d, n) for d, n in recent]
    median = statistics.median(rates)
    limit = median + max(ALARM_FLOOR, 3 * statistics.median(abs(r - median) for r in rates))
    out.update(recent_median=round(median, 4), limit=round(limit, 4), flagged=now > limit)
    if out["flagged"]:
        steps = by_step(dropped)
        before = [by_step(d) for d, _ in recent]
        rise = {s: sum(r.values()) / docs_in - statistics.median(sum(b.get(s, {}).values()) / n
                                                                 for b, (_, n) in zip(before, recent, strict=True))
                for s, r in steps.items()}
        step = max(rise, key=rise.__getitem__)
        out["why"] = (f"{100 * now:.1f}% of records dropped against a median of {100 * median:.1f}% over the last "
                      f"{len(recent)} nights (limit {100 * limit:.1f}%); {step} rose most "
                      f"(+{100 * rise[step]:.1f} points)")
    return out
