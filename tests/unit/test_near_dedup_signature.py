"""Near-dedup's MinHash against datatrove's, the oracle: the same simplified text, shingles and signature for
every document of a mixed sample, so two documents share a band here exactly when datatrove's buckets pair
them; and the clusters the driver builds from candidate pairs."""

from __future__ import annotations

import random
import unicodedata

import numpy as np
import pytest

from spark_jobs.near_dedup import MinHasher, _union_find, simplify
from spark_jobs.quality import Filters
from tests.support.quality_oracle import quality

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def texts() -> list[str]:
    from stoker_local.mixed_sample import documents

    return [t for t in (unicodedata.normalize("NFC", x).strip() for _, x in documents(400, seed=5)) if t]


def hasher(block: dict) -> MinHasher:
    q = quality({"near_dedup": {"enabled": True, **block}})
    return MinHasher(q.near_dedup, Filters(q).words)


def test_simplified_text_shingles_and_signatures_are_datatroves(texts, tmp_path):
    from datatrove.utils.text import simplify_text

    from tests.support.quality_oracle import minhash_signature

    theirs = minhash_signature(str(tmp_path))  # its shingles' UTF-8 bytes hashed, as Stoker does
    mine = hasher({})
    compared = 0
    for text in texts:
        assert simplify(text) == simplify_text(text)
        shingles = theirs.get_shingles(text)
        assert np.array_equal(mine.shingles(text), shingles)
        if shingles.size:
            expected = np.array(theirs.get_signature(shingles), dtype=np.uint64).reshape(-1)
            assert np.array_equal(mine.signature(text), expected)
            compared += 1
        else:
            assert mine.signature(text) is None and mine.bands(text) is None
    assert compared > len(texts) // 2


def test_a_copy_with_a_paragraph_changed_shares_a_band_and_an_unrelated_text_does_not(texts):
    h = hasher({})
    long = [t for t in texts if len(t.split()) > 200][:20]
    rng = random.Random(0)
    shared = unrelated = 0
    for i, text in enumerate(long):
        words = text.split()
        start, span = rng.randrange(len(words) - len(words) // 10), len(words) // 10
        words[start:start + span] = ["edited"] * span  # 10% of the words, in one place (a changed paragraph)
        shared += bool(set(h.bands(text)) & set(h.bands(" ".join(words))))
        other = long[(i + 1) % len(long)]
        unrelated += bool(set(h.bands(text)) & set(h.bands(other))) and other != text
    assert shared >= 18 and unrelated == 0, (shared, unrelated)


def test_curators_character_shingles_are_a_shape_of_their_own():
    h = hasher({"shingle": "chars", "n_grams": 24, "bands": 20, "hashes_per_band": 13})
    text = "The quick brown fox jumps over the lazy dog near the river bank today."
    assert len(h.bands(text)) == 20
    assert h.bands(text) == h.bands(text.upper() + "  ")  # simplified alike
    assert h.bands("too short") is None


def test_clusters_join_transitively_and_the_earliest_member_stays():
    a, b, c, d, x, y = ("2026-12-01", "f", 5), ("2026-12-02", "f", 1), ("2026-12-02", "g", 0), \
        ("2026-12-02", "f", 9), ("2026-12-02", "h", 1), ("2026-12-02", "h", 2)
    roots = _union_find([(b, d), (c, d), (a, c), (x, y)])
    assert {roots[n] for n in (a, b, c, d)} == {a} and roots[y] == x and roots[x] == x
