"""What an agent's MCP server is, the names and scope its tools get, and how the command line
values are read without ever echoing a secret."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from planner import ToolSpec
from worker.mcp.config import (
    check_server_name,
    is_mcp_scope,
    is_mcp_tool_name,
    namespaced_tool_name,
    parse_env_option,
    parse_header_option,
    parse_server_option,
    policy_hint_from_annotations,
    redact_url,
)
from worker.store.agent_servers import McpServerConfig


@pytest.mark.parametrize("name", ["fs", "GitHub", "my-fs", "my_fs", "a1", "x" * 32])
def test_valid_server_names(name: str) -> None:
    assert check_server_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "a__b", "_fs", "fs_", "-fs", "f s", "fs.x", "fś", "x" * 33, "mcp:fs"]
)
def test_invalid_server_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="MCP server name"):
        check_server_name(name)


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ("read_file", "fs__read_file"),
        ("read-file", "fs__read-file"),
        ("notes.append", "fs__notes_append"),
        ("search issues", "fs__search_issues"),
        ("Ünïcode/τool", "fs___n_code__ool"),
    ],
)
def test_tool_names_are_namespaced_and_made_valid(tool: str, expected: str) -> None:
    name = namespaced_tool_name("fs", tool)
    assert name == expected and is_mcp_tool_name(name)


def test_a_long_or_taken_name_gets_a_stable_hash_and_stays_a_valid_tool_name() -> None:
    long = namespaced_tool_name("server", "t" * 200)
    assert len(long) == 64 and long == namespaced_tool_name("server", "t" * 200)
    assert long != namespaced_tool_name("server", "t" * 199)
    first = namespaced_tool_name("fs", "read file")
    second = namespaced_tool_name("fs", "read_file", taken={first})
    assert first == "fs__read_file" and second.startswith("fs__read_file_") and second != first

    async def noop(args: dict[str, Any], ctx: Any) -> None:
        return None

    for name in (long, second):  # what ToolSpec accepts, so the tool can be offered
        ToolSpec(name, "d", {"type": "object"}, "read", noop)


def test_mcp_names_never_meet_the_built_ins() -> None:
    assert not is_mcp_tool_name("notes_list") and not is_mcp_tool_name("clock_now")
    assert is_mcp_tool_name("notes__list")  # a server called "notes"
    assert not is_mcp_tool_name("fs__") and not is_mcp_tool_name("a__b__" + "x" * 70)
    assert is_mcp_scope("mcp:fs") and not is_mcp_scope("notes") and not is_mcp_scope("mcp:a__b")


def _annotations(**hints: Any) -> Any:
    return SimpleNamespace(**{"read_only_hint": None, "destructive_hint": None, **hints})


@pytest.mark.parametrize(
    ("annotations", "hint"),
    [
        (None, "write"),
        (_annotations(), "write"),
        (_annotations(read_only_hint=True), "read"),
        (_annotations(destructive_hint=True), "destructive"),
        (_annotations(read_only_hint=False, destructive_hint=False), "write"),
        (_annotations(read_only_hint=True, destructive_hint=True), "destructive"),  # safer
    ],
)
def test_policy_hints_from_annotations(annotations: Any, hint: str) -> None:
    assert policy_hint_from_annotations(annotations) == hint


def test_server_options() -> None:
    http = parse_server_option("search=https://search.example/mcp")
    assert (http.name, http.transport, http.url) == ("search", "http", "https://search.example/mcp")
    stdio = parse_server_option("fs=stdio:npx -y '@mcp/server fs' /srv/a\\ b")
    assert (stdio.transport, stdio.command, stdio.args) == (
        "stdio",
        "npx",
        ("-y", "@mcp/server fs", "/srv/a b"),
    )


def test_a_stdio_command_may_come_as_words_of_its_own() -> None:
    server = parse_server_option("fs=stdio:npx", ["-y", "@mcp/server fs", "/srv"])
    assert (server.command, server.args) == ("npx", ("-y", "@mcp/server fs", "/srv"))
    with pytest.raises(ValueError, match="1 more word"):
        parse_server_option("s=https://x/mcp", ["extra"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("https://x/mcp", "expected NAME=URL"),
        ("fs=", "expected NAME=URL"),
        ("f s=https://x/mcp", "MCP server name"),
        ("fs=ftp://user:hunter2@host/mcp", r"expected an http\(s\) URL"),
        ("fs=stdio:", "needs a command"),
        ("fs=stdio:npx 'unclosed", "does not parse"),
        ("fs=https://x/m cp?key=hunter2", "must not contain whitespace"),
        # what httpx would refuse when the first run connects, refused when it is given
        ("fs=https://[::1/mcp?key=hunter2", "is not a URL"),
        ("fs=https://x:99999/mcp?key=hunter2", "invalid port"),
        ("fs=https://x/mcp\x1b[2J?key=hunter2", "hidden character"),
        ("fs=https:///mcp?key=hunter2", "has no host"),
    ],
)
def test_bad_server_options_say_why_without_echoing_secrets(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_server_option(text)
    assert "hunter2" not in str(caught.value)


def test_header_and_env_options() -> None:
    assert parse_header_option("s=Authorization: Bearer a:b") == (
        "s",
        "Authorization",
        "Bearer a:b",
    )
    assert parse_env_option("fs=TOKEN=a=b") == ("fs", "TOKEN", "a=b")


@pytest.mark.parametrize(
    "text",
    [
        "s=Authorization",  # no value separator
        "s=Bad Header: hunter2",
        "s=Host: hunter2",  # set by the client
        "s=Mcp-Session-Id: hunter2",
        "s=X-Key: hunter2\r\nX-Other: 1",
    ],
)
def test_bad_headers_are_refused_without_echoing_the_value(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_header_option(text)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("text", ["fs=TOKEN", "fs=1TOKEN=hunter2", "fs=A-B=hunter2"])
def test_bad_env_options_are_refused_without_echoing_the_value(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_env_option(text)
    assert "hunter2" not in str(caught.value)


def test_what_leaves_the_database_for_people_has_no_secret() -> None:
    server = McpServerConfig(
        name="s",
        transport="http",
        url="https://bot:hunter2@search.example/mcp?key=sk-1&x=2",
        headers={"Authorization": "Bearer sk-2"},
    )
    shown = str(server.public()) + server.describe()
    for secret in ("hunter2", "sk-1", "sk-2"):
        assert secret not in shown
    assert server.public()["url"] == "https://bot:***@search.example/mcp?key=***&x=***"
    assert server.public()["headers"] == ["Authorization"]
    assert McpServerConfig.from_row(server.row()) == server
    assert redact_url("http://h/mcp") == "http://h/mcp"
