"""Validated models of ``corpora/<name>.yaml``.

Every field has a docstring under it and every check lives in ``__post_init__``; a bad value
raises :class:`ConfigError` naming the field, the value, the limit and where to fix it, so a
broken corpus fails when the DAG file is parsed, not at 2 a.m. in the middle of a refresh.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import date
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from stoker.config.eval import EvalConfig
from stoker.config.quality import QualityConfig
from stoker.config.schema import build, jsonable, member
from stoker.config.schema import fail as _fail
from stoker.exceptions import ConfigError


class Optimizer(StrEnum):
    """``train.optimizer``: what a night does with its parent night's optimizer state."""

    CARRY = "carry"
    FRESH = "fresh"


class LrSchedule(StrEnum):
    """``train.lr_schedule``: the learning rate across a line's nights (training/schedule.py)."""

    REWARM = "rewarm"
    CONSTANT = "constant"
    WSD = "wsd"


class OlderNights(StrEnum):
    """``train.older_nights``: what a night the line's head cannot take does."""

    BRANCH = "branch"
    REFUSE = "refuse"


NODE_SHELL = "ssh -tt -o ServerAliveInterval=15 -o ServerAliveCountMax=4 {host}"
"""How a command reaches another training node by default (``train.node_shell``)."""

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_SCHEMES = ("file", "s3", "s3a", "hdfs")
_FORMATS = ("jsonl", "text", "parquet")
_NORMALIZATIONS = ("NFC", "NFKC", "none")
_COMPRESSIONS = ("zstd", "lz4")
TOKENIZER_BACKENDS = ("auto", "fastokens", "tokenizers")
"""tokenizer.backend values; spark_jobs/tokenizer_backends.py says what each does."""
SEQ_LEN_BOUNDS = (2, 1_048_576)
"""``pack.seq_len``'s range (the DAG's param form shows the same)."""
SPARK_PARTITIONS_BOUNDS = (1, 100_000)
RETENTION_MIN_MS = 60_000
"""The shortest ``topic.retention_ms`` a corpus may ask (-1 aside: for ever)."""


