"""S3 and HDFS settings as pure logic: where credentials come from, what Spark's S3A is told."""

from __future__ import annotations

import pytest

from stoker.exceptions import SourceError
from stoker.stores.drops import drop_status
from stoker.stores.hdfs import webhdfs_url_for
from stoker.stores.local import is_data_file, is_data_path
from stoker.stores.s3 import S3Settings, split_s3

pytestmark = pytest.mark.unit


def test_settings_from_the_aws_environment():
    s = S3Settings.from_env({"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK",
                             "AWS_ENDPOINT_URL": "http://store:8333", "AWS_DEFAULT_REGION": "eu-west-1"})
    assert (s.access_key, s.secret_key, s.endpoint_url, s.region) == ("AK", "SK", "http://store:8333", "eu-west-1")
    assert s.use_path_style  # a custom endpoint is an S3-compatible server: path-style addressing
    assert S3Settings.from_env({"AWS_ENDPOINT_URL_S3": "http://a", "AWS_ENDPOINT_URL": "http://b"}).endpoint_url \
        == "http://a"  # the S3-specific variable wins, as in the AWS SDKs
    assert not S3Settings.from_env({}).use_path_style  # AWS itself: virtual-hosted style


def test_settings_from_an_amazon_provider_connection_round_trip_through_the_environment():
    s = S3Settings.from_connection("AK", "SK", {"endpoint_url": "https://s3.internal", "region_name": "us-west-2",
                                                "aws_session_token": "TOK"})
    assert S3Settings.from_env(s.to_env()) == s
    conf = s.hadoop_conf()
    assert conf["fs.s3a.endpoint"] == "https://s3.internal" and conf["fs.s3a.connection.ssl.enabled"] == "true"
    assert conf["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
    assert (conf["fs.s3a.access.key"], conf["fs.s3a.secret.key"], conf["fs.s3a.session.token"]) == ("AK", "SK", "TOK")
    assert conf["fs.s3a.endpoint.region"] == "us-west-2" and conf["fs.s3a.path.style.access"] == "true"


def test_without_keys_s3a_keeps_its_default_credential_chain():
    conf = S3Settings().hadoop_conf()
    assert "fs.s3a.access.key" not in conf and "fs.s3a.aws.credentials.provider" not in conf
    assert "fs.s3a.endpoint" not in conf


def test_uris_split_and_webhdfs_defaults_to_the_namenode_host():
    assert split_s3("s3://bucket/a/b") == ("bucket", "a/b")
    assert split_s3("s3a://bucket") == ("bucket", "")
    with pytest.raises(SourceError, match="no bucket"):
        split_s3("s3:///a")
    assert webhdfs_url_for("hdfs://nn.example:8020/x") == "http://nn.example:9870"
    assert webhdfs_url_for("hdfs://nn:8020/x", "https://gw:50470/") == "https://gw:50470"
    assert not is_data_file("_SUCCESS") and not is_data_file(".part-0.crc") and is_data_file("part-0.jsonl")


class _Listing:
    def __init__(self, names):
        self.names = names

    def exists(self, uri):
        return uri.rsplit("/", 1)[1] in self.names

    def list_files(self, uri):
        from stoker.stores.base import FileInfo

        return [FileInfo(f"{uri}/{n}", 1) for n in self.names]


def test_a_drop_is_complete_on_its_marker_or_without_one_on_any_data_file():
    assert drop_status(_Listing(["a.jsonl"]), "s3://b/n", "_SUCCESS") == (False, "waiting for s3://b/n/_SUCCESS")
    assert drop_status(_Listing(["a.jsonl", "_SUCCESS"]), "s3://b/n", "_SUCCESS")[0]
    assert drop_status(_Listing(["_temporary", ".x.crc"]), "s3://b/n", None)[0] is False
    # a writer still at work: its files under _temporary/ are not data; nor is a folder-marker key
    assert drop_status(_Listing(["_temporary/0/part-0.jsonl", ""]), "s3://b/n", None)[0] is False
    assert drop_status(_Listing(["sub/part-0.jsonl"]), "s3://b/n", None)[0] is True


def test_data_paths_are_judged_below_the_drop_root_only():
    assert is_data_path("s3://b/_staging/n", "s3://b/_staging/n/part-0.jsonl")  # the root may be hidden-looking
    assert not is_data_path("s3://b/n/", "s3://b/n/_temporary/0/part-0.jsonl")
    assert not is_data_path("s3://b/n", "s3://b/n/")
    assert not is_data_path("hdfs://nn:8020/n", "hdfs://nn:8020/n/a/.part-0.crc")


def test_a_connection_replaces_the_workers_aws_environment_and_parses_flags_as_text():
    s = S3Settings.from_connection("AK", "SK", {"endpoint_url": "http://store", "s3_path_style": "false"})
    assert s.use_path_style is False  # "false" is false, not a truthy string
    env = s.to_env(complete=True)
    assert env["AWS_SESSION_TOKEN"] == "" and env["AWS_ENDPOINT_URL"] == "" and env["AWS_ACCESS_KEY_ID"] == "AK"
    assert S3Settings.from_env(env) == S3Settings.from_env(s.to_env())  # "" reads back as unset
    assert drop_status(_Listing(["a.jsonl"]), "s3://b/n", None) == (True, "1 data files")


def test_connector_and_server_versions_agree_everywhere():
    """S3A must match the Hadoop client pyspark ships, and the Makefile must build what the code runs."""
    import subprocess

    from stoker import paths
    from stoker.stores.connectors import HADOOP_VERSION, spark_hadoop_version
    from stoker_local.servers import SEAWEEDFS_VERSION

    assert spark_hadoop_version() == HADOOP_VERSION
    from stoker_local.broker import KAFKA_VERSION

    out = subprocess.run(["make", "-s", "-C", str(paths.REPO_ROOT), "versions"], capture_output=True, text=True,
                         check=True).stdout.split()
    assert dict(kv.split("=", 1) for kv in out) == {"KAFKA_VER": KAFKA_VERSION, "HADOOP_VER": HADOOP_VERSION,
                                                    "SEAWEEDFS_VER": SEAWEEDFS_VERSION}
    for pom in ("stoker/stores/connectors/pom.xml", "stoker_local/servers/hdfs/pom.xml"):
        text = (paths.REPO_ROOT / pom).read_text()
        assert f"<hadoop.version>{HADOOP_VERSION}</hadoop.version>" in text, pom


def test_a_corpus_needs_s3_for_its_source_or_its_near_dedup_index():
    # the Spark job gets the S3A jars and the connection's keys for either (an index on S3 beside a local drop)
    from stoker.config.corpus import parse_corpus
    from stoker.stores.drops import uses_s3

    def corpus(uri: str, index: str | None) -> object:
        quality = {"near_dedup": {"enabled": True, "index": index}} if index else {}
        return parse_corpus({"name": "c", "source": {"uri": uri}, "tokenizer": {"path": "t.json"}, "quality": quality})

    assert uses_s3(corpus("s3://b/drops/{ds}", None)) and uses_s3(corpus("/data/{ds}", "s3a://b/index"))
    assert not uses_s3(corpus("/data/{ds}", None)) and not uses_s3(corpus("hdfs://nn/d/{ds}", "hdfs://nn/index"))
