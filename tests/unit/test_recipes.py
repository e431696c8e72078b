"""Recipes as data: YAML recipes next to the corpus configs and command-line overrides are validated by
the same dataclasses as the built-ins, with the same clear errors."""

from __future__ import annotations

import pytest

from stoker.config.recipes import debug_cpu, get_recipe, parse_overrides, with_overrides
from stoker.exceptions import ConfigError
from training.train import parse_args
from training.trainer import resolve_recipe

pytestmark = pytest.mark.unit


@pytest.fixture()
def recipes(tmp_path, monkeypatch):
    folder = tmp_path / "corpora" / "recipes"
    folder.mkdir(parents=True)
    monkeypatch.setenv("STOKER_CORPORA", str(tmp_path / "corpora"))
    return folder


def test_a_yaml_recipe_is_built_on_its_base_and_validated(recipes):
    (recipes / "wide.yaml").write_text("base: debug_cpu\nlr: 3.0e-4\nmodel:\n  hidden_size: 512\n  num_layers: 6\n")
    r = get_recipe("wide")
    assert (r.name, r.lr, r.model.hidden_size, r.model.num_layers) == ("wide", 3e-4, 512, 6)
    assert r.model.n_routed_experts == debug_cpu().model.n_routed_experts  # the rest from the base
    (recipes / "own.yaml").write_text("micro_batch_size: 2\nzero_stage: 1\n")  # no base: the dataclass defaults
    assert (get_recipe("own").micro_batch_size, get_recipe("own").zero_stage) == (2, 1)


@pytest.mark.parametrize("body, message", [
    ("zero_stage: 4\n", "recipe bad: zero_stage = 4 must be 0, 1, 2 or 3"),
    ("model:\n  experts_per_token: 9\n", "experts_per_token = 9: must be <= n_routed_experts (8)"),
    ("lr: fast\n", "lr = 'fast': must be of type float, got str"),
    ("micro_batch: 4\n", "unknown key(s) ['micro_batch']"),
    ("base: nothing\n", "train.recipe = 'nothing': no such recipe"),
    ("- 1\n", "a recipe must be a mapping"),
])
def test_a_bad_yaml_recipe_fails_naming_its_file_the_key_and_the_value(recipes, body, message):
    (recipes / "bad.yaml").write_text(body)
    with pytest.raises(ConfigError) as e:
        get_recipe("bad")
    assert message in str(e.value)
    if "must be a mapping" not in message and "nothing" not in message:
        assert str(recipes / "bad.yaml") in str(e.value)


def test_an_unknown_recipe_lists_what_there_is(recipes):
    (recipes / "mine.yaml").write_text("base: debug_cpu\n")
    with pytest.raises(ConfigError, match=r"no such recipe; built in: \['debug_cpu', 'multi_8gpu', 'small_1gpu'\]; "
                                          r"in YAML \(corpora/recipes/<name>.yaml\): \['mine'\]"):
        get_recipe("mne")


def test_command_line_overrides_go_through_validation():
    args = parse_args(["--manifest", "m", "--plan", "p", "--out", "o", "--micro-batch-size", "0"])
    with pytest.raises(ConfigError, match="command line: recipe debug_cpu: micro_batch_size = 0 must be >= 1"):
        resolve_recipe(args, "debug_cpu")
    args = parse_args(["--manifest", "m", "--plan", "p", "--out", "o", "--set", "model.num_layers=2", "--set",
                       "lr=5e-4", "--checkpoint-every", "7"])
    r = resolve_recipe(args, "debug_cpu")
    assert (r.model.num_layers, r.lr, r.checkpoint_every, r.name) == (2, 5e-4, 7, "debug_cpu")
    with pytest.raises(ConfigError, match="--set 'lr': must be KEY=VALUE"):
        parse_overrides(["lr"])
    with pytest.raises(ConfigError, match=r"command line: model: unknown key\(s\) \[.num_layer.\]"):
        with_overrides(debug_cpu(), parse_overrides(["model.num_layer=2"]), "command line")


def test_a_corpus_naming_a_missing_recipe_is_an_import_error_and_the_others_stay(tmp_path, monkeypatch):
    import importlib
    import sys

    from stoker import paths

    folder = tmp_path / "corpora"
    folder.mkdir()
    sample = (paths.REPO_ROOT / "corpora" / "sample.yaml").read_text()
    (folder / "sample.yaml").write_text(sample)
    (folder / "other.yaml").write_text(sample.replace("name: sample", "name: other")
                                       .replace("recipe: debug_cpu", "recipe: huge"))
    monkeypatch.setenv("STOKER_CORPORA", str(folder))
    sys.modules.pop("dags.refresh_dags", None)
    m = importlib.import_module("dags.refresh_dags")
    try:
        assert hasattr(m, "refresh_sample") and not hasattr(m, "refresh_other")
        assert "train.recipe = 'huge': no such recipe" in "".join(m._errors)
    finally:
        sys.modules.pop("dags.refresh_dags", None)


def test_the_trainer_takes_its_recipe_and_line_settings_from_the_plan_only(capsys):
    """The command line is frozen to the plan and the launch's runtime paths: the recipe, the optimizer and the
    LR schedule across nights are the corpus's ``train.*`` in the run's plan, never a second copy as flags."""
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = capsys.readouterr().out
    for flag in ("--recipe", "--optimizer", "--lr-schedule", "--cooldown-share"):
        assert flag not in shown
    with pytest.raises(SystemExit):
        parse_args(["--manifest", "m", "--out", "o"])  # no plan: refused
    assert "--plan" in capsys.readouterr().err