@dataclass(kw_only=True, slots=True)
class SourceConfig:
    uri: str
    """Where the raw text is: a local path (relative to the project root) or file://, s3://, hdfs://.
    ``{ds}`` and ``{ds_nodash}`` are replaced by the run's logical date, selecting the night's drop."""
    format: str = "jsonl"
    """``jsonl`` (one JSON object per line), ``text`` (one document per line) or ``parquet`` (one document per
    row, in column ``text_field``); jsonl/text files ending in ``.gz`` or ``.zst``/``.zstd`` are decompressed (a
    file that does not decompress is one record dropped as ``corrupt_file``, its first 4 KiB quarantined)."""
    text_field: str = "text"
    """The JSON field (jsonl) or column (parquet) that holds the document's text."""
    success_marker: str | None = "_SUCCESS"
    """File whose presence marks the drop complete; null means 'any data file present'."""
    aws_conn_id: str = "aws_default"
    """s3:// only: the Airflow connection (Amazon provider's shape: login = access key id, password =
    secret key, extra ``endpoint_url``/``region_name``) with the store's address and credentials.
    When no such connection exists, the usual AWS environment variables (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL_S3``, ``AWS_REGION``) are used."""
    webhdfs_url: str | None = None
    """hdfs:// only: the NameNode's HTTP address, where await_source looks for the marker
    (default ``http://<namenode host>:9870``). Spark reads over the hdfs:// RPC address."""
    poke_interval_s: int = 30
    """How often await_source checks the source."""
    timeout_s: int = 6 * 3600
    """How long await_source waits for the drop before failing."""
    split_bytes: int = 64 << 20
    """The most bytes of plain JSONL/text one Spark task reads: the drop is cut into equal shares no
    larger (a 2 GB file is 32 or more tasks at the default; small files share a task); a compressed
    file is never cut. Memory per task does not grow with it: records stream in bounded batches."""
    allowed_uri_prefixes: list[str] = field(default_factory=list)
    """Where a run's ``source_uri`` param may point instead of ``uri``: each a folder or URI prefix (a run's
    value must be it or lie under it, no ``..``). None by default: whoever may trigger the corpus may then
    not point its night at another folder the workers can read (another corpus's quarantine, say), train
    it into the line and read its bytes on the run page. Refused before anything runs (await_source)."""

    def __post_init__(self) -> None:
        w = "source"
        scheme = self.uri.split("://", 1)[0] if "://" in self.uri else "file"
        if not self.uri.strip():
            raise _fail(f"{w}.uri", self.uri, "must not be empty: set the corpus location")
        if scheme not in _SCHEMES:
            raise _fail(f"{w}.uri", self.uri, f"scheme {scheme!r} is not one of {_SCHEMES}")
        rest = self.uri.split("://", 1)[1] if "://" in self.uri else self.uri
        if scheme in ("s3", "s3a") and not rest.split("/", 1)[0]:
            raise _fail(f"{w}.uri", self.uri, "names no bucket: write s3://<bucket>/<prefix>")
        if scheme == "hdfs" and not rest.split("/", 1)[0]:
            raise _fail(f"{w}.uri", self.uri, "names no NameNode: write hdfs://<namenode>:<port>/<path>")
        if self.webhdfs_url is not None and not self.webhdfs_url.startswith(("http://", "https://")):
            raise _fail(f"{w}.webhdfs_url", self.webhdfs_url, "must be an http:// or https:// address")
        if self.format not in _FORMATS:
            raise _fail(f"{w}.format", self.format, f"must be one of {_FORMATS}")
        if not 1 << 10 <= self.split_bytes <= 1 << 40:
            raise _fail(f"{w}.split_bytes", self.split_bytes, "must be in [1 KiB, 1 TiB]; 64 MiB (67108864) is a "
                        "good size")
        if self.poke_interval_s < 1 or self.timeout_s < self.poke_interval_s:
            raise _fail(f"{w}.timeout_s", self.timeout_s, "must be >= poke_interval_s >= 1")
        for prefix in self.allowed_uri_prefixes:
            if not isinstance(prefix, str) or not prefix.strip() or ".." in _segments(prefix):
                raise _fail(f"{w}.allowed_uri_prefixes", prefix, "each must be a non-empty folder or URI prefix "
                            "without '..'")

    def check_override(self, uri: str) -> None:
        """Refuse a run's ``source_uri`` that this source does not allow (:func:`check_source_override`)."""
        check_source_override(self.uri, self.allowed_uri_prefixes, uri)

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0] if "://" in self.uri else "file"

    def render(self, ds: str) -> str:
        """The URI of one night's drop (``ds`` is YYYY-MM-DD); ``{state}``/``{project}`` expanded."""
        return render_uri(self.uri, ds)


def _segments(uri: str) -> list[str]:
    return uri.split("://", 1)[-1].split("/")


def _under(uri: str, prefix: str) -> bool:
    """``uri`` is ``prefix`` or lies under it as a path (``s3://b/x`` does not hold ``s3://b/xy``)."""
    base = prefix.rstrip("/")
    return uri.rstrip("/") == base or uri.startswith(base + "/")


def check_source_override(own: str, allowed: list[str], uri: str) -> None:
    """Refuse a run's ``source_uri`` that is neither the corpus's own ``source.uri`` nor under one of
    ``source.allowed_uri_prefixes``. Compared with ``{state}``/``{project}`` expanded and before ``{ds}`` is
    rendered. The one check the plan and the await_source task both make."""
    from stoker.paths import expand

    if expand(uri) == expand(own):
        return
    if ".." not in _segments(uri) and any(_under(expand(uri), expand(prefix)) for prefix in allowed):
        return
    raise ConfigError(
        f"source_uri {uri!r} is not allowed for this corpus: a run may read only source.uri ({own!r}) or a "
        f"folder under source.allowed_uri_prefixes ({list(allowed) or 'none set'}); add a prefix there to allow it")


