"""An agent's MCP server as the database keeps it (a row of ``agent_mcp_servers``).

``McpServerConfig`` is the row's typed form, shared by the store (which reads and writes it),
the command line (which builds it from ``--mcp`` options: ``worker.mcp.config``) and the MCP
tool sources (which open it: ``worker.mcp.sources``). Header and environment values are
secrets: stored (the worker must send them), never logged nor printed; ``public()`` and
``describe()`` are the only forms that leave the database layer for people.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from worker.http_url import redact_url

__all__ = ["McpServerConfig", "Transport"]

Transport = Literal["http", "stdio"]
"""How an MCP server is reached: streamable HTTP at a URL, or a local process on stdio."""


@dataclass(frozen=True)
class McpServerConfig:
    """One MCP server of an agent (a row of ``agent_mcp_servers``).

    Attributes:
        name: the server's name (namespace of its tools, ``mcp:NAME`` their scope).
        transport: ``http`` (streamable HTTP at ``url``) or ``stdio`` (``command`` ``args``).
        url: the endpoint of an ``http`` server.
        command, args: the program of a ``stdio`` server and its arguments.
        headers: HTTP headers sent with every request (secret values).
        env: environment variables of a ``stdio`` server, over a minimal inherited environment
            (PATH, HOME, USER, ...; never the worker's MANA_AI_* settings). Secret values.
        required: when the server cannot be reached, the iteration fails instead of running
            without its tools.
    """

    name: str
    transport: Transport
    url: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    required: bool = False

    def describe(self) -> str:
        """One line for logs and errors, without secrets: ``fs (stdio: npx)``,
        ``search (http: https://host/mcp?key=***)``."""
        if self.transport == "http":
            return f"{self.name} (http: {redact_url(self.url or '')})"
        return f"{self.name} (stdio: {self.command})"

    def public(self) -> dict[str, Any]:
        """What the command line shows: everything but secret values (header and environment
        variable names only; a password or query values in the URL as ``***``)."""
        return {
            "name": self.name,
            "transport": self.transport,
            "url": redact_url(self.url) if self.url is not None else None,
            "command": self.command,
            "args": list(self.args),
            "headers": sorted(self.headers),
            "env": sorted(self.env),
            "required": self.required,
        }

    def secrets(self) -> set[str]:
        """The secret values of this server, for ``worker.redaction``: its header values (and
        the token of a ``Bearer TOKEN`` one), its environment values, and the password and
        query values of its URL."""
        found = set(self.env.values())
        for value in self.headers.values():
            found.add(value)
            scheme, _, token = value.partition(" ")
            if token.strip() and scheme.isalpha():
                found.add(token.strip())
        if self.url:
            parts = urlsplit(self.url)
            try:
                if parts.password:
                    found.add(unquote(parts.password))
            except ValueError:
                pass
            found.update(value for _, value in parse_qsl(parts.query))
        return {secret for secret in found if secret}

    def row(self) -> dict[str, Any]:
        """The ``agent_mcp_servers`` columns (``agent_id`` aside)."""
        return {
            "name": self.name,
            "transport": self.transport,
            "url": self.url,
            "command": self.command,
            "args": list(self.args),
            "headers": dict(self.headers),
            "env": dict(self.env),
            "required": self.required,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> McpServerConfig:
        """From an ``agent_mcp_servers`` row (or its JSON form)."""
        return cls(
            name=row["name"],
            transport=row["transport"],
            url=row.get("url"),
            command=row.get("command"),
            args=tuple(row.get("args") or ()),
            headers={str(k): str(v) for k, v in (row.get("headers") or {}).items()},
            env={str(k): str(v) for k, v in (row.get("env") or {}).items()},
            required=bool(row.get("required")),
        )
