"""Sources in object stores, against real servers the suite starts: SeaweedFS's S3 gateway and
Hadoop's own NameNode + DataNode. For each: await_source waits while the night's marker is absent
and proceeds when it appears, the job reads the right night and publishes exactly the sequences a
run on the same files from a local folder publishes, and the lineage names every file read. A
refused credential, a missing bucket or an unreachable store fails in seconds, named, before a
manifest or a topic exists."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from spark_jobs.tokenize_publish import run_job
from stoker.exceptions import SourceError
from stoker.kafka import offsets as koffsets
from stoker.kafka import topics as ktopics
from stoker.stores.drops import open_store
from stoker.stores.s3 import S3Settings
from stoker_airflow.sensors.source import SourceReadySensor

pytestmark = pytest.mark.integration

NIGHTS = ("2026-11-30", "2026-12-01")


def _night_files(corpus: Path) -> dict[str, dict[str, bytes]]:
    """Two nights: the first is the test corpus, the second its first file plus a document of its own."""
    a, b = (corpus / "a.jsonl").read_bytes(), (corpus / "b.jsonl").read_bytes()
    return {NIGHTS[0]: {"a.jsonl": a, "b.jsonl": b},
            NIGHTS[1]: {"a.jsonl": a, "c.jsonl": json.dumps({"text": "Only on the first of December."}).encode()}}


def _upload(store, root: str, nights: dict[str, dict[str, bytes]], *, marker_for: tuple[str, ...]) -> None:
    for night, files in nights.items():
        for name, data in files.items():
            store.put(f"{root}/{night}/{name}", data)
        if night in marker_for:
            store.put(f"{root}/{night}/_SUCCESS", b"")


def _local_copy(tmp_path: Path, files: dict[str, bytes]) -> Path:
    folder = tmp_path / "local-night"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def _published(kafka_config, topic: str) -> list[tuple[bytes, bytes]]:
    return sorted((m.key(), m.value()) for m in koffsets.read_all(kafka_config, topic))


def _same_as_local(spark, kafka_config, cfg, tmp_path, remote_root: str, files: dict[str, bytes], tag: str):
    """Run the job on the remote night and on a local copy of its files; return both manifests."""
    ds = NIGHTS[1]
    remote_cfg = dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, uri=remote_root + "/{ds}"))
    remote = run_job(spark, remote_cfg, ds=ds, topic=f"stoker.{tag}.20261201.a1", run_dir=tmp_path / "remote",
                     kafka_config=kafka_config)
    local_cfg = dataclasses.replace(cfg, source=dataclasses.replace(
        cfg.source, uri=str(_local_copy(tmp_path, files)), webhdfs_url=None))
    local = run_job(spark, local_cfg, ds=ds, topic=f"stoker.{tag}local.20261201.a1", run_dir=tmp_path / "local",
                    kafka_config=kafka_config)
    assert remote.source_uri == f"{remote_root}/{ds}"  # the logical date chose the night
    assert (remote.docs_in, remote.docs_kept, remote.docs_dropped) == (local.docs_in, local.docs_kept,
                                                                       local.docs_dropped)
    assert remote.sequences == local.sequences > 0
    assert _published(kafka_config, remote.topic) == _published(kafka_config, local.topic)
    # lineage: the night's data files (not the marker, not the other night), sizes and checksums
    assert [Path(f["path"]).name for f in remote.source_files] == sorted(files)
    for f in remote.source_files:
        data = files[Path(f["path"]).name]
        assert (f["bytes"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    return remote


def _s3_cfg(cfg, conn_id: str = "aws_default"):
    return dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, aws_conn_id=conn_id))


def test_s3_night_is_awaited_then_read_like_the_same_files_from_a_folder(spark, kafka_config, small_cfg, s3_env,
                                                                         tmp_path):
    root = f"s3://corpora/{tmp_path.name}/nights"
    store = s3_env.store()
    nights = _night_files(Path(small_cfg.source.uri))
    _upload(store, root, nights, marker_for=(NIGHTS[0],))  # night 2 is still being written

    sensor = SourceReadySensor(task_id="await_source", uri=f"{root}/{NIGHTS[1]}", aws_conn_id="stoker_test_s3")
    assert sensor.poke({}) is False
    assert SourceReadySensor(task_id="s", uri=f"{root}/{NIGHTS[0]}", aws_conn_id="stoker_test_s3").poke({}) is True
    store.put(f"{root}/{NIGHTS[1]}/_SUCCESS", b"")
    assert sensor.poke({}) is True
    # no marker configured: any data file will do
    assert SourceReadySensor(task_id="s", uri=f"{root}/{NIGHTS[1]}", success_marker=None,
                             aws_conn_id="stoker_test_s3").poke({}) is True

    m = _same_as_local(spark, kafka_config, _s3_cfg(small_cfg), tmp_path, root, nights[NIGHTS[1]], "s3")
    assert all(f["path"].startswith(f"s3a://corpora/{tmp_path.name}/nights/{NIGHTS[1]}/") for f in m.source_files)
    etags = {f["path"].rsplit("/", 1)[1]: f["etag"] for f in m.source_files}
    assert etags == {f.uri.rsplit("/", 1)[1]: f.etag for f in store.list_files(f"{root}/{NIGHTS[1]}")
                     if not f.uri.endswith("_SUCCESS")}


def test_hdfs_night_is_awaited_then_read_like_the_same_files_from_a_folder(spark, kafka_config, small_cfg, hdfs,
                                                                           tmp_path):
    root = hdfs.uri(f"/{tmp_path.name}/nights")
    store = hdfs.store()
    nights = _night_files(Path(small_cfg.source.uri))
    _upload(store, root, nights, marker_for=(NIGHTS[0],))

    sensor = SourceReadySensor(task_id="await_source", uri=f"{root}/{NIGHTS[1]}", webhdfs_url=hdfs.webhdfs_url)
    assert sensor.poke({}) is False
    assert SourceReadySensor(task_id="s", uri=f"{root}/{NIGHTS[0]}", webhdfs_url=hdfs.webhdfs_url).poke({}) is True
    store.put(f"{root}/{NIGHTS[1]}/_SUCCESS", b"")
    assert sensor.poke({}) is True

    cfg = dataclasses.replace(small_cfg, source=dataclasses.replace(small_cfg.source,
                                                                    webhdfs_url=hdfs.webhdfs_url))
    m = _same_as_local(spark, kafka_config, cfg, tmp_path, root, nights[NIGHTS[1]], "hdfs")
    assert all(f["path"].startswith(f"{root}/{NIGHTS[1]}/") for f in m.source_files)


@pytest.fixture()
def plain_http(tmp_path):
    """A web server that is not a NameNode: 404 for every WebHDFS path."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _dead_port() -> int:
    from stoker_local.servers import free_ports

    return free_ports(1)