def render_uri(uri: str, ds: str) -> str:
    """``{ds}``/``{ds_nodash}`` in a source URI become the night ``ds`` (YYYY-MM-DD); ``{state}`` and
    ``{project}`` are expanded. The one rendering every surface uses (the job, the sensor)."""
    from stoker.paths import expand

    return expand(uri.replace("{ds}", ds).replace("{ds_nodash}", ds.replace("-", "")))


@dataclass(kw_only=True, slots=True)
class CleanConfig:
    normalization: str = "NFC"
    """Unicode normalisation applied before dedup and tokenisation: NFC, NFKC or none."""
    min_chars: int = 1
    """Documents shorter than this (after normalisation and strip) are dropped as ``too_short``."""
    max_chars: int = 1_000_000
    """Documents longer than this are dropped as ``too_long`` (a guard against runaway lines)."""
    dedup: bool = True
    """Exact dedup on the normalised text; the first occurrence (by source file, line) is kept."""

    def __post_init__(self) -> None:
        if self.normalization not in _NORMALIZATIONS:
            raise _fail("clean.normalization", self.normalization, f"must be one of {_NORMALIZATIONS}")
        if self.min_chars < 1:
            raise _fail("clean.min_chars", self.min_chars, "must be >= 1")
        if self.max_chars < self.min_chars:
            raise _fail("clean.max_chars", self.max_chars, f"must be >= clean.min_chars ({self.min_chars})")


@dataclass(kw_only=True, slots=True)
class TokenizerConfig:
    path: str
    """A ``tokenizers`` JSON file (relative to the project root, or absolute). Loaded locally, never
    downloaded; its sha256 is recorded in every manifest."""
    eos_token: str = "<|endoftext|>"
    """Appended after every document when packing."""
    pad_token: str = "<|pad|>"
    """Fills the tail of the last sequence of a Spark partition (masked out of the loss)."""
    backend: str = "auto"
    """Which library encodes (spark_jobs/tokenizer_backends.py): ``auto``, the fast backend (fastokens) when its
    ids are proven equal to ``tokenizers``' for this tokenizer.json, else ``tokenizers``; ``fastokens``, the same
    proof, and a failed one is an error; ``tokenizers``, the reference only. The manifest says which ran and why."""
    check_every: int = 100
    """With a fast backend, every Nth document of each pack task (its first included) is encoded by
    ``tokenizers`` too; a difference fails the task, naming the document. 1 checks every document (at the
    reference's speed); the default costs ~3% of the stage on the sample tokenizer (BENCHMARKS.md, issue 34)."""

    def __post_init__(self) -> None:
        if not self.path.endswith(".json"):
            raise _fail("tokenizer.path", self.path, "must name a tokenizers .json file")
        if self.backend not in TOKENIZER_BACKENDS:
            raise _fail("tokenizer.backend", self.backend, f"must be one of {', '.join(TOKENIZER_BACKENDS)}")
        if self.check_every < 1:
            raise _fail("tokenizer.check_every", self.check_every,
                        "must be >= 1 (1 checks every document; larger numbers check fewer)")


@dataclass(kw_only=True, slots=True)
class PackConfig:
    seq_len: int = 2048
    """Tokens per training sequence; each record holds seq_len + 1 ids (inputs and shifted labels)."""

    def __post_init__(self) -> None:
        low, high = SEQ_LEN_BOUNDS
        if not low <= self.seq_len <= high:
            raise _fail("pack.seq_len", self.seq_len, f"must be in [{low}, {high}]")


