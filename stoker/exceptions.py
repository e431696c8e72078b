"""Named errors. Each message says what was wrong, the value, the limit and what to change."""


class StokerError(Exception):
    """Base of every error Stoker raises on purpose."""


class ConfigError(StokerError, ValueError):
    """A corpus config (corpora/<name>.yaml) or an argument is invalid."""


class RecordError(StokerError, ValueError):
    """A Kafka message does not decode as a Stoker packed sequence."""


class ManifestError(StokerError):
    """A run manifest is missing, unreadable or inconsistent."""


class StackError(StokerError):
    """The embedded stack (Kafka broker, Airflow home) cannot be set up or reached."""


class TopicNotFound(StokerError):
    """A topic the cluster does not list. Right after a create or a delete this can be metadata that has not
    reached the broker asked yet, so a caller that has just made the topic asks again."""


class KafkaTimeout(StokerError, TimeoutError):
    """A Kafka condition (published offsets, consumer lag) was not met in time."""


class SourceError(StokerError):
    """A corpus source (local folder, S3 bucket, HDFS) cannot be reached or read.

    ``transient``: the store may answer later (unreachable, timed out, throttled, 5xx, a standby
    NameNode), so a retry can help; otherwise (refused credential, missing bucket, wrong address)
    nothing changes until a person fixes the settings."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class TokenizerMismatch(StokerError):
    """A fast tokenizer backend gave other ids than the reference (``tokenizers``) for a document: the
    message names the document, where the ids part and both libraries' versions."""
