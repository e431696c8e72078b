"""A training session's counters: one step's stats (:class:`StepStats`) and the run-wide
:class:`Progress`, a Stateful part saved in the checkpoint so a resumed session continues it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class StepStats:
    """One optimizer micro-step, summed over every rank."""

    step: int
    loss: float
    rows: int
    tokens: int
    seconds: float
    data_wait: float
    keys: list[bytes] = field(default_factory=list)
    """This rank's sequence keys."""
    local_tokens: int = 0
    """This rank's label tokens (the rest of the fields are summed over every rank)."""
    optimizer_step: bool = True
    """The optimizer stepped (the last micro-step of a gradient-accumulation window)."""
    padding: int = 0
    """Fully masked micro-steps run after the data ended, to close a partial accumulation window (the
    step's other fields are then 0: it trained no sequence)."""


LAST_STEPS = 10
"""Steps the summary's ``last_loss`` averages over."""


@dataclass(slots=True)
class Progress:
    """Run-wide counters, saved in the checkpoint, so a resumed session continues them."""

    publication: str
    """The manifest publication the counters (and the checkpoint's offsets) belong to."""
    step: int = 0
    first_loss: float | None = None
    last_loss: float | None = None
    sequences: int = 0
    tokens: int = 0
    session_sequences: int = 0
    """This session's share (not saved: a new session starts it at 0)."""
    session_tokens: int = 0
    rank_tokens: int = 0
    """This rank's share of ``session_tokens``."""
    recent: list[tuple[float, int]] = field(default_factory=list)
    """(loss, label tokens) of the last ``LAST_STEPS`` steps: ``last_loss`` is their token-weighted
    mean, so a final step over a few real tokens (a padded tail) does not stand for the run's end."""

    def update(self, s: StepStats) -> None:
        self.step = s.step
        self.first_loss = s.loss if self.first_loss is None else self.first_loss
        self.recent = [*self.recent, (s.loss, s.tokens)][-LAST_STEPS:]
        weight = sum(t for _, t in self.recent)
        self.last_loss = sum(loss * t for loss, t in self.recent) / weight if weight else s.loss
        self.sequences += s.rows
        self.tokens += s.tokens
        self.session_sequences += s.rows
        self.session_tokens += s.tokens
        self.rank_tokens += s.local_tokens

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "first_loss": self.first_loss, "last_loss": self.last_loss,
                "sequences": self.sequences, "tokens": self.tokens, "manifest": self.publication,
                "recent": self.recent}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.first_loss = state["step"], state.get("first_loss")
        self.last_loss = state.get("last_loss")
        self.recent = [(float(loss), int(t)) for loss, t in state.get("recent", [])]
        self.sequences, self.tokens = state.get("sequences", 0), state.get("tokens", 0)
