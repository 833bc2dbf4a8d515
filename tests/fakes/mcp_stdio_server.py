"""A small MCP server on stdin/stdout (the official SDK's low-level server), started by tests
as an agent's ``--mcp NAME=stdio:python PATH``. It imports nothing from mana-ai.

Tools, with what a real server may send:

* ``echo`` (readOnlyHint): returns its ``text``.
* ``notes.append`` (no annotations: a write; a dot in its name): appends ``text`` to a file
  given with ``--log FILE`` (so a test sees it ran), and the idempotency key the client sent
  in ``_meta`` to ``FILE`` with the suffix ``.keys``, and returns ``{"appended": text}``
  (structured content).
* ``wipe`` (destructiveHint): appends ``WIPED`` to the log file.
* ``big``: returns ``size`` characters of text.
* ``fails``: answers with ``isError`` and a message.
* ``slow``: sleeps ``seconds`` before answering.

``--mode hang`` reads but never answers (not even the handshake); ``--mode exit`` exits at
once.
``--mode stderr`` writes hostile lines to its stderr before it serves (``STDERR_LINES``:
the tester's ``boom \x1b[31m``, bidi and C1 controls, bytes that are not UTF-8, a line of
10,000 bytes); ``--mode stderrflood`` writes 100,000 lines and then a line of 5 MB without
an end, then serves, and writes ``flooded`` to ``--log FILE`` when it has written them all.
``--mode odd`` is a hand-written JSON-RPC server (as servers built without this SDK are) whose
listing holds what the SDK's own server would refuse to send (``ODD_TOOLS``: a remote
``$ref``, no name, names too long, clashing or not ASCII, a huge description, an invalid
schema) next to ``echo``, which it runs.
``--mode raw`` is ``tests.fakes.mcp_raw`` on stdio, one message a line: tools that answer with
50 MB, garbled replies, log lines on stdout, replies to nobody or a flood of notifications,
listed next to entries that break the MCP specification. With ``--log FILE`` it appends
``sent NAME`` to FILE once it has written the whole reply of a call of tool NAME; with
``--protocol VERSION`` it speaks that protocol version (``mcp_raw.replies``' ``version``).
Environment variable ``FAKE_MCP_SECRET`` (when set) is echoed by ``echo`` with ``text`` equal
to ``$secret``, so a test can check that an agent's ``--mcp-env`` reaches the server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if not __package__:  # run as a script: the repository root on the path, for tests.fakes
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server

# The SDK (about 0.7 s of CPU to import) is imported by the modes that use it only: ``serve``
# and the ``stderr`` ones; ``raw``, ``odd``, ``hang`` and ``exit`` start without it.


def sdk_tools() -> list[Any]:
    """The tools of the SDK server (see the module docstring)."""
    import mcp.types as types

    return [
        types.Tool(
            name="echo",
            description="Echo the text.",
            input_schema={
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="notes.append",
            description="Append a line to the log.",
            input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        ),
        types.Tool(
            name="wipe",
            description="Wipe everything.",
            input_schema={"type": "object", "properties": {}},
            annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
        ),
        types.Tool(
            name="big",
            description="A big result.",
            input_schema={"type": "object", "properties": {"size": {"type": "integer"}}},
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="fails",
            description="Always fails.",
            input_schema={"type": "object"},
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="slow",
            description="Sleeps.",
            input_schema={"type": "object", "properties": {"seconds": {"type": "number"}}},
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
    ]


ODD_TOOLS: list[dict[str, Any]] = [
    {
        "name": "remote ref",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"$ref": "http://127.0.0.1:9/schema.json"}},
        },
    },
    {"name": "", "inputSchema": {"type": "object"}},
    {"name": "bad schema", "inputSchema": {"type": "object", "properties": {"a": {"type": 7}}}},
    {"name": "read file", "inputSchema": {"type": "object"}},
    {"name": "read_file", "inputSchema": {"type": "object"}},
    {"name": "t" * 100, "inputSchema": {"type": "object"}},
    {"name": "Ünïcode/τool", "inputSchema": {"type": "object"}},
    {"name": "huge", "description": "d" * 10_000, "inputSchema": {"type": "object"}},
    {
        "name": "echo",
        "description": "Echo the text.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    },
]


STDERR_LINES = [
    b"boom \x1b[31m",
    b"title \x1b]0;pwned\x07 c1 \xc2\x9b31m bidi \xe2\x80\xaeevil",
    b"not utf-8 \xff\xfe",
    b"long " + b"x" * 10_000,
]
"""What ``--mode stderr`` writes to stderr, one line each."""


def write_stderr(mode: str, log: Path | None) -> None:
    err = sys.stderr.buffer
    if mode == "stderr":
        err.write(b"".join(line + b"\n" for line in STDERR_LINES))
    else:  # stderrflood
        line = b"flood " + b"f" * 94 + b"\n"
        for _ in range(1000):
            err.write(line * 100)
        err.write(b"endless " * (5 * 1024 * 1024 // 8))
    err.flush()
    if log is not None and mode == "stderrflood":
        with log.open("a") as f:
            f.write("flooded\n")


def serve_raw(log: Path | None, version: str | None = None) -> None:
    """``tests.fakes.mcp_raw`` on stdin/stdout, one message a line, each chunk flushed,
    speaking protocol ``version`` (``None``: the client's)."""
    from tests.fakes.mcp_raw import replies

    out = sys.stdout.buffer
    try:
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            message = json.loads(line)
            for outgoing in replies(message, version=version):
                for index, chunk in enumerate(outgoing.chunks):
                    if index and outgoing.pause_s:
                        time.sleep(outgoing.pause_s)
                    out.write(chunk)
                    out.flush()
                out.write(b"\n")
                out.flush()
            name = (message.get("params") or {}).get("name")
            if log is not None and message.get("method") == "tools/call":
                with log.open("a", encoding="utf-8") as f:
                    f.write(f"sent {name}\n")
    except BrokenPipeError:  # the client is gone
        pass


def serve_odd() -> None:
    """Newline-delimited JSON-RPC on stdin/stdout, by hand (the handshake era)."""
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "id" not in message:  # a notification
            continue
        method, params = message.get("method"), message.get("params") or {}
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        if method == "initialize":
            reply["result"] = {
                "protocolVersion": params.get("protocolVersion"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "odd", "version": "1"},
            }
        elif method == "tools/list":
            reply["result"] = {"tools": ODD_TOOLS}
        elif method == "tools/call" and params.get("name") == "echo":
            text = str((params.get("arguments") or {}).get("text", ""))
            reply["result"] = {"content": [{"type": "text", "text": text}]}
        elif method == "ping":
            reply["result"] = {}
        else:
            reply["error"] = {"code": -32601, "message": f"method not found: {method}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def build(log: Path | None) -> Server[Any]:
    import mcp.types as types
    from mcp.server.lowlevel import Server

    tools = sdk_tools()

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        name = params.name

        def text(value: str, *, error: bool = False) -> types.CallToolResult:
            return types.CallToolResult(content=[types.TextContent(text=value)], is_error=error)

        if name == "echo":
            value = str(args.get("text", ""))
            if value == "$secret":
                value = os.environ.get("FAKE_MCP_SECRET", "(unset)")
            return text(value)
        if name in ("notes.append", "wipe"):
            line = "WIPED" if name == "wipe" else str(args.get("text", ""))
            if log is not None:
                with log.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")
                key = (params.meta or {}).get("mana-ai/idempotency-key")
                with log.with_suffix(".keys").open("a", encoding="utf-8") as f:
                    f.write(f"{key}\n")
            return types.CallToolResult(
                content=[types.TextContent(text=line)], structured_content={"appended": line}
            )
        if name == "big":
            return text("x" * int(args.get("size", 100_000)))
        if name == "fails":
            return text("the disk is full", error=True)
        if name == "slow":
            await anyio.sleep(float(args.get("seconds", 30)))
            return text("slept")
        return text(f"unknown tool {name}", error=True)

    return Server("fake-mcp", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve(log: Path | None) -> None:
    from mcp.server.stdio import stdio_server

    server = build(log)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--mode",
        default="serve",
        choices=("serve", "hang", "exit", "odd", "raw", "stderr", "stderrflood"),
    )
    parser.add_argument("--log", type=Path)
    parser.add_argument("--protocol", help="with --mode raw: the protocol version it speaks")
    args = parser.parse_args()
    if args.mode in ("stderr", "stderrflood"):
        write_stderr(args.mode, args.log)
        args.mode, args.log = "serve", None
    if args.mode == "exit":
        print("fake MCP server: exiting at once", file=sys.stderr)
        sys.exit(3)
    if args.mode == "hang":
        for _ in sys.stdin:  # reads every message, answers none, ends when stdin closes
            pass
        return
    if args.mode == "odd":
        serve_odd()
        return
    if args.mode == "raw":
        serve_raw(args.log, args.protocol)
        return
    anyio.run(serve, args.log)


if __name__ == "__main__":
    main()
