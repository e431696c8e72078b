"""The reference tokenizer (Hugging Face ``tokenizers``) and the corpus's special ids; which library
encodes a night, and the proof, is spark_jobs/tokenizer_backends.py."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=4)
def load_tokenizer(path: str) -> Any:
    """A ``tokenizers`` tokenizer from a local JSON file (never from a hub)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    # A document that contains the text "<|endoftext|>" must not inject a real EOS (or any other
    # special id): special tokens inside the data are encoded as ordinary text.
    tok.encode_special_tokens = True
    return tok


def token_id(tokenizer: Any, token: str, what: str) -> int:
    tid = tokenizer.token_to_id(token)
    if tid is None:
        raise ValueError(
            f"tokenizer.{what} = {token!r} is not in the tokenizer's vocabulary: add it or change the config")
    return int(tid)


def special_ids(tokenizer: Any, cfg: Any, path: str) -> tuple[int, int]:
    """(EOS, PAD) of the corpus config's ``tokenizer`` section, checked before any data moves; they
    travel to the trainer in the manifest."""
    from stoker.exceptions import ConfigError

    try:
        return token_id(tokenizer, cfg.eos_token, "eos_token"), token_id(tokenizer, cfg.pad_token, "pad_token")
    except ValueError as e:
        raise ConfigError(f"{e} ({path})") from None


def encode_batch(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Ids without special tokens; the packer adds EOS between documents itself."""
    return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
