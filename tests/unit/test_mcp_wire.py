"""Reading an MCP server's messages within limits (``worker.mcp.wire``), line by line
(``worker.mcp.stdio.LineReader``), event by event (``worker.mcp.http_transport.SseFramer``),
and what ``worker.mcp.guard`` makes of replies the SDK would drop. No sockets: bytes in,
messages out, in parts of every size a pipe or a socket may cut them into."""

from __future__ import annotations

import json
from typing import Any

import mcp.types as types
import pytest
from mcp.shared.message import SessionMessage
from mcp_types.methods import parse_server_result, validate_server_result

from worker.mcp.guard import SessionGuard
from worker.mcp.http_transport import SseFramer
from worker.mcp.stdio import LineReader
from worker.mcp.translate import McpToolError, result_value
from worker.mcp.wire import (
    CUT_META_KEY,
    MAX_MESSAGE_BYTES,
    MessageBuffer,
    WireLimits,
    cut_message,
    encode,
    is_lost_reply,
    read_message,
)

LIMITS = WireLimits(call_bytes=300, message_bytes=2_000)
SIZES = [1, 3, 7, 64, 10_000]  # how a pipe or a socket may cut the same bytes


def reply(request_id: Any, text: str, *, id_last: bool = False) -> bytes:
    result = {"content": [{"type": "text", "text": text}]}
    if id_last:
        return json.dumps({"result": result, "jsonrpc": "2.0", "id": request_id}).encode()
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode()


def parts(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_the_limits_leave_room_for_the_longest_escape_of_every_character() -> None:
    limits = WireLimits.for_result_chars(20_000)
    assert limits.call_bytes == 6 * 20_000 + 64 * 1024
    assert limits.message_bytes == MAX_MESSAGE_BYTES
    big = WireLimits.for_result_chars(10_000_000)
    assert big.message_bytes == big.call_bytes  # a listing may be as long as a result


def test_a_buffer_keeps_the_head_and_the_tail_of_what_passes_its_limit() -> None:
    buffer = MessageBuffer(LIMITS, "call")
    assert [buffer.add(b"a" * 200), buffer.add(b"b" * 200), buffer.add(b"c" * 500)] == [
        False,
        True,  # once, when it passes
        False,
    ]
    assert buffer.head == b"a" * 200 + b"b" * 100
    assert buffer.size == 900 and buffer.tail == (b"b" * 100 + b"c" * 500)[-256:]


def test_a_message_of_unknown_kind_gets_the_call_limit_only_when_it_is_a_tool_result() -> None:
    result = MessageBuffer(LIMITS, "any")
    over = [result.add(p) for p in parts(reply(1, "x" * 5_000), 64)]
    assert over.count(True) == 1 and result.limit == 300
    listing = MessageBuffer(LIMITS, "any")
    page = json.dumps({"jsonrpc": "2.0", "id": 2, "result": {"tools": ["t" * 1_000]}})
    assert not any(listing.add(p) for p in parts(page.encode(), 64))  # 1 KB: under 2 KB
    assert listing.head == page.encode()


@pytest.mark.parametrize(
    ("data", "request_id", "why"),
    [
        (
            b'{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"a\\ud800"}]}}',
            4,
            "JSON with a lone UTF-16 surrogate (\\ud800), which is not valid Unicode",
        ),
        (
            b'{"jsonrpc":"2.0","id":"a","result":{"content":[{"type":"text","text":"\\udc00"}]}}',
            "a",
            "JSON with a lone UTF-16 surrogate (\\udc00), which is not valid Unicode",
        ),
        (b'{"jsonrpc":"2.0","id":5,"result":{"a', 5, "not valid JSON (EOF while parsing"),
        (
            b'{"jsonrpc":"2.0","id":6,"result":7}',
            6,
            "JSON but not a JSON-RPC message (result: Input should be a valid dictionary)",
        ),
        (
            b'{"jsonrpc":"1.0","id":7,"error":{"code":1,"message":"m"}}',
            7,
            "JSON but not a JSON-RPC message (jsonrpc: Input should be '2.0')",
        ),
        (b'{"jsonrpc":"2.0","result":{}, "x": "\\ud800"}', None, "JSON with a lone UTF-16"),
    ],
)
def test_a_reply_the_sdk_cannot_parse_becomes_an_error_reply_for_its_request(
    data: bytes, request_id: Any, why: str
) -> None:
    message, problem = read_message(data)
    assert isinstance(message, types.JSONRPCError) and message.id == request_id
    assert message.error.message.startswith(f"its reply could not be read: it is {why}")
    assert is_lost_reply(message.error.data) and problem is not None


def test_what_answers_nothing_is_skipped_and_a_valid_message_passes() -> None:
    assert read_message(b"  \r") == (None, None)
    message, problem = read_message(b"Server started on stdio")
    assert message is None
    assert problem == "skipped a line that is not a JSON-RPC message: 'Server started on stdio'"
    broken = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"\\ud800"}}'
    message, problem = read_message(broken)
    assert message is None and problem is not None and "'notifications/message'" in problem
    pair = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text",'
    pair += b'"text":"\\ud83d\\ude00"}]}}'
    message, problem = read_message(pair + b"\r")  # a surrogate pair is one character
    assert isinstance(message, types.JSONRPCResponse) and problem is None
    assert message.result["content"][0]["text"] == "\U0001f600"


