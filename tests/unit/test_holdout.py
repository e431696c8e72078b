"""Held-out documents: chosen by the digest of their text, packed apart, accounted per source."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from spark_jobs import steps
from stoker.config.corpus import parse_corpus
from stoker.exceptions import ConfigError
from stoker.run.holdout import HoldoutPart, account, documents, held_out

pytestmark = pytest.mark.unit


def test_the_share_held_out_follows_the_setting_and_depends_on_the_text_alone():
    digests = [hashlib.sha256(f"document {i}".encode()).digest() for i in range(20_000)]
    for per_mille in (0, 5, 100):
        chosen = [d for d in digests if held_out(d, per_mille)]
        assert abs(len(chosen) - 20 * per_mille) <= 4 * (20 * per_mille) ** 0.5 + 1  # ~binomial
        assert chosen == [d for d in digests if held_out(d, per_mille)]  # the same every time
    # a smaller share is a subset of a larger one: raising the setting only adds documents
    assert {d for d in digests if held_out(d, 5)} <= {d for d in digests if held_out(d, 100)}


def test_a_pack_task_marks_the_held_out_texts_and_every_copy_of_one_goes_the_same_way():
    texts = [f"text number {i}" for i in range(300)]
    recs = [steps.parse_line("f", i, f'{{"text": "{t}"}}'.encode(), "jsonl", "text") for i, t in enumerate(texts * 2)]
    out = [(t, h) for ts, _, hs, _, _ in steps.kept_texts(recs, "NFC", 1, 100, steps.Skips(), 64, 100)
           for t, h in zip(ts, hs, strict=True)]
    held = {t for t, h in out if h}
    assert held == {t for t in texts if held_out(hashlib.sha256(t.encode()).digest(), 100)} and 0 < len(held) < 300
    assert [h for t, h in out[:300]] == [h for t, h in out[300:]]  # no dedup here: both copies held out


def test_held_out_files_keep_each_documents_source_tokens_and_bytes(tmp_path):
    part = HoldoutPart(packer=steps.Packer(seq_len=4, eos_id=0, pad_id=9))
    part.add("file:/a.jsonl", [5, 6, 7], "héllo")  # 6 UTF-8 bytes
    part.add("file:/b.jsonl", [8], "x")
    part.add("file:/a.jsonl", [1, 2], "ab")
    part.write(tmp_path / "holdout", 3, "uint16")
    with np.load(tmp_path / "holdout" / "part-00003.npz") as z:
        assert z["tokens"].tolist() == [[5, 6, 7, 0, 8], [0, 1, 2, 0, 9]]  # packed as training is, padded last
        assert z["tokens"].dtype == np.uint16
    got = account(tmp_path / "holdout", 7)
    assert (got["per_mille"], got["docs"], got["tokens"], got["bytes"], got["sequences"]) == (7, 3, 9, 9, 2)
    assert got["sources"] == [{"path": "file:/a.jsonl", "docs": 2, "tokens": 7, "bytes": 8},
                              {"path": "file:/b.jsonl", "docs": 1, "tokens": 2, "bytes": 1}]
    assert not list((tmp_path / "holdout").glob(".*"))  # no temporary file left


def test_a_holdout_share_over_the_limit_names_the_field_and_the_limit():
    with pytest.raises(ConfigError, match=r"eval.holdout_per_mille = 500: must be in \[0, 100\]"):
        parse_corpus({"name": "c", "source": {"uri": "/d"}, "tokenizer": {"path": "/t.json"},
                      "eval": {"holdout_per_mille": 500}})


def test_forgetting_is_measured_on_the_latest_earlier_nights_of_the_lineage_that_kept_held_out_data(tmp_path,
                                                                                                    monkeypatch):
    import json

    from stoker.layout import LineLayout
    from stoker.lines.eval_sets import baseline_model, eval_sets

    monkeypatch.setenv("STOKER_HOME", str(tmp_path))
    line = LineLayout.of("l")
    lineage = [{"kind": "random"}, *({"ds": f"2026-12-0{d}", "corpus": c} for d, c in
                                     ((1, "a"), (2, "b"), (3, "a"), (4, "a"), (5, "a")))]
    for entry in lineage[1:]:
        night = line.night(entry["ds"], entry["corpus"])
        night.folder.mkdir(parents=True)
        part = HoldoutPart(packer=steps.Packer(seq_len=4, eos_id=0, pad_id=9))
        if entry["ds"] != "2026-12-03":  # 12-03's tasks held out no document: its part files are empty
            part.add("file:/a.jsonl", [5, 6], "ab")
        part.write(night.holdout, 0, "uint16")
    # night 12-05 continued 12-04, whose lineage is every night before it
    parent = {"kind": "night", "line": "l", "path": str(line.night("2026-12-04", "a").folder)}
    line.night("2026-12-04", "a").record.write_text(json.dumps({"lineage": lineage[:-1]}))
    own = HoldoutPart(packer=steps.Packer(seq_len=4, eos_id=0, pad_id=9))
    own.add("file:/b.jsonl", [7, 8], "cd")
    own.write(tmp_path / "run" / "holdout", 0, "uint16")
    got = eval_sets(tmp_path / "run" / "holdout", parent, "2026-12-05", "a", 2)
    # newest first; 12-03's empty set is none (it would be NaN, which the gate counts as a regression, and hold
    # every later night for good)
    assert list(got) == ["night", "forgetting:2026-12-04.a", "forgetting:2026-12-02.b"]
    # a night that held out no document of its own is scored on the earlier nights' sets alone, as many of them
    assert list(eval_sets(tmp_path / "empty", parent, "2026-12-05", "a", 2)) == [
        "forgetting:2026-12-04.a", "forgetting:2026-12-02.b"]
    assert documents(line.night("2026-12-03", "a").holdout) == 0 and documents(tmp_path / "nowhere") == 0
    assert documents(line.night("2026-12-02", "b").holdout) == 1
    assert got["night"] == tmp_path / "run" / "holdout"
    assert got["forgetting:2026-12-02.b"] == line.night("2026-12-02", "b").holdout
    # a re-run of 12-04 (its parent 12-03, whose lineage holds an earlier publication of 12-04 in a branch's
    # case): never scored against itself
    assert "forgetting:2026-12-04.a" not in eval_sets(tmp_path / "h", parent, "2026-12-04", "a", 5)
    assert list(eval_sets(tmp_path / "run" / "holdout", {"kind": "random", "path": ""}, "2026-12-05", "a", 2)) == [
        "night"]
    assert eval_sets(tmp_path / "h", {"kind": "random", "path": ""}, "2026-12-05", "a", 2) == {}  # eval.ungated
    assert baseline_model({"kind": "night", "path": "/l/nights/x"}) == Path("/l/nights/x/hf")
    assert baseline_model({"kind": "hf", "path": "/models/m"}) == Path("/models/m")
    assert baseline_model({"kind": "random", "path": ""}) is None


def test_the_evaluate_task_takes_the_trainers_scores_only_for_this_export_baseline_and_sets(tmp_path):
    import json
    import os

    from stoker.layout import TrainerFiles
    from stoker_airflow.operators.evaluate import trainer_scores

    files = TrainerFiles(tmp_path / "t")
    files.export.mkdir(parents=True)
    (files.export / "config.json").write_text("{}")
    sets = {"night": tmp_path / "run" / "holdout", "forgetting:2026-12-01.a": tmp_path / "l" / "holdout"}
    scores = {"model": str(files.export), "baseline": "/l/nights/x/hf",
              "sets": {k: {"path": str(v), "all": {"bpb": 2.0}} for k, v in sets.items()}}
    assert trainer_scores(files, sets, Path("/l/nights/x/hf")) is None  # none written (an earlier Stoker's)
    files.evaluation.write_text(json.dumps(scores))
    assert trainer_scores(files, sets, Path("/l/nights/x/hf")) == scores
    assert trainer_scores(files, sets, None) is None  # another baseline
    assert trainer_scores(files, {"night": sets["night"]}, Path("/l/nights/x/hf")) is None  # other sets
    old = files.evaluation.stat().st_mtime - 60
    os.utime(files.evaluation, (old, old))  # scores of an earlier life's export, which this life replaced
    assert trainer_scores(files, sets, Path("/l/nights/x/hf")) is None


def test_a_diverged_nights_figures_reach_airflow_as_strict_json():
    """A NaN bits per byte (a diverged model) holds the night; the evaluate task's return value must still be
    strict JSON, or Airflow fails the task on every try ('Out of range float values are not JSON compliant')."""
    import json

    from stoker_airflow.operators.evaluate import xcom_safe

    value = {"decision": {"decision": "held"}, "night": {"bpb": float("nan"), "delta": float("inf"), "docs": 3},
             "lists": [1.5, float("-inf")]}
    safe = xcom_safe(value)
    assert json.loads(json.dumps(safe, allow_nan=False)) == {
        "decision": {"decision": "held"}, "night": {"bpb": None, "delta": None, "docs": 3}, "lists": [1.5, None]}
