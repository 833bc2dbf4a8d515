"""An agent's MCP server, and the names and scope its tools get.

An operator gives an agent an MCP server with ``--mcp NAME=URL`` (streamable HTTP) or
``--mcp NAME=stdio:COMMAND ARGS`` (a local process speaking MCP on stdin/stdout), plus
``--mcp-header NAME=HEADER:VALUE`` (HTTP), ``--mcp-env NAME=VAR=VALUE`` (stdio) and
``--mcp-required NAME``. Header and environment values are secrets: they are stored (the worker
must send them) but never logged nor printed; ``McpServerConfig.public()`` and ``describe()``
are the only forms that leave the database layer for people.

Names: a server is called ``NAME`` (1-32 letters, digits, ``-`` and single ``_``; no ``__``,
which separates the namespace), its tools ``NAME__tool`` (``planner.ToolSpec``'s name rule:
at most 64 of ``[a-zA-Z0-9_-]``; other characters become ``_``, and a name that is too long or
taken gets a short hash of the original), and their scope is ``mcp:NAME``, so that
``mana-ai policy allow-destructive USER mcp:NAME`` opts a user in to every destructive tool of
that server.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Collection, Sequence
from typing import Any

from planner.tools import PolicyHint
from worker.http_url import http_url_problem, redact_url
from worker.store.agent_servers import McpServerConfig

__all__ = [
    "MAX_SERVER_NAME_CHARS",
    "NAMESPACE_SEPARATOR",
    "SCOPE_PREFIX",
    "McpServerConfig",
    "check_server_name",
    "is_mcp_scope",
    "is_mcp_tool_name",
    "mcp_scope",
    "namespaced_tool_name",
    "parse_env_option",
    "parse_header_option",
    "parse_server_option",
    "policy_hint_from_annotations",
    "redact_url",
]

NAMESPACE_SEPARATOR = "__"
SCOPE_PREFIX = "mcp:"
MAX_SERVER_NAME_CHARS = 32
MAX_TOOL_NAME_CHARS = 64  # planner.ToolSpec's rule (OpenAI's function-name limit)

_SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$")
_TOOL_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 token
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOP_HEADERS = frozenset(
    {"host", "content-length", "content-type", "connection", "transfer-encoding", "accept"}
)


def check_server_name(name: str) -> str:
    """``name`` when it is a valid MCP server name (see the module docstring).

    Raises:
        ValueError: saying what is wrong with it.
    """
    if not 1 <= len(name) <= MAX_SERVER_NAME_CHARS:
        raise ValueError(
            f"MCP server name {name[:40]!r} must be 1 to {MAX_SERVER_NAME_CHARS} characters"
        )
    if not _SERVER_NAME.match(name) or name.endswith("_"):
        raise ValueError(
            f"MCP server name {name!r} may hold letters, digits, '-' and single '_' (not "
            "'__', nor '_' at its end), starting with a letter or digit"
        )
    return name


def mcp_scope(server: str) -> str:
    """The scope of a server's tools: ``mcp:NAME``."""
    return SCOPE_PREFIX + server


def is_mcp_scope(text: str) -> bool:
    """True for ``mcp:NAME`` with a valid server name."""
    if not text.startswith(SCOPE_PREFIX):
        return False
    try:
        check_server_name(text.removeprefix(SCOPE_PREFIX))
    except ValueError:
        return False
    return True


def is_mcp_tool_name(text: str) -> bool:
    """True for a name an MCP server's tool can get: ``NAME__tool`` with a valid server name,
    at most 64 of ``[a-zA-Z0-9_-]``."""
    server, sep, tool = text.partition(NAMESPACE_SEPARATOR)
    if not sep or not tool or len(text) > MAX_TOOL_NAME_CHARS or _TOOL_CHARS.search(text):
        return False
    try:
        check_server_name(server)
    except ValueError:
        return False
    return True


