"""A line's mixture config (``corpora/lines/<name>.yaml``) and its night's plan (stoker/lines/mix_plan.py): the
deadline rule against a small reference, the plan written once over the corpora that published, a late corpus
that cannot change a written plan, manifests that cannot share a batch refused by name, and the night claimed by
one run of the line's DAG (a state machine against a reference) while the plan task waits."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from stoker.config.corpus import load_corpus
from stoker.config.line import check_line, load_line
from stoker.exceptions import ConfigError, StokerError
from stoker.layout import LineLayout, RunLayout
from stoker.lines.mix_plan import (
    arrivals,
    claim_night,
    lead_of,
    plan_mixture,
    plan_night,
    read_plan,
    rest_of,
    write_plan,
)
from stoker.lines.mixture import Mix
from stoker.run.manifest import Manifest, PartitionRange, read_manifest, write_manifest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
SHARES = {"web": 0.6, "code": 0.3, "papers": 0.1}
T0 = 1_800_000_000.0


def manifest(corpus: str, ds: str, sequences: int, at: float = T0, seq_len: int = 32) -> Path:
    run = RunLayout.of(corpus, ds)
    from datetime import UTC, datetime

    m = Manifest(run_id=f"{corpus}/{ds}", corpus=corpus, ds=ds, topic=f"stoker.{corpus}.{ds.replace('-', '')}.a1",
                 partitions=[PartitionRange(partition=0, start_offset=0, end_offset=sequences + 1,
                                            sequences=sequences)],
                 seq_len=seq_len, dtype="uint16", tokenizer_path="/t.json", tokenizer_sha256="0" * 64,
                 vocab_size=8192, docs_in=sequences, docs_kept=sequences, docs_dropped={}, tokens=sequences * 33,
                 padding_tokens=0, sequences=sequences, source_uri="/x",
                 created_at=datetime.fromtimestamp(at, UTC).isoformat())
    write_manifest(run.run_dir, m)
    return run.manifest


def line_file(tmp_path: Path, text: str, name: str = "mixed") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return p


@settings(max_examples=300, deadline=None)
@given(published=st.dictionaries(st.sampled_from(sorted(SHARES)), st.floats(0, 1000)),
       now=st.floats(0, 3000), after=st.floats(0, 2000), policy=st.sampled_from(["train_rest", "wait"]))
def test_the_deadline_rule_against_its_reference(published, now, after, policy):
    got = arrivals(SHARES, published, now, after, policy)
    missing = sorted(set(SHARES) - set(published))
    if not missing:
        ready = True
    elif not published:
        ready = False
    else:
        ready = now >= min(published.values()) + after and policy == "train_rest"
    assert got.ready == ready and got.missing == missing
    assert all(k in got.why for k in missing)  # whoever holds the night, or is left out, is named


def test_a_line_file_names_its_mix_and_its_errors(tmp_path):
    line = load_line(line_file(tmp_path, "mix:\n  shares: {web: 0.6, code: 0.3, papers: 0.1}\n"
                                          "deadline: {after_s: 600, when_missing: wait}\n"))
    assert line.name == "mixed" and line.lead == "web" and line.mix.shares == SHARES
    for text, match in [
        ("mix: {shares: {web: 0.7, code: 0.2}}\n", "sum to 0.8999"),
        ("mix: {shares: {web: 1.0}}\ndeadline: {when_missing: later}\n", "deadline.when_missing"),
        ("mix: {shares: {web: 0.5, replay: 0.5}}\n", "replay as a mixture component is not built yet"),
        ("mix: {shares: {web: 1.0}, colour: 3}\n", r"unknown key\(s\) \['colour'\]"),
        ("mix: {shares: {web: lots}}\n", "mix.shares.web"),
        ("mix: {shares: {web: 1.0}}\nlead: code\n", "lead"),
    ]:
        with pytest.raises(ConfigError, match=match):
            load_line(line_file(tmp_path, text))


def test_every_corpus_of_a_mix_must_exist_and_train_on_the_line(tmp_path):
    sample = load_corpus(REPO / "corpora" / "sample.yaml")
    web = dataclasses.replace(sample, name="web", train=dataclasses.replace(sample.train, line="mixed"))
    code = dataclasses.replace(sample, name="code", train=dataclasses.replace(sample.train, line="code"))
    line = load_line(line_file(tmp_path, "mix: {shares: {web: 0.5, code: 0.3, papers: 0.2}}\n"))
    errors = check_line(line, {"web": web, "code": code})
    assert any("papers, which has no corpus file" in e for e in errors)
    assert any("corpus code trains line 'code'" in e for e in errors)
    assert check_line(line, {"web": web, "code": dataclasses.replace(code, train=web.train),
                             "papers": dataclasses.replace(web, name="papers")}) == []


def test_the_example_line_validates():
    for path in (REPO / "corpora" / "examples" / "lines").glob("*.yaml"):
        assert load_line(path).mix.shares


def test_a_night_waits_for_its_corpora_then_trains_the_rest_and_its_plan_is_written_once(home, tmp_path):
    line = load_line(line_file(tmp_path, "mix: {shares: {web: 0.6, code: 0.3, papers: 0.1}}\n"
                                          "deadline: {after_s: 600}\n"))
    ds = "2026-12-01"
    manifest("web", ds, 600)
    arr, plan = plan_night(line, ds, now=T0 + 10)
    assert plan is None and not arr.ready and "['code', 'papers']" in arr.why and arr.deadline == T0 + 600
    manifest("code", ds, 300, at=T0 + 20)
    arr, plan = plan_night(line, ds, now=T0 + 601)  # papers is late: the night trains web and code at 2:1
    assert plan is not None and sorted(plan.manifests) == ["code", "web"] and "papers" in plan.missing
    assert plan.mix.shares == pytest.approx({"web": 2 / 3, "code": 1 / 3}) and plan.night.rows == {"web": 600,
                                                                                                   "code": 300}
    assert LineLayout.of("mixed").mix_plan(ds).is_file()
    manifest("papers", ds, 100, at=T0 + 700)
    again = plan_night(line, ds, now=T0 + 800)[1]  # a relaunch: the written plan, not a new one with papers
    assert again == plan
    with pytest.raises(StokerError, match="already plans this night"):
        write_plan(LineLayout.of("mixed").mix_plan(ds), plan_mixture(line.mix, {
            k: RunLayout.of(k, ds).manifest for k in SHARES}))

    ds2 = "2026-12-02"  # all three in time; a corpus whose night kept nothing counts missing without holding it
    manifest("web", ds2, 900)
    manifest("code", ds2, 0, at=T0 + 5)
    manifest("papers", ds2, 100, at=T0 + 6)
    _, plan = plan_night(line, ds2, now=T0 + 7)
    assert plan is not None and plan.missing == {"code": "published no sequence (every document was dropped)"}
    assert plan.night.rows == {"web": 600, "papers": 100} and plan.night.left == {"web": 300}
    assert read_plan(LineLayout.of("mixed").mix_plan(ds2)) == plan


def test_manifests_that_cannot_share_a_batch_are_refused_by_name(home):
    paths = {"web": manifest("web", "2026-12-03", 60), "code": manifest("code", "2026-12-03", 30, seq_len=64)}
    with pytest.raises(ConfigError, match="differ in seq_len"):
        plan_mixture(Mix(shares={"web": 0.5, "code": 0.5}), paths)
    with pytest.raises(ConfigError, match="no share for"):
        plan_mixture(Mix(shares={"web": 1.0}), paths)


RUNS = st.sampled_from(["scheduled__a", "asset_triggered__b", "manual__c"])
DATES = st.sampled_from(["2026-12-01", "2026-12-02"])


class ClaimMachine(RuleBasedStateMachine):
    """The night claims of a line (``mixes/<ds>.claim.json``) against ``self.model``: date → the first run that
    claimed it. Every asking run but the first is told the first's id; the first is told the night is its own."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="claim-states-"))
        self.before = os.environ.get("STOKER_HOME")
        os.environ["STOKER_HOME"] = str(self.root)
        self.model: dict[str, str] = {}

    def teardown(self) -> None:
        if self.before is None:
            os.environ.pop("STOKER_HOME", None)
        else:
            os.environ["STOKER_HOME"] = self.before
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(run=RUNS, ds=DATES)
    def claim(self, run: str, ds: str) -> None:
        owner = claim_night("mixed", ds, run)
        first = self.model.setdefault(ds, run)
        assert owner == (None if first == run else first)

    @invariant()
    def the_files_are_the_model(self) -> None:
        for ds in ("2026-12-01", "2026-12-02"):
            path = LineLayout.of("mixed").mix_claim(ds)
            assert (json.loads(path.read_text())["run_id"] if path.is_file() else None) == self.model.get(ds)


ClaimMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=12, deadline=None)
test_a_night_is_claimed_by_one_run = ClaimMachine.TestCase


def test_a_torn_claim_names_its_file_and_the_fix(home):
    path = LineLayout.of("mixed").mix_claim("2026-12-01")
    path.parent.mkdir(parents=True)
    path.write_text("")
    with pytest.raises(StokerError, match="does not say which run trains night 2026-12-01.*remove it"):
        claim_night("mixed", "2026-12-01", "manual__a")


def test_the_lead_is_the_lines_or_the_largest_share_present(home, tmp_path):
    line = load_line(line_file(tmp_path, "mix: {shares: {web: 0.6, code: 0.3, papers: 0.1}}\nlead: code\n"))
    ds = "2026-12-01"
    full = plan_mixture(line.mix, {k: manifest(k, ds, 100) for k in SHARES})
    assert lead_of(line, full) == "code"
    rest = plan_mixture(rest_of(line.mix, ["papers", "web"]), {k: RunLayout.of(k, ds).manifest
                                                                for k in ("papers", "web")}, {"code": "late"})
    assert lead_of(line, rest) == "web"  # the lead missed the night: the largest share present leads it


def test_the_plan_task_waits_claims_and_skips_a_second_run_of_the_date(home, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowSkipException

    from stoker_airflow.sensors.mix import MixPlanSensor

    (tmp_path / "corpora" / "lines").mkdir(parents=True)
    (tmp_path / "corpora" / "lines" / "mixed.yaml").write_text("mix: {shares: {web: 0.6, code: 0.4}}\n"
                                                               "deadline: {after_s: 3600}\n")
    monkeypatch.setenv("STOKER_CORPORA", str(tmp_path / "corpora"))
    ds = "2026-12-01"
    sensor = MixPlanSensor(task_id="plan", line="mixed", ds=ds)
    manifest("web", ds, 60, at=time.time())
    assert sensor.poke({"run_id": "asset_triggered__web"}) is False  # code has not published: the night waits
    with pytest.raises(AirflowSkipException, match="trained by run 'asset_triggered__web'"):
        sensor.poke({"run_id": "asset_triggered__code"})  # started by code's publication: the first run trains it
    manifest("code", ds, 40, at=time.time())
    done = sensor.poke({"run_id": "asset_triggered__web"})
    assert done.is_done and done.xcom_value["lead"] == "web" and done.xcom_value["manifest"] == str(
        RunLayout.of("web", ds).manifest.resolve())
    assert read_plan(done.xcom_value["plan"]).night.rows == {"web": 60, "code": 40}


def test_a_corpus_republished_after_the_night_was_planned_is_refused_by_name(home, tmp_path):
    line = load_line(line_file(tmp_path, "mix: {shares: {web: 0.6, code: 0.4}}\n"))
    ds = "2026-12-01"
    for k in ("web", "code"):
        manifest(k, ds, 50)
    _, plan = plan_night(line, ds, now=T0 + 1)
    assert plan is not None and plan.topics == {"web": "stoker.web.20261201.a1", "code": "stoker.code.20261201.a1"}
    m = read_manifest(RunLayout.of("code", ds).manifest)
    write_manifest(RunLayout.of("code", ds).run_dir, dataclasses.replace(m, topic="stoker.code.20261201.a2"))
    again = plan_night(line, ds, now=T0 + 2)[1]
    assert again == plan  # the written plan stands, and a trainer reading its manifests is told why it cannot
    with pytest.raises(StokerError, match="code planned over stoker.code.20261201.a1, .* now names "
                                          "stoker.code.20261201.a2"):
        again.read_manifests()
