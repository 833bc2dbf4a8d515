"""What mana-ai checks between an MCP transport and the SDK's client session.

``SessionGuard.wrap(transport)`` is a transport around another (the SDK's ``Client`` takes any
``Transport``: an async context manager of a read and a write stream). On the way out it keeps
the ledger of the session's requests (``RequestLedger``: id → method, and which still wait for
their reply). On the way in:

* a reply with an id this session never sent, an error reply with ``id: null`` (JSON-RPC's
  "the id could not be read", also what ``worker.mcp.wire`` makes of a garbled message naming
  no request), or an exception the transport put on its read stream: the SDK drops each of
  them, and the call it answered would wait for its timeout. Instead every request in flight
  fails at once, with an error saying why (``wire.LOST_REPLY_DATA``: its call may have run).
  A mission runs a write alone (``planner.execution``), so a write is failed only by a reply
  that can have been its own; reads in flight beside each other fail together;
* a reply to ``tools/list``: a tool whose entry breaks the MCP specification (an input schema
  that is not an object, a name that is not a string …) would make the SDK refuse the whole
  page; it is taken out alone, with the reason in ``left_out``, and the others pass. An entry
  is judged by the protocol version the session negotiated (``version``: the server's answer
  to ``initialize``, or the version the SDK stamps on each request of a 2026-07-28 session,
  which negotiates with ``server/discover``), as the SDK judges the page.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import anyio
import mcp.types as types
from mcp.shared.dispatcher import as_request_id, coerce_request_id
from mcp.shared.message import SessionMessage
from mcp.types import PROTOCOL_VERSION_META_KEY
from mcp_types.methods import validate_server_result
from pydantic import ValidationError

from worker.mcp.wire import is_lost_reply, lost_reply

__all__ = ["MAX_LEFT_OUT", "RequestLedger", "SessionGuard"]

logger = logging.getLogger(__name__)

MAX_LEFT_OUT = 20
"""Reasons kept of tools taken out of one session's listings (then a count)."""

Item = SessionMessage | Exception


class RequestLedger:
    """The requests a session sent (by id, as the SDK correlates them: ``"7"`` is ``7``), and
    which of them still wait for their reply (in flight)."""

    def __init__(self) -> None:
        self._in_flight: dict[types.RequestId, str] = {}
        self._sent: set[types.RequestId] = set()

    def sent(self, message: types.JSONRPCMessage) -> None:
        """Note an outgoing message: a request is in flight; a ``notifications/cancelled`` of
        one (the SDK gave up on it) takes it out."""
        if isinstance(message, types.JSONRPCRequest):
            key = coerce_request_id(message.id)
            self._in_flight[key] = message.method
            self._sent.add(key)
        elif (
            isinstance(message, types.JSONRPCNotification)
            and message.method == "notifications/cancelled"
        ):
            cancelled = as_request_id((message.params or {}).get("requestId"))
            if cancelled is not None:
                self._in_flight.pop(coerce_request_id(cancelled), None)

    def answered(self, request_id: types.RequestId) -> str | None:
        """The method of in-flight request ``request_id``, which its reply takes out; ``None``
        when it is not in flight."""
        return self._in_flight.pop(coerce_request_id(request_id), None)

    def was_sent(self, request_id: types.RequestId) -> bool:
        """True when this session ever sent a request with ``request_id``."""
        return coerce_request_id(request_id) in self._sent

    def in_flight(self) -> list[types.RequestId]:
        """The requests waiting for their reply, oldest first."""
        return list(self._in_flight)

    def only_call_in_flight(self) -> types.RequestId | None:
        """The id of the one ``tools/call`` in flight; ``None`` when there are none or more."""
        calls = [k for k, method in self._in_flight.items() if method == "tools/call"]
        return calls[0] if len(calls) == 1 else None

    def settle_all(self) -> list[types.RequestId]:
        """Take every request out of flight and return their ids."""
        ids = list(self._in_flight)
        self._in_flight.clear()
        return ids