def test_a_tool_result_past_its_limit_is_cut_for_the_request_it_names() -> None:
    full = reply(3, "x" * 5_000)
    message, _ = cut_message(full[:300], limit=300)
    assert isinstance(message, types.JSONRPCResponse) and message.id == 3
    result = types.CallToolResult.model_validate(message.result, by_name=False)
    value = result_value(result, 100)
    assert value == "x" * 100 + (
        "\n[cut while it was read: the reply had more than 300 bytes (6 per character of "
        "MANA_AI_MCP_MAX_RESULT_CHARS + 64 KiB); the first 100 characters are shown]"
    )
    last = reply(9, "x" * 5_000, id_last=True)  # the id only at its end
    message, _ = cut_message(last[:300], limit=300, tail=last[-256:])
    assert isinstance(message, types.JSONRPCResponse) and message.id == 9
    message, _ = cut_message(last[:300], limit=300, request_id=11)  # the POST's request
    assert isinstance(message, types.JSONRPCResponse) and message.id == 11
    message, _ = cut_message(last[:300], limit=300)
    assert isinstance(message, types.JSONRPCError) and message.id is None


def test_a_cut_result_the_server_marked_as_an_error_is_an_error() -> None:
    head = b'{"jsonrpc":"2.0","id":1,"result":{"isError":true,"content":[{"type":"text","text":"no'
    message, _ = cut_message(head + b"o" * 400, limit=300)
    assert isinstance(message, types.JSONRPCResponse)
    assert message.result["_meta"][CUT_META_KEY] == {"limit_bytes": 300, "is_error": True}
    result = types.CallToolResult.model_validate(message.result, by_name=False)
    with pytest.raises(McpToolError, match=r"^noo+\n\[cut while it was read"):
        result_value(result, 1_000)


def test_other_messages_past_their_limit_are_refused_or_dropped() -> None:
    page = b'{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"' + b"t" * 3_000
    message, _ = cut_message(page[:2_000], limit=2_000)
    assert isinstance(message, types.JSONRPCError) and message.id == 2
    assert message.error.message.startswith("its reply has more than 2000 bytes, the most")
    note = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"' + b"n" * 3_000
    assert cut_message(note[:2_000], limit=2_000) == (
        None,
        "dropped a 'notifications/message' message of more than 2000 bytes",
    )
    error = b'{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"' + b"e" * 3_000
    message, _ = cut_message(error[:2_000], limit=2_000)
    assert isinstance(message, types.JSONRPCError) and message.error.code == -32602
    assert message.error.message.endswith("(an error reply of more than 2000 bytes, cut)")


def stdout(*lines: bytes) -> bytes:
    return b"".join(line + b"\n" for line in lines)


