"""A history checker of one publish: what Kafka's own ConsoleConsumer reads back from the run topic, under
``read_committed`` and ``read_uncommitted``, against what the Spark tasks' committed done records say they
published. Every anomaly is reported by name, in the terms of Jepsen's analyses of Kafka-compatible systems:

* ``lost``: a sequence a task's final done record counts that no committed read returns;
* ``duplicate``: a sequence a committed read returns more than once;
* ``aborted_read``: a committed record no task published (a key outside every task's count: the write of an
  aborted or fenced attempt made visible);
* ``torn``: a task whose committed sequences have a gap with later ones present (part of a transaction visible,
  part not), counted apart from ``lost`` at its end;
* ``out_of_order``: within a partition, a task's sequences not in their order (a delayed write applied late);
* ``unreadable``: a committed record the read_uncommitted read does not hold at the same partition and offset
  (the two isolation levels disagree on what is in the log);
* ``counts``: per partition, the committed records differ from the manifest's count, or the tasks' sum from
  its total.

No Stoker code reads the topics here: the keys and done records come from the ConsoleConsumer's output.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from stoker.run import records

ANOMALIES = ("lost", "duplicate", "aborted_read", "torn", "out_of_order", "unreadable", "counts")


@dataclass(frozen=True, slots=True)
class Read:
    partition: int
    offset: int
    key: bytes
    value: bytes = b""


def read_topic(bootstrap: str, topic: str, isolation: str, values: bool = False,
               timeout_ms: int = 15_000) -> list[Read]:
    """Every record of ``topic`` at ``isolation`` (``read_committed`` or ``read_uncommitted``), by Kafka's tool."""
    from stoker_local import broker

    cmd = broker.tool_command(
        "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--from-beginning", "--timeout-ms", str(timeout_ms), "--isolation-level", isolation,
        "--property", "print.partition=true", "--property", "print.offset=true", "--property", "print.key=true",
        "--property", f"print.value={'true' if values else 'false'}", "--property", "key.separator=\t")
    res = subprocess.run(cmd, capture_output=True, timeout=600)
    out = []
    for line in res.stdout.splitlines():
        fields = line.split(b"\t")
        if len(fields) < 3 or not fields[0].startswith(b"Partition:"):
            continue
        out.append(Read(int(fields[0].split(b":")[1]), int(fields[1].split(b":")[1]), fields[2],
                        fields[3] if values and len(fields) > 3 else b""))
    assert out or res.returncode == 0, res.stderr.decode(errors="replace")[-2000:]
    return out


def task_counts(bootstrap: str, tasks_topic: str) -> dict[int, int]:
    """Each task's sequences, as its last committed done record (marked final) says."""
    counts: dict[int, int] = {}
    for r in read_topic(bootstrap, tasks_topic, "read_committed", values=True):
        done = json.loads(r.value)
        if done.get("final", True):
            counts[int(done["spark_partition"])] = int(done["sequences"])
    return counts


def check(committed: list[Read], uncommitted: list[Read], tasks: dict[int, int],
          manifest: Any | None = None) -> dict[str, list[Any]]:
    """Every anomaly of the history, by name (an empty list for each that did not happen)."""
    found: dict[str, list[Any]] = {name: [] for name in ANOMALIES}
    keys = Counter(r.key for r in committed)
    found["duplicate"] = sorted(k for k, n in keys.items() if n > 1)
    by_task: dict[int, set[int]] = defaultdict(set)
    for k in keys:
        task, index = records.parse_key(k)
        if task not in tasks or index >= tasks[task]:
            found["aborted_read"].append(k)
        else:
            by_task[task].add(index)
    for task, n in sorted(tasks.items()):
        have = by_task.get(task, set())
        missing = sorted(set(range(n)) - have)
        top = max(have, default=-1)
        found["torn"] += [(task, i) for i in missing if i < top]
        found["lost"] += [(task, i) for i in missing if i > top]
    last: dict[tuple[int, int], int] = {}
    for r in sorted(committed, key=lambda r: (r.partition, r.offset)):
        task, index = records.parse_key(r.key)
        if index < last.get((r.partition, task), -1):  # the same index again is a duplicate, named once
            found["out_of_order"].append((r.partition, r.offset, r.key))
        last[(r.partition, task)] = index
    logged = {(r.partition, r.offset): r.key for r in uncommitted}
    found["unreadable"] = [(r.partition, r.offset, r.key) for r in committed
                           if logged.get((r.partition, r.offset)) != r.key]
    if manifest is not None:
        per = Counter(r.partition for r in committed)
        for p in manifest.partitions:
            if per.get(p.partition, 0) != p.sequences:
                found["counts"].append(("partition", p.partition, per.get(p.partition, 0), p.sequences))
        if sum(tasks.values()) != manifest.sequences:
            found["counts"].append(("tasks", sum(tasks.values()), manifest.sequences))
    return found


def anomalies(found: dict[str, list[Any]]) -> dict[str, int]:
    """The anomalies that happened, with how many of each."""
    return {name: len(v) for name, v in found.items() if v}


def check_publish(bootstrap: str, topic: str, manifest: Any | None) -> dict[str, list[Any]]:
    """Read ``topic`` both ways and its tasks' done records, and check the history."""
    from stoker.layout import tasks_topic

    return check(read_topic(bootstrap, topic, "read_committed"), read_topic(bootstrap, topic, "read_uncommitted"),
                 task_counts(bootstrap, tasks_topic(topic)), manifest)
