import json

import pytest

from stoker.exceptions import ManifestError
from stoker.files import atomic_write_json
from stoker.run.manifest import Manifest, PartitionRange, read_manifest, write_manifest

pytestmark = pytest.mark.unit


def _manifest(**over) -> Manifest:
    base = dict(
        run_id="sample/2026-12-01", corpus="sample", ds="2026-12-01", topic="stoker.sample.20261201.a1",
        partitions=[PartitionRange(partition=0, start_offset=0, end_offset=4, sequences=3),
                    PartitionRange(partition=1, start_offset=0, end_offset=3, sequences=2)],
        seq_len=8, dtype="uint16", tokenizer_path="/t/tokenizer.json", tokenizer_sha256="ab" * 32,
        vocab_size=100, docs_in=10, docs_kept=7, docs_dropped={"duplicate": 2, "invalid_json": 1},
        tokens=40, padding_tokens=5, sequences=5, source_uri="/data",
    )
    base.update(over)
    return Manifest(**base)


def test_write_then_read_round_trips(tmp_path):
    m = _manifest()
    path = write_manifest(tmp_path, m)
    assert path.name == "manifest.json"
    back = read_manifest(tmp_path)
    assert back == m
    assert back.end_offsets() == {0: 4, 1: 3}
    assert not [p for p in tmp_path.iterdir() if p.name != "manifest.json"]  # no temp files left


def test_counts_that_do_not_add_up_are_refused(tmp_path):
    with pytest.raises(ManifestError, match="docs_in 11"):
        write_manifest(tmp_path, _manifest(docs_in=11))
    with pytest.raises(ManifestError, match="partition sequences"):
        write_manifest(tmp_path, _manifest(sequences=6))
    assert not (tmp_path / "manifest.json").exists()


def test_a_failed_write_leaves_the_old_manifest_whole(tmp_path):
    write_manifest(tmp_path, _manifest())
    before = (tmp_path / "manifest.json").read_text()

    class Boom:
        def __iter__(self):
            raise RuntimeError("disk full")

    with pytest.raises(TypeError):
        atomic_write_json(tmp_path / "manifest.json", {"x": Boom()})
    assert (tmp_path / "manifest.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_missing_or_corrupt_manifest_says_what_to_do(tmp_path):
    with pytest.raises(ManifestError, match="tokenize_publish not done"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="unreadable"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 1, "partitions": []}))
    with pytest.raises(ManifestError, match="malformed"):
        read_manifest(tmp_path)


def test_the_trainer_takes_eos_and_pad_from_the_manifest_and_never_guesses(tmp_path):
    """The ids the packer used travel in the manifest; an earlier manifest without them falls back to the
    config's default tokens, and a tokenizer without those is an error, not a silent id 0."""
    import dataclasses

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    from stoker.exceptions import StokerError
    from training.model import special_ids

    tok_path = tmp_path / "tok.json"
    Tokenizer(WordLevel({"a": 0, "<|endoftext|>": 7, "<|pad|>": 9}, unk_token="a")).save(str(tok_path))
    m = dataclasses.replace(_manifest(), tokenizer_path=str(tok_path))
    assert special_ids(dataclasses.replace(m, eos_id=3, pad_id=4)) == (3, 4)
    assert special_ids(dataclasses.replace(m, eos_id=-1, pad_id=-1)) == (7, 9)
    Tokenizer(WordLevel({"a": 0, "b": 1}, unk_token="a")).save(str(tok_path))
    with pytest.raises(StokerError, match="records no EOS/PAD ids.*re-run tokenize_publish"):
        special_ids(dataclasses.replace(m, eos_id=-1, pad_id=-1))