@dataclass(kw_only=True, slots=True)
class TopicConfig:
    partitions: int = 4
    """Partitions of the run's topic: a multiple of the training world size."""
    replication_factor: int = 1
    """Copies of each partition; 3 on a production cluster."""
    min_insync_replicas: int = 1
    """Replicas that must acknowledge a write (acks=all); 2 with replication 3."""
    compression: str = "zstd"
    """Producer compression: zstd or lz4."""
    retention_ms: int = 7 * 24 * 3600 * 1000
    """How long the broker keeps the run's sequences (training must finish before); -1 keeps them for ever,
    as Kafka's ``retention.ms`` does. At least a minute otherwise. The train task reads the topic's live value
    as it waits, so a retention raised on the cluster for a slow night is heard."""

    def settings(self) -> dict[str, str]:
        """The run topic's Kafka configs (what the Spark stage creates it with)."""
        return {"min.insync.replicas": str(self.min_insync_replicas), "retention.ms": str(self.retention_ms),
                "compression.type": "producer"}

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= 10_000:
            raise _fail("topic.partitions", self.partitions, "must be in [1, 10000]")
        if self.replication_factor < 1:
            raise _fail("topic.replication_factor", self.replication_factor, "must be >= 1")
        if not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise _fail(
                "topic.min_insync_replicas",
                self.min_insync_replicas,
                f"must be in [1, replication_factor={self.replication_factor}]",
            )
        if self.retention_ms != -1 and self.retention_ms < RETENTION_MIN_MS:
            raise _fail("topic.retention_ms", self.retention_ms, f"must be -1 (keep for ever) or at least "
                        f"{RETENTION_MIN_MS} ms: the night's records must outlive its training")
        if self.compression not in _COMPRESSIONS:
            raise _fail("topic.compression", self.compression, f"must be one of {_COMPRESSIONS}")


@dataclass(kw_only=True, slots=True)
class PublishConfig:
    spark_partitions: int = 4
    """Spark tasks that pack and publish, at least; each is one Kafka transaction, fenced on retry. A
    drop larger than ``spark_partitions × source.split_bytes`` gets a multiple of it, so set it to the
    cluster's cores (or a multiple) and no core idles at the end of the stage."""
    transaction_timeout_ms: int = 900_000
    """Kafka transaction timeout per Spark task (must not exceed the broker's transaction.max.timeout.ms)."""
    spark_conf: dict[str, str] = field(default_factory=dict)
    """Spark settings for this corpus's job (e.g. ``spark.driver.memory: 6g``, ``spark.executor.cores: 4``);
    they win over Stoker's defaults, which are sized from the machine (``TokenizePublishOperator``'s
    ``default_spark_conf``)."""

    def __post_init__(self) -> None:
        low, high = SPARK_PARTITIONS_BOUNDS
        if not low <= self.spark_partitions <= high:
            raise _fail("publish.spark_partitions", self.spark_partitions, f"must be in [{low}, {high}]")
        if not 1_000 <= self.transaction_timeout_ms <= 900_000:
            raise _fail("publish.transaction_timeout_ms", self.transaction_timeout_ms, "must be in [1000, 900000]")
        bad = [k for k in self.spark_conf if not k.startswith("spark.")]
        if bad:
            raise _fail("publish.spark_conf", bad[0], "is not a Spark setting: keys start with 'spark.'")


