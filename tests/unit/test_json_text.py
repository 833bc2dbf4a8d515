"""``planner.json_text.json_text`` is ``json.dumps(value, ensure_ascii=False, default=str)``:
the same text, or the same exception."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planner.json_text import json_text


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


@pytest.mark.parametrize(
    "value",
    [
        {"ok": True},
        {"a": [1, 2.5, None, "é\u2028\x00x"], "b": {"c": float("inf"), "d": float("nan")}},
        "text",
        1,
        -2.5e300,
        None,
        [1, {"x": "y"}],
        {1: "int key", 2.5: "float key", False: "bool key", None: "null key"},
        {"tuple": (1, 2), "set": {3}, "object": object},
        [[[[["deep"]]]]],
        {"\ud800": "a lone surrogate"},
    ],
)
def test_the_text_is_json_dumps(value: Any) -> None:
    assert json_text(value) == _dumps(value)


def test_a_circular_value_raises_what_json_dumps_raises() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference detected"):
        json_text({"loop": looped})


def test_a_key_json_cannot_have_raises_what_json_dumps_raises() -> None:
    with pytest.raises(TypeError, match="keys must be str, int, float, bool or None"):
        json_text({(1, 2): "tuple key"})


def test_a_value_nested_too_deeply_raises_recursion_error() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        json_text(deep)


def test_as_deep_a_structure_as_json_dumps_reaches() -> None:
    def nested(depth: int) -> list[Any]:
        value: list[Any] = []
        for _ in range(depth):
            value = [value]
        return value

    low, high = 1, 20_000  # the deepest json.dumps encodes from here
    while low < high:
        middle = (low + high + 1) // 2
        try:
            json.dumps(nested(middle), ensure_ascii=False, default=str)
        except RecursionError:
            high = middle - 1
        else:
            low = middle
    assert json_text(nested(low)) == json.dumps(nested(low), ensure_ascii=False, default=str)
