"""Consumer lag of a run: the arithmetic the sensors, the trainer and ``stoker runs`` share (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stoker.exceptions import StokerError


@dataclass(frozen=True, slots=True)
class PartitionLag:
    partition: int
    end: int
    committed: int | None
    lag: int


@dataclass(frozen=True, slots=True)
class LagReport:
    partitions: tuple[PartitionLag, ...]
    tokens_per_message: int
    total_messages: int
    """Offsets the run spans (end - start summed): the denominator of % consumed."""

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def lag_tokens(self) -> int:
        return self.lag * self.tokens_per_message

    @property
    def consumed_fraction(self) -> float:
        return 1.0 if self.total_messages == 0 else 1.0 - self.lag / self.total_messages

    def describe(self) -> str:
        parts = ", ".join(f"p{p.partition}={p.lag}" for p in self.partitions)
        return (
            f"lag {self.lag} messages ({self.lag_tokens} tokens), "
            f"{100 * self.consumed_fraction:.1f}% consumed [{parts}]"
        )


def compute_lag(
    end: Mapping[int, int],
    committed: Mapping[int, int | None],
    start: Mapping[int, int] | None = None,
    tokens_per_message: int = 0,
) -> LagReport:
    """Lag per partition = end - committed (or end - start when the group committed nothing).

    Offsets count Kafka's transaction markers too, so lag in offsets is an upper bound of lag in
    messages that reaches 0 exactly when the group has committed the end offset. A committed
    offset past the end (a topic recreated under the group) is an error, not a negative lag.
    """
    start = start or {}
    rows = []
    for p in sorted(end):
        e, s, c = end[p], start.get(p, 0), committed.get(p)
        pos = s if c is None else c
        if pos > e:
            raise StokerError(f"partition {p}: committed offset {pos} is past the end offset {e} (topic recreated?)")
        rows.append(PartitionLag(partition=p, end=e, committed=c, lag=e - max(pos, s)))
    total = sum(end[p] - start.get(p, 0) for p in end)
    return LagReport(partitions=tuple(rows), tokens_per_message=tokens_per_message, total_messages=total)
