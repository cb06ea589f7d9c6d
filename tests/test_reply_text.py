"""The text of replies and log lines is the library's: json_text writes what json.dumps writes, and
rfc3339 what datetime writes, for every value they are given."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from token_service.server import json_text
from token_service.server.operations import rfc3339

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and the infinities too: json.dumps writes NaN, Infinity
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=8), children, max_size=5)
        | st.tuples(children, children)
    ),
    max_leaves=30,
)


@given(JSON_VALUES)
def test_compact_is_json_dumps_with_compact_separators(value: Any) -> None:
    assert json_text.compact(value) == json.dumps(value, separators=(",", ":"))


@given(JSON_VALUES)
def test_spaced_is_plain_json_dumps(value: Any) -> None:
    assert json_text.spaced(value) == json.dumps(value)


@given(st.dictionaries(st.integers() | st.booleans() | st.none() | st.floats(), st.integers(), max_size=4))
def test_keys_that_are_not_strings_are_written_as_json_dumps_writes_them(value: dict[Any, int]) -> None:
    assert json_text.spaced(value) == json.dumps(value)


@pytest.mark.parametrize("value", [object(), {"at": datetime(2026, 1, 1)}, [b"bytes"], {(1, 2): 3}])
def test_what_json_dumps_cannot_write_is_the_same_type_error(value: Any) -> None:
    with pytest.raises(TypeError) as ours:
        json_text.spaced(value)
    with pytest.raises(TypeError) as library:
        json.dumps(value)
    assert str(ours.value) == str(library.value)


def test_a_structure_that_contains_itself_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(RecursionError):
        json_text.compact(loop)


def _library_rfc3339(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@given(st.floats(min_value=0, max_value=2**33, allow_nan=False))
def test_rfc3339_is_what_datetime_writes(epoch_seconds: float) -> None:
    assert rfc3339(epoch_seconds) == _library_rfc3339(epoch_seconds)


@pytest.mark.parametrize(
    "epoch_seconds",
    [
        # a hair before a second: datetime rounds to the microsecond first (half to even)
        1_796_000_000.9999995,
        1_796_000_000.9999994,
        1.9999995,
        1.9999985,
        math.nextafter(1_796_000_001.0, 0.0),
        0.0,
        1_796_000_000.5,
    ],
)
def test_rfc3339_rounds_as_datetime_does_next_to_a_second(epoch_seconds: float) -> None:
    assert rfc3339(epoch_seconds) == _library_rfc3339(epoch_seconds)