def namespaced_tool_name(server: str, tool: str, taken: Collection[str] = ()) -> str:
    """The name the agent sees for ``tool`` of ``server``: ``server__tool``, with characters
    outside ``[a-zA-Z0-9_-]`` replaced by ``_``; when that is longer than 64 characters, or
    already in ``taken`` (two tools of one server that differ only in such characters), it is
    cut and ends with ``_`` and 8 hex digits of the original name's SHA-256, which keeps it
    stable across runs. The model calls it by this name; the server gets ``tool``."""
    name = f"{server}{NAMESPACE_SEPARATOR}{_TOOL_CHARS.sub('_', tool)}"
    if len(name) <= MAX_TOOL_NAME_CHARS and name not in taken:
        return name
    digest = hashlib.sha256(tool.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{name[: MAX_TOOL_NAME_CHARS - 9]}_{digest}"


def policy_hint_from_annotations(annotations: Any) -> PolicyHint:
    """An MCP tool's policy hint from its annotations (``mcp.types.ToolAnnotations`` or
    ``None``): ``destructiveHint`` → ``destructive``, else ``readOnlyHint`` → ``read``, else
    ``write``. A tool that claims both is taken as destructive (the safer reading); one without
    annotations as ``write`` (it runs alone and needs no opt-in)."""
    if annotations is None:
        return "write"
    if getattr(annotations, "destructive_hint", None) is True:
        return "destructive"
    if getattr(annotations, "read_only_hint", None) is True:
        return "read"
    return "write"


def parse_server_option(text: str, more: Sequence[str] = ()) -> McpServerConfig:
    """``NAME=URL`` (http or https) or ``NAME=stdio:COMMAND ARGS`` (split like a shell would:
    quote arguments with spaces). ``more`` are further arguments of a stdio command that came
    as words of their own (``--mcp fs=stdio:npx server /srv`` unquoted on a command line).

    Raises:
        ValueError: a message naming what is wrong (the value is not echoed whole: it may
            hold a secret).
    """
    name, sep, target = text.partition("=")
    name, target = name.strip(), target.strip()
    if not sep or not name or not target:
        raise ValueError("expected NAME=URL or NAME=stdio:COMMAND ARGS")
    check_server_name(name)
    if target.startswith("stdio:"):
        try:
            words = shlex.split(target.removeprefix("stdio:"))
        except ValueError as exc:
            raise ValueError(f"the command of MCP server {name} does not parse: {exc}") from None
        words += list(more)
        if not words:
            raise ValueError(f"MCP server {name}: stdio: needs a command, e.g. stdio:npx server")
        if any("\x00" in w for w in words):
            raise ValueError(f"the command of MCP server {name} contains a NUL character")
        return McpServerConfig(
            name=name, transport="stdio", command=words[0], args=tuple(words[1:])
        )
    if more:
        raise ValueError(
            f"MCP server {name}: {len(more)} more word(s) after its URL; only a stdio: command "
            "takes arguments"
        )
    if not target.lower().startswith(("http://", "https://")):
        raise ValueError(
            f"MCP server {name}: expected an http(s) URL such as https://host/mcp, or "
            "stdio:COMMAND ARGS"
        )
    problem = http_url_problem(target)
    if problem is not None:
        raise ValueError(f"the URL of MCP server {name} {problem}")
    return McpServerConfig(name=name, transport="http", url=target)


def parse_header_option(text: str) -> tuple[str, str, str]:
    """``NAME=HEADER:VALUE`` (e.g. ``search=Authorization: Bearer abc``) as
    ``(server, header, value)``.

    Raises:
        ValueError: without echoing the value (a secret).
    """
    server, sep, rest = text.partition("=")
    header, colon, value = rest.partition(":")
    server, header, value = server.strip(), header.strip(), value.strip()
    if not sep or not colon or not server or not header:
        raise ValueError("expected NAME=HEADER:VALUE, e.g. search=Authorization: Bearer TOKEN")
    if not _HEADER_NAME.match(header):
        raise ValueError(f"{header[:40]!r} is not an HTTP header name")
    if header.lower() in _HOP_HEADERS or header.lower().startswith("mcp-"):
        raise ValueError(f"header {header} is set by the MCP client itself")
    if any(c in value for c in "\r\n\x00"):
        raise ValueError(f"the value of header {header} contains a line break or NUL")
    return check_server_name(server), header, value


def parse_env_option(text: str) -> tuple[str, str, str]:
    """``NAME=VAR=VALUE`` (e.g. ``fs=GITHUB_TOKEN=abc``) as ``(server, variable, value)``.

    Raises:
        ValueError: without echoing the value (a secret).
    """
    server, sep, rest = text.partition("=")
    var, eq, value = rest.partition("=")
    server, var = server.strip(), var.strip()
    if not sep or not eq or not server or not var:
        raise ValueError("expected NAME=VAR=VALUE, e.g. github=GITHUB_TOKEN=ghp_...")
    if not _ENV_NAME.match(var):
        raise ValueError(f"{var[:40]!r} is not an environment variable name")
    if "\x00" in value:
        raise ValueError(f"the value of {var} contains a NUL character")
    return check_server_name(server), var, value
