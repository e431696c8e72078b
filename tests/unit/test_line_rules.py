"""Model-line rules (stoker/lines/nights.py) on plain files: parents, heads, older nights, the tokenizer
agreement, the promotion and the model card."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from stoker import paths
from stoker.config.corpus import parse_corpus
from stoker.exceptions import ConfigError, StokerError
from stoker.layout import CHECKPOINT_COMPLETE, LineLayout, NightFiles
from stoker.lines import ledger
from stoker.lines.ledger import head
from stoker.lines.nights import Night, Parent, read_night
from stoker.lines.parents import check_agreement, choose_parent
from stoker.lines.promotion import model_card, promote
from stoker.run.tokenizer import TokenizerFacts, tokenizer_facts

pytestmark = pytest.mark.unit
SAMPLE = paths.REPO_ROOT / "corpora" / "sample.yaml"


def _night(line: str, ds: str, parent: dict, sha: str = "a" * 64, lineage: list | None = None,
           corpus: str = "c") -> Night:
    n = Night(line=line, ds=ds, corpus=corpus, topic=f"stoker.{corpus}.{ds}.a1", publication="p", parent=parent,
              tokenizer={"path": "/t/tokenizer.json", "sha256": sha, "vocab_size": 8192, "eos_id": 0, "pad_id": 1},
              recipe="debug_cpu", world_size=2, steps=10, sequences=80, tokens=5120, first_loss=9.0, last_loss=6.5,
              offsets={"0": [0, 41], "1": [0, 41]}, trained_at="2026-12-04T00:00:00+00:00")
    n.lineage = [*(lineage or [{"init": "random"}]), n.entry()]
    return n


def _join(line: LineLayout, tmp_path, ds: str, corpus: str = "c", init: str = "random", decided: bool = True) -> Night:
    """Night (ds, corpus) planned and promoted into the line, as the train task does it; ``decided``: then
    promoted by the gate, as the evaluate task does for a night that did not regress (else it stays pending)."""
    parent = choose_parent(line, ds, corpus, init, "branch")
    lineage = json.loads(NightFiles(Path(parent.path)).record.read_text())["lineage"] if parent.kind == "night" \
        else None
    n = _night(line.name, ds, parent.to_dict(), lineage=lineage, corpus=corpus)
    ckpts, export = tmp_path / f"ckpt-{ds}-{corpus}", tmp_path / f"export-{ds}-{corpus}"
    if not ckpts.exists():
        (ckpts / "step00000010").mkdir(parents=True)
        (ckpts / "step00000010" / CHECKPOINT_COMPLETE).write_text("{}")
        export.mkdir()
    promote(line, n, ckpts, export)
    if decided and n.parent["role"] == "head":
        ledger.decide(line, ds, corpus, {"decision": "promoted", "by": "gate", "at": "", "why": "no figure regressed"})
    return n


def test_each_night_continues_the_head_and_older_ones_branch(tmp_path):
    line = LineLayout(tmp_path / "l")
    first = choose_parent(line, "2026-12-01", "c", "random", "branch")
    assert (first.kind, first.role) == ("random", "head")
    _join(line, tmp_path, "2026-12-01")
    _join(line, tmp_path, "2026-12-02")
    assert head(line)["ds"] == "2026-12-02"
    nxt = choose_parent(line, "2026-12-03", "c", "random", "branch")
    assert (nxt.kind, nxt.ds, nxt.role) == ("night", "2026-12-02", "head")
    # a re-run of the head night starts again from its parent, and may replace the head
    rerun = choose_parent(line, "2026-12-02", "c", "random", "branch")
    assert (rerun.ds, rerun.role) == ("2026-12-01", "head")
    # older than the head: a branch from what precedes it, or refused with what to do
    old = choose_parent(line, "2026-11-15", "c", "random", "branch")
    assert (old.kind, old.role) == ("random", "branch")
    # a backfill of several old nights is a chain of branches: the next continues the one before it (CI caught
    # the ledger's first cut training every branch from random weights: a branch was no parent)
    _join(line, tmp_path, "2026-11-15")
    assert ledger.state(read_night(line.night("2026-11-15", "c"))) == "branch"
    chained = choose_parent(line, "2026-11-16", "c", "random", "branch")
    assert (chained.kind, chained.ds, chained.role) == ("night", "2026-11-15", "branch")
    with pytest.raises(StokerError, match=r"night 2026-11-15 of corpus c cannot continue line l's head, night "
                                          r"2026-12-02 of corpus c.*train.older_nights: branch"):
        choose_parent(line, "2026-11-15", "c", "random", "refuse")
    # what is not a night's link is not a night: the store, a promotion's temporary link
    (line.nights_dir / ".2026-12-09.c.link1").mkdir()
    (line.nights_dir / ".2026-12-09.c.link1" / "night.json").write_text("{}")
    assert [n.folder.name for n in line.nights()] == ["2026-11-15.c", "2026-12-01.c", "2026-12-02.c"]


def test_two_corpora_feed_one_line_and_neither_replaces_the_others_night(tmp_path):
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01", "web")
    _join(line, tmp_path, "2026-12-01", "code")  # the same date: continues web's night, whichever came first
    assert choose_parent(line, "2026-12-01", "code", "random", "branch").ds == "2026-12-01"
    assert [n.folder.name for n in line.nights()] == ["2026-12-01.code", "2026-12-01.web"]
    top = head(line)
    assert (top["corpus"], top["seq"], top["parent"]["corpus"]) == ("code", 2, "web")
    nxt = choose_parent(line, "2026-12-02", "web", "random", "branch")
    assert (nxt.ds, nxt.corpus, nxt.role) == ("2026-12-01", "code", "head")
    _join(line, tmp_path, "2026-12-02", "web")
    assert [(e["ds"], e["corpus"]) for e in head(line)["lineage"][1:]] == [
        ("2026-12-01", "web"), ("2026-12-01", "code"), ("2026-12-02", "web")]  # every night of both corpora
    # a re-run of web's first night must not continue a model that already holds it: a branch from before it
    rerun = choose_parent(line, "2026-12-01", "web", "random", "branch")
    assert (rerun.kind, rerun.role) == ("random", "branch")


def test_a_night_the_line_moved_past_while_it_retried_follows_older_nights(tmp_path):
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    first_try = choose_parent(line, "2026-12-02", "c", "random", "branch")
    assert (first_try.ds, first_try.role) == ("2026-12-01", "head")
    _join(line, tmp_path, "2026-12-03")  # night 3 trains and joins while night 2 waits for its retry
    retry = choose_parent(line, "2026-12-02", "c", "random", "branch")
    assert (retry.ds, retry.role) == ("2026-12-01", "branch")  # the head stays night 3, which lacks night 2
    with pytest.raises(StokerError, match="cannot continue line l's head, night 2026-12-03"):
        choose_parent(line, "2026-12-02", "c", "random", "refuse")


def test_a_hugging_face_start_must_be_a_model_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"train.init = .*no config.json"):
        choose_parent(LineLayout(tmp_path / "l"), "2026-12-01", "c", str(tmp_path / "nothing"), "branch")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert choose_parent(LineLayout(tmp_path / "l"), "2026-12-01", "c", str(tmp_path / "hf"), "branch").kind == "hf"


def test_tokenizer_facts_agree_with_the_tokenizers_library(tmp_path):
    from tokenizers import Tokenizer

    from stoker_local.sample import train_tokenizer, write_corpus

    write_corpus(tmp_path / "data", shards=1, max_docstring_bytes=20_000)
    train_tokenizer(tmp_path / "data", tmp_path / "tok", vocab_size=600)
    path = tmp_path / "tok" / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    facts = tokenizer_facts(path, "<|endoftext|>", "<|pad|>")
    assert facts.vocab_size == tok.get_vocab_size()
    assert (facts.eos_id, facts.pad_id) == (tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>"))
    with pytest.raises(ConfigError, match=r"tokenizer.eos_token = '</s>': not in the tokenizer"):
        tokenizer_facts(path, "</s>", "<|pad|>")


def test_a_tokenizer_that_does_not_fit_the_model_fails_naming_both(tmp_path):
    line = LineLayout(tmp_path / "l")
    _join(line, tmp_path, "2026-12-01")
    parent = choose_parent(line, "2026-12-02", "c", "random", "branch")
    mine = TokenizerFacts(path="/new/tokenizer.json", sha256="b" * 64, vocab_size=8192, eos_id=0, pad_id=1)
    with pytest.raises(ConfigError, match=r"/new/tokenizer.json \(sha256 bbbbbbbbbbbb.*night 2026-12-01 of corpus "
                                          r"c in line l.*/t/tokenizer.json \(sha256 aaaaaaaaaaaa"):
        check_agreement(parent, mine)
    check_agreement(parent, TokenizerFacts(**{**asdict(mine), "sha256": "a" * 64}))  # the same file: fine

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"vocab_size": 4096, "eos_token_id": [2, 3], "pad_token_id": None}))
    start = Parent(kind="hf", line="m", path=str(hf))
    with pytest.raises(ConfigError, match=r"4096 embeddings, the tokenizer 8192 ids; the model's eos_token_id is "
                                          r"\[2, 3\], the corpus tokenizer's is 0"):
        check_agreement(start, mine)
    check_agreement(start, TokenizerFacts(**{**asdict(mine), "vocab_size": 4000, "eos_id": 3}))


def test_promotion_is_whole_and_carries_a_model_card(tmp_path):
    ckpts, export = tmp_path / "ckpt", tmp_path / "export"
    (ckpts / "step00000010").mkdir(parents=True)
    (ckpts / "step00000010" / "model.pt").write_bytes(b"w" * 100)
    (ckpts / "step00000010" / CHECKPOINT_COMPLETE).write_text("{}")
    (ckpts / "step00000012").mkdir()  # a tag some rank never finished (DeepSpeed's `latest` names it)
    (ckpts / "latest").write_text("step00000012")
    export.mkdir()
    (export / "config.json").write_text("{}")
    line = LineLayout(tmp_path / "lines" / "l")
    one = _night("l", "2026-12-01", {"kind": "hf", "line": "l", "path": "/models/base"},
                 lineage=[{"init": "/models/base"}])
    done = promote(line, one, ckpts, export)
    assert (done.checkpoint / "latest").read_text() == "step00000010"
    assert (done.checkpoint / "step00000010" / "model.pt").stat().st_nlink == 2  # linked, not copied
    assert json.loads(done.record.read_text())["ds"] == "2026-12-01"
    two = _night("l", "2026-12-02", {"kind": "night", "line": "l", "ds": "2026-12-01", "path": str(done.folder)},
                 lineage=one.lineage)
    card = model_card(two)
    assert "night 2026-12-01 of line `l`" in card and "The line started from: /models/base" in card
    assert "| 2026-12-01 | c | `stoker.c.2026-12-01.a1` | 0: 0-41, 1: 0-41 | 80 | 5,120 | 10 | 9.0000 | 6.5000 |" \
        in card and "2 night(s), 10,240 tokens in all." in card
    # promoting the same night again (a re-run) replaces it whole: one link swapped, the old folder gone
    (export / "config.json").unlink()
    (export / "config.json").write_text('{"new": 1}')
    again = promote(line, one, ckpts, export)
    assert again == done and json.loads((again.model / "config.json").read_text()) == {"new": 1}
    assert sorted(p.name for p in line.nights_dir.iterdir()) == [".store", "2026-12-01.c"]
    assert len(list(line.store.iterdir())) == 1 and done.folder.is_symlink()


def test_a_night_of_an_earlier_stoker_is_replaced_whole(tmp_path):
    line = LineLayout(tmp_path / "l")
    legacy = line.night("2026-12-01", "c")
    legacy.folder.mkdir(parents=True)  # a plain folder, as an earlier Stoker promoted it
    legacy.record.write_text(json.dumps(asdict(_night("l", "2026-12-01", {"kind": "random", "line": "l"}))))
    assert head(line)["ds"] == "2026-12-01"
    n = _join(line, tmp_path, "2026-12-02")
    assert n.parent["ds"] == "2026-12-01" and head(line)["seq"] == 1
    _join(line, tmp_path, "2026-12-01")  # a re-run of the old night
    assert legacy.folder.is_symlink() and json.loads(legacy.record.read_text())["seq"] == 2


def test_line_settings_validate():
    data = yaml.safe_load(SAMPLE.read_text())
    assert parse_corpus(data).train.line == "sample"  # one line per corpus by default
    for key, value, why in (("line", "Bad-Line", "must match"), ("older_nights", "merge", "must be one of"),
                            ("optimizer", "sgd", "must be one of"), ("lr_schedule", "cosine", "must be one of")):
        bad = {**data, "train": {**data.get("train", {}), key: value}}
        with pytest.raises(ConfigError, match=rf"train.{key} = '{value}': {why}"):
            parse_corpus(bad)


def test_the_train_task_holds_its_lines_pool():
    import dags.refresh_dags as m

    train = m.refresh_sample.get_task("training.train")
    assert train.pool == "stoker_line_sample"
    # CeleryExecutor: the trainer goes to a GPU worker, the Spark driver and the sensors to the default queue
    assert train.queue == "gpu" and m.refresh_sample.get_task("publish.tokenize_publish").queue == "default"
    # the train settings come from the run plan when the task runs (tests/unit/test_run_plan.py): the DAG
    # file keeps only what shapes the task (retries, retry delay, pool, queue)
    runtime = {"recipe", "world_size", "launcher", "nodes", "node_shell", "timeout_s", "log_keys", "line"}
    kept = runtime & set(vars(train))
    assert not kept, kept


def test_node_settings_validate():
    data = yaml.safe_load(SAMPLE.read_text())
    ok = parse_corpus({**data, "train": {**data["train"], "nodes": ["127.0.0.1", "localhost"]}})
    assert ok.train.nodes == ["127.0.0.1", "localhost"]
    for train, message in (({"nodes": ["a", "b", "c"]}, "train.world_size = 2: must be a multiple of len(train.nodes)"),
                           ({"nodes": "a,b"}, "train.nodes = 'a,b': must be a list"),
                           ({"nodes": ["a", 2]}, "train.nodes[1] = 2: must be of type str"),
                           ({"launcher": "mpirun"}, "train.launcher = 'mpirun': must be 'torchrun' or 'deepspeed'"),
                           ({"node_shell": "ssh"}, "train.node_shell = 'ssh': must contain {host}")):
        with pytest.raises(ConfigError) as e:
            parse_corpus({**data, "train": {**data["train"], **train}})
        assert message in str(e.value)


def test_a_broken_tokenizer_file_is_a_config_error(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"vocab": 3}}')
    with pytest.raises(ConfigError, match=r"tokenizer.path = .*not a readable tokenizers JSON file"):
        tokenizer_facts(bad, "<|endoftext|>", "<|pad|>")
