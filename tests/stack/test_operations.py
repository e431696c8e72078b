"""Airflow operations as users run them, against the real stack (`stoker up` = `make up`):
PostgreSQL, api-server, scheduler, dag-processor, triggerer with LocalExecutor, Kafka, Spark, DeepSpeed.

The tests share one stack and run in file order: a refresh triggered from the UI in headless
Chromium, the scheduled nightly run, a CLI backfill of two nights and the re-run of one, a run
without a logical date, a night the gate holds decided in the UI and from a terminal, and last `stoker down`
leaving no process behind.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.run.manifest import read_manifest
from tests.support.trainer_tools import pretrain_deepseek

REPO = Path(__file__).resolve().parents[2]
STACK_HOME = Path(os.environ["STOKER_HOME"]) / "stack-it"  # inside the suite's state folder
PORTS = {"STOKER_KAFKA_PORT": "29292", "STOKER_API_PORT": "28080", "STOKER_PG_PORT": "29532"}
NIGHTLY = """\
name: nightly
description: One folder of documents per night; the test corpus of schedules and backfills.
source:
  uri: "{state}/data/nightly/{ds}"
  format: jsonl
  success_marker: _SUCCESS
  poke_interval_s: 2
  timeout_s: 120
tokenizer:
  path: "{state}/tokenizers/sample-bpe-8192/tokenizer.json"
pack:
  seq_len: 64
topic:
  partitions: 2
publish:
  spark_partitions: 2
schedule:
  cron: "0 2 * * *"
  start_date: 2026-01-01
  catchup: false
  retries: 1
  retry_delay_s: 5
  max_active_runs: 1
train:
  recipe: debug_cpu
  world_size: 1
  timeout_s: 900
"""


PAIR = """\
name: {name}
description: One of two corpora feeding the model line `pair`.
source:
  uri: "{{state}}/data/{name}/{{ds}}"
  format: jsonl
  poke_interval_s: 2
  timeout_s: 120
tokenizer:
  path: "{{state}}/tokenizers/sample-bpe-8192/tokenizer.json"
pack:
  seq_len: 64
topic:
  partitions: 2
publish:
  spark_partitions: 2
schedule:
  cron: null
  start_date: 2026-01-01
train:
  recipe: debug_cpu
  world_size: 1
  timeout_s: 900
  line: pair
"""


MIXED = PAIR.replace("One of two corpora feeding the model line `pair`.",
                     "A component of the mixture line `mixline` (corpora/lines/mixline.yaml).").replace(
    "line: pair", "line: mixline")
MIXLINE = """\
description: three corpora at 0.6/0.3/0.1, trained as one night by the line's DAG
mix:
  shares: {mix_web: 0.6, mix_code: 0.3, mix_papers: 0.1}
  when_short: repeat
  max_repeats: 4
deadline:
  after_s: 900
"""
MIX_DOCS = {"mix_web": 240, "mix_code": 120, "mix_papers": 80}
"""About 116, 58 and 40 rows of 65 tokens: the night is 193 rows, and the padding of a pack task's last row is too
little of any corpus's share to move it by half a point (stoker/lines/mixture.py)."""
GATED = """\
name: gated
description: A line started from a model pre-trained on English; its night trains on gibberish, the gate holds it.
source:
  uri: "{state}/data/gated/{ds}"
  format: jsonl
  poke_interval_s: 2
  timeout_s: 120
tokenizer:
  path: "{state}/tokenizers/sample-bpe-8192/tokenizer.json"
pack:
  seq_len: 64
topic:
  partitions: 2
publish:
  spark_partitions: 2
schedule:
  cron: null
  start_date: 2026-01-01
eval:
  holdout_per_mille: 100
  approval_timeout_s: 900
train:
  recipe: debug_cpu
  world_size: 1
  timeout_s: 900
  init: "START"
"""


GATED_NIGHT = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
"""Line `gated`'s one night: yesterday, so its run's logical date (the night at 02:00) is in the past whenever
the suite runs (Airflow starts no task of a run whose logical date is ahead of now)."""


def pair_dates() -> list[date]:
    today = datetime.now(UTC).date()
    return [today - timedelta(days=6)]


