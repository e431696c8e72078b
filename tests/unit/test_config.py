import copy

import pytest
import yaml

from stoker import paths
from stoker.config.corpus import load_all, load_corpus, parse_corpus
from stoker.exceptions import ConfigError

pytestmark = pytest.mark.unit

SAMPLE = paths.REPO_ROOT / "corpora" / "sample.yaml"


def _data() -> dict:
    return yaml.safe_load(SAMPLE.read_text())


def test_every_shipped_corpus_validates():
    examples = {c.name: c for c in load_all(paths.REPO_ROOT / "corpora" / "examples")}
    assert examples["sample_s3"].source.render("2026-12-01") == "s3://corpora/sample/2026-12-01"
    assert examples["sample_hdfs"].source.render("2026-12-01").startswith("hdfs://127.0.0.1:29820/")
    configs = load_all(paths.REPO_ROOT / "corpora")
    assert "sample" in [c.name for c in configs]
    cfg = load_corpus(SAMPLE)
    assert cfg.pack.seq_len == 256
    assert cfg.topic.partitions % cfg.train.world_size == 0
    assert cfg.source.render("2026-12-01").endswith("data/sample")


@pytest.mark.parametrize(
    "path,value,expected",
    [
        (("pack", "seq_len"), 0, r"pack.seq_len = 0: must be in \[2, 1048576\]"),
        (("pack", "seq_len"), "256", r"pack.seq_len = '256': must be of type int"),
        (("topic", "compression"), "gzip", r"topic.compression = 'gzip': must be one of"),
        (("topic", "min_insync_replicas"), 2, r"must be in \[1, replication_factor=1\]"),
        (("topic", "retention_ms"), 5000, r"topic.retention_ms = 5000: must be -1 \(keep for ever\) or at least 60000"),
        (("topic", "retention_ms"), -2, r"topic.retention_ms = -2: must be -1"),
        (("topic", "partitions"), 3, r"topic.partitions = 3: must be a multiple of train.world_size \(2\)"),
        (("source", "uri"), "ftp://x/y", r"scheme 'ftp' is not one of"),
        (("source", "uri"), "s3:///nights/{ds}", r"source.uri = 's3:///nights/{ds}': names no bucket"),
        (("source", "uri"), "hdfs:///corpora", r"names no NameNode: write hdfs://<namenode>:<port>/<path>"),
        (("source", "webhdfs_url"), "namenode:9870", r"source.webhdfs_url = 'namenode:9870': must be an http"),
        (("clean", "normalization"), "NFD", r"clean.normalization = 'NFD'"),
        (("schedule", "cron"), "nightly", r"schedule.cron = 'nightly': must have 5 fields"),
        (("schedule", "start_date"), "yesterday", r"schedule.start_date = 'yesterday': must be a date"),
        (("train", "world_size"), True, r"train.world_size = True: must be of type int"),
    ],
)
def test_bad_values_name_the_field_the_value_and_the_limit(path, value, expected):
    data = copy.deepcopy(_data())
    data[path[0]][path[1]] = value
    with pytest.raises(ConfigError, match=expected) as e:
        parse_corpus(data, "corpora/sample.yaml")
    assert str(e.value).startswith("corpora/sample.yaml: ")


def test_unknown_and_missing_keys_are_reported():
    data = copy.deepcopy(_data())
    data["pack"]["seqlen"] = 512
    with pytest.raises(ConfigError, match=r"pack: unknown key\(s\) \['seqlen'\]"):
        parse_corpus(data)
    data = copy.deepcopy(_data())
    del data["tokenizer"]
    with pytest.raises(ConfigError, match="tokenizer is required"):
        parse_corpus(data)


def test_file_name_must_match_the_corpus_name(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text(SAMPLE.read_text())
    with pytest.raises(ConfigError, match="must equal the file name 'other'"):
        load_corpus(other)


def test_source_render_selects_the_night():
    data = copy.deepcopy(_data())
    data["source"]["uri"] = "/drops/{ds}/part-{ds_nodash}"
    cfg = parse_corpus(data)
    assert cfg.source.render("2026-12-01") == "/drops/2026-12-01/part-20261201"
