"""AsyncLLMServer: an OpenAI-compatible chat-completions server on asyncio, for load.

``FakeLLMServer`` (a thread per connection) is the scriptable one; this one answers many
concurrent requests cheaply: every request is answered after ``latency_s`` seconds (a number,
or a function of the request's body giving one; give or take a uniform ``spread_s``: a model's
answers take more or less time), by
``responder(body)`` (default: a ``clock_now`` call first, then a final answer once a tool
result is in the conversation: two requests per mission). HTTP/1.1 with keep-alive, a
listen backlog of 4096. It counts the connections open now and at most (``peak``), and the
requests answered.

In a test::

    async with AsyncLLMServer(latency_s=0.3) as server:
        ... OpenAICompatibleChatModel(base_url=server.base_url) ...

In a child process (a benchmark, so that the server's CPU is not the worker's):
``serve_in_process(latency_s, connection)`` sends the port through ``connection`` and serves
until killed.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from tests.fakes.llm_server import chat_completion_body

__all__ = ["AsyncLLMServer", "clock_then_answer_body", "serve_in_process"]


def clock_then_answer_body(body: dict[str, Any]) -> dict[str, Any]:
    """A ``clock_now`` call, or a final answer once a tool result is in the conversation."""
    if any(m.get("role") == "tool" for m in body.get("messages", [])):
        return chat_completion_body(content="It is now.")
    return chat_completion_body(tool_calls=[("clock_now", {})])


class AsyncLLMServer:
    """See the module docstring. ``base_url`` is valid once started."""

    def __init__(
        self,
        latency_s: float | Callable[[dict[str, Any]], float] = 0.0,
        responder: Callable[[dict[str, Any]], dict[str, Any]] = clock_then_answer_body,
        spread_s: float = 0.0,
    ) -> None:
        self.latency_s = latency_s
        self.spread_s = spread_s
        self.responder = responder
        self.open = 0
        self.peak = 0
        self.answered = 0
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0, backlog=4096)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = json.loads(await reader.readexactly(length))
                latency = self.latency_s
                base = latency(body) if callable(latency) else latency
                spread = random.uniform(-self.spread_s, self.spread_s) if self.spread_s else 0
                await asyncio.sleep(max(0.0, base + spread))
                data = json.dumps(self.responder(body)).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
                self.answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def serve_in_process(latency_s: float, connection: Any, spread_s: float = 0.0) -> None:
    """Serve until the process is killed; send the port through ``connection`` first."""

    async def serve() -> None:
        async with AsyncLLMServer(latency_s, spread_s=spread_s) as server:
            connection.send(server.port)
            await asyncio.Event().wait()

    asyncio.run(serve())
