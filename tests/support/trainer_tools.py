"""A published run to train on and the trainer launched as a process tree, for the tests that train
against a real broker (tests/integration/test_train.py) or hurt one (tests/faults, bench/soak.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stoker import paths
from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.run import records
from stoker.run.manifest import Manifest, PartitionRange, write_manifest
from stoker_local import broker

if TYPE_CHECKING:
    from stoker.config.corpus import TrainConfig

REPO = Path(__file__).resolve().parents[2]


def publish_run(config: dict, tokenizer: Path, out: Path, *, partitions: int = 4, per_partition: int = 41,
                seq_len: int = 32, replication: int = 1, name: str = "train") -> Manifest:
    """A run topic published in one transaction (random token ids, ``per_partition`` sequences in each
    partition) and its manifest in ``out``."""
    from confluent_kafka import Producer

    topic = f"stoker.{name}.{time.time_ns()}.a1"
    ktopics.create_topic(config, topic, partitions, replication,
                        {"min.insync.replicas": str(min(2, replication))})
    producer = Producer({**config, "transactional.id": topic, "acks": "all"})
    producer.init_transactions(30)
    producer.begin_transaction()
    rng = np.random.default_rng(0)
    counts: Counter[int] = Counter()
    for i in range(partitions * per_partition):
        p = i % partitions
        producer.produce(topic, key=records.make_key(0, i), partition=p,
                         value=records.encode_value(rng.integers(2, 8192, seq_len + 1), "uint16"),
                         headers=records.encode_headers("t/2026-12-01", "uint16", doc_starts=[0, 11]))
        counts[p] += 1
    producer.commit_transaction(30)
    ends = koffsets.stable_end_offsets(config, topic)
    m = Manifest(run_id="t/2026-12-01", corpus="t", ds="2026-12-01", topic=topic,
                 partitions=[PartitionRange(partition=p, start_offset=0, end_offset=ends[p], sequences=counts[p])
                             for p in range(partitions)],
                 seq_len=seq_len, dtype="uint16", tokenizer_path=str(tokenizer), tokenizer_sha256="0" * 64,
                 vocab_size=8192, docs_in=1, docs_kept=1, docs_dropped={},
                 tokens=sum(counts.values()) * (seq_len + 1), padding_tokens=0, sequences=sum(counts.values()),
                 source_uri="/synthetic")
    write_manifest(out, m)
    return m


def publish_text_run(config: dict, tokenizer: Path, texts: list[str], out: Path, *, ds: str, seq_len: int = 64,
                     partitions: int = 2, corpus: str = "lines", max_sequences: int = 300,
                     transactions: int = 1) -> Manifest:
    """Real text as the Spark stage packs it (documents back to back, EOS after each, ``seq_len + 1``
    ids a record), so that a model's loss on it means something; in ``transactions`` transactions (each
    leaves a marker offset in every partition); manifest in ``out``."""
    from confluent_kafka import Producer
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    eos, pad = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>")
    ids = [i for e in tok.encode_batch(texts, add_special_tokens=False) for i in [*e.ids, eos]]
    rows = [ids[i:i + seq_len + 1] for i in range(0, len(ids) - seq_len, seq_len + 1)][:max_sequences]
    topic = f"stoker.{corpus}.{ds.replace('-', '')}.{time.time_ns()}"
    ktopics.create_topic(config, topic, partitions, 1, {})
    producer = Producer({**config, "transactional.id": topic, "acks": "all"})
    producer.init_transactions(30)
    producer.begin_transaction()
    counts: Counter[int] = Counter()
    for i, row in enumerate(rows):
        if i and i % -(-len(rows) // transactions) == 0:
            producer.commit_transaction(30)
            producer.begin_transaction()
        producer.produce(topic, key=records.make_key(0, i), partition=i % partitions,
                         value=records.encode_value(np.asarray(row), "uint16"),
                         headers=records.encode_headers(f"{corpus}/{ds}", "uint16", doc_starts=[0]))
        counts[i % partitions] += 1
    producer.commit_transaction(30)
    ends = koffsets.stable_end_offsets(config, topic)
    from stoker.files import sha256_file

    m = Manifest(run_id=f"{corpus}/{ds}", corpus=corpus, ds=ds, topic=topic,
                 partitions=[PartitionRange(partition=p, start_offset=0, end_offset=ends[p], sequences=counts[p])
                             for p in range(partitions)],
                 seq_len=seq_len, dtype="uint16", tokenizer_path=str(tokenizer),
                 tokenizer_sha256=sha256_file(tokenizer), vocab_size=tok.get_vocab_size(), docs_in=len(texts),
                 docs_kept=len(texts), docs_dropped={}, tokens=len(rows) * (seq_len + 1), padding_tokens=0,
                 sequences=len(rows), source_uri="/synthetic", eos_id=eos, pad_id=pad)
    write_manifest(out, m)
    return m


def all_keys(m: Manifest) -> list[str]:
    """The keys :func:`publish_run` gave the run's sequences, sorted."""
    return sorted(records.make_key(0, i).decode() for i in range(m.sequences))


