"""A mixture night on the real broker and DeepSpeed (issue 35): three corpora of different sizes at 0.6/0.3/0.1, the
two smaller ones repeated up to their cap, trained on two ranks, killed mid-night and resumed on one rank with twice
the accumulation (the same rows a step). Every optimizer step trains the keys the night's order names, as a run
never interrupted would; every record of every topic, as Kafka's own ConsoleConsumer lists them, is trained as often
as the plan says (once, or twice for the repeated ones); the realised shares over every 100 optimizer steps are
within half a point of the targets; every topic's offsets reach the training group; `stoker runs show` and the run
page report the realised shares."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.layout import RunLayout
from stoker.lines.mix_plan import plan_mixture, read_plan, write_plan
from stoker.lines.mixture import Mix, NightOrder
from stoker.reports import runs
from stoker_local import broker
from tests.support.trainer_tools import await_step, kill_tree, launch_trainer, publish_run, resume_step, wait_trainer

pytestmark = pytest.mark.integration
SHARES = {"web": 0.6, "code": 0.3, "papers": 0.1}
SIZES = {"web": (4, 120), "code": (2, 110), "papers": (3, 20)}
"""Partitions and sequences per partition: 480, 220 and 60 rows."""
STEP_ROWS = 4
"""Rows an optimizer step: micro-batch 2 x 2 ranks, then 2 x 1 rank x 2 accumulation."""


def records_by_partition(bootstrap: str, topic: str, published: int) -> dict[int, list[str]]:
    """Partition → its committed keys in offset order, read by Kafka's ConsoleConsumer (which stops at the
    ``published``-th record, or 15 s after the last: a topic short of its manifest fails the counts below)."""
    cmd = broker.tool_command("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap,
                              "--topic", topic, "--from-beginning", "--timeout-ms", "15000",
                              "--max-messages", str(published),
                              "--isolation-level", "read_committed", "--property", "print.key=true",
                              "--property", "print.value=false", "--property", "print.partition=true",
                              "--property", "print.offset=true", "--property", "key.separator=|")
    res = subprocess.run(cmd, capture_output=True, timeout=300, text=True)
    rows: dict[int, list[tuple[int, str]]] = {}
    for line in res.stdout.splitlines():  # Partition:P|Offset:O|KEY (the key separator between the columns)
        m = re.fullmatch(r"Partition:(\d+)\|Offset:(\d+)\|(\S+)", line.strip())
        if m:
            rows.setdefault(int(m[1]), []).append((int(m[2]), m[3]))
    assert rows, res.stderr[-2000:]
    return {p: [k for _, k in sorted(v)] for p, v in rows.items()}


def logged(folder: Path, pattern: str) -> dict[int, list[str]]:
    """Optimizer step → the keys every rank trained in it, from one life's keys logs."""
    steps: dict[int, list[str]] = {}
    for f in folder.glob(pattern):
        for line in f.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a torn last line of the killed life
                continue
            steps.setdefault(row["optimizer_step"], []).extend(row["keys"])
    return steps


