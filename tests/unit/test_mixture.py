"""The mixing rule of a night over several corpora (stoker/lines/mixture.py), against its promises: the night's
rows sum to its size and keep every cap, the shares are the targets to a row, every prefix of the dealt order is
within one row of its share (so every window of 100 steps is well within ±0.5 pp), a stratified batch holds the
floor or ceiling of its share, and nothing is left untrained without being named."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.exceptions import ConfigError
from stoker.lines.mixture import (
    Mix,
    NightOrder,
    deal,
    hamilton,
    night_rows,
    partition_rows,
    pass_counts,
    rank_chunks,
    realised,
)

pytestmark = pytest.mark.unit

NAMES = ["code", "papers", "replay", "web", "wiki"]


@st.composite
def mixes(draw):
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    raw = [draw(st.integers(1, 100)) for _ in names]
    shares = {n: r / sum(raw) for n, r in zip(names, raw, strict=True)}
    policy = draw(st.sampled_from(["shrink", "repeat"]))
    cap = draw(st.sampled_from([1.0, 1.5, 2.0, 4.0]))
    available = {n: draw(st.integers(0, 3000)) for n in names}
    return Mix(shares=shares, when_short=policy, max_repeats=cap), available


@settings(max_examples=300, deadline=None)
@given(mixes())
def test_a_nights_rows_keep_the_caps_and_name_what_they_leave(case):
    mix, available = case
    night = night_rows(mix, available)
    cap = mix.max_repeats if mix.when_short == "repeat" else 1.0
    for k, n in night.rows.items():
        assert 0 <= n <= math.floor(available[k] * cap + 1e-9)
        assert night.left.get(k, 0) == max(available[k] - n, 0)  # what stays in its topic is named
        assert night.repeated.get(k, 0) == max(n - available[k], 0)
    if mix.when_short == "shrink":
        assert not night.repeated
    # as large as the policy allows: one more row at the target shares would break a cap (or, for repeat,
    # the largest component is already trained whole)
    t = night.total
    grow = {k: (t + len(mix.shares) + 1) * s for k, s in mix.shares.items()}
    assert any(grow[k] > available[k] * cap for k in grow) or (
        mix.when_short == "repeat" and any(night.rows[k] >= available[k] for k in night.rows))
    for k, s in mix.shares.items():  # the shares are the targets, to the rounding of one row per component
        assert abs(night.rows[k] - t * s) <= 1 + 1e-9


def test_three_corpora_at_0_6_0_3_0_1_shrink_to_the_smallest_and_say_so():
    mix = Mix(shares={"web": 0.6, "code": 0.3, "papers": 0.1})
    night = night_rows(mix, {"web": 9_000, "code": 2_000, "papers": 500})
    assert night.rows == {"web": 3_000, "code": 1_500, "papers": 500} and night.binding == "papers"
    assert night.left == {"web": 6_000, "code": 500}
    rep = night_rows(Mix(shares=mix.shares, when_short="repeat", max_repeats=2),
                     {"web": 9_000, "code": 2_000, "papers": 500})
    assert rep.binding == "papers" and rep.rows == {"web": 6_000, "code": 3_000, "papers": 1_000}
    assert rep.repeated == {"code": 1_000, "papers": 500} and rep.left == {"web": 3_000}


@settings(max_examples=200, deadline=None)
@given(rows=st.dictionaries(st.sampled_from(NAMES), st.integers(0, 400), min_size=1))
def test_every_prefix_of_the_order_is_within_one_row_of_its_share(rows):
    order = list(deal(rows))
    total = sum(rows.values())
    assert sorted(order) == sorted(k for k, n in rows.items() for _ in range(n))
    dealt = dict.fromkeys(rows, 0)
    for n, k in enumerate(order, 1):
        dealt[k] += 1
        for c, r in rows.items():
            assert abs(dealt[c] - n * r / total) < 1, (n, c, dealt)


@settings(max_examples=200, deadline=None)
@given(rows=st.dictionaries(st.sampled_from(NAMES), st.integers(1, 300), min_size=1),
       batch=st.integers(1, 64))
def test_a_stratified_batch_holds_the_floor_or_ceiling_of_each_share(rows, batch):
    order = list(deal(rows, batch=batch, stratified=True))
    assert sorted(order) == sorted(k for k, n in rows.items() for _ in range(n))
    total, left = sum(rows.values()), dict(rows)
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        if len(chunk) == batch and all(v >= batch for v in left.values()):  # every component still has a batch
            for c, r in rows.items():
                assert math.floor(batch * r / total) <= chunk.count(c) <= math.ceil(batch * r / total)
        for c in chunk:
            left[c] -= 1


def test_shares_over_every_window_of_100_steps_are_within_half_a_point():
    mix = Mix(shares={"web": 0.6, "code": 0.3, "papers": 0.1})
    night = night_rows(mix, {"web": 30_000, "code": 9_500, "papers": 3_210})
    order, batch = list(deal(night.rows)), 16
    for start in range(0, len(order) - 100 * batch + 1, batch):
        for k, share in realised(order[start:start + 100 * batch]).items():
            assert abs(share - night.shares()[k]) < 0.005
    assert all(abs(night.shares()[k] - s) < 1e-3 for k, s in mix.shares.items())


def test_the_order_depends_only_on_the_rows():
    rows = {"web": 600, "code": 300, "papers": 100}
    assert list(deal(rows)) == list(deal(dict(reversed(rows.items()))))
    first = list(deal(rows))[:10]  # the first ten slots are the shares to a row: 6, 3 and 1
    assert (first.count("web"), first.count("code"), first.count("papers")) == (6, 3, 1)


def test_hamilton_sums_and_breaks_ties_by_name():
    assert hamilton(10, {"b": 1, "a": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert sum(hamilton(7, {"x": 0.123, "y": 0.877}).values()) == 7


@pytest.mark.parametrize(("mix", "match"), [
    (dict(shares={}), "mix.shares is empty"),
    (dict(shares={"web": 0.7, "code": 0.2}), "sum to 0.89"),
    (dict(shares={"web": 1.2}), r"mix.shares.web = 1.2"),
    (dict(shares={"web": 1.0}, when_short="wait"), "mix.when_short = 'wait'"),
    (dict(shares={"web": 1.0}, max_repeats=0.5), "mix.max_repeats = 0.5"),
])
def test_a_bad_mix_names_the_value_and_the_limit(mix, match):
    with pytest.raises(ConfigError, match=match):
        Mix(**mix)


def test_a_corpus_without_a_share_or_a_share_without_rows_is_an_error():
    mix = Mix(shares={"web": 0.5, "code": 0.5})
    with pytest.raises(ConfigError, match="published nothing"):
        night_rows(mix, {"web": 10})
    with pytest.raises(ConfigError, match="gives them no share"):
        night_rows(mix, {"web": 10, "code": 10, "papers": 3})


@settings(max_examples=200, deadline=None)
@given(seqs=st.dictionaries(st.integers(0, 7), st.integers(0, 30), min_size=1), data=st.data())
def test_pass_counts_is_the_least_advanced_rule_in_closed_form(seqs, data):
    counts = dict.fromkeys(seqs, 0)
    for i in range(sum(seqs.values()) + 1):
        assert pass_counts(seqs, i) == counts, i
        live = [p for p in sorted(seqs) if counts[p] < seqs[p]]
        if live:
            counts[min(live, key=lambda p: (counts[p], p))] += 1


@settings(max_examples=150, deadline=None)
@given(rows=st.dictionaries(st.sampled_from(NAMES), st.integers(1, 120), min_size=1, max_size=4),
       data=st.data(), stratified=st.booleans())
def test_the_night_order_resumed_from_its_dealt_counts_continues_the_same_slots(rows, data, stratified):
    sequences = {k: dict(enumerate(data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=4)))) for k in rows}
    step = data.draw(st.integers(1, 16))
    whole = NightOrder(rows, sequences, stratified)
    slots = []
    while whole.left:
        slots += whole.step(step)
    cut = data.draw(st.integers(0, len(slots) // step)) * step  # a checkpoint at a step boundary
    head = NightOrder(rows, sequences, stratified)
    for _ in range(cut // step):
        head.step(step)
    again, tail = NightOrder(rows, sequences, stratified, head.state_dict()), []
    while again.left:
        tail += again.step(step)
    assert slots[cut:] == tail
    for k, n in rows.items():  # every record of a pass once before any twice; the counts the trainer checks
        mine = [s for s in slots if s.component == k]
        assert len(mine) == n and Counter((s.partition, s.index) for s in mine if s.use == 0).most_common(1)[0][1] == 1
        assert Counter(s.partition for s in mine) == Counter(partition_rows(sequences[k], n))


@settings(max_examples=200, deadline=None)
@given(rows=st.dictionaries(st.sampled_from(NAMES), st.integers(1, 80), min_size=1, max_size=3),
       data=st.data(), world=st.integers(1, 4), accumulation=st.integers(1, 4), micro=st.integers(1, 4))
def test_a_steps_rows_are_split_over_the_ranks_that_own_them_and_no_micro_step_is_empty_before_the_end(
        rows, data, world, accumulation, micro):
    sequences = {k: dict(enumerate(data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=6)))) for k in rows}
    order, step = NightOrder(rows, sequences), micro * world * accumulation
    owned = [{k: set(sorted(sequences[k])[r::world]) for k in rows} for r in range(world)]
    while order.left:
        slots = order.step(step)
        chunks = [rank_chunks(slots, owned[r], accumulation) for r in range(world)]
        assert sorted(map(id, (s for rank in chunks for c in rank for s in c))) == sorted(map(id, slots))
        for r, rank in enumerate(chunks):
            assert all(s.partition in owned[r][s.component] for c in rank for s in c)
            sizes = [len(c) for c in rank]
            assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1
        if len(slots) == step:  # a whole step: every micro-step has a row on some rank
            assert all(any(rank[m] for rank in chunks) for m in range(accumulation))