def write_plan(manifest_path: Path, train: TrainConfig | None = None, evaluation: dict | None = None) -> Path:
    """The run plan beside a test's manifest, as the publish task writes it beside a refresh's: the sample
    corpus's config under the manifest's corpus name, with ``train`` as its train settings (default: a corpus
    file's defaults) and ``evaluation`` over its ``eval:`` block. The trainer reads its recipe and the line's
    settings from here, as in a refresh."""
    import dataclasses

    from stoker.config.corpus import TrainConfig, load_corpus, parse_corpus
    from stoker.layout import RunLayout
    from stoker.run.manifest import read_manifest
    from stoker.run.plan import RunPlan

    m = read_manifest(manifest_path)
    data = load_corpus(REPO / "corpora" / "sample.yaml").to_dict()
    data["name"] = m.corpus
    data["train"] = {k: v for k, v in dataclasses.asdict(train or TrainConfig()).items() if v != ""}
    data["eval"] = {**data.get("eval", {}), **(evaluation or {})}
    cfg = parse_corpus(data, f"the test plan of {manifest_path}")
    plan = RunPlan(corpus=cfg, ds=m.ds, attempt=1, params={}, corpus_path=str(REPO / "corpora" / "sample.yaml"))
    return plan.write(RunLayout.of_manifest(manifest_path).plan)


def launch_trainer(manifest_path: Path, out: Path, kafka_config: dict, nproc: int, *extra: str,
                   train: TrainConfig | None = None) -> subprocess.Popen:
    """``torchrun`` of training/train.py in a session of its own, logging every step's keys; with the run's
    plan beside the manifest (written first when there is none, or when ``train`` is given)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STOKER_KAFKA_CONFIG": json.dumps(kafka_config),
           **paths.torch_build_env()}
    from stoker.layout import RunLayout
    from stoker_local.servers import free_ports

    plan = RunLayout.of_manifest(manifest_path).plan
    if train is not None or not plan.is_file():
        write_plan(manifest_path, train)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_ports(1)), str(REPO / "training" / "train.py"), "--manifest", str(manifest_path),
           "--plan", str(plan), "--out", str(out), "--micro-batch-size", "2", "--log-keys",
           str(out / "keys.{rank}.jsonl"), *extra]
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"launch-{time.time_ns()}.log", "w")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


def launch_logs(out: Path) -> str:
    return "".join(p.read_text(errors="replace")[-3000:] for p in sorted(out.glob("launch-*.log")))


def wait_trainer(proc: subprocess.Popen, out: Path, timeout: float = 600) -> None:
    rc = proc.wait(timeout=timeout)
    assert rc == 0, launch_logs(out)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process under it (torchrun starts its ranks in sessions of their own)."""
    import psutil

    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):  # a short-lived child that already ended
            p.kill()
    psutil.wait_procs(tree, timeout=30)
    proc.wait()


