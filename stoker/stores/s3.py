"""A drop in S3 (or an S3-compatible store) through boto3 with short timeouts, and the ``fs.s3a.*``
settings Spark reads it with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker.exceptions import SourceError
from stoker.stores.base import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, FileInfo

# ----------------------------------------------------------------------------------------------- S3


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach an S3-compatible store. ``None`` fields fall back to the SDKs' own defaults
    (the AWS environment, shared config files, instance roles)."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    path_style: bool | None = None
    """Path-style addressing (``endpoint/bucket/key``); on by default with a custom endpoint,
    which is what S3-compatible servers (SeaweedFS, Ceph, MinIO) expect."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        e = os.environ if env is None else env
        style = e.get("STOKER_S3_PATH_STYLE") or None
        return cls(endpoint_url=e.get("AWS_ENDPOINT_URL_S3") or e.get("AWS_ENDPOINT_URL") or None,
                   region=e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION") or None,
                   access_key=e.get("AWS_ACCESS_KEY_ID") or None, secret_key=e.get("AWS_SECRET_ACCESS_KEY") or None,
                   session_token=e.get("AWS_SESSION_TOKEN") or None,
                   path_style=None if style is None else _truthy(style))

    @classmethod
    def from_connection(cls, login: str | None, password: str | None, extra: Mapping[str, Any]) -> S3Settings:
        """An Airflow connection of the Amazon provider's shape."""
        style = extra.get("s3_path_style", extra.get("path_style"))
        style = _truthy(style) if isinstance(style, str) else style
        return cls(endpoint_url=extra.get("endpoint_url") or None,
                   region=extra.get("region_name") or extra.get("region") or None,
                   access_key=login or extra.get("aws_access_key_id") or None,
                   secret_key=password or extra.get("aws_secret_access_key") or None,
                   session_token=extra.get("aws_session_token") or None,
                   path_style=None if style is None else bool(style))

    @property
    def use_path_style(self) -> bool:
        return self.path_style if self.path_style is not None else self.endpoint_url is not None

    def to_env(self, complete: bool = False) -> dict[str, str]:
        """The same settings as environment variables, for a child process (spark-submit). With
        ``complete``, unset fields are set to ``""`` (read back as unset), so nothing of the parent's
        own AWS environment (a stale session token, another endpoint) mixes with them."""
        pairs = {"AWS_ENDPOINT_URL_S3": self.endpoint_url, "AWS_REGION": self.region,
                 "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                 "AWS_SESSION_TOKEN": self.session_token,
                 "STOKER_S3_PATH_STYLE": None if self.path_style is None else str(self.path_style).lower()}
        if complete:
            return {**dict.fromkeys(("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"), ""),
                    **{k: v or "" for k, v in pairs.items()}}
        return {k: v for k, v in pairs.items() if v is not None}

    def hadoop_conf(self) -> dict[str, str]:
        """``fs.s3a.*`` for Spark's Hadoop configuration (Spark redacts the keys in its UI and logs)."""
        conf = {
            "fs.s3a.path.style.access": str(self.use_path_style).lower(),
            # Spark reads every file whole (binaryFile): no random-access read-ahead games
            "fs.s3a.input.fadvise": "sequential",
            # the preflight has already proven the store reachable: keep retries short and bounded
            "fs.s3a.connection.establish.timeout": "5s",
            "fs.s3a.attempts.maximum": "3",
            "fs.s3a.retry.limit": "3",
        }
        if self.endpoint_url:
            conf["fs.s3a.endpoint"] = self.endpoint_url
            conf["fs.s3a.connection.ssl.enabled"] = str(self.endpoint_url.startswith("https")).lower()
        conf["fs.s3a.endpoint.region"] = self.region or "us-east-1"
        if self.access_key and self.secret_key:
            conf["fs.s3a.access.key"] = self.access_key
            conf["fs.s3a.secret.key"] = self.secret_key
            if self.session_token:
                conf["fs.s3a.session.token"] = self.session_token
                conf["fs.s3a.aws.credentials.provider"] = \
                    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            else:
                conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        return conf

    def describe(self) -> str:
        return self.endpoint_url or "AWS S3"


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` (or ``s3a://``) → ``("bucket", "a/b")``."""
    rest = uri.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise SourceError(f"source uri {uri!r}: no bucket: write s3://<bucket>/<prefix>")
    return bucket, key


class S3Store:
    def __init__(self, settings: S3Settings) -> None:
        import boto3
        from botocore.config import Config

        self.settings = settings
        cfg = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                     retries={"total_max_attempts": 2, "mode": "standard"},
                     s3={"addressing_style": "path" if settings.use_path_style else "auto"})
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=settings.endpoint_url, region_name=settings.region or "us-east-1",
            aws_access_key_id=settings.access_key, aws_secret_access_key=settings.secret_key,
            aws_session_token=settings.session_token, config=cfg)

    def _call(self, uri: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            ReadTimeoutError,
        )

        bucket = kwargs.get("Bucket")
        where = f"{uri} at {self.settings.describe()}"
        try:
            return fn(**kwargs)
        except ClientError as e:
            err = e.response.get("Error", {})
            code, status = str(err.get("Code", "")), e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket" or (code in ("404", "NotFound") and "Key" not in kwargs):
                raise SourceError(f"{where}: bucket {bucket!r} does not exist (NoSuchBucket): create it, or fix "
                                  "source.uri") from None
            if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                        "ServiceUnavailable", "503", "500") or (isinstance(status, int) and status >= 500):
                raise SourceError(f"{where}: the store is failing or throttling ({code or status}: "
                                  f"{err.get('Message', '')}): try again later", transient=True) from None
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "Forbidden",
                        "InvalidToken", "ExpiredToken") or status == 403:
                raise SourceError(f"{where}: the store refused the credentials ({code or status}: "
                                  f"{err.get('Message', '')}): check the access key and secret of the Airflow "
                                  "connection (source.aws_conn_id) or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, and "
                                  f"that they may list and read bucket {bucket!r}") from None
            raise SourceError(f"{where}: {code or status}: {err.get('Message', e)}") from None
        except NoCredentialsError:
            raise SourceError(f"{where}: no S3 credentials: set them in the Airflow connection named by "
                              "source.aws_conn_id, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY") from None
        except (EndpointConnectionError, ConnectionClosedError, ConnectTimeoutError, ReadTimeoutError) as e:
            raise SourceError(f"{where}: cannot reach the S3 endpoint ({e}): check endpoint_url and that the "
                              "store is up", transient=True) from None
        except BotoCoreError as e:
            raise SourceError(f"{where}: {type(e).__name__}: {e}: check endpoint_url and that the store is up") \
                from None

    def list_files(self, uri: str) -> list[FileInfo]:
        """Every object under the prefix (markers included), recursively, in key order."""
        bucket, key = split_s3(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        out: list[FileInfo] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            page = self._call(uri, self.client.list_objects_v2, **kw)
            out += [FileInfo(f"s3://{bucket}/{o['Key']}", int(o["Size"]), str(o.get("ETag", "")).strip('"') or None,
                             o["LastModified"].timestamp() if o.get("LastModified") else None)
                    for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return sorted(out, key=lambda f: f.uri)
            if not page.get("NextContinuationToken") or page["NextContinuationToken"] == token:
                raise SourceError(f"{uri} at {self.settings.describe()}: the store said the listing goes on but "
                                  "gave no new continuation token (not S3-compatible here)", transient=True)
            token = page["NextContinuationToken"]

    def exists(self, uri: str) -> bool:
        # a listing, not HEAD: a missing bucket or a refused credential then says so instead of 404
        bucket, key = split_s3(uri)
        page = self._call(uri, self.client.list_objects_v2, Bucket=bucket, Prefix=key, MaxKeys=1)
        return any(o["Key"] == key for o in page.get("Contents", []))

    def check(self, uri: str) -> None:
        bucket, _ = split_s3(uri)
        self._call(uri, self.client.list_objects_v2, Bucket=bucket, MaxKeys=1)

    def put(self, uri: str, data: bytes) -> None:
        bucket, key = split_s3(uri)
        self._call(uri, self.client.put_object, Bucket=bucket, Key=key, Body=data)
