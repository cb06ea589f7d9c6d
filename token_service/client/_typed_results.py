"""Typed results: what a guard stores for duplicates, and how it is read back.

:func:`dump_result` turns a value into its JSON form; :func:`load_result` reads that form back
*as the type the caller declares* (``result_type=``, or the return annotation of the function a
guard runs), so the first caller and every duplicate get the same typed value. Nothing in the
stored data names a class: a stored record can never make this process build anything but the
declared type. The types read, and what happens without one: docs/sdk.md, "Typed results".
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import functools
import json
import types
import typing
import uuid
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

__all__ = ["UnresolvedResultType", "dump_result", "load_result", "return_type"]

_SCALARS = (str, int, float, bool, type(None))
_PLAIN = frozenset({*_SCALARS, dict, list})  # exactly these types, never a subclass


def dump_result(value: Any) -> Any:
    """The JSON form of ``value`` (dicts, lists, strings, numbers, booleans, None)."""
    kind = type(value)
    if kind in _PLAIN:  # the usual result, a plain dict of plain values: none of the checks below
        if kind is dict:
            return {
                key if type(key) is str else _dump_key(key): dump_result(item) for key, item in value.items()
            }
        return [dump_result(item) for item in value] if kind is list else value
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, enum.Enum):
        return dump_result(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: dump_result(getattr(value, field.name)) for field in dataclasses.fields(value)}
    model_dump = getattr(value, "model_dump", None)
    if model_dump is not None and callable(model_dump) and not isinstance(value, type):
        return model_dump(mode="json")  # a pydantic model
    if isinstance(value, Mapping):
        return {_dump_key(key): dump_result(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [dump_result(item) for item in value]
    if isinstance(value, set | frozenset):
        items = [dump_result(item) for item in value]
        try:
            return sorted(items)  # the same set stores the same JSON
        except TypeError:
            return items
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} values cannot be stored as a result")


def _dump_key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        key = key.value
    if isinstance(key, str):
        return key
    if isinstance(key, int | float | bool) or key is None:
        return json.dumps(key)  # as json.dumps writes such keys: 1 -> "1", True -> "true", None -> "null"
    raise TypeError(
        f"dict keys must be str, numbers, booleans or None to be stored, not {type(key).__name__}"
    )


def load_result(data: Any, result_type: Any) -> Any:
    """``data`` (a JSON form) read back as ``result_type``; ``None`` / ``Any``: as it is."""
    if result_type is None or result_type is Any or result_type is object:
        return data
    return _load(data, result_type)


def _load(data: Any, tp: Any) -> Any:  # one branch per kind of type
    if tp is Any or tp is object:
        return data
    if tp is None or tp is type(None):
        if data is not None:
            raise ValueError("expected null")
        return None
    origin, args = _shape(tp)
    if origin is typing.Union or origin is types.UnionType:
        if data is None and type(None) in args:
            return None
        errors = []
        for arm in args:
            if arm is type(None):
                continue
            try:
                return _load(data, arm)
            except (TypeError, ValueError, KeyError) as exc:
                errors.append(exc)
        raise ValueError(f"no arm of {tp} reads the stored value: {errors}")
    if origin is typing.Literal:
        if data not in args:
            raise ValueError(f"{data!r} is not one of {args}")
        return data
    if origin is typing.Annotated:
        return _load(data, args[0])
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise TypeError(f"{tp.__name__} is stored as an object")
        hints = _hints(tp)
        kwargs = {
            field.name: _load(data[field.name], hints.get(field.name, Any))
            for field in dataclasses.fields(tp)
            if field.init and field.name in data
        }
        return tp(**kwargs)
    if isinstance(tp, type) and callable(getattr(tp, "model_validate", None)):
        return tp.model_validate(data)  # type: ignore[attr-defined] # a pydantic model
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    container = origin or tp
    if container is tuple:
        _expect(data, list, tp)
        if not args:
            return tuple(data)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_load(item, args[0]) for item in data)
        if len(args) != len(data):
            raise ValueError(f"{tp} holds {len(args)} items, the stored value {len(data)}")
        return tuple(_load(item, arm) for item, arm in zip(data, args, strict=True))
    if container in (list, Sequence, set, frozenset):
        _expect(data, list, tp)
        items = [_load(item, args[0] if args else Any) for item in data]
        if container is set:
            return set(items)
        if container is frozenset:
            return frozenset(items)
        return items
    if container in (dict, Mapping):
        _expect(data, dict, tp)
        key_type, value_type = args if args else (Any, Any)
        if key_type is str and value_type is Any:
            return dict(data)  # JSON keys are str already: nothing to read item by item
        return {_load_key(key, key_type): _load(item, value_type) for key, item in data.items()}
    if tp in _FROM_TEXT:
        return _FROM_TEXT[tp](data)
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)  # 2.0 is stored as 2.0, but a hand-written record may say 2
    if tp in (str, int, float, bool):
        if type(data) is not tp:
            raise TypeError(f"expected {tp.__name__}, the stored value is {type(data).__name__}")
        return data
    return data  # a type this module does not know: the JSON form, as without a type


# the types stored as text (ISO 8601, a UUID's hex, a Decimal exactly as written)
_FROM_TEXT: dict[Any, Callable[[str], Any]] = {
    dt.datetime: dt.datetime.fromisoformat,
    dt.date: dt.date.fromisoformat,
    dt.time: dt.time.fromisoformat,
    uuid.UUID: uuid.UUID,
    Decimal: Decimal,
}


# type -> (typing.get_origin, typing.get_args): asked on every guarded call and replay, and
# the two walk typing's classes; bounded (a program declares a handful of result types)
_SHAPES: dict[Any, tuple[Any, tuple[Any, ...]]] = {}


def _shape(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    try:
        return _SHAPES[tp]
    except (KeyError, TypeError):  # not seen yet, or not hashable (asked again next time)
        pass
    shape = typing.get_origin(tp), typing.get_args(tp)
    if len(_SHAPES) < 1024:
        with contextlib.suppress(TypeError):
            _SHAPES[tp] = shape
    return shape


def _load_key(key: str, key_type: Any) -> Any:
    if key_type is int:
        return int(key)
    if isinstance(key_type, type) and issubclass(key_type, enum.Enum):
        for member in key_type:
            if _dump_key(member) == key:
                return member
        raise ValueError(f"{key!r} is not a {key_type.__name__}")
    return key


def _expect(data: Any, kind: type, tp: Any) -> None:
    if not isinstance(data, kind):
        raise TypeError(f"{tp} is stored as a JSON {'array' if kind is list else 'object'}")


@functools.cache
def _hints(tp: type) -> dict[str, Any]:
    return typing.get_type_hints(tp)


# function -> its return type: typing.get_type_hints evaluates every annotation of the
# function, far more work than the guarded call itself, and guard.run asks on every call
_RETURN_TYPES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class UnresolvedResultType(UserWarning):
    """A guarded function's return annotation names what cannot be found: results are plain JSON."""