def test_a_mixture_night_killed_and_resumed_at_another_world_size_trains_the_planned_keys_each_step(
        kafka_config, sample_corpus, tmp_path):
    bootstrap = kafka_config["bootstrap.servers"]
    manifests, paths = {}, {}
    try:
        for name, (parts, per) in SIZES.items():
            paths[name] = tmp_path / name / "manifest.json"
            manifests[name] = publish_run(kafka_config, sample_corpus["tokenizer"], tmp_path / name, partitions=parts,
                                          per_partition=per, name=name)
        mix = Mix(shares=SHARES, when_short="repeat", max_repeats=2)
        plan_path = tmp_path / "mix.json"
        write_plan(plan_path, plan_mixture(mix, paths))
        plan = read_plan(plan_path)
        assert plan.night.rows == {"web": 480, "code": 240, "papers": 80}  # web whole; the others repeat 20 rows each
        assert plan.night.repeated == {"code": 20, "papers": 20} and not plan.night.left
        out = RunLayout(tmp_path / "web").trainer(manifests["web"].topic).folder
        extra = ("--mix", str(plan_path), "--checkpoint-every", "25")
        first = launch_trainer(paths["web"], out, kafka_config, 2, *extra, "--log-keys", str(out / "one.{rank}.jsonl"))
        await_step(out, 90, first)  # past three checkpoints, inside the night (200 steps)
        kill_tree(first)
        resumed = resume_step(out)
        assert 50 <= resumed < 200
        wait_trainer(launch_trainer(paths["web"], out, kafka_config, 1, *extra, "--set", "grad_accum_steps=2",
                                    "--log-keys", str(out / "two.{rank}.jsonl")), out)

        trained = {s: k for s, k in logged(out, "one.*.jsonl").items() if s <= resumed}
        trained.update(logged(out, "two.*.jsonl"))
        # what every step should hold: the night's order over the records as Kafka's own consumer lists them
        topics = {k: m.topic for k, m in manifests.items()}
        with ThreadPoolExecutor(3) as pool:
            kafka = dict(zip(topics, pool.map(lambda k: records_by_partition(bootstrap, topics[k],
                                                                             manifests[k].sequences), topics),
                             strict=True))
        order = NightOrder(plan.night.rows, {k: {p.partition: p.sequences for p in m.partitions}
                                             for k, m in manifests.items()})
        expected: dict[int, list[str]] = {}
        while order.left:
            expected[len(expected) + 1] = [f"{topics[s.component]}:{kafka[s.component][s.partition][s.index]}"
                                           for s in order.step(STEP_ROWS)]
        assert len(expected) == 200 and sorted(trained) == sorted(expected)
        wrong = [s for s in expected if sorted(trained[s]) != sorted(expected[s])]
        assert not wrong, f"steps {wrong[:5]} trained other keys than the night's order names"

        uses = Counter(k for keys in trained.values() for k in keys)
        for name, by_part in kafka.items():
            keys = [f"{topics[name]}:{k}" for part in by_part.values() for k in part]
            assert len(keys) == manifests[name].sequences  # every committed record, each trained once or twice
            assert sorted(uses[k] for k in keys) == sorted([1] * (len(keys) - plan.night.repeated.get(name, 0))
                                                          + [2] * plan.night.repeated.get(name, 0))
        component = {t: k for k, t in topics.items()}
        steps = [Counter(component[k.split(":", 1)[0]] for k in trained[s]) for s in sorted(trained)]
        for start in range(len(steps) - 100 + 1):  # every window of 100 optimizer steps, not only the aligned ones
            window = sum(steps[start:start + 100], Counter())
            for name, share in SHARES.items():
                assert abs(window[name] / sum(window.values()) - share) < 0.005, (start, window)

        summary = json.loads((out / "train_summary.json").read_text())
        mixture = summary["mixture"]
        assert mixture["realised"]["rows"] == plan.night.rows and summary["sequences_consumed"] == 800
        assert [w["steps"] for w in mixture["windows"]] == [[1, 100], [101, 200]]
        for w in mixture["windows"]:  # the accounting a person reads: token shares per window of 100 steps
            assert all(abs(w["token_shares"][k] - s) < 0.005 for k, s in SHARES.items()), w
        for name, topic in topics.items():  # each topic's offsets reached the group, where the night stopped in it
            ends = summary["next_offsets"][name]
            committed = koffsets.committed_offsets(kafka_config, summary["group_id"], topic, [int(p) for p in ends])
            assert {str(p): o for p, o in committed.items()} == ends
        shown = runs.render(runs.summary(tmp_path / "web"))  # `stoker runs show` of the lead corpus's night
        assert "mixture        code 0.3000 (target 0.3000)" in shown and "papers 80 of 60 (+20 repeated)" in shown
        assert re.search(r"per 100 steps  widest gap 0\.\d\d pp", shown), shown
        from stoker_airflow.web import _summary_html

        page = _summary_html(tmp_path / "web").body.decode()  # the run page in the Airflow UI: the shares' chart
        assert "label-token shares per 100 optimizer steps" in page and "papers in steps 101-200" in page
    finally:
        ktopics.delete_topics(kafka_config, [m.topic for m in manifests.values()])