@pytest.mark.parametrize("size", SIZES)
def test_lines_read_in_parts_of_any_size_give_the_same_messages(size: int) -> None:
    data = stdout(
        reply(1, "a"),
        b"log text on stdout",
        reply(2, "x" * 5_000),  # cut at 300 bytes; the rest is dropped
        b'{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"\\ud800"}]}}',
        reply(4, "b"),
    )
    reader = LineReader(LIMITS, None, "fake")
    messages = [m for p in parts(data, size) for m in reader.feed(p)] + reader.finish()
    assert [(type(m).__name__, m.id) for m in messages] == [  # type: ignore[union-attr]
        ("JSONRPCResponse", 1),
        ("JSONRPCResponse", 2),
        ("JSONRPCError", 3),
        ("JSONRPCResponse", 4),
    ]
    assert CUT_META_KEY in messages[1].result["_meta"]  # type: ignore[union-attr]


def in_flight(guard: SessionGuard, *calls: int) -> None:
    for request_id in calls:
        params = {"name": "t"}
        request = types.JSONRPCRequest(
            jsonrpc="2.0", id=request_id, method="tools/call", params=params
        )
        guard.ledger.sent(request)


def test_a_cut_line_that_names_its_call_at_its_end_waits_for_it_unless_one_call_waits() -> None:
    huge = reply(8, "x" * 5_000, id_last=True)
    guard = SessionGuard("fake")
    in_flight(guard, 7, 8)
    reader = LineReader(LIMITS, guard.ledger, "fake")
    assert reader.feed(huge[:1_000]) == []  # past its limit, but for which of the two?
    [message] = reader.feed(huge[1_000:] + b"\n")
    assert isinstance(message, types.JSONRPCResponse) and message.id == 8
    guard.ledger.answered(7)
    reader = LineReader(LIMITS, guard.ledger, "fake")
    [message] = reader.feed(huge[:1_000])  # the only call in flight: at once
    assert isinstance(message, types.JSONRPCResponse) and message.id == 8
    assert reader.feed(huge[1_000:] + b"\n" + reply(9, "next") + b"\n")[0].id == 9  # type: ignore[union-attr]


def sse(*events: bytes, crlf: bool = False) -> bytes:
    data = b"".join(b"event: message\nid: e1\ndata: " + e + b"\n\n" for e in events)
    return data.replace(b"\n", b"\r\n") if crlf else data


def frame(data: bytes, size: int, request_id: int | None = 1) -> tuple[list[bytes], bool]:
    """The data of each event the framer passes on, and whether it stopped reading."""
    framer = SseFramer(LIMITS, "call", request_id)
    out = b""
    for part in parts(data, size):
        out += framer.feed(part)
        if framer.done:
            break
    events = [e for e in out.split(b"\n\n") if e]
    for event in events:
        assert event.startswith(b"event: message\nid: e1\n"), event
    datas = [b"\n".join(line[6:] for line in e.split(b"\n")[2:]) for e in events]
    return datas, framer.done


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("crlf", [False, True])
def test_sse_events_read_in_parts_of_any_size_pass_as_they_came(size: int, crlf: bool) -> None:
    note = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,'
    note += b'"progress":1}}'
    two_lines = b'{"jsonrpc":"2.0",\ndata: "id":1,"result":{"content":[]}}'
    datas, done = frame(sse(note, two_lines, crlf=crlf), size)
    assert datas == [note, b'{"jsonrpc":"2.0",\n"id":1,"result":{"content":[]}}'] and not done


@pytest.mark.parametrize("size", SIZES)
def test_an_sse_reply_past_its_limit_is_cut_and_ends_the_stream(size: int) -> None:
    big_note = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"'
    big_note += b"n" * 1_000 + b'"}}'
    datas, done = frame(sse(big_note, b"not json-rpc", reply(1, "x" * 5_000)) + b"junk", size)
    [cut] = datas  # the big notification dropped, the line of text skipped
    message = types.jsonrpc_message_adapter.validate_json(cut, by_name=False)
    assert isinstance(message, types.JSONRPCResponse) and message.id == 1
    assert CUT_META_KEY in message.result["_meta"] and done


