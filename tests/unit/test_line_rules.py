"""Model-line rules (stoker/lines.py) on plain files: parents, heads, older nights, the tokenizer
agreement, the promotion and the model card."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import yaml

from stoker import paths
from stoker.config import parse_corpus
from stoker.exceptions import ConfigError, StokerError
from stoker.layout import LineLayout, NightFiles
from stoker.lines import (
    Night,
    Parent,
    TokenizerFacts,
    check_agreement,
    head,
    model_card,
    plan,
    promote,
    tokenizer_facts,
)

pytestmark = pytest.mark.unit
SAMPLE = paths.REPO_ROOT / "corpora" / "sample.yaml"


def _night(line: str, ds: str, parent: dict, sha: str = "a" * 64, lineage: list | None = None) -> Night:
    n = Night(line=line, ds=ds, corpus="c", topic=f"stoker.c.{ds}.a1", publication="p", parent=parent,
              tokenizer={"path": "/t/tokenizer.json", "sha256": sha, "vocab_size": 8192, "eos_id": 0, "pad_id": 1},
              recipe="debug_cpu", world_size=2, steps=10, sequences=80, tokens=5120, first_loss=9.0, last_loss=6.5,
              offsets={"0": [0, 41], "1": [0, 41]}, trained_at="2026-12-04T00:00:00+00:00")
    n.lineage = [*(lineage or [{"init": "random"}]), n.entry()]
    return n


def _record(line: LineLayout, n: Night) -> None:
    f = line.night(n.ds)
    f.folder.mkdir(parents=True)
    f.record.write_text(json.dumps(asdict(n)))


def test_each_night_continues_the_newest_night_before_it(tmp_path):
    line = LineLayout(tmp_path / "l")
    first = plan(line, "2026-12-01", "random", "branch")
    assert (first.kind, first.role) == ("random", "head")
    _record(line, _night("l", "2026-12-01", first.to_dict()))
    _record(line, _night("l", "2026-12-02", {"kind": "night", "ds": "2026-12-01", "line": "l"}))
    assert head(line)["ds"] == "2026-12-02"
    nxt = plan(line, "2026-12-03", "random", "branch")
    assert (nxt.kind, nxt.ds, nxt.role) == ("night", "2026-12-02", "head")
    # a re-run of the head night starts again from its parent, and may replace the head
    rerun = plan(line, "2026-12-02", "random", "branch")
    assert (rerun.ds, rerun.role) == ("2026-12-01", "head")
    # older than the head: a branch from what precedes it, or refused with what to do
    old = plan(line, "2026-11-15", "random", "branch")
    assert (old.kind, old.role) == ("random", "branch")
    with pytest.raises(StokerError, match=r"night 2026-11-15 is older than line l's head, night 2026-12-02.*"
                                          r"train.older_nights: branch"):
        plan(line, "2026-11-15", "random", "refuse")
    # a promotion's temporary folder is not a night
    (line.nights_dir / ".2026-12-09.tmp1").mkdir()
    (line.nights_dir / ".2026-12-09.tmp1" / "night.json").write_text("{}")
    assert [n.folder.name for n in line.nights()] == ["2026-12-01", "2026-12-02"]


def test_a_hugging_face_start_must_be_a_model_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"train.init = .*no config.json"):
        plan(LineLayout(tmp_path / "l"), "2026-12-01", str(tmp_path / "nothing"), "branch")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert plan(LineLayout(tmp_path / "l"), "2026-12-01", str(tmp_path / "hf"), "branch").kind == "hf"


def test_tokenizer_facts_agree_with_the_tokenizers_library(tmp_path):
    from tokenizers import Tokenizer

    from stoker.local.sample import train_tokenizer, write_corpus

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
    _record(line, _night("l", "2026-12-01", {"kind": "random", "line": "l"}, sha="a" * 64))
    parent = plan(line, "2026-12-02", "random", "branch")
    mine = TokenizerFacts(path="/new/tokenizer.json", sha256="b" * 64, vocab_size=8192, eos_id=0, pad_id=1)
    with pytest.raises(ConfigError, match=r"/new/tokenizer.json \(sha256 bbbbbbbbbbbb.*night 2026-12-01 of line l"
                                          r".*/t/tokenizer.json \(sha256 aaaaaaaaaaaa"):
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
    (ckpts / "latest").write_text("step00000010")
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
    # promoting the same night again (a re-run) replaces it whole
    again = promote(line, one, ckpts, export)
    assert again == done and NightFiles(again.folder).card.read_text().startswith("---")
    assert sorted(p.name for p in line.nights_dir.iterdir()) == ["2026-12-01"]


def test_line_settings_validate():
    data = yaml.safe_load(SAMPLE.read_text())
    assert parse_corpus(data).train.line == "sample"  # one line per corpus by default
    for key, value, why in (("line", "Bad-Line", "must match"), ("older_nights", "merge", "must be one of"),
                            ("optimizer", "sgd", "must be one of"), ("lr_schedule", "wsd", "must be one of")):
        bad = {**data, "train": {**data.get("train", {}), key: value}}
        with pytest.raises(ConfigError, match=rf"train.{key} = '{value}': {why}"):
            parse_corpus(bad)


def test_the_train_task_holds_its_lines_pool():
    import dags.refresh_dags as m

    train = m.refresh_sample.get_task("training.train")
    assert train.pool == "stoker_line_sample" and train.line["line"] == "sample"


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
