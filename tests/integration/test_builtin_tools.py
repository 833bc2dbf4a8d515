"""The built-in tools through their ToolSpecs: notes on a real database, clock on a fixed time."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import ToolContext, ToolRegistry, ToolSpec
from worker.daemon.tools_setup import allowed_tools_for, web_fetch_config
from worker.settings import load_settings
from worker.tools import WebFetchConfig, builtin_tools, clock_tools, notes_tools, web_tools
from worker.tools.notes import BODY_MAX_CHARS, TITLE_MAX_CHARS, escape_like, snippet

# 2025-03-30 00:30 UTC: Europe/Berlin switches to summer time half an hour later.
FIXED_NOW = datetime(2025, 3, 30, 0, 30, 5, tzinfo=UTC)


@pytest.fixture
def tools(db: AsyncEngine) -> dict[str, ToolSpec]:
    return {spec.name: spec for spec in builtin_tools(db, now=lambda: FIXED_NOW)}


async def call(
    tools: dict[str, ToolSpec], name: str, args: dict[str, Any], user: str = "alice"
) -> Any:
    """Call a tool the way the loop does: validate the arguments, then run the handler."""
    spec = tools[name]
    assert spec.validate_arguments(args) is None
    result = await spec.handler(args, ToolContext(user_id=user, mission_id=1, iteration_id=1))
    json.dumps(result)  # results go back to the model as JSON
    return result


# --- the tool specs ---------------------------------------------------------------------------


def test_the_builtin_tools_form_a_valid_registry(db: AsyncEngine) -> None:
    registry = ToolRegistry(builtin_tools(db))
    assert registry.names() == [
        "notes_list",
        "notes_search",
        "notes_read",
        "notes_create",
        "notes_update",
        "notes_delete",
        "clock_now",
        "web_fetch",
    ]
    hints = {spec.name: (spec.policy_hint, spec.scope) for spec in registry.specs()}
    assert hints == {
        "notes_list": ("read", "notes"),
        "notes_search": ("read", "notes"),
        "notes_read": ("read", "notes"),
        "notes_create": ("write", "notes"),
        "notes_update": ("write", "notes"),
        "notes_delete": ("destructive", "notes"),
        "clock_now": ("read", "clock"),
        "web_fetch": ("read", "web"),
    }
    for spec in registry.specs():
        assert spec.input_schema["type"] == "object"
        assert spec.input_schema["additionalProperties"] is False
        assert len(spec.description) > 30
        for prop in spec.input_schema["properties"].values():
            assert prop.get("description"), spec.name


def test_the_pack_functions_split_the_builtin_tools(db: AsyncEngine) -> None:
    names = [spec.name for spec in [*notes_tools(db), *clock_tools(), *web_tools()]]
    assert names == [spec.name for spec in builtin_tools(db)]


def test_web_fetch_is_opt_in_an_agent_gets_it_only_when_its_tools_name_it(
    db: AsyncEngine,
) -> None:
    tools = builtin_tools(db)
    every = [spec.name for spec in allowed_tools_for(tools, None)]
    assert "web_fetch" not in every and "clock_now" in every and len(every) == len(tools) - 1
    named = allowed_tools_for(tools, ["web_fetch", "clock_now"])
    assert [spec.name for spec in named] == ["clock_now", "web_fetch"]


def test_the_web_settings_reach_web_fetch() -> None:
    settings = load_settings(
        web_allow_private=True,
        web_allow_domains="Docs.Example.org, example.com",
        web_deny_domains="ads.example.com",
        web_timeout_s=3,
        web_max_bytes=1000,
        web_max_chars=100,
        web_max_redirects=1,
    )
    assert web_fetch_config(settings) == WebFetchConfig(
        allow_private=True,
        allow_domains=("docs.example.org", "example.com"),
        deny_domains=("ads.example.com",),
        timeout_s=3,
        max_bytes=1000,
        max_chars=100,
        max_redirects=1,
    )
    [spec] = web_tools(web_fetch_config(settings))
    assert spec.timeout_s == 8 and "at most 100 characters" in spec.description


@pytest.mark.parametrize(
    ("name", "args", "where"),
    [
        ("notes_list", {"limit": 0}, "limit"),
        ("notes_list", {"limit": 101}, "limit"),
        ("notes_list", {"limit": "5"}, "limit"),
        ("notes_list", {"offset": 5}, "(root)"),
        ("notes_search", {}, "(root)"),
        ("notes_search", {"query": ""}, "query"),
        ("notes_search", {"query": "x" * 201}, "query"),
        ("notes_read", {}, "(root)"),
        ("notes_read", {"id": 0}, "id"),
        ("notes_read", {"id": "7"}, "id"),
        ("notes_read", {"id": True}, "id"),
        ("notes_create", {"body": "no title"}, "(root)"),
        ("notes_create", {"title": ""}, "title"),
        ("notes_create", {"title": "   "}, "title"),
        ("notes_create", {"title": "t" * (TITLE_MAX_CHARS + 1)}, "title"),
        ("notes_create", {"title": "t", "body": "b" * (BODY_MAX_CHARS + 1)}, "body"),
        ("notes_create", {"title": "t", "user_id": "bob"}, "(root)"),
        ("notes_update", {"id": 1}, "(root)"),
        ("notes_update", {"title": "t"}, "(root)"),
        ("notes_update", {"id": 1, "title": ""}, "title"),
        ("notes_delete", {"id": -1}, "id"),
        ("clock_now", {"timezone": ""}, "timezone"),
        ("clock_now", {"tz": "UTC"}, "(root)"),
    ],
)
def test_schemas_reject_bad_arguments(
    tools: dict[str, ToolSpec], name: str, args: dict[str, Any], where: str
) -> None:
    error = tools[name].validate_arguments(args)
    assert error is not None
    assert error.startswith(f"invalid arguments for {name} at {where}:")


# --- notes ------------------------------------------------------------------------------------


async def test_notes_create_read_update_delete(tools: dict[str, ToolSpec]) -> None:
    created = await call(tools, "notes_create", {"title": "Groceries", "body": "milk, eggs"})
    assert created["id"] == 1
    assert created["title"] == "Groceries"
    assert datetime.fromisoformat(created["created_at"]).tzinfo is not None

    note = await call(tools, "notes_read", {"id": 1})
    assert note["title"] == "Groceries"
    assert note["body"] == "milk, eggs"
    assert note["created_at"] == note["updated_at"] == created["created_at"]

    updated = await call(tools, "notes_update", {"id": 1, "body": "milk, eggs, bread"})
    assert updated["changed"] == ["body"]
    assert updated["title"] == "Groceries"
    note = await call(tools, "notes_read", {"id": 1})
    assert note["body"] == "milk, eggs, bread"
    assert note["updated_at"] > note["created_at"]

    await call(tools, "notes_update", {"id": 1, "title": "Shopping"})
    assert (await call(tools, "notes_read", {"id": 1}))["title"] == "Shopping"

    assert await call(tools, "notes_delete", {"id": 1}) == {"deleted": 1, "title": "Shopping"}
    with pytest.raises(LookupError, match=r"^no note with id 1$"):
        await call(tools, "notes_read", {"id": 1})


async def test_a_note_without_a_body_has_an_empty_one(tools: dict[str, ToolSpec]) -> None:
    created = await call(tools, "notes_create", {"title": "Just a title"})
    assert (await call(tools, "notes_read", {"id": created["id"]}))["body"] == ""


async def test_notes_list_is_newest_first_and_limited(tools: dict[str, ToolSpec]) -> None:
    for title in ("first", "second", "third"):
        await call(tools, "notes_create", {"title": title, "body": "long body " * 50})
    listed = await call(tools, "notes_list", {})
    assert [n["title"] for n in listed["notes"]] == ["third", "second", "first"]
    assert listed["count"] == 3
    assert set(listed["notes"][0]) == {"id", "title", "updated_at"}  # no bodies

    await call(tools, "notes_update", {"id": 1, "title": "first, edited"})
    listed = await call(tools, "notes_list", {"limit": 2})
    assert [n["title"] for n in listed["notes"]] == ["first, edited", "third"]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("notes_read", {"id": 7}),
        ("notes_update", {"id": 7, "title": "x"}),
        ("notes_delete", {"id": 7}),
    ],
)
async def test_an_unknown_id_is_an_error_the_model_can_read(
    tools: dict[str, ToolSpec], name: str, args: dict[str, Any]
) -> None:
    with pytest.raises(LookupError, match=r"^no note with id 7$"):
        await call(tools, name, args)


async def test_update_with_nothing_to_change_is_refused_by_the_handler_too(
    tools: dict[str, ToolSpec],
) -> None:
    await call(tools, "notes_create", {"title": "t"})
    with pytest.raises(ValueError, match="nothing to change"):
        await tools["notes_update"].handler({"id": 1}, ToolContext(user_id="alice"))


async def test_users_never_see_each_others_notes(tools: dict[str, ToolSpec]) -> None:
    secret = await call(tools, "notes_create", {"title": "alice's diary", "body": "secret"})
    await call(tools, "notes_create", {"title": "bob's list", "body": "secret too"}, user="bob")
    note_id = secret["id"]

    assert [n["title"] for n in (await call(tools, "notes_list", {}, user="bob"))["notes"]] == [
        "bob's list"
    ]
    found = await call(tools, "notes_search", {"query": "secret"}, user="bob")
    assert [n["title"] for n in found["notes"]] == ["bob's list"]
    for name, args in [
        ("notes_read", {"id": note_id}),
        ("notes_update", {"id": note_id, "body": "mine now"}),
        ("notes_delete", {"id": note_id}),
    ]:
        # Same answer as for an id that does not exist: ids leak nothing.
        with pytest.raises(LookupError, match=f"^no note with id {note_id}$"):
            await call(tools, name, args, user="bob")

    assert (await call(tools, "notes_read", {"id": note_id}))["body"] == "secret"
    assert (await call(tools, "notes_list", {}, user="carol"))["notes"] == []


async def test_search_matches_title_or_body_case_insensitively(
    tools: dict[str, ToolSpec],
) -> None:
    await call(tools, "notes_create", {"title": "Trip to LISBON", "body": "flights"})
    await call(tools, "notes_create", {"title": "Packing", "body": "passport for lisbon"})
    await call(tools, "notes_create", {"title": "Unrelated", "body": "nothing here"})

    found = await call(tools, "notes_search", {"query": "Lisbon"})
    assert [n["title"] for n in found["notes"]] == ["Packing", "Trip to LISBON"]
    assert found["notes"][0]["snippet"] == "passport for lisbon"
    assert found["count"] == 2
    assert (await call(tools, "notes_search", {"query": "lisbon", "limit": 1}))["count"] == 1


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("100%", ["100% done"]),
        ("%", ["100% done"]),
        ("snake_case", ["snake_case"]),
        ("_", ["snake_case"]),
        ("e_c", ["snake_case"]),
        ("\\", ["C:\\temp"]),
        ("\\t", ["C:\\temp"]),
    ],
)
async def test_search_takes_like_wildcards_literally(
    tools: dict[str, ToolSpec], query: str, expected: list[str]
) -> None:
    for title in ("100% done", "1000 done", "snake_case", "snakeXcase", "C:\\temp", "C:temp"):
        await call(tools, "notes_create", {"title": title})
    found = await call(tools, "notes_search", {"query": query})
    assert [n["title"] for n in found["notes"]] == expected


def test_escape_like() -> None:
    assert escape_like("50%_off\\") == "50\\%\\_off\\\\"


@pytest.mark.parametrize(
    ("body", "query", "width", "expected"),
    [
        ("short body", "body", 160, "short body"),
        ("0123456789abcdefghij", "a", 6, "…89abcd…"),
        ("0123456789abcdefghij", "0", 6, "012345…"),
        ("0123456789abcdefghij", "j", 6, "…efghij"),
        ("0123456789abcdefghij", "zzz", 6, "012345…"),
    ],
)
def test_snippet_is_cut_around_the_first_match(
    body: str, query: str, width: int, expected: str
) -> None:
    assert snippet(body, query, width) == expected


# --- clock ------------------------------------------------------------------------------------


async def test_clock_defaults_to_utc(tools: dict[str, ToolSpec]) -> None:
    assert await call(tools, "clock_now", {}) == {
        "now": "2025-03-30T00:30:05+00:00",
        "date": "2025-03-30",
        "time": "00:30:05",
        "weekday": "Sunday",
        "timezone": "UTC",
        "utc_offset": "+00:00",
        "unix_time_s": int(FIXED_NOW.timestamp()),
    }


@pytest.mark.parametrize(
    ("zone", "now", "weekday", "offset"),
    [
        ("Europe/Berlin", "2025-03-30T01:30:05+01:00", "Sunday", "+01:00"),
        ("America/New_York", "2025-03-29T20:30:05-04:00", "Saturday", "-04:00"),
        ("Asia/Kolkata", "2025-03-30T06:00:05+05:30", "Sunday", "+05:30"),
    ],
)
async def test_clock_in_a_timezone(
    tools: dict[str, ToolSpec], zone: str, now: str, weekday: str, offset: str
) -> None:
    result = await call(tools, "clock_now", {"timezone": zone})
    assert (result["now"], result["weekday"], result["utc_offset"]) == (now, weekday, offset)
    assert result["timezone"] == zone


async def test_clock_follows_the_injected_clock() -> None:
    moments = iter([FIXED_NOW, FIXED_NOW.replace(hour=1)])
    [spec] = clock_tools(now=lambda: next(moments))
    ctx = ToolContext(user_id="alice")
    first = await spec.handler({"timezone": "Europe/Berlin"}, ctx)
    second = await spec.handler({"timezone": "Europe/Berlin"}, ctx)
    # One hour of real time later the Berlin clock is two hours on: summer time began.
    assert (first["time"], second["time"]) == ("01:30:05", "03:30:05")


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../etc/passwd", "utc+2"])
async def test_an_unknown_timezone_is_a_clear_error(tools: dict[str, ToolSpec], zone: str) -> None:
    with pytest.raises(ValueError, match=r"unknown timezone .*IANA name"):
        await call(tools, "clock_now", {"timezone": zone})


async def test_a_naive_clock_is_refused() -> None:
    [spec] = clock_tools(now=lambda: datetime(2025, 1, 1))  # noqa: DTZ001 - the point of the test
    with pytest.raises(RuntimeError, match="naive"):
        await spec.handler({}, ToolContext(user_id="alice"))


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("notes_create", {"title": "a\x00b"}, "title contains a NUL character"),
        ("notes_create", {"title": "t", "body": "x\ud800"}, "body contains an unpaired surrogate"),
        ("notes_search", {"query": "\x00"}, "query contains a NUL character"),
    ],
)
async def test_text_postgresql_cannot_hold_is_refused_in_words_the_model_reads(
    tools: dict[str, ToolSpec], name: str, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        await call(tools, name, args)


async def test_notes_create_makes_one_note_per_idempotency_key_and_reports_it(
    tools: dict[str, ToolSpec], db: AsyncEngine
) -> None:
    ctx = ToolContext(user_id="alice", iteration_id=9).for_call(2, 0)
    assert ctx.idempotency_key == "9:2:0"
    spec = tools["notes_create"]
    assert spec.outcome_of is not None
    assert "no note was created" in await spec.outcome_of({"title": "t"}, ctx)
    first = await spec.handler({"title": "once"}, ctx)
    again = await spec.handler({"title": "once"}, ctx)  # a second attempt at the same call
    assert again["id"] == first["id"]
    other = await spec.handler({"title": "once"}, ctx.for_call(3, 0))  # another call
    assert other["id"] != first["id"]
    report = await spec.outcome_of({"title": "once"}, ctx)
    assert f"that call created note {first['id']}" in report
    # keys are per user: bob's call with the same key makes bob's note
    bob = await spec.handler({"title": "b"}, dataclasses.replace(ctx, user_id="bob"))
    assert bob["id"] not in (first["id"], other["id"])
    delete_state = tools["notes_delete"].outcome_of
    assert delete_state is not None
    assert "exists now" in await delete_state({"id": first["id"]}, ctx)
    assert "does not exist now" in await delete_state({"id": 999}, ctx)


@pytest.mark.parametrize("tool", ["notes_read", "notes_update", "notes_delete"])
async def test_an_id_past_what_the_database_holds_is_refused_by_the_schema(
    tools: dict[str, ToolSpec], tool: str
) -> None:
    args: dict[str, Any] = {"id": 99999999999999999999}
    if tool == "notes_update":
        args["title"] = "t"
    refused = tools[tool].validate_arguments(args)
    assert refused is not None and "9223372036854775807" in refused


async def test_a_call_the_database_refuses_is_told_in_words_without_the_statement(
    tools: dict[str, ToolSpec],
) -> None:
    # past the schema (a caller that skips validation): the database refuses the value, and
    # the error the model reads names the reason, never SQLAlchemy's "[SQL: ...]" text
    from planner.errors import ToolError

    with pytest.raises(ToolError) as refused:
        await tools["notes_delete"].handler(
            {"id": 99999999999999999999}, ToolContext(user_id="alice", mission_id=1)
        )
    text = str(refused.value)
    assert text.startswith("notes_delete failed: the database refused it (")
    assert "SQL" not in text and "DELETE" not in text and "alice" not in text