BAD_SOURCES = {
    "wrong secret": ("s3", lambda s3, h: ("s3://corpora/x/{ds}", S3Settings(
        endpoint_url=s3.endpoint_url, access_key=s3.access_key, secret_key="not-the-secret")),
        "refused the credentials (SignatureDoesNotMatch"),
    "unknown key": ("s3", lambda s3, h: ("s3://corpora/x/{ds}", S3Settings(
        endpoint_url=s3.endpoint_url, access_key="nobody", secret_key="x")), "refused the credentials"),
    "missing bucket": ("s3", lambda s3, h: ("s3://no-such-bucket/x/{ds}", s3.settings),
                       "bucket 'no-such-bucket' does not exist"),
    "unreachable S3 endpoint": ("s3", lambda s3, h: ("s3://corpora/x/{ds}", S3Settings(
        endpoint_url=f"http://127.0.0.1:{_dead_port()}", access_key="a", secret_key="b")),
        "cannot reach the S3 endpoint"),
    "unreachable NameNode": ("hdfs", lambda s3, h: (f"hdfs://127.0.0.1:{_dead_port()}/x/{{ds}}", None),
                             "cannot reach the NameNode"),
    "not a WebHDFS address": ("hdfs", lambda s3, h: ("hdfs://127.0.0.1:1/x/{ds}", None),
                              "is not the NameNode's WebHDFS"),  # an HTTP server that answers 404 to all
}


@pytest.mark.parametrize("case", list(BAD_SOURCES))
def test_a_bad_store_fails_in_seconds_named_and_leaves_no_manifest(case, spark, kafka_config, small_cfg, seaweed,
                                                                   plain_http, tmp_path, monkeypatch):
    _, make, message = BAD_SOURCES[case]
    uri, settings = make(seaweed, None)
    for k, v in (settings.to_env() if settings else {}).items():
        monkeypatch.setenv(k, v)
    # WebHDFS on the dead port too, or on a server that is not a NameNode (the S3 gateway answers 404s)
    webhdfs = {"unreachable NameNode": uri.replace("hdfs://", "http://").split("/x/")[0],
               "not a WebHDFS address": plain_http}.get(case)
    cfg = dataclasses.replace(small_cfg, source=dataclasses.replace(small_cfg.source, uri=uri, webhdfs_url=webhdfs,
                                                                    aws_conn_id="stoker_no_such_conn"))
    topic = f"stoker.bad{abs(hash(case)) % 10**6}.20261201.a1"
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=re.escape(message)) as err:
        run_job(spark, cfg, ds=NIGHTS[1], topic=topic, run_dir=tmp_path / "run", kafka_config=kafka_config)
    assert time.monotonic() - t0 < 30, "a bad store must fail in seconds, not after minutes of retries"
    assert uri.replace("{ds}", NIGHTS[1]) in str(err.value)  # names what it tried to read
    assert not (tmp_path / "run" / "manifest.json").exists()
    assert topic not in ktopics.list_topics(kafka_config, "stoker.bad")

    # await_source says the same; what no retry can fix fails the task for good
    sensor = SourceReadySensor(task_id="await_source", uri=uri.replace("{ds}", NIGHTS[1]),
                               aws_conn_id="stoker_no_such_conn", webhdfs_url=webhdfs)
    expected = SourceError if "unreachable" in case else AirflowFailException
    with pytest.raises(expected, match=re.escape(message)):
        sensor.poke({})


