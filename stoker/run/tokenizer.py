"""What a run's tokenizer is, read from its ``tokenizers`` JSON file without the library: its path,
sha256, id count and special ids (the manifest records them; a line checks them against its model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from stoker.exceptions import ConfigError
from stoker.files import sha256_file


@dataclass(kw_only=True, slots=True)
class TokenizerFacts:
    path: str
    sha256: str
    vocab_size: int
    """Ids the tokenizer can produce (its highest id + 1)."""
    eos_id: int
    pad_id: int


def tokenizer_facts(path: str | Path, eos_token: str, pad_token: str) -> TokenizerFacts:
    """Read a ``tokenizers`` JSON file without the library (the Airflow side may not have it)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        vocab = data.get("model", {}).get("vocab") or {}
        ids = dict(vocab) if isinstance(vocab, dict) else {piece[0]: i for i, piece in enumerate(vocab)}
        ids.update({t["content"]: int(t["id"]) for t in data.get("added_tokens", [])})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ConfigError(f"tokenizer.path = {str(path)!r}: not a readable tokenizers JSON file ({e!r})") from None

    def token_id(token: str, key: str) -> int:
        if token not in ids:
            raise ConfigError(f"tokenizer.{key} = {token!r}: not in the tokenizer {path}; name one of its "
                              "special tokens")
        return int(ids[token])

    return TokenizerFacts(path=str(path), sha256=sha256_file(path), vocab_size=max(ids.values(), default=-1) + 1,
                          eos_id=token_id(eos_token, "eos_token"), pad_id=token_id(pad_token, "pad_token"))