def keys_by_step(out: Path) -> dict[int, list[str]]:
    """step → keys trained in that step (all ranks); a torn last line of a killed rank is skipped."""
    steps: dict[int, list[str]] = {}
    for f in out.glob("keys.*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            steps.setdefault(row["step"], []).extend(row["keys"])
    return steps


def await_step(out: Path, step: int, proc: subprocess.Popen, timeout: float = 600) -> int:
    """Until the trainer's metrics reach ``step``; the step reached."""
    from training.metrics import read_log

    deadline = time.monotonic() + timeout
    while True:
        reached = max((r["step"] for r in read_log(out / "metrics.jsonl")), default=0)
        if reached >= step:
            return reached
        assert proc.poll() is None, f"the trainer exited ({proc.returncode}) before step {step}:\n{launch_logs(out)}"
        assert time.monotonic() < deadline, f"the trainer did not reach step {step} in {timeout}s"
        time.sleep(0.2)


def committed_keys(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed key of ``topic``, read by Kafka's own ConsoleConsumer."""
    cmd = broker.tool_command("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap,
                              "--topic", topic, "--from-beginning", "--timeout-ms", "15000",
                              "--isolation-level", "read_committed", "--property", "print.key=true",
                              "--property", "print.value=false", "--property", "key.separator=|")
    res = subprocess.run(cmd, capture_output=True, timeout=300)
    keys = [line.strip() for line in res.stdout.splitlines() if line.strip()]
    assert keys or res.returncode == 0, res.stderr.decode()[-2000:]
    return keys


def resume_step(out: Path) -> int:
    """The step a relaunch resumes from: the newest checkpoint every rank finished (DeepSpeed's own
    ``latest`` may name one a kill interrupted)."""
    from stoker.layout import complete_checkpoints

    complete = complete_checkpoints(out / "checkpoints")
    return int(complete[-1].removeprefix("step")) if complete else 0


def decide_ungated(line: str, m: Manifest, export: Path | None = None) -> dict:
    """What the evaluate task decides on a joined night with no held-out document to score (``eval.ungated``'s
    default, promote), through the line's ledger: until then the night is pending, neither head nor parent. As
    the task does, the card with its decision goes to the run's ``export`` too."""
    from stoker.layout import LineLayout
    from stoker.lines.gate import record_decision, ungated

    layout = LineLayout.of(line)
    done = record_decision(layout, m.ds, m.corpus, {"sets": {}},
                           ungated("promote", f"no held-out document to score night {m.ds}.{m.corpus} on"))
    if export is not None:
        (export / "README.md").unlink(missing_ok=True)
        (export / "README.md").write_text(layout.night(m.ds, m.corpus).card.read_text())
    return done


def bless_night(m: Manifest, line: str, folder: Path) -> None:
    """Night ``m`` recorded in ``line`` as the train and evaluate tasks leave a promoted night, through the line's
    own modules (near-dedup counts only the nights in a line head's weights). A complete checkpoint marker and an
    empty export in ``folder`` stand in for the model: what is read here is which nights the line holds."""
    from stoker.layout import CHECKPOINT_COMPLETE, LineLayout
    from stoker.lines import ledger
    from stoker.lines.nights import night_record
    from stoker.lines.parents import choose_parent
    from stoker.lines.promotion import promote

    layout = LineLayout.of(line)
    parent = choose_parent(layout, m.ds, m.corpus, "random", "branch")
    summary = {"recipe": "debug_cpu", "world_size": 1, "steps": 0, "sequences_consumed": m.sequences,
               "tokens_consumed": m.tokens}
    ckpts, export = folder / "checkpoints", folder / "export"
    (ckpts / "step00000000").mkdir(parents=True)
    (ckpts / "step00000000" / CHECKPOINT_COMPLETE).write_text("{}")
    export.mkdir()
    promote(layout, night_record(m, summary, parent), ckpts, export)
    ledger.decide(layout, m.ds, m.corpus, {"decision": "promoted", "by": "gate", "at": "", "why": "a test's night"})


def first_night(kafka_config: dict, sample_corpus: dict, tmp_path: Path, line: str, ds: str) -> str:
    """Night ``ds`` of corpus and line ``line``, its first, trained on 200 of the sample's documents (60 sequences of
    256) as the train task trains it, and joined to the line (any earlier folder of the line removed); its folder."""
    import shutil

    from stoker.config.corpus import TrainConfig
    from stoker.layout import LineLayout, RunLayout
    from stoker_airflow.lines import init_args, join_line, launch_parent
    from stoker_local.sample import texts

    settings = TrainConfig(line=line)
    shutil.rmtree(LineLayout.of(line).folder, ignore_errors=True)
    run = RunLayout(tmp_path / "night1")
    m = publish_text_run(kafka_config, sample_corpus["tokenizer"], list(texts(sample_corpus["data"]))[:200],
                         run.run_dir, ds=ds, seq_len=256, max_sequences=60, corpus=line)
    files = run.trainer(m.topic)
    parent = launch_parent(settings, files, m)
    wait_trainer(launch_trainer(run.manifest, files.folder, kafka_config, 1, *init_args(parent), train=settings),
                 files.folder)
    folder = str(join_line(settings, m, files).folder)
    decide_ungated(line, m)
    return folder


def pretrain_deepseek(tokenizer: Path, docs: list[str], out: Path, seq_len: int, steps: int = 40) -> float:
    """A small DeepSeek-V3, pre-trained for a few plain-torch steps and saved with save_pretrained; its
    last training loss."""
    import torch
    from tokenizers import Tokenizer

    from stoker.config.recipes import debug_cpu
    from training.model import build_model

    tok = Tokenizer.from_file(str(tokenizer))
    eos, pad = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>")
    ids = [i for e in tok.encode_batch(docs, add_special_tokens=False) for i in [*e.ids, eos]]
    model = build_model(debug_cpu(), tok.get_vocab_size(), seq_len, eos, pad)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    data = torch.tensor(ids[: (len(ids) // (seq_len + 1)) * (seq_len + 1)]).view(-1, seq_len + 1)
    loss = torch.tensor(0.0)
    for step in range(steps):
        batch = data[(step * 8) % (len(data) - 8):][:8]
        out_ = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone(), use_cache=False)
        loss = out_.loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(str(out))
    return float(loss)
