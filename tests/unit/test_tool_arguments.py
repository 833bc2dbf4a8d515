"""Tool-call arguments in odd encodings are decoded before they are judged invalid."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.llm.tool_arguments import decode_arguments, nesting_depth

TITLE = {"title": "time"}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"title": "time"}', TITLE),  # the documented form
        (TITLE, TITLE),  # already an object
        ('"{\\"title\\": \\"time\\"}"', TITLE),  # the example: JSON text of JSON text
        (json.dumps(json.dumps(json.dumps(TITLE))), TITLE),  # nested twice
        ('\ufeff{"title": "time"}', TITLE),  # a byte-order mark
        ('```json\n{"title": "time"}\n```', TITLE),  # a Markdown code fence
        ('```\n{"title": "time"}\n```', TITLE),
        ("{'title': 'time'}", TITLE),  # a Python dict literal
        ("{'n': 1, 'ok': True, 'none': None}", {"n": 1, "ok": True, "none": None}),
        ("  \n", {}),  # nothing, for a tool without parameters
        ("", {}),
        (None, {}),
        ("null", {}),
        ("None", {}),
        ("{}", {}),
        ('""', {}),
        (json.dumps(""), {}),
    ],
)
def test_odd_encodings_decode_to_the_object(raw: Any, expected: dict[str, Any]) -> None:
    assert decode_arguments(raw) == (expected, None)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("{title: time", "arguments are not valid JSON: Expecting property name"),
        ("[1, 2]", "arguments must be a JSON object, got an array"),
        ('"just text"', "arguments are not valid JSON"),
        ("42", "arguments must be a JSON object, got a number"),
        (["a"], "arguments must be a JSON object, got an array"),
        ("{'s': {1, 2}}", "arguments are not valid JSON"),  # a set is no argument
        ("{1: 'x'}", "arguments are not valid JSON"),  # nor a non-text key
        (json.dumps(json.dumps(json.dumps(json.dumps(TITLE)))), "nested more than 3 levels"),
        ("__import__('os').system('true')", "arguments are not valid JSON"),  # never evaluated
    ],
)
def test_what_is_not_an_object_is_a_parse_error_for_the_model(raw: Any, error: str) -> None:
    arguments, parse_error = decode_arguments(raw)
    assert arguments == {}
    assert parse_error is not None and error in parse_error


def test_a_cut_reply_says_the_arguments_were_truncated() -> None:
    _, error = decode_arguments('{"title": "ti', truncated=True)
    assert error is not None
    assert error.startswith("your output was cut off at the output-token limit")
    assert "call the tool again with shorter arguments" in error
    # complete arguments in a cut reply are fine
    assert decode_arguments('{"title": "time"}', truncated=True) == (TITLE, None)


def nested(depth: int) -> str:
    return '{"x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        (nested(64), True),  # at the limit
        (nested(65), False),  # just past it
        (nested(990), False),  # deep enough to break encoders later
        (nested(10_000), False),  # deep enough to break the JSON parser
        ({"x": json.loads(nested(70))}, False),  # already decoded, still too deep
    ],
)
def test_arguments_nested_too_deeply_are_a_parse_error(raw: Any, ok: bool) -> None:
    arguments, error = decode_arguments(raw)
    assert (error is None) is ok
    if not ok:
        assert arguments == {} and "nested more than 64 levels deep" in (error or "")


@pytest.mark.parametrize(
    ("value", "depth"), [(1, 0), ({}, 1), ([], 1), ({"a": [1, {"b": []}]}, 4), ([[[[]]]], 4)]
)
def test_nesting_depth(value: Any, depth: int) -> None:
    assert nesting_depth(value) == depth
