"""train.replay on the real broker and DeepSpeed, with the train task's own pieces (``stoker_airflow.lines``):
night 2 of a line replays a quarter of its rows from night 1's topic, read at its launch; it trains on two
ranks, stops, resumes on one, and every sequence of its own and every replayed one is trained exactly once.
Each night leaves some of its own rows to the line's replay store: a night whose earlier topic is gone
replays those instead, and counts what neither holds as missing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from stoker.config.corpus import TrainConfig
from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.layout import LineLayout, RunLayout
from stoker.lines.nights import read_night
from stoker.lines.replay import replay_count
from stoker.lines.replay_rows import ReplayRows
from stoker.reports import runs
from stoker.run import records
from stoker_airflow.lines import init_args, join_line, keep_replay_store, launch_parent, prepare_replay
from stoker_local.sample import texts
from tests.support.trainer_tools import committed_keys, decide_ungated, launch_trainer, publish_text_run, wait_trainer

pytestmark = pytest.mark.integration
SEQ_LEN = 64


def _logged(folder: Path) -> tuple[list[str], list[str], list[int]]:
    """The keys audit: the night's own keys, the replayed ones, and the steps that replayed."""
    own, replayed, steps = [], [], []
    for f in folder.glob("keys.*.jsonl"):
        for row in map(json.loads, f.read_text().splitlines()):
            own += row["keys"]
            replayed += row.get("replayed", [])
            steps += [row["step"]] if row.get("replayed") else []
    return own, replayed, steps


def test_a_night_replays_its_share_of_the_earlier_night_exactly_once_across_a_resume_at_another_world_size(
        kafka_config, sample_corpus, tmp_path):
    bootstrap, docs = kafka_config["bootstrap.servers"], list(texts(sample_corpus["data"]))
    settings = TrainConfig(line=f"replay_{time.time_ns()}", replay=0.25)
    topics: list[str] = []
    try:
        one = RunLayout(tmp_path / "2026-11-01")
        m1 = publish_text_run(kafka_config, sample_corpus["tokenizer"], docs[:40], one.run_dir, ds="2026-11-01",
                              seq_len=SEQ_LEN, max_sequences=30, transactions=6)  # a marker every 5 records
        topics.append(m1.topic)
        f1 = one.trainer(m1.topic)
        p1 = launch_parent(settings, f1, m1)
        assert prepare_replay(settings, f1, m1, p1, kafka_config) is None  # the line's first night: nothing earlier
        wait_trainer(launch_trainer(one.manifest, f1.folder, kafka_config, 1, *init_args(p1), train=settings),
                     f1.folder)
        keep_replay_store(settings, m1, f1, kafka_config)  # as the train task does before the night joins
        join_line(settings, m1, f1)
        decide_ungated(settings.line, m1)

        two = RunLayout(tmp_path / "2026-11-02")
        m2 = publish_text_run(kafka_config, sample_corpus["tokenizer"], docs[150:300], two.run_dir, ds="2026-11-02",
                              seq_len=SEQ_LEN)
        topics.append(m2.topic)
        f2 = two.trainer(m2.topic)
        p2 = launch_parent(settings, f2, m2)
        drawn = prepare_replay(settings, f2, m2, p2, kafka_config)
        want = replay_count(m2.sequences, 0.25)
        assert want > m1.sequences  # night 2 would replay more than night 1 holds: every record of it, once
        want = m1.sequences
        assert drawn["drawn"] == drawn["replayed"] == want and drawn["topics"][m1.topic]["missing"] == 0
        rows = ReplayRows(f2.replay)
        keys = [rows.key(i).decode() for i in range(len(rows))]
        # what was read is night 1's committed records, as Kafka's own consumer lists them, though some of
        # the drawn offsets were transaction markers
        night_one = {k.decode() for k in committed_keys(bootstrap, m1.topic)}
        assert sorted(k.removeprefix(f"replay:{m1.topic}:") for k in keys) == sorted(night_one)
        by_key = {m.key().decode(): m for m in koffsets.read_all(kafka_config, m1.topic)}
        for key, tokens in zip(keys, rows.tokens, strict=True):
            msg = by_key[key.removeprefix(f"replay:{m1.topic}:")]
            assert np.array_equal(tokens, records.decode(msg.value(), msg.headers(), SEQ_LEN).tokens)
        assert prepare_replay(settings, f2, m2, p2, kafka_config) == drawn  # a relaunch reuses the draw

        args = init_args(p2)
        wait_trainer(launch_trainer(two.manifest, f2.folder, kafka_config, 2, *args, "--max-steps", "5",
                                    "--checkpoint-every", "2", train=settings), f2.folder)
        first = _logged(f2.folder)
        wait_trainer(launch_trainer(two.manifest, f2.folder, kafka_config, 1, *args), f2.folder)  # resumes on 1 rank
        own, replayed, steps = _logged(f2.folder)
        assert sorted(own) == sorted(k.decode() for k in committed_keys(bootstrap, m2.topic))  # each once
        assert sorted(replayed) == sorted(keys) and len(set(replayed)) == want  # each drawn row once
        assert 0 < len(first[1]) < want and max(steps) > 5  # spread over the night, not bunched at one end
        summary = json.loads(f2.summary.read_text())
        assert (summary["sequences_consumed"], summary["sequences_replayed"]) == (m2.sequences, want)
        shown = runs.summary(two.run_dir)  # `stoker runs show`: the night's own and its replayed sequences
        assert shown["training"]["replay"]["replayed"] == shown["training"]["sequences_replayed"] == want
        assert f"replayed       {want} sequences of 1 earlier night(s) (train.replay 0.25" in runs.render(shown)
        keep_replay_store(settings, m2, f2, kafka_config)
        join_line(settings, m2, f2)
        line = LineLayout.of(settings.line)
        record = read_night(line.night("2026-11-02", m2.corpus))
        assert record["replayed"] == want

        kept = ReplayRows(line.night("2026-11-01", m1.corpus).replay_store)  # night 1 left a quarter
        store = [kept.key(i).decode() for i in range(len(kept))]
        assert len(store) == replay_count(m1.sequences, 0.25) and set(store) <= {
            f"replay:{m1.topic}:{k}" for k in night_one}
        ktopics.delete_topics(kafka_config, [m1.topic])  # night 1's topic gone: a new draw takes its store's rows
        f3 = two.trainer(m2.topic + ".again")
        launch_parent(settings, f3, m2)
        gone = prepare_replay(settings, f3, m2, p2, kafka_config)
        from_store = min(want, len(store))
        assert gone["topics"][m1.topic] == {"drawn": want, "read": 0, "from_store": from_store,
                                            "missing": want - from_store, "other_length": 0}
        again = ReplayRows(f3.replay)
        assert gone["replayed"] == from_store and {again.key(i).decode() for i in range(len(again))} <= set(store)
    finally:
        ktopics.delete_topics(kafka_config, topics)
