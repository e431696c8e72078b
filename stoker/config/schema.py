"""Validation of YAML mappings into dataclasses: every key known, every scalar of its annotated type
(a bool is never an int), nested dataclasses built the same way; errors name the dotted key, the
value and what is allowed. Corpus configs and recipe YAMLs both go through here."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from datetime import date
from typing import Any

from stoker.exceptions import ConfigError


def fail(where: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{where} = {value!r}: {why}")


def jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [jsonable(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, date):
        return obj.isoformat()
    return obj


E = typing.TypeVar("E", bound=enum.Enum)


def member(where: str, value: Any, kind: type[E]) -> E:
    """``value`` as a member of the enum ``kind`` (a config's word for one of a few choices), or an error that
    names the key, the value and the choices."""
    try:
        return kind(value)
    except ValueError:
        raise fail(where, value, f"must be one of {', '.join(str(m.value) for m in kind)}") from None


def check_type(where: str, value: Any, tp: Any) -> Any:
    """Coerce/verify one scalar against its annotation; bool is never accepted as int."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return check_type(where, value, inner)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return member(where, value, tp)
    if origin is list:
        if not isinstance(value, list):
            raise fail(where, value, "must be a list")
        (inner,) = typing.get_args(tp)
        return [check_type(f"{where}[{i}]", v, inner) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(v, str | int | float) and not isinstance(v, bool)
                                                  for v in value.values()):
            raise fail(where, value, "must be a mapping of names to values")
        inner = typing.get_args(tp)[1] if typing.get_args(tp) else str
        if inner is str:
            return {str(k): str(v) for k, v in value.items()}
        return {str(k): check_type(f"{where}.{k}", v, inner) for k, v in value.items()}
    if tp is date:
        if isinstance(value, date):
            return value
        try:
            return date.fromisoformat(str(value))
        except ValueError:
            raise fail(where, value, "must be a date YYYY-MM-DD") from None
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise fail(where, value, f"must be of type {tp.__name__}, got {type(value).__name__}")
    return value


def build(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise fail(where or cls.__name__, data, "must be a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"{where or 'corpus'}: unknown key(s) {unknown}; allowed: {sorted(names)} (check for typos)"
        )
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{where}.{f.name}" if where else f.name
        if f.name in data:
            kwargs[f.name] = check_type(key, data[f.name], hints[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key} is required but missing: add it to the corpus YAML")
    return cls(**kwargs)
