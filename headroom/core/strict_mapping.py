"""Build a frozen dataclass (nested ones too) from a parsed YAML/JSON mapping, refusing what it does not know.

Unknown keys are refused with a did-you-mean, values are type-checked against the field's annotation (int, float,
bool, str, tuple[X, ...], Mapping[str, str], a nested dataclass, or `X | None`), and the dataclass's own
`__post_init__` checks ranges. Every error names the full path of the offending key (`router.health.max_ejection_s`).
`to_mapping` is the inverse, so a file written from a config reads back equal.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file that cannot be used as written; the message says where and how to fix it."""


def _did_you_mean(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(sorted(known))})"


def _convert(value: Any, hint: Any, where: str, default: Any = None) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        if len(inner) == 1:
            return _convert(value, inner[0], where, default)
        raise ConfigError(f"{where}: unsupported field type {hint!r}")
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping of {hint.__name__} fields, got {type(value).__name__}")
        return from_mapping(hint, value, where, default if isinstance(default, hint) else None)
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict, typing.Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        key_t, val_t = typing.get_args(hint)
        return {_convert(k, key_t, where): _convert(v, val_t, f"{where}.{k}") for k, v in value.items()}
    return _scalar(value, hint, where)


def _scalar(value: Any, hint: Any, where: str) -> Any:
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported field type {hint!r}")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def from_mapping(cls: type[T], data: Mapping[str, Any], where: str = "", base: T | None = None) -> T:
    """An instance of the dataclass `cls` from `data`. Keys left out keep `base`'s values (or the dataclass
    defaults); a nested section overrides only the keys it names."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            raise ConfigError(f"{path}: unknown key{_did_you_mean(str(key), sorted(fields))}")
        current = getattr(base, key) if base is not None else _default(fields[key])
        kwargs[key] = _convert(value, hints[key], path, current)
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)  # type: ignore[type-var]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from None


def to_mapping(obj: Any) -> Any:
    """The plain (YAML-safe) form of a dataclass instance: dicts, lists and scalars."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, tuple | list):
        return [to_mapping(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_mapping(v) for k, v in obj.items()}
    return obj
