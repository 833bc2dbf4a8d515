"""The settings of `mana-ai mcp serve` and of the MCP servers agents use: ``McpSettings``
(``Settings.mcp``, ``MANA_AI_MCP_*``)."""

from __future__ import annotations

from pydantic import Field

from worker.settings.values import CommaList, Section

__all__ = ["McpSettings"]


class McpSettings(Section):
    """``MANA_AI_MCP_*``."""

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description=(
            "Address `mana-ai mcp serve` listens on for MCP clients (streamable HTTP). Default "
            "127.0.0.1 (this host only); set 0.0.0.0 to serve other machines. Every client "
            "authenticates with a bearer token (`mana-ai mcp token create`)."
        ),
    )
    port: int = Field(
        default=8765,
        ge=0,
        le=65535,
        description=(
            "TCP port of `mana-ai mcp serve`: MCP at /mcp, with /metrics and /healthz beside "
            "it. 0 picks a free port (printed at start). Default 8765."
        ),
    )
    scopes: CommaList = Field(
        default=(),
        description=(
            "Tool scopes that clients of `mana-ai mcp serve` may use, separated by commas "
            "(e.g. 'notes,clock'); tools of other scopes are not listed, and a call of one is "
            "denied (scope_not_exposed). Unset: every scope."
        ),
    )
    list_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "Seconds an iteration waits for each MCP server of its agent to connect and list "
            "its tools (at the start of every iteration). A server that fails or does not "
            "answer in time is left out of that iteration, with the reason on the iteration's "
            "error; with --mcp-required the iteration fails instead."
        ),
    )
    max_result_chars: int = Field(
        default=20_000,
        ge=100,
        le=10_000_000,
        description=(
            "Characters of one MCP tool result (its text, or its structured content as JSON) "
            "an agent gets at most (100 to 10000000); a longer result is cut and says so. Its "
            "reply is read at most 6 bytes a character + 64 KiB (JSON escapes, the envelope), "
            "and cut while it is read past that. Default 20000."
        ),
    )