def test_a_connection_wins_over_the_environment(s3_env, monkeypatch):
    from stoker_airflow.hooks import s3_settings

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "stale-environment-secret")
    assert s3_settings("stoker_test_s3").secret_key == s3_env.secret_key
    assert s3_settings("stoker_no_such_conn").secret_key == "stale-environment-secret"
    assert open_store("s3://corpora/x", s3=s3_settings("stoker_test_s3")).list_files("s3://corpora/none") == []


def test_a_dead_namenode_rpc_port_fails_the_spark_read_in_seconds(spark, kafka_config, small_cfg, hdfs, tmp_path):
    """WebHDFS answers (the preflight passes) but nothing listens on the hdfs:// RPC port: Spark's own
    client gives up after its bounded retries, with the URI named, and nothing is published."""
    hdfs.store().put(hdfs.uri(f"/{tmp_path.name}/2026-12-01/a.jsonl"), b'{"text": "hello"}\n')
    uri = f"hdfs://127.0.0.1:{_dead_port()}/{tmp_path.name}/{{ds}}"
    cfg = dataclasses.replace(small_cfg, source=dataclasses.replace(small_cfg.source, uri=uri,
                                                                    webhdfs_url=hdfs.webhdfs_url))
    topic = "stoker.deadrpc.20261201.a1"
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=re.escape(uri.replace("{ds}", NIGHTS[1])) + ": Spark cannot read it"):
        run_job(spark, cfg, ds=NIGHTS[1], topic=topic, run_dir=tmp_path / "run", kafka_config=kafka_config)
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "run" / "manifest.json").exists()
    assert topic not in ktopics.list_topics(kafka_config, "stoker.deadrpc")


@pytest.mark.parametrize("kind", ["s3", "hdfs"])
def test_an_object_rewritten_between_the_passes_fails_the_attempt(kind, spark, kafka_config, small_cfg, request,
                                                                  tmp_path):
    """As tests/integration/test_tokenize_publish.py does for a local file, for an S3 object (its ETag, asked with
    ``If-Match``) and an HDFS file (its modification time): re-delivered between the index pass and the pack pass
    with other bytes of the same length (so its size says nothing), it fails the attempt, named; no manifest."""
    from spark_jobs.tokenize_publish import pack_publish, prepare, stage
    from stoker.layout import RunLayout, tasks_topic

    files = _night_files(Path(small_cfg.source.uri))[NIGHTS[1]]
    if kind == "s3":
        store, root, cfg = request.getfixturevalue("s3_env").store(), f"s3://corpora/{tmp_path.name}/rw", \
            _s3_cfg(small_cfg)
    else:
        hdfs = request.getfixturevalue("hdfs")
        store, root = hdfs.store(), hdfs.uri(f"/{tmp_path.name}/rw")
        cfg = dataclasses.replace(small_cfg, source=dataclasses.replace(small_cfg.source, webhdfs_url=hdfs.webhdfs_url))
    _upload(store, root, {NIGHTS[1]: files}, marker_for=(NIGHTS[1],))
    cfg = dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, uri=root + "/{ds}"))
    run, topic = RunLayout(tmp_path / "run"), f"stoker.rw{kind}.20261201.a1"
    inputs = prepare(spark, cfg, NIGHTS[1], run, kafka_config)
    staged = stage(spark, cfg, inputs)
    rewritten = files["a.jsonl"].replace(b"e", b"E", 3)
    assert len(rewritten) == len(files["a.jsonl"]) and rewritten != files["a.jsonl"]
    time.sleep(0.01)  # HDFS keeps modification times in milliseconds
    store.put(f"{root}/{NIGHTS[1]}/a.jsonl", rewritten)
    how = r"its ETag is no longer" if kind == "s3" else r"\d+ bytes, modified \S+ when listed; now \d+ bytes"
    with pytest.raises(Exception, match=rf"a.jsonl changed while this run read it \({how}"):
        pack_publish(spark, staged, cfg, inputs, topic, kafka_config, fail=None)
    assert not run.manifest.exists()
    ktopics.delete_topics(kafka_config, [topic, tasks_topic(topic)])