def mix_date() -> date:
    return datetime.now(UTC).date() - timedelta(days=5)


def nightly_dates() -> list[date]:
    """Nights with data: the backfill's two, and every night the scheduler may pick around today."""
    today = datetime.now(UTC).date()
    return [today - timedelta(days=d) for d in range(12, -2, -1)]


def backfill_dates() -> list[date]:
    today = datetime.now(UTC).date()
    return [today - timedelta(days=d) for d in (10, 9)]


@dataclass
class StackEnv:
    home: Path
    env: dict[str, str]
    api: str
    password: str

    def stoker(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run([sys.executable, "-m", "stoker_local.cli", *args], env=self.env, capture_output=True,
                             text=True, timeout=timeout, cwd=REPO)
        if check and res.returncode != 0:
            raise AssertionError(f"stoker {' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
        return res

    # -- the REST API, as a logged-in user --------------------------------------------------------
    def token(self) -> str:
        import httpx

        r = httpx.post(f"{self.api}/auth/token", json={"username": "admin", "password": self.password}, timeout=30)
        r.raise_for_status()
        return r.json()["access_token"]

    def rest(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        r = httpx.request(method, f"{self.api}/api/v2{path}", headers={"Authorization": f"Bearer {self.token()}"},
                          timeout=30, **kw)
        r.raise_for_status()
        return r.json()

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.rest("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 100})["dag_runs"]

    def wait_runs(self, dag_id: str, pred: Any, count: int, timeout: float) -> list[dict[str, Any]]:
        """Wait until ``count`` runs match ``pred`` and are all finished; fail fast on a failed one."""
        deadline = time.monotonic() + timeout
        while True:
            runs = [r for r in self.dag_runs(dag_id) if pred(r)]
            failed = [r for r in runs if r["state"] == "failed"]
            assert not failed, f"{dag_id} run failed: {failed[0]['dag_run_id']}\n{self.failure_logs(dag_id)}"
            if len(runs) >= count and all(r["state"] == "success" for r in runs):
                return runs
            assert time.monotonic() < deadline, (
                f"{dag_id}: {[(r['dag_run_id'], r['state']) for r in runs]} after {timeout:.0f}s")
            time.sleep(1)

    def failure_logs(self, dag_id: str) -> str:
        logs = sorted((self.home / "airflow" / "logs").rglob("*.log"), key=lambda p: p.stat().st_mtime)
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs[-3:])


def _clean_env(home: Path, password: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "STOKER_", "PYSPARK_")) and k != "SPARK_LOCAL_IP"}
    env.update(PORTS)
    env.update({"STOKER_HOME": str(home), "STOKER_PROJECT": str(REPO), "STOKER_CORPORA": str(home / "corpora"),
                "STOKER_ADMIN_PASSWORD": password, "HF_HUB_OFFLINE": "1", "STOKER_PARALLELISM": "3"})
    return env


def _prepare(home: Path, sample_corpus: dict[str, Path]) -> None:
    from stoker_local import sample

    if home.exists():
        shutil.rmtree(home)
    (home / "corpora").mkdir(parents=True)
    # the UI test's corpus is triggered by hand only: unpausing it on trigger must not add a scheduled run
    sample_yaml = (REPO / "corpora" / "sample.yaml").read_text()
    assert 'cron: "0 2 * * *"' in sample_yaml
    (home / "corpora" / "sample.yaml").write_text(sample_yaml.replace('cron: "0 2 * * *"', "cron: null"))
    (home / "corpora" / "nightly.yaml").write_text(NIGHTLY)
    for name in ("pair_a", "pair_b"):
        (home / "corpora" / f"{name}.yaml").write_text(PAIR.format(name=name))
    (home / "corpora" / "gated.yaml").write_text(GATED.replace("START", str(home / "models" / "start")))
    for name in MIX_DOCS:
        (home / "corpora" / f"{name}.yaml").write_text(MIXED.format(name=name))
    (home / "corpora" / "lines").mkdir()
    (home / "corpora" / "lines" / "mixline.yaml").write_text(MIXLINE)
    shutil.copytree(sample_corpus["tokenizer"].parent, home / "tokenizers" / "sample-bpe-8192")
    # a smaller sample (same kinds of records, bad ones included) keeps a UI-triggered run short
    sample.write_corpus(home / "data" / "sample", shards=2, max_docstring_bytes=120_000)
    # a different slice of the sample's documents every night
    texts = list(sample.texts(sample_corpus["data"]))
    for i, night in enumerate(nightly_dates()):
        folder = home / "data" / "nightly" / night.isoformat()
        folder.mkdir(parents=True)
        docs = texts[i * 40:(i + 1) * 40]
        (folder / "part-00000.jsonl").write_text(
            "".join(json.dumps({"text": t, "night": night.isoformat()}, ensure_ascii=False) + "\n" for t in docs))
        (folder / "_SUCCESS").write_text("")
    for i, night in enumerate(pair_dates()):
        for j, name in enumerate(("pair_a", "pair_b")):
            folder = home / "data" / name / night.isoformat()
            folder.mkdir(parents=True)
            docs = texts[2000 + (2 * i + j) * 30:2000 + (2 * i + j + 1) * 30]
            (folder / "part-00000.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
            (folder / "_SUCCESS").write_text("")
    at = 4000
    for name, n in MIX_DOCS.items():
        folder = home / "data" / name / mix_date().isoformat()
        folder.mkdir(parents=True)
        (folder / "part-00000.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[at:at + n]))
        (folder / "_SUCCESS").write_text("")
        at += n
    _gated_night(home, sample_corpus, texts)


def _gated_night(home: Path, sample_corpus: dict[str, Path], texts: list[str]) -> None:
    """Line `gated` starts from a model pre-trained on English (its baseline); its night's drop holds out only
    English documents (the held-out choice is the digest of the clean text) and trains only on gibberish: the
    night is worse on its held-out documents (7.3 -> 12 nats a token, measured in plain torch), held."""
    import hashlib
    import random
    import unicodedata

    from stoker.run.holdout import held_out

    def kept(t: str) -> bool:  # the tenth of documents the night holds out (eval.holdout_per_mille 100)
        return held_out(hashlib.sha256(t.encode()).digest(), 100)

    pretrain_deepseek(sample_corpus["tokenizer"], texts[1000:1400], home / "models" / "start", 64, steps=80)
    english = [t for t in (unicodedata.normalize("NFC", x).strip() for x in texts[2200:3000]) if kept(t)][:12]
    rng, gibberish = random.Random(3), []
    while len(gibberish) < 80:
        t = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
                     for _ in range(60))
        if not kept(t):
            gibberish.append(t)
    folder = home / "data" / "gated" / GATED_NIGHT
    folder.mkdir(parents=True)
    (folder / "part-00000.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in english + gibberish))
    (folder / "_SUCCESS").write_text("")


@pytest.fixture(scope="module")
def local_stack(sample_corpus) -> StackEnv:
    home = STACK_HOME
    password = secrets.token_urlsafe(10)
    env = _clean_env(home, password)
    _prepare(home, sample_corpus)
    s = StackEnv(home=home, env=env, api=f"http://127.0.0.1:{PORTS['STOKER_API_PORT']}", password=password)
    try:
        out = s.stoker("up", timeout=600)
        assert f"Airflow UI   {s.api}" in out.stdout and "log in as admin" in out.stdout, out.stdout
        yield s
    finally:
        s.stoker("down", timeout=300, check=False)


def stack_processes(home: Path) -> list[tuple[int, str]]:
    """Processes (other than this test process) whose environment names ``home`` as STOKER_HOME."""
    marker = f"STOKER_HOME={home}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker in (d / "environ").read_bytes().split(b"\0"):
                found.append((int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]))
        except OSError:
            continue
    return found


pytestmark = [pytest.mark.stack, pytest.mark.timeout(1500)]
# Debian's chromium (installed by `make test`'s browser-deps), never a browser Playwright downloads
CHROMIUM = os.environ.get("STOKER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser") or ""
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(os.environ["STOKER_HOME"]) / "artifacts"


def _kafka(s: StackEnv) -> dict[str, str]:
    return {"bootstrap.servers": f"127.0.0.1:{PORTS['STOKER_KAFKA_PORT']}"}


def _sequences(s: StackEnv, topic: str) -> list[tuple[bytes, bytes]]:
    return sorted((m.key(), m.value()) for m in koffsets.read_all(_kafka(s), topic))


def _check_run(s: StackEnv, corpus: str, ds: str) -> dict:
    """A finished refresh: the manifest matches the topic, every sequence once, all of them consumed."""
    run_dir = s.home / "runs" / corpus / ds
    m = read_manifest(run_dir)
    seqs = _sequences(s, m.topic)
    assert len(seqs) == len({k for k, _ in seqs}) == m.sequences > 0
    assert koffsets.end_offsets(_kafka(s), m.topic) == m.end_offsets()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["training"]["sequences_consumed"] == m.sequences
    return {"manifest": m, "sequences": seqs, "manifest_bytes": (run_dir / "manifest.json").read_bytes()}


def test_login_required(local_stack: StackEnv):
    import httpx

    assert httpx.get(f"{local_stack.api}/api/v2/dags", timeout=10).status_code == 401
    assert httpx.get(f"{local_stack.api}/stoker/", timeout=10).status_code == 401
    r = httpx.post(f"{local_stack.api}/auth/token", json={"username": "admin", "password": "wrong"}, timeout=10)
    assert r.status_code in (401, 403)
    dags = {d["dag_id"] for d in local_stack.rest("GET", "/dags")["dags"]}
    assert dags == {"refresh_sample", "refresh_nightly", "refresh_pair_a", "refresh_pair_b", "refresh_gated",
                    *(f"refresh_{k}" for k in MIX_DOCS), "line_mixline"}


def _logged_in(browser: Any, s: StackEnv) -> Any:
    """A page of the stack's UI, signed in as admin."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    page.goto(f"{s.api}/")
    page.locator("input[name=username]").fill("admin")
    page.locator("input[name=password]").fill(s.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{s.api}/")
    return page


def test_trigger_from_the_ui_with_a_changed_param(local_stack: StackEnv):
    from playwright.sync_api import expect, sync_playwright

    s = local_stack
    out = ARTIFACTS / "ui"
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        assert CHROMIUM, "Chromium not found: `make test` installs Debian's chromium, or set STOKER_CHROMIUM"
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = _logged_in(browser, s)
        try:
            page.goto(f"{s.api}/dags/refresh_sample")
            expect(page.get_by_text("await_source")).to_be_visible()
            page.get_by_role("button", name="Trigger Dag").click()
            dialog = page.get_by_role("dialog")
            dialog.get_by_role("button", name="Packing").click()  # the params form's sections fold
            expect(dialog.get_by_text("Sequence length")).to_be_visible()
            seq_len_id = dialog.locator("[id='number-input:element_seq_len:inc']").get_attribute("aria-controls")
            seq_len = dialog.locator(f"[id='{seq_len_id}']")
            seq_len.fill("512")
            seq_len.press("Tab")
            page.screenshot(path=str(out / "trigger-form.png"))
            dialog.get_by_test_id("trigger-dag-submit").click()
            # the UI refetches the DAG's runs before it closes the dialog: slow on a busy 2-core machine
            expect(dialog).to_be_hidden(timeout=120_000)

            runs = s.wait_runs("refresh_sample", lambda r: True, 1, timeout=1200)
            run_id = runs[0]["dag_run_id"]
            assert runs[0]["conf"].get("seq_len") == 512
            page.goto(f"{s.api}/dags/refresh_sample/runs/{run_id}")
            expect(page.get_by_text("success").first).to_be_visible()
            page.screenshot(path=str(out / "run-success.png"), full_page=True)
            # the plugin's run summary, behind the same login (the browser's session cookie)
            page.goto(f"{s.api}/stoker/dag-runs/refresh_sample/{run_id}")
            expect(page.get_by_text("consumed")).to_be_visible()
            expect(page.get_by_alt_text("loss curve")).to_be_visible()
            expect(page.get_by_role("img", name="held-out bits per byte of line sample's nights")).to_be_visible()
            # the night's drops as a chart, and its first quarantined records of each reason with their text
            expect(page.get_by_role("img", name="records dropped by reason")).to_be_visible()
            expect(page.locator("#samples-invalid_json + ul pre.sample").first).to_be_visible()
            expect(page.locator("#samples-duplicate + ul li").first).to_contain_text("same text as ")
            page.screenshot(path=str(out / "run-summary.png"), full_page=True)
        finally:
            page.screenshot(path=str(out / "last.png"))
            browser.close()
    ds = runs[0]["logical_date"][:10]
    run = _check_run(s, "sample", ds)
    assert run["manifest"].seq_len == 512  # the changed param reached the Spark job
    assert {"duplicate", "invalid_json", "invalid_utf8", "missing_text", "empty_text"} <= set(
        run["manifest"].docs_dropped)
    assert (out / "run-success.png").stat().st_size > 10_000


def test_the_scheduler_runs_the_latest_night_once_unpaused(local_stack: StackEnv):
    s = local_stack
    s.rest("PATCH", "/dags/refresh_nightly", json={"is_paused": False})
    runs = s.wait_runs("refresh_nightly", lambda r: r["run_type"] == "scheduled", 1, timeout=900)
    assert len(runs) == 1
    ds = runs[0]["logical_date"][:10]
    run = _check_run(s, "nightly", ds)
    # the logical date picked the night's folder
    assert run["manifest"].source_uri.endswith(f"/data/nightly/{ds}")


def test_cli_backfill_two_nights_then_rerun_one(local_stack: StackEnv):
    s = local_stack
    nights = [d.isoformat() for d in backfill_dates()]
    # the runs of a backfill are those whose logical date (the cron's 02:00) lies in [from, to]:
    # the last night's run is at <night>T02:00, so the range ends with that night's end
    s.stoker("airflow", "backfill", "create", "--dag-id", "refresh_nightly", "--from-date", nights[0],
             "--to-date", f"{nights[-1]}T23:59:59", timeout=120)
    runs = s.wait_runs("refresh_nightly", lambda r: r["run_type"] == "backfill", 2, timeout=1200)
    assert sorted(r["logical_date"][:10] for r in runs) == nights
    # one refresh of a corpus at a time (schedule.max_active_runs: 1), backfills included
    spans = sorted((r["start_date"], r["end_date"]) for r in runs)
    assert all(prev_end <= start for (_, prev_end), (start, _) in zip(spans, spans[1:], strict=False)), spans
    before = {ds: _check_run(s, "nightly", ds) for ds in nights}
    topics = {ds: r["manifest"].topic for ds, r in before.items()}
    assert len(set(topics.values())) == 2  # one isolated topic per night
    for ds, r in before.items():  # each night read its own folder, nothing else
        assert r["manifest"].source_uri.endswith(f"/data/nightly/{ds}")
    assert len({seq for r in before.values() for seq in r["sequences"]}) == sum(
        len(r["sequences"]) for r in before.values())
    _check_line(s, nights, topics)

    # re-run the second night from a terminal while the stack is up: `stoker refresh` hands it to the
    # stack's scheduler (its run cleared, as in the UI) and follows it; its data is replaced by an identical
    # copy, the first night untouched
    again = nights[1]
    run_id = next(r["dag_run_id"] for r in runs if r["logical_date"][:10] == again)
    out = s.stoker("refresh", "nightly", "--ds", again, timeout=900)
    assert f"cleared to run again (run {run_id})" in out.stdout and "joined" in out.stdout, out.stdout[-3000:]
    assert s.rest("GET", f"/dags/refresh_nightly/dagRuns/{run_id}")["state"] == "success"
    assert read_manifest(s.home / "runs" / "nightly" / again).topic != topics[again]
    after = _check_run(s, "nightly", again)
    rerun = json.loads((s.home / "lines" / "nightly" / "nights" / f"{again}.nightly" / "night.json").read_text())
    assert rerun["parent"]["ds"] == nights[0] and rerun["topic"] == after["manifest"].topic  # from its parent again
    assert after["manifest"].topic != topics[again]  # a new attempt-scoped topic...
    assert after["sequences"] == before[again]["sequences"]  # ...holding exactly the same sequences
    assert topics[again] not in ktopics.list_topics(_kafka(s))  # the replaced attempt's topic is gone
    for ds in nights:
        if ds != again:
            assert (s.home / "runs" / "nightly" / ds / "manifest.json").read_bytes() == before[ds]["manifest_bytes"]
            assert _sequences(s, topics[ds]) == before[ds]["sequences"]


def test_two_corpora_feed_one_line_under_the_scheduler(local_stack: StackEnv):
    """`pair_a` and `pair_b` share the line `pair`. Both nights of one date are triggered at once: the line's
    pool (and the line's training lease) trains them one after the other, the second continues the first,
    neither replaces the other's night, and the second's model card lists both corpora's nights."""
    s = local_stack
    first = pair_dates()[0].isoformat()
    for dag in ("refresh_pair_a", "refresh_pair_b"):
        s.rest("PATCH", f"/dags/{dag}", json={"is_paused": False})  # cron null: only triggered runs
    runs = {dag: s.rest("POST", f"/dags/{dag}/dagRuns", json={"logical_date": f"{first}T02:00:00Z"})["dag_run_id"]
            for dag in ("refresh_pair_a", "refresh_pair_b")}
    for dag, run_id in runs.items():
        s.wait_runs(dag, lambda r, run_id=run_id: r["dag_run_id"] == run_id, 1, timeout=1200)
    spans = sorted((ti["start_date"], ti["end_date"]) for dag, run_id in runs.items() for ti in
                   s.rest("GET", f"/dags/{dag}/dagRuns/{run_id}/taskInstances")["task_instances"]
                   if ti["task_id"] == "training.train")
    assert spans[0][1] <= spans[1][0], spans  # one night of a line trains at a time

    folder = s.home / "lines" / "pair" / "nights"
    recs = {p.name: json.loads((p / "night.json").read_text()) for p in folder.iterdir() if not p.name.startswith(".")}
    assert sorted(recs) == [f"{first}.pair_a", f"{first}.pair_b"]
    one, two = sorted(recs.values(), key=lambda r: r["seq"])
    assert one["parent"]["kind"] == "random" and (one["seq"], two["seq"]) == (1, 2)
    assert (two["parent"]["ds"], two["parent"]["corpus"], two["parent"]["role"]) == (first, one["corpus"], "head")
    assert [(e["ds"], e["corpus"]) for e in two["lineage"][1:]] == [(first, one["corpus"]), (first, two["corpus"])]
    card = (folder / f"{first}.{two['corpus']}" / "hf" / "README.md").read_text()
    assert all(f"| {first} | {c} | `{recs[f'{first}.{c}']['topic']}` |" in card for c in ("pair_a", "pair_b")), card
    assert "2 night(s)" in card


def test_three_corpora_publish_and_their_mixture_lines_dag_starts_by_itself(local_stack: StackEnv):
    """Their three publish DAGs run for one date; each publication starts the line's DAG for that date (asset
    partitions), one of those runs claims and trains the night, the others skip; `stoker runs show` reports the
    realised shares within half a point of the targets, every planned row trained."""
    s = local_stack
    ds = mix_date().isoformat()
    s.rest("PATCH", "/dags/line_mixline", json={"is_paused": False})
    for dag in (f"refresh_{k}" for k in MIX_DOCS):
        s.rest("PATCH", f"/dags/{dag}", json={"is_paused": False})
        s.rest("POST", f"/dags/{dag}/dagRuns", json={"logical_date": f"{ds}T02:00:00Z"})
    for dag in (f"refresh_{k}" for k in MIX_DOCS):
        s.wait_runs(dag, lambda r: True, 1, timeout=900)
    deadline = time.monotonic() + 900
    while not any(r["state"] == "success" for r in s.dag_runs("line_mixline")):
        runs = s.dag_runs("line_mixline")
        assert not [r for r in runs if r["state"] == "failed"], s.failure_logs("line_mixline")
        assert time.monotonic() < deadline, [(r["dag_run_id"], r["state"]) for r in runs]
        time.sleep(2)
    runs = s.dag_runs("line_mixline")
    assert {r.get("partition_key") for r in runs} == {ds}, runs  # started by the publications, keyed by the date
    claim = json.loads((s.home / "lines" / "mixline" / "mixes" / f"{ds}.claim.json").read_text())
    trained = [r for r in runs if r["dag_run_id"] == claim["run_id"]]
    assert len(trained) == 1 and trained[0]["state"] == "success"
    shown = json.loads(s.stoker("runs", "show", f"mix_web/{ds}", "--json").stdout)
    mixture = shown["training"]["mixture"]
    assert mixture["realised"]["rows"] == mixture["planned_rows"] and not mixture["missing"]
    shares = mixture["realised"]["token_shares"]
    assert all(abs(shares[k] - v) <= 0.005 for k, v in mixture["targets"].items()), (shares, mixture["targets"])
    assert (s.home / "lines" / "mixline" / "nights" / f"{ds}.mix_web" / "night.json").is_file()


def _check_line(s: StackEnv, nights: list[str], topics: dict[str, str]) -> None:
    """The nights form one model line: each continued the one before it (its first loss within 10% of the
    previous night's last), and the last one's model card lists them all."""
    folder = s.home / "lines" / "nightly" / "nights"
    recs = [json.loads((folder / f"{ds}.nightly" / "night.json").read_text()) for ds in nights]
    assert [r["parent"].get("ds", "") for r in recs] == ["", *nights[:-1]]
    for prev, cur in zip(recs, recs[1:], strict=False):
        assert abs(cur["first_loss"] - prev["last_loss"]) <= 0.10 * prev["last_loss"], (prev, cur)
    card = (folder / f"{nights[-1]}.nightly" / "hf" / "README.md").read_text()
    assert all(f"| {ds} | nightly | `{topics[ds]}` |" in card for ds in nights), card
    assert f"{len(nights)} night(s)" in card


def test_a_run_triggered_without_a_logical_date(local_stack: StackEnv):
    """REST (or the UI with the date cleared) may start a run with no logical date: it still reads a
    well-defined night (the day it runs), and when that night was refreshed before, the new run
    replaces it under the same attempt name without mixing in the old run's trainer state."""
    s = local_stack
    today = datetime.now(UTC).date().isoformat()
    earlier = _check_run(s, "nightly", today) if (s.home / "runs" / "nightly" / today / "manifest.json").exists() \
        else None
    s.rest("PATCH", "/dags/refresh_nightly", json={"is_paused": False})  # a paused DAG's runs wait
    run = s.rest("POST", "/dags/refresh_nightly/dagRuns", json={"logical_date": None, "conf": {}})
    assert run["logical_date"] is None
    s.wait_runs("refresh_nightly", lambda r: r["dag_run_id"] == run["dag_run_id"], 1, timeout=900)
    after = _check_run(s, "nightly", today)  # every sequence once, all consumed by this run's trainer
    assert after["manifest"].source_uri.endswith(f"/data/nightly/{today}")
    if earlier is not None:
        assert after["sequences"] == earlier["sequences"]
        assert after["manifest"].created_at >= earlier["manifest"].created_at


def _await_review(s: StackEnv, dag: str, run_id: str, timeout: float = 900) -> dict[str, Any]:
    """The run's review step waiting for a person; what it asks (the REST API's hitlDetails)."""
    deadline = time.monotonic() + timeout
    while True:
        tis = {t["task_id"]: t["state"] for t in
               s.rest("GET", f"/dags/{dag}/dagRuns/{run_id}/taskInstances")["task_instances"]}
        if tis.get("training.review") == "awaiting_input":
            return s.rest("GET", f"/dags/{dag}/dagRuns/{run_id}/taskInstances/training.review/-1/hitlDetails")
        assert "failed" not in tis.values() and tis.get("training.review") not in ("skipped", "success"), (
            tis, s.failure_logs(dag))
        assert time.monotonic() < deadline, tis
        time.sleep(2)


def test_a_held_night_waits_for_a_person_in_the_ui_and_a_terminal_answers_through_rest(local_stack: StackEnv):
    """Line `gated` starts from a pre-trained model; its night, trained on gibberish, is worse on its held-out
    English documents: the gate holds it and the review step asks. The REST API shows the figures; a person rolls it
    back in the UI's Required actions. `stoker refresh` of the same night on the stack is asked again and
    answers with its --decision through the REST API, never waiting on a question. The line gets no head."""
    from playwright.sync_api import expect, sync_playwright

    from stoker.layout import LineLayout
    from stoker.lines.ledger import head

    s, dag, night = local_stack, "refresh_gated", GATED_NIGHT
    line = LineLayout(s.home / "lines" / "gated")
    s.rest("PATCH", f"/dags/{dag}", json={"is_paused": False})
    run_id = s.rest("POST", f"/dags/{dag}/dagRuns", json={"logical_date": f"{night}T02:00:00Z"})["dag_run_id"]
    asked = _await_review(s, dag, run_id)
    assert asked["options"] == ["Promote", "Hold", "Roll back"] and asked["defaults"] == ["Hold"]
    assert f"Night {night}.gated of line gated was held by the gate" in asked["subject"]
    assert "Regressed: night" in asked["body"] and "| night |" in asked["body"], asked["body"]
    out = ARTIFACTS / "ui"
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = _logged_in(browser, s)
        try:
            page.goto(f"{s.api}/dags/{dag}/runs/{run_id}/tasks/training.review/required_actions")
            expect(page.get_by_text("Regressed: night").first).to_be_visible()
            page.screenshot(path=str(out / "review.png"), full_page=True)
            page.get_by_role("button", name="Roll back").click()
            s.wait_runs(dag, lambda r: r["dag_run_id"] == run_id, 1, timeout=300)
        finally:
            page.screenshot(path=str(out / "review-last.png"))
            browser.close()
    record = json.loads(line.night(night, "gated").record.read_text())
    assert record["decision"]["decision"] == "rolled_back", record["decision"]
    assert record["decision"]["by"] == "admin (Airflow review)" and record["decision"]["previous"]["by"] == "gate"
    assert head(line) is None  # a held night never becomes the head

    res = s.stoker("refresh", "gated", "--ds", night, "--decision", "hold", timeout=900)
    assert "answered 'Hold' (--decision hold)" in res.stdout, res.stdout[-3000:]
    record = json.loads(line.night(night, "gated").record.read_text())
    assert (record["decision"]["decision"], record["decision"]["by"]) == ("held", "admin (Airflow review)")
    assert head(line) is None


def test_down_stops_everything_up_started(local_stack: StackEnv):
    s = local_stack
    assert stack_processes(s.home), "the stack should be running before down"
    out = s.stoker("down", timeout=300)
    assert "api-server" in out.stdout and "postgres" in out.stdout and "kafka" in out.stdout
    deadline = time.monotonic() + 10
    while stack_processes(s.home) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stack_processes(s.home) == []
    assert "nothing of the stack was running" in s.stoker("down").stdout


def test_a_night_run_by_stoker_refresh_is_listed_by_the_stacks_rest_api_after_up(local_stack: StackEnv):
    """`make run` (= `stoker refresh`) and `make up` share one metadata database: a night refreshed with
    the stack down is one of the runs the stack's REST API (and UI) lists once it is up. (With the stack up,
    `stoker refresh` hands the night to its scheduler: test_cli_backfill_two_nights_then_rerun_one.)"""
    s = local_stack
    assert stack_processes(s.home) == []  # after `stoker down`
    ds = nightly_dates()[0].isoformat()  # a night no other test refreshes (older than the line's head: a branch)
    out = s.stoker("refresh", "nightly", "--ds", ds, timeout=1200)
    assert "joined" in out.stdout, out.stdout[-3000:]
    try:
        s.stoker("up", timeout=600)
        runs = [r for r in s.dag_runs("refresh_nightly") if (r["logical_date"] or "")[:10] == ds]
        assert [r["state"] for r in runs] == ["success"], runs
        assert _check_run(s, "nightly", ds)["manifest"].source_uri.endswith(f"/data/nightly/{ds}")
    finally:
        s.stoker("down", timeout=300)  # what up started, and the PostgreSQL the refresh started
        s.stoker("kafka", "down", timeout=120)  # the broker the refresh started (up found it running)
    deadline = time.monotonic() + 10
    while stack_processes(s.home) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stack_processes(s.home) == []