def test_a_garbled_sse_reply_becomes_an_error_for_the_posts_request() -> None:
    garbled = b'{"jsonrpc":"2.0","result":{"content":[{"type":"text","text":"\\ud800"}]}}'
    [data], _ = frame(sse(garbled), 5, request_id=12)
    message = types.jsonrpc_message_adapter.validate_json(data, by_name=False)
    assert isinstance(message, types.JSONRPCError) and message.id == 12
    assert is_lost_reply(message.error.data)


def test_a_priming_event_without_data_passes() -> None:
    framer = SseFramer(LIMITS, "other", None)
    assert framer.feed(b"id: 1\nretry: 5\nda") + framer.feed(b"ta\n\n") == (
        b"id: 1\nretry: 5\ndata: \n\n"
    )


def inbound(guard: SessionGuard, message: types.JSONRPCMessage) -> list[Any]:
    return [
        item.message if isinstance(item, SessionMessage) else item
        for item in guard.inbound(SessionMessage(message))
    ]


def test_a_reply_the_session_cannot_match_fails_every_request_in_flight() -> None:
    guard = SessionGuard("fake")
    in_flight(guard, 1, 2)
    stray = types.JSONRPCResponse(jsonrpc="2.0", id=99, result={})
    failed = inbound(guard, stray)
    assert [(type(m).__name__, m.id) for m in failed] == [("JSONRPCError", 1), ("JSONRPCError", 2)]
    assert failed[0].error.message == (
        "it answered a request it was never sent (id '99'); the requests waiting on the "
        "session failed, this one among them"
    )
    assert inbound(guard, stray) == []  # nothing in flight: logged, dropped
    in_flight(guard, 3)
    nobody = types.JSONRPCError(
        jsonrpc="2.0", id=None, error=types.ErrorData(code=-32700, message="Parse error")
    )
    [failed_3] = inbound(guard, nobody)
    assert failed_3.id == 3 and failed_3.error.message.startswith(
        "it answered with an error: Parse error (MCP error -32700), and names no request"
    )
    in_flight(guard, 4)
    [failed_4] = [i.message for i in guard.inbound(ValueError("bad frame"))]  # type: ignore[union-attr]
    assert failed_4.id == 4 and "could not be read (bad frame)" in failed_4.error.message


def test_a_late_reply_to_a_request_given_up_on_passes_and_answers_nothing_else() -> None:
    guard = SessionGuard("fake")
    in_flight(guard, 1, 2)
    cancel = types.JSONRPCNotification(
        jsonrpc="2.0", method="notifications/cancelled", params={"requestId": 1}
    )
    guard.ledger.sent(cancel)
    late = types.JSONRPCResponse(jsonrpc="2.0", id="1", result={})  # "1" is 1 to the SDK
    assert inbound(guard, late) == [late]
    assert guard.ledger.in_flight() == [2]


def test_a_listing_keeps_the_tools_the_sdk_takes_and_says_why_the_others_went() -> None:
    guard = SessionGuard("fake")
    guard.ledger.sent(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list"))
    good = {"name": "good", "inputSchema": {"type": "object"}}
    tools = [good, {"name": "list", "inputSchema": []}, {"inputSchema": {"type": "object"}}]
    listing = types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"tools": tools, "nextCursor": "c"})
    [kept] = inbound(guard, listing)
    assert kept.result == {"tools": [good], "nextCursor": "c"}
    assert guard.listing_problems() == [
        "tool 'list' was left out: its entry in the tool list breaks the MCP specification "
        "(inputSchema: Input should be a valid dictionary)",
        "tool without a usable name was left out: its entry in the tool list breaks the MCP "
        "specification (name: Field required)",
    ]


VERSIONS = types.version.KNOWN_PROTOCOL_VERSIONS
"""Every protocol version the SDK knows, oldest first: a session may negotiate any of them."""