@dataclass(kw_only=True, slots=True)
class ScheduleConfig:
    cron: str | None = "0 2 * * *"
    """Cron of the nightly refresh; null for manual/backfill only."""
    start_date: date = date(2026, 1, 1)
    """First logical date the scheduler considers."""
    catchup: bool = False
    """Whether the scheduler runs every missed night by itself (backfill from the CLI otherwise)."""
    retries: int = 2
    """Retries of each task."""
    retry_delay_s: int = 60
    """First retry delay; doubles with each retry (exponential back-off)."""
    max_active_runs: int = 1
    """Refreshes of this corpus allowed at once."""

    def __post_init__(self) -> None:
        if self.cron is not None and len(self.cron.split()) != 5:
            raise _fail("schedule.cron", self.cron, "must have 5 fields (min hour dom month dow) or be null")
        if not 0 <= self.retries <= 10:
            raise _fail("schedule.retries", self.retries, "must be in [0, 10]")
        if self.retry_delay_s < 1:
            raise _fail("schedule.retry_delay_s", self.retry_delay_s, "must be >= 1")
        if self.max_active_runs < 1:
            raise _fail("schedule.max_active_runs", self.max_active_runs, "must be >= 1")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    recipe: str = "debug_cpu"
    """Named training recipe in stoker/config/recipes.py."""
    world_size: int = 1
    """Training ranks; topic.partitions must be a multiple of it."""
    timeout_s: int = 24 * 3600
    """How long one launch of the trainer may take to consume the run (the train task's deadline)."""
    max_restarts: int = 3
    """Relaunches of a trainer that died (the train task's Airflow retries); each resumes from the
    latest checkpoint."""
    restart_delay_s: int = 10
    """Seconds between a trainer's death and its relaunch."""
    log_keys: bool = False
    """Audit: every step's sequence keys, per rank, in the trainer folder's ``keys.<rank>.jsonl``
    (what the weights saw: each key exactly once, across restarts)."""
    nodes: list[str] = field(default_factory=list)
    """Hosts the ranks run on (none: this machine). Several: one ``torchrun`` per node joining a c10d
    rendezvous on the first (``launcher: deepspeed``: one launcher with a hostfile); each node runs
    ``world_size / len(nodes)`` ranks and must see the project and the run folder at the same paths."""
    queue: str = "gpu"
    """The executor queue the train task runs on (CeleryExecutor: a worker started with ``--queues gpu`` on a
    GPU host; every other task runs on Airflow's default queue). The LocalExecutor ignores it."""
    launcher: str = "torchrun"
    """``torchrun`` or ``deepspeed`` (DeepSpeed's launcher; over several nodes it uses pdsh/ssh itself)."""
    node_shell: str = NODE_SHELL
    """How a torchrun reaches a node that is not this machine. The default forces a remote terminal
    (``-tt``), so the node's launcher gets a hang-up when the ssh client dies, and keepalives, so a
    lost connection is noticed within a minute; the task also stops what a try left on each node
    (``python -m stoker.process stop-tagged``) before it relaunches."""
    line: str = ""
    """The model line this corpus's nights continue (default: the corpus name). Several corpora may
    feed one line; its nights train one at a time (an Airflow pool of one slot per line)."""
    init: str = "random"
    """How the line starts: ``random`` (the recipe's shape) or a local Hugging Face folder of a causal
    LM (DeepSeek-V3/V2 family, or Llama/Qwen), loaded offline with ``from_pretrained``."""
    older_nights: OlderNights = OlderNights.BRANCH
    """A night older than the line's head (a backfill after newer nights trained): ``branch`` trains
    it from the newest night before it and leaves the head where it is; ``refuse`` fails its train
    task with a message."""
    optimizer: Optimizer = Optimizer.CARRY
    """Across nights: ``carry`` restores the parent night's AdamW moments (fresh where they cannot be
    loaded, e.g. another ZeRO world size, or an HF init); ``fresh`` starts new ones every night."""
    lr_schedule: LrSchedule = LrSchedule.WSD
    """Across nights: ``wsd`` (default) warms up on the line's first night only, then holds the peak LR, and
    the night's last ``cooldown_share`` of steps decay it: the released model (export, evaluation, gate) is
    that cooled-down branch, and the next night continues the weights and optimizer state from before the
    cooldown (the line's trunk); ``rewarm`` warms up and cosine-decays again over each night's steps
    (re-warming and re-decaying, as in continual pre-training); ``constant`` holds the peak LR after the
    first night's warm-up, no cooldown (the stable phase of a warmup-stable-decay schedule). The default
    follows ``make bench-schedule`` (BENCHMARKS.md): wsd's released model was the best or level each night."""
    cooldown_share: float = 0.1
    """``wsd``: the share of a night's optimizer steps in its cooldown (at least one step), the LR going
    linearly from the peak to the recipe's ``min_lr_ratio`` x lr. In (0, 0.5]."""
    replay: float = 0.0
    """Against forgetting: this share of a night's training rows are sequences of the nights its model already
    holds (its parent's lineage), drawn at the train task's first launch from their topics (stoker/lines/replay.py)
    and spread evenly over the night. 0.05 replays about 5%; 0 (default) none. In [0, 0.5)."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise _fail("train.world_size", self.world_size, "must be >= 1")
        if self.timeout_s < 1:
            raise _fail("train.timeout_s", self.timeout_s, "must be >= 1")
        if not 0 <= self.max_restarts <= 100:
            raise _fail("train.max_restarts", self.max_restarts, "must be in [0, 100]")
        if self.restart_delay_s < 0:
            raise _fail("train.restart_delay_s", self.restart_delay_s, "must be >= 0")
        if self.nodes and self.world_size % len(self.nodes):
            raise _fail("train.world_size", self.world_size, f"must be a multiple of len(train.nodes) "
                        f"({len(self.nodes)}): every node runs the same number of ranks")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.queue):
            raise _fail("train.queue", self.queue, "must be a queue name ([A-Za-z0-9_.-], e.g. 'gpu')")
        if self.launcher not in ("torchrun", "deepspeed"):
            raise _fail("train.launcher", self.launcher, "must be 'torchrun' or 'deepspeed'")
        if "{host}" not in self.node_shell:
            raise _fail("train.node_shell", self.node_shell, "must contain {host}, e.g. 'ssh {host}'")
        if self.line and not _NAME_RE.match(self.line):
            raise _fail("train.line", self.line, "must match [a-z][a-z0-9_]{0,63} (it names an Airflow pool)")
        # built in code rather than from YAML, a plain string still becomes its member (or a named error)
        self.older_nights = member("train.older_nights", self.older_nights, OlderNights)
        self.optimizer = member("train.optimizer", self.optimizer, Optimizer)
        self.lr_schedule = member("train.lr_schedule", self.lr_schedule, LrSchedule)
        if not self.init:
            raise _fail("train.init", self.init, "must be 'random' or a local Hugging Face model folder")
        if not 0 <= self.replay < 0.5:
            raise _fail("train.replay", self.replay, "must be in [0, 0.5) (the share of a night's rows replayed from "
                        "earlier nights; 0.05 is typical)")
        if not 0 < self.cooldown_share <= 0.5:
            raise _fail("train.cooldown_share", self.cooldown_share, "must be in (0, 0.5] (a share of the night's "
                        "optimizer steps)")


@dataclass(kw_only=True, slots=True)
class CorpusConfig:
    name: str
    """Corpus name: the DAG is ``refresh_<name>`` (``stoker.run.plan.refresh_dag``), topics are
    ``stoker.<name>.<date>.a<try>``."""
    source: SourceConfig
    tokenizer: TokenizerConfig
    description: str = ""
    """Shown as the DAG's documentation."""
    clean: CleanConfig = field(default_factory=CleanConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    pack: PackConfig = field(default_factory=PackConfig)
    topic: TopicConfig = field(default_factory=TopicConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise _fail("name", self.name, "must match [a-z][a-z0-9_]{0,63}")
        if not self.train.line:
            self.train.line = self.name
        if self.topic.partitions % self.train.world_size:
            raise _fail(
                "topic.partitions",
                self.topic.partitions,
                f"must be a multiple of train.world_size ({self.train.world_size}) so every rank "
                "reads the same number of partitions",
            )

    def to_dict(self) -> dict[str, Any]:
        return jsonable(dataclasses.asdict(self))


def parse_corpus(data: Any, origin: str = "<dict>") -> CorpusConfig:
    """Validate a mapping into a :class:`CorpusConfig`; errors name ``origin`` (the YAML file)."""
    try:
        return build(CorpusConfig, data, "")
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}") from None


def load_corpus(path: str | Path) -> CorpusConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read corpus config: {e}") from None
    cfg = parse_corpus(data, str(path))
    if cfg.name != path.stem:
        raise ConfigError(f"{path}: name = {cfg.name!r} must equal the file name {path.stem!r}")
    return cfg


def load_all(folder: str | Path) -> list[CorpusConfig]:
    """Every ``*.yaml`` in ``folder``, sorted by name."""
    return [load_corpus(p) for p in sorted(Path(folder).glob("*.yaml"))]


def load_each(folder: str | Path) -> tuple[list[CorpusConfig], list[str]]:
    """Every ``*.yaml`` in ``folder`` that validates, and a message for each that does not: one
    broken config must not take the others down."""
    good, errors = [], []
    for p in sorted(Path(folder).glob("*.yaml")):
        try:
            good.append(load_corpus(p))
        except ConfigError as e:
            errors.append(str(e) if str(p) in str(e) else f"{p}: {e}")
    return good, errors
