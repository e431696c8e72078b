"""The fast tokenizer backend against the reference, across the tokenizer families users bring.

Every tokenizer here is trained offline with ``tokenizers``' own trainers on a small fixed text, in the shape of
a family's published ``tokenizer.json``: GPT-2's byte-level BPE, Llama-3's split regex over ByteLevel with
``ignore_merges``, Llama-2's SentencePiece-style BPE (Prepend + Replace normalizers, byte fallback), a tokenizer with
added special and ordinary tokens, normalizers (NFC + Lowercase), digits split apart. For each, the fast
backend must be chosen and give the reference's ids on the hostile texts and on generated text; for the
families it cannot prove (WordPiece with the BERT normalizer, a Metaspace pre-tokenizer, NFKC, a stripping
added token) the night must fall back to ``tokenizers`` and say why. A real difference (the fast backend
built from another tokenizer.json) must be caught before Spark and inside a task, naming the text.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs import tokenizer_backends as tb
from stoker.exceptions import ConfigError, TokenizerMismatch
from tests.support.small_corpus import GOOD

pytestmark = pytest.mark.unit

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|pad|>"]


def _text() -> list[str]:
    base = GOOD + tb.HOSTILE + [
        "The pipeline cleans, deduplicates, tokenises and packs text; training reads it from Kafka.",
        "In 2026 the line trained on 1,234,567 tokens at 3.5e-4 with 12 experts, 4 of them active.",
        "Ölçüm sonuçları: çok iyi. Ça va très bien, merci. Größe und Maß.", "naïve coöperate façade",
    ]
    return [f"{t} {i}" for i in range(6) for t in base]


def _train(kind: str) -> str:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if kind in ("wordpiece", "metaspace"):
        if kind == "wordpiece":
            tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
            tok.normalizer, tok.pre_tokenizer = normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer()
            trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[UNK]", *SPECIALS])
        else:
            tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
            tok.pre_tokenizer = pre_tokenizers.Metaspace()
            trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", *SPECIALS])
    elif kind == "llama2":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
        trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<unk>", *SPECIALS]
                                      + [f"<0x{i:02X}>" for i in range(256)])
    else:
        tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
        tok.decoder = decoders.ByteLevel()
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.pre_tokenizer = {
            "llama3": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            "digits": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]),
        }.get(kind, byte_level)
        if kind == "nfc_lower":
            tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
        if kind == "nfkc":
            tok.normalizer = normalizers.NFKC()
        trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, initial_alphabet=alphabet)
    tok.train_from_iterator(_text(), trainer)
    if kind == "added":
        tok.add_tokens([AddedToken("<think>", special=False), AddedToken("hello world", special=False)])
        tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    if kind == "stripping":
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    return tok.to_str()


PROVEN = ["gpt2", "llama3", "llama2", "added", "nfc_lower", "digits"]
UNPROVEN = {"wordpiece": "model type 'WordPiece'", "metaspace": "pre_tokenizer 'Metaspace'",
            "nfkc": "normalizer 'NFKC'", "stripping": "'<mask>' with lstrip"}


@pytest.fixture(scope="module")
def families() -> dict[str, str]:
    return {k: _train(k) for k in [*PROVEN, *UNPROVEN]}


@pytest.fixture(scope="module")
def proven(families) -> dict[str, tuple[tb.Encoder, tb.Encoder]]:
    return {k: (tb.fast_encoder(families[k]), tb.reference_encoder(families[k])) for k in PROVEN}


def _ids(enc: tb.Encoder, texts: list[str]) -> list[list[int]]:
    return [np.asarray(x).tolist() for x in enc.encode_batch(texts)]


@pytest.mark.parametrize("kind", PROVEN)
def test_a_proven_family_runs_fast_with_the_references_ids(families, kind):
    js = families[kind]
    night = _text()[:200]
    choice = tb.choose(js, "auto", night, 100)
    assert (choice.name, choice.unproven) == ("fastokens", []), choice.reason
    assert choice.checked_docs == len(tb.hostile_texts(json.loads(js))) + len(night)
    texts = tb.hostile_texts(json.loads(js)) + _text()
    assert _ids(tb.fast_encoder(js), texts) == _ids(tb.reference_encoder(js), texts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(st.characters(codec="utf-8"), max_size=200) | st.sampled_from(
    ["<|endoftext|>", "<|im_start|>", "<think>", "hello world", " ", "\n", "'s", "99999", "\u2581"]), max_size=8))
def test_generated_text_gets_the_references_ids_in_every_proven_family(proven, texts):
    text = ["".join(texts), *texts]
    for kind, (fast, ref) in proven.items():
        assert _ids(fast, text) == _ids(ref, text), kind


@pytest.mark.parametrize("kind", sorted(UNPROVEN))
def test_a_family_the_fast_backend_cannot_prove_falls_back_and_says_why(families, kind):
    choice = tb.choose(families[kind], "auto", [], 100)
    assert choice.name == "tokenizers"
    assert UNPROVEN[kind] in choice.reason, choice.reason
    with pytest.raises(ConfigError, match="cannot be proven"):
        tb.choose(families[kind], "fastokens", [], 100)


def test_the_reference_backend_is_used_when_asked_and_an_unknown_one_is_an_error(families):
    assert tb.choose(families["gpt2"], "tokenizers", [], 100).name == "tokenizers"
    with pytest.raises(ConfigError, match="tokenizer.backend = 'fast'"):
        tb.choose(families["gpt2"], "fast", [], 100)


def test_truncation_padding_and_regex_replacements_are_not_proven(families):
    spec = json.loads(families["gpt2"])
    spec["truncation"] = {"max_length": 8}
    spec["normalizer"] = {"type": "Replace", "pattern": {"Regex": "a+"}, "content": "b"}
    found = tb.unproven_features(spec)
    assert any("truncation" in u for u in found) and any("regex" in u for u in found)


def _other_tokenizer(js: str) -> tuple[str, str]:
    """The same tokenizer with its first merge gone, and a word whose ids it changes: a real library
    loading a JSON that gives other ids."""
    spec = json.loads(js)
    first = spec["model"]["merges"][0]
    pair = first.split(" ") if isinstance(first, str) else first
    ref = tb.reference_encoder(js).tok
    word = ref.decode([ref.token_to_id("".join(pair))])
    spec["model"]["merges"] = spec["model"]["merges"][1:]
    return json.dumps(spec), word


def _sabotaged(js: str) -> tuple[tb.Encoder, str]:
    import fastokens

    other, word = _other_tokenizer(js)
    fast = tb.FastEncoder(fastokens.Tokenizer.from_json_str(other))
    assert _ids(fast, [f"x{word}y"]) != _ids(tb.reference_encoder(js), [f"x{word}y"])
    return fast, word


def test_a_difference_on_the_nights_documents_is_caught_before_spark(families, monkeypatch):
    js = families["gpt2"]
    fast, word = _sabotaged(js)
    night = ["ordinary text", f"a document with x{word}y in it"]
    monkeypatch.setattr(tb, "fast_encoder", lambda text: fast)
    choice = tb.choose(js, "auto", night, 100)
    assert choice.name == "tokenizers"
    assert "give other ids" in choice.reason and "from token" in choice.reason, choice.reason
    with pytest.raises(ConfigError, match="give other ids"):
        tb.choose(js, "fastokens", night, 100)


def test_a_pack_task_checks_every_nth_document_and_names_the_one_that_differs(families):
    js = families["gpt2"]
    fast, word = _sabotaged(js)
    parity = tb.TaskParity(tb.reference_encoder(js), every=3)
    texts = [f"plain document {i}"[:3 + i] for i in range(7)]
    parity.check(texts, fast.encode_batch(texts), ["f.jsonl"] * 7, list(range(0, 70, 10)))
    assert (parity.seen, parity.checked) == (7, 3)  # documents 0, 3 and 6
    texts = [f"x{word}y", "a", "b"]  # the task's 8th document differs but is not checked; its 10th is
    parity.check(texts, fast.encode_batch(texts), ["f.jsonl"] * 3, [70, 80, 90])
    assert parity.checked == 4
    texts = ["c", "d", f"x{word}y"]  # the 13th is checked and differs
    with pytest.raises(TokenizerMismatch, match=r"\('f.jsonl', 120\).*give other ids"):
        parity.check(texts, fast.encode_batch(texts), ["f.jsonl"] * 3, [100, 110, 120])


def test_without_a_fast_backend_the_task_checks_nothing(families):
    parity = tb.TaskParity(None, every=1)
    parity.check(["a"], [[1]], ["f"], [0])
    assert parity.checked == 0


def test_hostile_texts_say_every_added_token_in_context(families):
    texts = tb.hostile_texts(json.loads(families["added"]))
    for t in ["<|im_start|>", "<think>", "hello world", "<|endoftext|>"]:
        assert t in texts and f"a{t}b" in texts
    assert "a\x00b\x00\x00c" in texts and any(len(t) >= 5000 for t in texts)