def huge_reply(version: str, *, head: str = "") -> bytes:
    """A reply of 5,000 ``x`` as a server of ``version`` writes it: ``head`` (fields written
    before the content), the content, then what the version requires (2026-07-28:
    ``resultType``, after the content as the SDK writes it)."""
    after = ',"resultType":"complete"' if version in types.version.MODERN_PROTOCOL_VERSIONS else ""
    text = "x" * 5_000
    return (
        f'{{"jsonrpc":"2.0","id":3,"result":{{{head}"content":[{{"text":"{text}",'
        f'"type":"text"}}]{after}}}}}'
    ).encode()


@pytest.mark.parametrize("is_error", [False, True])
@pytest.mark.parametrize("version", VERSIONS)
def test_a_cut_result_is_one_the_sdk_takes_under_every_protocol_version(
    version: str, is_error: bool
) -> None:
    # the cut result lacked resultType, which 2026-07-28 requires: the agent's call failed
    # with "CallToolResult.resultType: Field required" instead of getting the cut result
    full = huge_reply(version, head='"isError":true,' if is_error else "")
    message, _ = cut_message(full[:300], limit=300)
    assert isinstance(message, types.JSONRPCResponse) and message.id == 3
    wire = json.loads(encode(message))["result"]  # what the SDK's client reads
    validate_server_result("tools/call", version, wire)  # the version's own schema
    result = parse_server_result("tools/call", version, wire)
    assert isinstance(result, types.CallToolResult)
    note = "\n[cut while it was read: the reply had more than 300 bytes"
    if is_error:
        with pytest.raises(McpToolError, match=r"^x+\n\[cut while it was read"):
            result_value(result, 100)
    else:
        assert result_value(result, 100).startswith("x" * 100 + note)


def test_a_cut_result_keeps_every_field_its_first_bytes_hold_whole() -> None:
    meta = '"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s","version":"1"}},'
    full = huge_reply("2026-07-28", head=f'{meta}"resultType":"complete",')
    message, _ = cut_message(full[:400], limit=400)
    assert isinstance(message, types.JSONRPCResponse)
    assert message.result["_meta"] == {
        "io.modelcontextprotocol/serverInfo": {"name": "s", "version": "1"},
        CUT_META_KEY: {"limit_bytes": 400, "is_error": False},
    }
    assert message.result["resultType"] == "complete"
    assert message.result["isError"] is True  # so that no output schema is checked


def test_the_guard_learns_the_version_a_session_negotiated_either_way() -> None:
    legacy = SessionGuard("fake")
    legacy.outbound(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="initialize"))
    answer = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {}}
    inbound(legacy, types.JSONRPCResponse(jsonrpc="2.0", id=1, result=answer))
    assert legacy.version == "2025-06-18"
    modern = SessionGuard("fake")  # server/discover: the SDK stamps each request with it
    stamp = {"_meta": {types.PROTOCOL_VERSION_META_KEY: "2026-07-28"}}
    modern.outbound(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list", params=stamp))
    assert modern.version == "2026-07-28"


def test_a_listing_of_a_2026_session_is_judged_by_that_version() -> None:
    # {"type": "nonsense"} passes the SDK's own model but not 2026-07-28's schema, which the
    # SDK checks the page against: the whole listing was refused, every tool of the server lost
    guard = SessionGuard("fake")
    stamp = {"_meta": {types.PROTOCOL_VERSION_META_KEY: "2026-07-28"}}
    guard.outbound(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list", params=stamp))
    good = {"name": "good", "inputSchema": {"type": "object"}}
    odd = {"name": "odd", "inputSchema": {"type": "nonsense"}}
    page = {"tools": [good, odd], "ttlMs": 0, "cacheScope": "private", "resultType": "complete"}
    [kept] = inbound(guard, types.JSONRPCResponse(jsonrpc="2.0", id=1, result=page))
    assert kept.result == {**page, "tools": [good]}
    validate_server_result("tools/list", "2026-07-28", kept.result)
    assert guard.listing_problems() == [
        "tool 'odd' was left out: its entry in the tool list breaks the MCP specification "
        "(inputSchema.type: Input should be 'object')"
    ]
