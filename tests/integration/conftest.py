"""Fixtures of the integration tests (the suite-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from stoker.config.corpus import load_corpus
from tests.support.small_corpus import write_corpus


@pytest.fixture()
def small_cfg(tmp_path, sample_corpus):
    cfg = load_corpus(Path(__file__).resolve().parents[2] / "corpora" / "sample.yaml")
    write_corpus(tmp_path / "corpus")
    cfg.source = dataclasses.replace(cfg.source, uri=str(tmp_path / "corpus"))
    cfg.tokenizer = dataclasses.replace(cfg.tokenizer, path=str(sample_corpus["tokenizer"]))
    cfg.pack = dataclasses.replace(cfg.pack, seq_len=64)
    cfg.publish = dataclasses.replace(cfg.publish, spark_partitions=3)
    cfg.eval = dataclasses.replace(cfg.eval, holdout_per_mille=0)  # every kept document reaches the topic
    return cfg


@pytest.fixture()
def s3_env(seaweed, monkeypatch):
    """The job reads the usual AWS environment (the operator fills it from the Airflow connection);
    the sensor reads the connection itself."""
    for k, v in seaweed.settings.to_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AIRFLOW_CONN_STOKER_TEST_S3", json.dumps({
        "conn_type": "aws", "login": seaweed.access_key, "password": seaweed.secret_key,
        "extra": {"endpoint_url": seaweed.endpoint_url, "region_name": "us-east-1"}}))
    return seaweed
