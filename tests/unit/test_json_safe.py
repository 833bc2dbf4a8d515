"""``json_safe``: what a run stores is plain JSON PostgreSQL accepts, whichever way it gets
there (plain data is walked; anything else goes through the encoder)."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.store.rows import _storable, json_safe


class Colour(StrEnum):
    RED = "red"


def through_the_encoder(value: Any) -> Any:
    """What ``json_safe`` stored before plain data had a path of its own."""
    try:
        return _storable(json.loads(json.dumps(value, default=str)))
    except (RecursionError, ValueError, TypeError) as exc:
        return f"(not stored: cannot be encoded as JSON: {type(exc).__name__})"


circular: list[Any] = []
circular.append(circular)


@pytest.mark.parametrize(
    "value",
    [
        "a\x00b\ud800c",
        {"k\x00": [1, 2.5, math.nan, math.inf, -math.inf, None, True, False, "x"]},
        {"a": {"b": [{"c": "d"}]}, "n": 10**30},
        (1, "two"),
        {1: "a", "1": "b"},
        {"colour": Colour.RED},
        {"when": object()},
        circular,
        [[[[]]]] * 3,
        -0.0,
    ],
    ids=lambda value: type(value).__name__,  # stable across xdist workers (no addresses)
)
def test_plain_or_not_json_safe_stores_what_the_encoder_would(value: Any) -> None:
    stored, expected = json_safe(value), through_the_encoder(value)
    assert json.dumps(stored, allow_nan=False) == json.dumps(expected, allow_nan=False)
    assert type(stored) is type(expected)


_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities included
    | st.text(alphabet=st.characters(codec=None, blacklist_categories=()))  # NUL, surrogates
    | st.sampled_from([Colour.RED, "\\u0000", "\x00", "\ud83d", "\U0001f600"])
)
_structures = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(
            st.text(max_size=3) | st.integers() | st.sampled_from(["\x00"]), inner, max_size=4
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=st.dictionaries(st.text(max_size=3), _structures, max_size=4) | st.lists(_structures))
def test_any_structure_is_stored_as_the_encoder_would(value: Any) -> None:
    stored, expected = json_safe(value), through_the_encoder(value)
    assert json.dumps(stored, allow_nan=False) == json.dumps(expected, allow_nan=False)


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for this")


def test_a_value_whose_str_raises_is_stored_as_a_note() -> None:
    assert json_safe({"x": _Unprintable()}) == (
        "(not stored: cannot be encoded as JSON: RuntimeError)"
    )
