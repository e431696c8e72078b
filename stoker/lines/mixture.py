"""A night over several corpora at target shares (issue 35): how many rows each component trains, and the order
they are dealt in, so that the shares a model saw are the shares asked for.

Pure logic, no I/O: the rule the trainer deals a mixture night by (training/data/mixture_source.py), tested on its
own (tests/unit/test_mixture.py); a night's plan of it is :mod:`stoker.lines.mix_plan`'s.

* **The night's size** (:func:`night_rows`). Each component ``i`` (a corpus of the line, or ``replay``) has
  ``available[i]`` rows published for the night and a target share ``s[i]``. With ``when_short: shrink`` the
  night is the largest that trains no row twice: ``T = min(available[i] / s[i])``; the component that binds is
  trained whole, the others in part, and what they leave is counted and named (it stays in its topic; no row
  leaves the line silently). With ``when_short: repeat`` the night trains every row of the largest component
  once, ``T = max(available[i] / s[i])``, and a smaller one repeats its rows, up to ``max_repeats`` uses of each;
  where even that is short the night shrinks to what the cap allows. ``T`` is split by Hamilton's method
  (largest remainders, ties by name), so the rows sum to ``T`` exactly. The shares are of rows, and a row is
  ``seq_len + 1`` token ids, so they are the night's token shares up to padding: a pack task pads its last row
  only, which moves a component's label-token share by well under a point on a night of any real size (8 rows of
  64 tokens, one of them two-thirds padding, moved one by 0.54 points in a test; the trainer reports both).
* **The order** (:func:`deal`). Row slots are dealt by earliest deadline first over each component's
  proportionate-fair windows (:func:`_next_slot`). Every prefix of the night is then within one row of its
  share for every component (``|dealt[i] - n * w[i]| < 1``, ``w`` the night's realised weights;
  tests/unit/test_mixture.py searches for a counterexample), so any window of steps is too, and the order
  depends only on the rows: not on
  the world size, the micro-batch or where a kill fell. ``stratified`` deals each batch of ``batch`` slots on
  its own by Hamilton's method, so each batch holds ``floor`` or ``ceil`` of ``batch * w[i]`` (MosaicML's
  "stratified" batching), for as long as every component has rows left.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from stoker.exceptions import ConfigError

SHORT_POLICIES = ("shrink", "repeat")
REPLAY = "replay"
"""The component name of the line's replayed rows (``train.replay``), mixed as one more source."""
SHARE_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class Mix:
    """A line's ``mix:``: target shares per component, the repeat cap and what a short source does."""

    shares: dict[str, float]
    """Target share of each component (a corpus of the line; ``replay`` as a component is not built yet), summing
    to 1: ``{web: 0.6, code: 0.3, papers: 0.1}``. Shares of rows, which are tokens too: every row is ``seq_len + 1``
    ids."""
    max_repeats: float = 1.0
    """How many times a row may be used in one night (``when_short: repeat``); 1: never twice."""
    when_short: str = "shrink"
    """When a component has fewer rows than its share of the night: ``shrink`` the night to what it allows (the
    others' rest stays in their topics, named), or ``repeat`` its rows up to ``max_repeats`` uses each."""
    stratified: bool = False
    """Deal each batch by itself at the target shares (else: the whole night, every prefix within a row)."""
    window_steps: int = 100
    """The accounting's window: realised shares are reported per this many optimizer steps, and for the night."""

    def __post_init__(self) -> None:
        if not self.shares:
            raise ConfigError("mix.shares is empty: name each corpus of the line with its share, e.g. {web: 0.6, "
                              "code: 0.3, papers: 0.1}")
        for name, share in self.shares.items():
            if not 0 < share <= 1:
                raise ConfigError(f"mix.shares.{name} = {share!r}: must be in (0, 1]")
        total = sum(self.shares.values())
        if abs(total - 1) > SHARE_SUM_TOLERANCE:
            raise ConfigError(f"mix.shares sum to {total!r}: they must sum to 1 (within {SHARE_SUM_TOLERANCE}); "
                              "scale them or add the missing component")
        if self.when_short not in SHORT_POLICIES:
            raise ConfigError(f"mix.when_short = {self.when_short!r}: must be one of {', '.join(SHORT_POLICIES)}")
        if not 1 <= self.max_repeats <= 1000:
            raise ConfigError(f"mix.max_repeats = {self.max_repeats!r}: must be in [1, 1000] (1: no row twice)")
        if not 1 <= self.window_steps <= 1_000_000:
            raise ConfigError(f"mix.window_steps = {self.window_steps!r}: must be in [1, 1000000] optimizer steps")


@dataclass(slots=True)
class NightMix:
    """What a night trains of each component, and why it is that size."""

    rows: dict[str, int]
    available: dict[str, int]
    binding: str
    """The component that set the night's size (trained whole, or up to its repeat cap)."""
    left: dict[str, int] = field(default_factory=dict)
    """Rows of a component the night does not train (``shrink``): they stay in their topic, named here."""
    repeated: dict[str, int] = field(default_factory=dict)
    """Rows trained beyond each component's own (``repeat``): second and later uses."""

    @property
    def total(self) -> int:
        return sum(self.rows.values())

    def shares(self) -> dict[str, float]:
        t = self.total
        return {k: (v / t if t else 0.0) for k, v in self.rows.items()}


def hamilton(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """``total`` split in proportion to ``weights`` by largest remainders (ties by name): sums to ``total``."""
    wsum = sum(weights.values())
    quotas = {k: total * w / wsum for k, w in weights.items()}
    out = {k: math.floor(q) for k, q in quotas.items()}
    rest = total - sum(out.values())
    for k in sorted(quotas, key=lambda k: (-(quotas[k] - out[k]), k))[:rest]:
        out[k] += 1
    return out


def night_rows(mix: Mix, available: Mapping[str, int]) -> NightMix:
    """Rows of each component for a night whose components published ``available`` rows."""
    missing = sorted(set(mix.shares) - set(available))
    if missing:
        raise ConfigError(f"mix.shares names {missing}, which published nothing for the night: wait for them, "
                          "or let the deadline leave them out and say so")
    unmixed = sorted(set(available) - set(mix.shares))
    if unmixed:
        raise ConfigError(f"{unmixed} published rows for the night but mix.shares gives them no share: their rows "
                          "would leave the line untrained; give each a share")
    if any(n < 0 for n in available.values()):
        raise ValueError(f"available rows must be >= 0: {dict(available)}")
    cap = mix.max_repeats if mix.when_short == "repeat" else 1.0
    limits = {k: available[k] * cap / s for k, s in mix.shares.items()}  # the largest night each could feed
    binding = min(limits, key=lambda k: (limits[k], k))
    size = limits[binding]
    if mix.when_short == "repeat":  # every row of the largest component once, unless a cap binds first
        largest = max(mix.shares, key=lambda k: (available[k] / mix.shares[k], k))
        if available[largest] / mix.shares[largest] <= size:
            binding, size = largest, available[largest] / mix.shares[largest]
    total = math.floor(size + 1e-9)
    rows = hamilton(total, mix.shares)
    for k in rows:  # rounding may ask one row over a cap: give it back (the night is one row smaller)
        rows[k] = min(rows[k], math.floor(available[k] * cap + 1e-9))
    return NightMix(rows=rows, available=dict(available), binding=binding,
                    left={k: available[k] - rows[k] for k in rows if rows[k] < available[k]},
                    repeated={k: rows[k] - available[k] for k in rows if rows[k] > available[k]})


def deal(rows: Mapping[str, int], batch: int = 1, stratified: bool = False) -> Iterator[str]:
    """The component of each row slot of the night, in order (see the module)."""
    if batch < 1:
        raise ValueError(f"batch = {batch}: must be >= 1")
    dealer = Dealer(rows, stratified=stratified)
    while dealer.left:
        yield from dealer.batch(batch)


class Dealer:
    """The night's order from any point of it: its whole state is the rows dealt of each component (the EDF rule
    and the stratified batches both read only that), so a checkpoint that saves :meth:`state_dict` at a step
    boundary continues the same order on resume, at any world size."""

    def __init__(self, rows: Mapping[str, int], stratified: bool = False,
                 dealt: Mapping[str, int] | None = None) -> None:
        self.rows = {k: n for k, n in rows.items() if n > 0}
        self.total = sum(self.rows.values())
        self.names = sorted(self.rows)
        self.stratified = stratified
        self.dealt = dict.fromkeys(self.names, 0)
        for k, n in (dealt or {}).items():
            if not 0 <= n <= self.rows.get(k, 0):
                raise ValueError(f"dealt {k} = {n}: outside the night's [0, {self.rows.get(k, 0)}] rows of it")
            if n:
                self.dealt[k] = n

    @property
    def left(self) -> int:
        return self.total - sum(self.dealt.values())

    def batch(self, size: int) -> list[str]:
        """The next ``size`` slots (fewer at the night's end)."""
        if self.stratified:
            out = list(_in_order(self._quota(size)))
        else:
            out = []
            t = sum(self.dealt.values())
            for _ in range(min(size, self.left)):
                k = _next_slot(t, self.rows, self.dealt, self.total, self.names)
                self.dealt[k] += 1
                t += 1
                out.append(k)
            return out
        for k in out:
            self.dealt[k] += 1
        return out

    def _quota(self, size: int) -> dict[str, int]:
        """A stratified batch: Hamilton's split of ``size`` at the night's weights, what a component lacks given to
        those with the most left."""
        left = {k: self.rows[k] - self.dealt[k] for k in self.names if self.rows[k] > self.dealt[k]}
        n = min(size, sum(left.values()))
        if not n:
            return {}
        quota = hamilton(n, {k: self.rows[k] / self.total for k in left})
        quota = {k: min(q, left[k]) for k, q in quota.items()}
        short = n - sum(quota.values())
        for k in sorted(left, key=lambda k: (-(left[k] - quota[k]), k)):  # a component ran out mid-batch
            if short <= 0:
                break
            extra = min(short, left[k] - quota[k])
            quota[k] += extra
            short -= extra
        return quota

    def state_dict(self) -> dict[str, int]:
        return {k: n for k, n in self.dealt.items() if n}


def _next_slot(t: int, rows: Mapping[str, int], dealt: Mapping[str, int], total: int, names: list[str]) -> str:
    """Slot ``t``'s component by earliest deadline first over Pfair windows: the ``j``-th row of a component
    with ``r`` of the night's ``T`` rows may go no earlier than slot ``floor((j - 1) T / r)`` and must go before
    ``ceil(j T / r)``. The shares sum to one, so EDF meets every window (Baruah et al., proportionate fairness),
    and every prefix is within one row of every share: ``|dealt - t r / T| < 1``. Integers only; ``names``
    sorted, so ties go to the first name."""
    best: tuple[int, str] | None = None
    for k in names:
        j, r = dealt[k] + 1, rows[k]
        if j > r or (j - 1) * total // r > t:  # done, or its next row is not released yet
            continue
        deadline = -(-j * total // r)
        if best is None or deadline < best[0]:
            best = (deadline, k)
    assert best is not None, f"no component eligible at slot {t}: {dict(rows)}, dealt {dict(dealt)}"
    return best[1]


def _in_order(counts: Mapping[str, int]) -> Iterator[str]:
    """A batch's slots interleaved by the same rule, so each batch is mixed, not sorted."""
    live = {k: c for k, c in counts.items() if c > 0}
    dealt, total, names = dict.fromkeys(live, 0), sum(live.values()), sorted(live)
    for t in range(total):
        k = _next_slot(t, live, dealt, total, names)
        dealt[k] += 1
        yield k


def realised(slots: list[str]) -> dict[str, float]:
    """The share of each component in ``slots`` (a window of the night)."""
    out: dict[str, float] = {}
    for s in slots:
        out[s] = out.get(s, 0) + 1
    return {k: v / len(slots) for k, v in out.items()} if slots else {}


def pass_counts(sequences: Mapping[int, int], i: int) -> dict[int, int]:
    """Rows each partition gave after the first ``i`` rows of one pass over a component, by the rule
    :meth:`NightOrder.step` takes them in: the partition that gave least so far (ties: the lower one), so the
    partitions are drained level by level. In closed form, so a resume needs no replay of the night."""
    if not 0 <= i <= sum(sequences.values()):
        raise ValueError(f"row {i} of a pass over {sum(sequences.values())} rows")
    lo, hi = 0, max(sequences.values(), default=0)
    while lo < hi:  # the highest level L every partition with more than L rows has reached
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in sequences.values()) <= i:
            lo = mid
        else:
            hi = mid - 1
    counts = {p: min(n, lo) for p, n in sequences.items()}
    extra = i - sum(counts.values())
    for p in sorted(p for p, n in sequences.items() if n > lo)[:extra]:
        counts[p] += 1
    return counts


def partition_rows(sequences: Mapping[int, int], rows: int) -> dict[int, int]:
    """Rows each partition gives when a night trains ``rows`` of the component (passes beyond the first:
    ``when_short: repeat``)."""
    size = sum(sequences.values())
    if size == 0:
        return dict.fromkeys(sequences, 0)
    passes, rest = divmod(rows, size)
    return {p: passes * n + c for (p, n), c in zip(sequences.items(), pass_counts(sequences, rest).values(),
                                                    strict=True)}


@dataclass(frozen=True, slots=True)
class Slot:
    """One row of a step: the ``index``-th record of ``partition`` of ``component``'s topic, in its ``use``-th pass."""

    component: str
    partition: int
    index: int
    use: int


class NightOrder:
    """Which record each row slot of the night is: the component from :class:`Dealer`, then within the
    component the partition that gave least in this pass (ties: the lower one), its next record; after a pass
    the component's partitions start over (``when_short: repeat``). A function of the night's rows and the
    manifests' per-partition counts only, resumed from the dealt counts: every rank computes the whole order,
    and trains the slots of the partitions it owns."""

    def __init__(self, rows: Mapping[str, int], sequences: Mapping[str, Mapping[int, int]], stratified: bool = False,
                 dealt: Mapping[str, int] | None = None) -> None:
        self.dealer = Dealer(rows, stratified, dealt)
        self.sequences = {k: dict(sorted(v.items())) for k, v in sequences.items()}
        self.size = {k: sum(v.values()) for k, v in self.sequences.items()}
        for k, n in self.dealer.rows.items():
            if not self.size.get(k):
                raise ValueError(f"{k}: {n} rows to train from a component with no rows")
        self._counts = {k: pass_counts(self.sequences[k], self.dealer.dealt.get(k, 0) % self.size[k])
                        for k in self.dealer.rows}

    @property
    def left(self) -> int:
        return self.dealer.left

    def step(self, size: int) -> list[Slot]:
        """The next ``size`` slots (one optimizer step's rows over every rank; fewer at the night's end)."""
        out = []
        row = dict(self.dealer.dealt)
        for k in self.dealer.batch(size):
            use, i = divmod(row[k], self.size[k])
            row[k] += 1
            counts, seqs = self._counts[k], self.sequences[k]
            if i == 0 and use:  # a pass ended: the next starts over (when_short: repeat)
                counts = self._counts[k] = dict.fromkeys(seqs, 0)
            p = min((q for q in seqs if counts[q] < seqs[q]), key=lambda q: (counts[q], q))
            out.append(Slot(k, p, counts[p], use))
            counts[p] += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return self.dealer.state_dict()


def rank_chunks(slots: list[Slot], owned: Mapping[str, set[int]], accumulation: int) -> list[list[Slot]]:
    """One rank's rows of a step (the slots of the partitions it ``owned``, in the step's order) cut into its
    ``accumulation`` micro-steps, the larger first (sizes differ by one at most): then a micro-step in which no
    rank has a row can only be the night's last, which the trainer takes for its end."""
    mine = [s for s in slots if s.partition in owned.get(s.component, ())]
    q, r = divmod(len(mine), accumulation)
    cuts = [i * q + min(i, r) for i in range(accumulation + 1)]
    return [mine[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
