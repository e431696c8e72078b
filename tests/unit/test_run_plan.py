"""The run plan: a run's params applied to the corpus config and validated once, by the publish task,
and read by the Spark job and the train task instead of flags and copied bounds."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from stoker.config import corpus as config
from stoker.exceptions import ConfigError
from stoker.layout import RunLayout, run_topic
from stoker.run.plan import RUN_PARAMS, corpus_of, plan_run, read_plan, refresh_dag

pytestmark = pytest.mark.unit


@pytest.fixture()
def corpus(home, tmp_path):
    path = tmp_path / "corpora" / "web.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({
        "name": "web", "source": {"uri": "/data/web/{ds}", "allowed_uri_prefixes": ["/other", "s3://backfills/web/"]},
        "tokenizer": {"path": str(tmp_path / "none.json")},
        "pack": {"seq_len": 256}, "train": {"line": "pair", "optimizer": "fresh"}}))
    return path


def test_params_apply_to_the_config_and_are_validated_once(corpus):
    plan = plan_run(corpus, "2026-12-03", {"seq_len": "512", "source_uri": "/other/{ds}"}, attempt=2)
    assert plan.corpus.pack.seq_len == 512 and plan.corpus.source.uri == "/other/{ds}"
    assert plan.source_uri == "/other/2026-12-03" and plan.topic == run_topic("web", "2026-12-03", 2)
    assert plan.params == {"source_uri": "/other/{ds}", "seq_len": 512, "spark_partitions": 4, "review": "ask"}
    assert plan_run(corpus, "2026-12-03", {"review": "roll-back"}).corpus.eval.review == "roll-back"
    with pytest.raises(ConfigError, match=r"eval.review = 'maybe': must be one of ask, promote, hold, roll-back"):
        plan_run(corpus, "2026-12-03", {"review": "maybe"})
    with pytest.raises(ConfigError, match=r"pack.seq_len = 1: must be in \[2, 1048576\]"):
        plan_run(corpus, "2026-12-03", {"seq_len": 1})
    with pytest.raises(ConfigError, match=r"param 'seq_length' is not a run param; allowed: \['review', 'seq_len'"):
        plan_run(corpus, "2026-12-03", {"seq_length": 512})
    with pytest.raises(ConfigError, match=r"publish.spark_partitions = 0: must be in \[1, 100000\]"):
        plan_run(corpus, "2026-12-03", {"spark_partitions": 0})


def test_the_plan_is_written_next_to_the_manifest_and_reads_back(corpus):
    plan = plan_run(corpus, "2026-12-03", {"seq_len": 128}, parent={"kind": "random", "line": "pair"})
    path = plan.write()
    assert path == RunLayout.of("web", "2026-12-03").plan
    again = read_plan(path)
    assert again.corpus == plan.corpus and again.topic == plan.topic and again.parent == plan.parent
    data = json.loads(path.read_text())
    assert data["dag_id"] == "refresh_web" and data["run_dir"] == str(path.parent)
    with pytest.raises(ConfigError, match="plan version 0"):
        path.write_text(json.dumps({**data, "version": 0}))
        read_plan(path)


def test_names_are_spelled_once():
    assert refresh_dag("web") == "refresh_web" and corpus_of("refresh_web") == "web"
    assert corpus_of("some_other_dag") is None


def test_the_dags_param_form_comes_from_the_run_params():
    import dags.refresh_dags as m

    params = m.refresh_sample.params
    assert list(params) == [p.name for p in RUN_PARAMS]
    schema = params.get_param("seq_len").schema
    assert (schema["minimum"], schema["maximum"]) == config.SEQ_LEN_BOUNDS
    schema = params.get_param("spark_partitions").schema
    assert (schema["minimum"], schema["maximum"]) == config.SPARK_PARTITIONS_BOUNDS
    assert params.get_param("review").schema["enum"] == ["ask", "promote", "hold", "roll-back"]  # a drop-down
    review = m.refresh_sample.get_task("training.review")
    assert review.options == ["Promote", "Hold", "Roll back"] and review.defaults == ["Hold"]
    assert dict(review.params) == {}  # the run's params are not questions to the reviewer


def test_the_publish_task_writes_the_plan_and_the_train_task_reads_its_line_from_it(corpus):
    from stoker_airflow.operators.publish import TokenizePublishOperator
    from stoker_airflow.operators.train import DeepSpeedTrainOperator

    op = TokenizePublishOperator(task_id="t", corpus_path=str(corpus), ds="2026-12-03")
    context = {"params": {"seq_len": 64, "source_uri": "/data/web/{ds}", "spark_partitions": 2},
               "ti": SimpleNamespace(try_number=3)}
    plan = op.plan(context)
    on_disk = read_plan(plan.run.plan)
    assert on_disk.corpus.pack.seq_len == 64 and on_disk.corpus.publish.spark_partitions == 2
    assert on_disk.topic.endswith(".a3") and on_disk.parent["kind"] == "random"  # the line's first night
    train = DeepSpeedTrainOperator(task_id="train", manifest_path=str(plan.run.manifest))
    settings = train.train_config()  # read from the plan when the task runs, not from the DAG file
    assert (settings.line, settings.optimizer) == ("pair", "fresh")

    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match=r"pack.seq_len = 1: must be in \[2, 1048576\]"):
        op.plan({**context, "params": {**context["params"], "seq_len": 1}})


def test_stoker_refresh_checks_its_params_before_anything_starts():
    from stoker.exceptions import StokerError
    from stoker_local.refresh import run_conf

    assert run_conf("sample", "2026-12-01", ["seq_len=512", "source_uri={state}/drops/x"]) == {
        "seq_len": 512, "source_uri": "{state}/drops/x"}
    with pytest.raises(StokerError, match=r"source_uri '/data/x' is not allowed .* source.allowed_uri_prefixes"):
        run_conf("sample", "2026-12-01", ["source_uri=/data/x"])
    with pytest.raises(StokerError, match=r"pack.seq_len = 4000000: must be in \[2, 1048576\]"):
        run_conf("sample", "2026-12-01", ["seq_len=4000000"])
    with pytest.raises(StokerError, match="write NAME=VALUE"):
        run_conf("sample", "2026-12-01", ["seq_len"])


@pytest.mark.parametrize("uri", ["/elsewhere/{ds}", "/otherwise/{ds}", "/other/../data/quarantine",
                                 "s3://backfills/webs/x", "/data/web"])
def test_a_source_uri_outside_the_allowed_prefixes_is_refused_naming_the_setting(corpus, uri):
    with pytest.raises(ConfigError, match=r"source_uri .* is not allowed for this corpus: a run may read only "
                                          r"source.uri \('/data/web/\{ds\}'\) or a folder under "
                                          r"source.allowed_uri_prefixes \(\['/other', 's3://backfills/web/'\]\)"):
        plan_run(corpus, "2026-12-03", {"source_uri": uri})


@pytest.mark.parametrize("uri", ["/other", "/other/{ds}", "/other/deep/{ds_nodash}/", "s3://backfills/web/2026/{ds}"])
def test_a_source_uri_under_an_allowed_prefix_is_taken(corpus, uri):
    assert plan_run(corpus, "2026-12-03", {"source_uri": uri}).corpus.source.uri == uri


def test_with_no_prefix_allowed_a_run_may_not_change_its_source(corpus):
    import yaml as _yaml

    data = _yaml.safe_load(corpus.read_text())
    del data["source"]["allowed_uri_prefixes"]
    corpus.write_text(_yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"source.allowed_uri_prefixes \(none set\)"):
        plan_run(corpus, "2026-12-03", {"source_uri": "/other/{ds}"})
    assert plan_run(corpus, "2026-12-03", {"source_uri": "/data/web/{ds}"}).corpus.source.uri == "/data/web/{ds}"


def test_await_source_refuses_a_source_uri_the_corpus_does_not_allow_before_its_first_poke(tmp_path):
    """The first task of the night: a drop that is there and complete, but not one this corpus may read."""
    from airflow.sdk.exceptions import AirflowFailException

    from stoker_airflow.sensors.source import SourceReadySensor

    drop = tmp_path / "quarantine"
    drop.mkdir()
    (drop / "_SUCCESS").write_text("")
    (drop / "part-0.jsonl").write_text('{"text": "raw bytes of another corpus"}\n')
    sensor = SourceReadySensor(task_id="await_source", uri=str(drop), corpus_uri="/data/web/{ds}",
                               allowed_uri_prefixes=["/other"])
    assert sensor.poke({}) is True  # the drop itself is ready: only the allow-list refuses it
    with pytest.raises(AirflowFailException, match=r"source.allowed_uri_prefixes \(\['/other'\]\)"):
        sensor.execute({})


def _trigger(user: str | None, review: str) -> dict:
    return {"params": {"review": review}, "ti": SimpleNamespace(try_number=1),
            "dag_run": SimpleNamespace(triggering_user_name=user)}


def test_a_held_night_is_decided_ahead_only_by_a_named_allowed_user_and_never_anonymously(corpus):
    """The "Held night" param set to promote or roll-back is the triggering user's decision: refused before Spark
    for a run no user triggered, or a user eval.reviewers leaves out; recorded under their name otherwise."""
    import yaml as _yaml
    from airflow.sdk.exceptions import AirflowFailException

    from stoker.run.plan import read_plan
    from stoker_airflow.operators.publish import TokenizePublishOperator
    from stoker_airflow.operators.review import decided_ahead

    op = TokenizePublishOperator(task_id="t", corpus_path=str(corpus), ds="2026-12-03")
    with pytest.raises(AirflowFailException, match=r"review 'promote': .* only by a named person, and no user "
                                                   r"triggered this run"):
        op.plan(_trigger(None, "promote"))
    plan = op.plan(_trigger("alice", "promote"))  # no eval.reviewers: any named user
    assert decided_ahead(read_plan(plan.run.plan), _trigger("alice", "promote")) == (
        "promote", "alice, by the run's eval.review (promote) when they triggered it", True)
    held = op.plan(_trigger(None, "hold"))  # a hold decides nothing: any run may set it
    assert decided_ahead(held, _trigger(None, "hold")) == ("hold", "the run's eval.review (hold)", False)
    assert decided_ahead(op.plan(_trigger(None, "ask")), _trigger(None, "ask")) is None

    data = _yaml.safe_load(corpus.read_text())
    data["eval"] = {"reviewers": ["bob"]}
    corpus.write_text(_yaml.safe_dump(data))
    with pytest.raises(AirflowFailException, match=r"user 'alice' may not decide a held night of this corpus: "
                                                   r"eval.reviewers is \['bob'\]"):
        op.plan(_trigger("alice", "roll-back"))
    assert decided_ahead(op.plan(_trigger("bob", "roll-back")), _trigger("bob", "roll-back"))[:2] == (
        "roll-back", "bob, by the run's eval.review (roll-back) when they triggered it")

    data["eval"]["review"] = "promote"  # the corpus config's own policy: no person, recorded as the policy
    corpus.write_text(_yaml.safe_dump(data))
    assert decided_ahead(op.plan(_trigger(None, "promote")), _trigger(None, "promote")) == (
        "promote", f"the corpus config's eval.review (promote: {corpus})", False)