def return_type(function: Callable[..., Any]) -> Any:
    """The declared return type of ``function`` (awaited, for a coroutine function), or None."""
    key = getattr(function, "__func__", function)  # a bound method: its function's
    try:
        return _RETURN_TYPES[key]
    except (KeyError, TypeError):  # not seen yet, or not weakly referable (a builtin)
        pass
    try:
        hints = typing.get_type_hints(function)
    except Exception as exc:  # an annotation that does not resolve: no type, plain JSON
        _warn_unresolved(function, exc)
        return None
    declared = hints.get("return")  # for an async def: the awaited value's type
    found = None if declared is type(None) else declared
    with contextlib.suppress(TypeError):  # not weakly referable: asked again next time
        _RETURN_TYPES[key] = found
    return found


def _warn_unresolved(function: Callable[..., Any], error: Exception) -> None:
    """Say once per function (Python's registry at its definition) why its results come back as
    plain JSON; the usual cause is in docs/sdk.md, "Typed results"."""
    code = getattr(function, "__code__", None)
    module_globals = getattr(function, "__globals__", None)
    if code is None or module_globals is None:
        return
    annotation = getattr(function, "__annotations__", {}).get("return")
    warnings.warn_explicit(
        f"{function.__qualname__}: its return annotation {annotation!r} does not resolve ({error}); "
        "its results come back as plain JSON. Define the class at module level, or pass result_type=.",
        UnresolvedResultType,
        code.co_filename,
        code.co_firstlineno,
        module=module_globals.get("__name__", "<unknown>"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )
