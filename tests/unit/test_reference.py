"""The configuration reference (docs/config.md) is what the code validates: generated from the
dataclasses, and every field says what it does. The example recipe loads."""

from __future__ import annotations

import pytest

from stoker import paths
from stoker.config.reference import PAGE, render, undocumented

pytestmark = pytest.mark.unit


def test_the_config_reference_is_the_codes():
    assert PAGE.read_text() == render(), "docs/config.md differs from the dataclasses: run `make docs`"


def test_every_field_says_what_it_does():
    assert undocumented() == [], "write a docstring under each of these fields, then `make docs`"


def test_the_reference_names_every_field_a_corpus_may_set():
    import dataclasses

    from stoker.config.corpus import TrainConfig

    page = PAGE.read_text()
    assert all(f"`train.{f.name}`" in page for f in dataclasses.fields(TrainConfig))


def test_the_example_recipe_loads_and_changes_what_it_says(monkeypatch):
    from stoker.config.recipes import get_recipe, small_1gpu

    monkeypatch.setenv("STOKER_CORPORA", str(paths.REPO_ROOT / "corpora"))
    r, base = get_recipe("example"), small_1gpu()
    assert r.name == "example" and (r.grad_accum_steps, r.model.hidden_size, r.zero_stage) == (16, 1280, 1)
    assert r.model.kv_lora_rank == base.model.kv_lora_rank  # not named: the base's
