"""Fakes of the services mana-ai talks to, for integration and e2e tests.

``FakeLLMServer`` is a real OpenAI-compatible HTTP server on 127.0.0.1 (see ``llm_server``);
``FakeWebServer`` serves scripted web pages on 127.0.0.1 (see ``web_server``).
``provider_zoo`` builds the replies real providers send and the checks strict ones apply.
``mcp_stdio_server.py`` is a script: a small MCP server on stdio that agents' ``--mcp`` start;
``FakeMcpHttpServer`` is an MCP server over streamable HTTP (see ``mcp_http_server``); both
serve ``mcp_raw``, a hand-written server that sends what broken MCP servers send.
"""

from tests.fakes.llm_server import (
    FakeLLMServer,
    Flood,
    RequestCheck,
    Responder,
    ScriptedReply,
    chat_completion_body,
    down_base_url,
    final_answer_responder,
)
from tests.fakes.mcp_http_server import FakeMcpHttpServer, RecordedCall
from tests.fakes.web_server import FakeWebServer, RecordedRequest

__all__ = [
    "FakeLLMServer",
    "FakeMcpHttpServer",
    "FakeWebServer",
    "Flood",
    "RecordedCall",
    "RecordedRequest",
    "RequestCheck",
    "Responder",
    "ScriptedReply",
    "chat_completion_body",
    "down_base_url",
    "final_answer_responder",
]