class SessionGuard:
    """The checks of one MCP client session (see the module docstring).

    Args:
        server: the server as logs name it (``McpServerConfig.describe()``: no secrets).

    Attributes:
        ledger: the session's requests.
        left_out: why tools were taken out of its listings (at most ``MAX_LEFT_OUT``, then
            one line with the count of the others).
    """

    def __init__(self, server: str) -> None:
        self.server = server
        self.ledger = RequestLedger()
        self.left_out: list[str] = []
        self._more_left_out = 0
        self._version: str | None = None

    @property
    def version(self) -> str | None:
        """The protocol version the session negotiated, once it is known."""
        return self._version

    def outbound(self, message: types.JSONRPCMessage) -> None:
        """Note a message the session sends: in the ledger, and the protocol version a
        request carries in its ``_meta`` (the SDK stamps it on every request of a session
        that negotiated with ``server/discover``)."""
        self.ledger.sent(message)
        if isinstance(message, types.JSONRPCRequest):
            meta = (message.params or {}).get("_meta")
            version = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
            if isinstance(version, str):
                self._version = version

    @contextlib.asynccontextmanager
    async def wrap(self, transport: Any) -> AsyncIterator[tuple[_GuardedRead, _GuardedWrite]]:
        """``transport`` (an SDK ``Transport``) with this guard between it and the session."""
        async with transport as (read, write):
            yield _GuardedRead(read, self), _GuardedWrite(write, self)

    def listing_problems(self) -> list[str]:
        """``left_out``, with a line for those past ``MAX_LEFT_OUT``."""
        more = [f"{self._more_left_out} more tools were left out"] if self._more_left_out else []
        return [*self.left_out, *more]

    def inbound(self, item: Item) -> list[Item]:
        """What the session gets for ``item`` from the transport (nothing, it, or errors of
        the requests in flight)."""
        if isinstance(item, Exception):
            return self._fail_in_flight(f"it sent a message that could not be read ({item})"[:300])
        message = item.message
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            return [item]
        if message.id is None:
            error = message.error  # only an error reply may name no request
            text = error.message
            if not is_lost_reply(error.data):
                text = f"it answered with an error: {text[:200]} (MCP error {error.code})"
            return self._fail_in_flight(f"{text[:300]}, and names no request")
        method = self.ledger.answered(message.id)
        if method is None:
            if self.ledger.was_sent(message.id):
                return [item]  # a late reply to a request the SDK gave up on: it drops it
            return self._fail_in_flight(
                f"it answered a request it was never sent (id {str(message.id)[:40]!r})"
            )
        if isinstance(message, types.JSONRPCResponse):
            if method == "initialize":
                version = message.result.get("protocolVersion")
                self._version = version if isinstance(version, str) else None
            elif method == "tools/list":
                return [self._listing(item, message)]
        return [item]

    def _fail_in_flight(self, why: str) -> list[Item]:
        ids = self.ledger.settle_all()
        if not ids:
            logger.warning("MCP server %s: %s (no request was waiting)", self.server, why)
            return []
        logger.warning(
            "MCP server %s: %s; %d request(s) in flight failed", self.server, why, len(ids)
        )
        text = f"{why}; the requests waiting on the session failed, this one among them"
        return [SessionMessage(lost_reply(i, types.INTERNAL_ERROR, text)) for i in ids]

    def _listing(self, item: SessionMessage, message: types.JSONRPCResponse) -> SessionMessage:
        tools = message.result.get("tools")
        if not isinstance(tools, list):
            return item  # the listing itself is broken: the SDK says how
        if self._refusal({**message.result, "tools": []}) is not None:
            return item  # the page itself is broken, whatever its tools: the SDK says how
        kept = [tool for tool in tools if self._tool_fits(message.result, tool)]
        if len(kept) == len(tools):
            return item
        result = {**message.result, "tools": kept}
        reply = types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result=result)
        return SessionMessage(reply, metadata=item.metadata)

    def _refusal(self, page: dict[str, Any]) -> ValidationError | None:
        """Why the SDK refuses ``page`` (a ``tools/list`` result) under the session's
        protocol version; ``None`` when it takes it (or does not know the version)."""
        try:
            types.ListToolsResult.model_validate(page, by_name=False)
            if self._version is not None:
                validate_server_result("tools/list", self._version, page)
        except ValidationError as exc:
            return exc
        except (KeyError, ValueError):  # a protocol version the SDK's tables do not know
            pass
        return None

    def _tool_fits(self, page: dict[str, Any], tool: Any) -> bool:
        """True when ``tool`` (one entry of the listing ``page``) is one the SDK takes in
        that page; else the reason goes to ``left_out``."""
        exc = self._refusal({**page, "tools": [tool]})
        if exc is None:
            return True
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"][2:]) or "the entry"
        name = tool.get("name") if isinstance(tool, dict) else None
        shown = repr(name[:80]) if isinstance(name, str) else "without a usable name"
        self._note_left_out(
            f"tool {shown} was left out: its entry in the tool list breaks the MCP "
            f"specification ({where}: {first['msg']})"
        )
        return False

    def _note_left_out(self, reason: str) -> None:
        if len(self.left_out) < MAX_LEFT_OUT:
            self.left_out.append(reason)
        else:
            self._more_left_out += 1


class _GuardedRead:
    """The transport's read stream, through ``SessionGuard.inbound`` (the SDK's
    ``ReadStream`` protocol; ``last_context`` passed on, as the SDK's dispatcher reads it)."""

    def __init__(self, inner: Any, guard: SessionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._queue: deque[Item] = deque()
        self.last_context: Any = None

    async def receive(self) -> Item:
        while not self._queue:
            item = await self._inner.receive()
            self.last_context = getattr(self._inner, "last_context", None)
            self._queue.extend(self._guard.inbound(item))
        return self._queue.popleft()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _GuardedRead:
        return self

    async def __anext__(self) -> Item:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _GuardedRead:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _GuardedWrite:
    """The transport's write stream, noting each message in the guard first
    (``SessionGuard.outbound``)."""

    def __init__(self, inner: Any, guard: SessionGuard) -> None:
        self._inner = inner
        self._guard = guard

    async def send(self, item: SessionMessage, /) -> None:
        self._guard.outbound(item.message)
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _GuardedWrite:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()
