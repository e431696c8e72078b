"""The quiet terminal of `stoker refresh`: the live line is read from the run's own files."""

from __future__ import annotations

import io
import json
import re
import time

import pytest

from stoker.layout import RunLayout
from stoker.run.manifest import Manifest, PartitionRange, write_manifest
from stoker_local.progress import LiveLine, RunWatcher, last_json_line

pytestmark = pytest.mark.unit


def _manifest() -> Manifest:
    return Manifest(run_id="c/2026-12-01", corpus="c", ds="2026-12-01", topic="stoker.c.20261201.a1",
                    partitions=[PartitionRange(partition=0, start_offset=0, end_offset=100, sequences=100)],
                    seq_len=256, dtype="uint16", tokenizer_path="t", tokenizer_sha256="x", vocab_size=10,
                    docs_in=50, docs_kept=40, docs_dropped={"duplicate": 10}, tokens=25_000, padding_tokens=700,
                    sequences=100, source_uri="data", created_at="2026-12-01T00:00:00")


def test_the_line_follows_the_stages_and_the_trainer(tmp_path):
    run = RunLayout.of("c", "2026-12-01", root=tmp_path)
    run.run_dir.mkdir(parents=True)
    w = RunWatcher(run, since=1000.0)
    assert w.line(1001.0) == ("start", "[0:01] starting Airflow")
    # a stage of an earlier run of the date does not count
    run.timings.write_text(json.dumps({"tokenize_publish": {"start": 10.0, "end": 20.0}}))
    assert w.line(1002.0)[0] == "start"
    run.timings.write_text(json.dumps({"await_source": {"start": 1001.0, "end": 1002.0},
                                       "tokenize_publish": {"start": 1002.5}}))
    key, text = w.line(1010.0)
    assert key == "tokenize_publish:..." and "Spark" in text and text.startswith("[0:10]")
    run.spark_progress.write_text(json.dumps({"line": "read, validate, dedup: tasks 3/8, read 40.0 MB of 100.0 MB "
                                                      "(40%), 9,000 docs (900/s), ETA 15 s", "at": 1009.0}))
    assert "Spark read, validate, dedup: tasks 3/8, read 40.0 MB of 100.0 MB (40%)" in w.line(1011.0)[1]
    write_manifest(run.run_dir, _manifest())
    run.timings.write_text(json.dumps({"tokenize_publish": {"start": 1002.5, "end": 1040.0},
                                       "train": {"start": 1045.0}}))
    metrics = run.trainer(_manifest().topic).metrics
    metrics.parent.mkdir(parents=True)
    assert "launching the trainer" in w.line(1046.0)[1]
    files = run.trainer(_manifest().topic)
    files.phase.write_text(json.dumps({"phase": "joining the other ranks (world 2)", "at": time.time() - 42}))
    assert re.search(r"starting: joining the other ranks \(world 2\) \(4[23] s\)", w.line(1047.0)[1])  # and how long
    rows = [{"step": i, "loss": 9.0 - i / 10, "tokens_per_s": 2560.0, "sequences_done": 4 * i} for i in (1, 2, 3)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo')  # a torn last line
    key, text = w.line(1050.0)
    assert key == "train:..."
    assert "step 3" in text and "loss 8.700" in text and "12/100 seq (12%)" in text and "ETA 0:08" in text


def test_a_pipe_gets_a_line_per_change_and_a_terminal_one_line_per_stage():
    out = io.StringIO()
    live = LiveLine(out=out, every=20.0)
    for t, key in enumerate(["a:...", "a:...", "a:done", "b:..."]):
        live.show(key, f"{key} at {t}", float(t))
    live.show("b:...", "b later", 30.0)
    assert out.getvalue().splitlines() == ["a:... at 0", "a:done at 2", "b:... at 3", "b later"]

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    live = LiveLine(out=tty)
    for key, text in [("a:...", "a running long"), ("a:done", "a done"), ("b:...", "b")]:
        live.show(key, text, 0.0)
    live.close()
    assert tty.getvalue().split("\n") == ["\ra running long\ra done        ", "\rb", ""]


def test_last_json_line_of_a_missing_or_empty_file(tmp_path):
    assert last_json_line(tmp_path / "none") is None
    (tmp_path / "e").write_text("")
    assert last_json_line(tmp_path / "e") is None
