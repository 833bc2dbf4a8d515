"""The MCP server's tables: its clients' bearer tokens and the calls they make.

* Tokens (``mcp_tokens``): ``create_token`` makes a random token (``secrets.token_urlsafe``,
  256 bits) and stores only its SHA-256; the token is returned once, to be shown once.
  ``token_principal`` finds the live (not revoked) token of a presented bearer token by its
  hash: one indexed query per request, so a revocation applies to the next request.
* Calls: ``record_call`` writes an MCP client's call into ``tool_invocations`` with
  ``consumer = 'mcp'`` (no iteration, mission or round; the token's id), next to the calls of
  missions, so ``mana-ai policy report`` and the audit read both.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.tables import mcp_tokens, tool_invocations
from worker.errors import NotFoundError
from worker.store.records import ToolInvocationRow
from worker.store.writes.params import invocation_outcome_values

__all__ = ["TOKEN_PREFIX", "McpPrincipal", "McpStore", "hash_token", "revoke_token_row"]

TOKEN_PREFIX = "mana_mcp_"
"""Every token starts with it, so a leaked one is recognisable (secret scanners, logs)."""

_TOKEN_COLUMNS = (
    mcp_tokens.c.id,
    mcp_tokens.c.user_id,
    mcp_tokens.c.label,
    mcp_tokens.c.created_at,
    mcp_tokens.c.revoked_at,
)  # never the hash


async def revoke_token_row(
    engine: AsyncEngine,
    table: Table,
    columns: Sequence[Any],
    token_id: int,
    missing: str,
) -> tuple[dict[str, Any], bool]:
    """Set ``revoked_at`` of row ``token_id`` of a token ``table`` (``mcp_tokens``,
    ``admin_tokens``) unless it is set: ``(its columns, whether it was live until now)``, in
    one transaction; revoking a revoked token changes nothing.

    Raises:
        NotFoundError: no row has that id (``missing`` is the message).
    """
    key = table.c.id
    stmt = (
        update(table)
        .where(key == token_id, table.c.revoked_at.is_(None))
        .values(revoked_at=func.now())
        .returning(*columns)
    )
    async with engine.begin() as conn:
        row = (await conn.execute(stmt)).mappings().first()
        if row is not None:
            return dict(row), True
        existing = (await conn.execute(select(*columns).where(key == token_id))).mappings().first()
    if existing is None:
        raise NotFoundError(missing)
    return dict(existing), False


def hash_token(token: str) -> str:
    """The stored form of a token: hex SHA-256 of its UTF-8 bytes. A token carries 256 random
    bits, so a plain hash is enough (no salt or slow hash is needed against guessing)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class McpPrincipal:
    """Who an MCP request runs for: the token's user (``token_id`` is ``None`` for
    ``mcp serve --stdio``, which runs for the user named on its command line)."""

    user_id: str
    token_id: int | None = None


class McpStore:
    """``mcp_tokens`` and MCP clients' ``tool_invocations`` over one engine; every method is
    one short transaction."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def create_token(
        self, user_id: str, *, label: str | None = None
    ) -> tuple[dict[str, Any], str]:
        """A new token of ``user_id``: ``(its row without the hash, the token)``. The token is
        not stored and cannot be shown again."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        stmt = (
            insert(mcp_tokens)
            .values(user_id=user_id, label=label, token_hash=hash_token(token))
            .returning(*_TOKEN_COLUMNS)
        )
        async with self.engine.begin() as conn:
            row = dict((await conn.execute(stmt)).mappings().one())
        return row, token

    async def token_principal(self, token: str) -> McpPrincipal | None:
        """The principal of ``token`` when it is known and not revoked, else ``None``."""
        stmt = select(mcp_tokens.c.id, mcp_tokens.c.user_id).where(
            mcp_tokens.c.token_hash == hash_token(token), mcp_tokens.c.revoked_at.is_(None)
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(stmt)).first()
        return McpPrincipal(user_id=row.user_id, token_id=row.id) if row is not None else None

    async def list_tokens(self, user_id: str | None = None) -> list[dict[str, Any]]:
        """Tokens (revoked ones too, never a hash), oldest first; of ``user_id`` when given."""
        stmt = select(*_TOKEN_COLUMNS).order_by(mcp_tokens.c.id)
        if user_id is not None:
            stmt = stmt.where(mcp_tokens.c.user_id == user_id)
        async with self.engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings()]

    async def revoke_token(self, token_id: int) -> tuple[dict[str, Any], bool]:
        """Revoke token ``token_id``: ``(its row, whether it was live until now)``; revoking a
        revoked token changes nothing.

        Raises:
            NotFoundError: no token has that id.
        """
        return await revoke_token_row(
            self.engine,
            mcp_tokens,
            _TOKEN_COLUMNS,
            token_id,
            f"no MCP token with id {token_id} (see `mana-ai mcp token list`)",
        )

    async def record_call(self, principal: McpPrincipal, row: ToolInvocationRow) -> None:
        """Store one MCP client's call (executed, denied or refused) in ``tool_invocations``."""
        values = {
            "iteration_id": None,
            "mission_id": None,
            "round": None,
            "consumer": "mcp",
            "mcp_token_id": principal.token_id,
            "user_id": principal.user_id,
            "attempt": row.attempt,
            "call_id": row.call_id,
            "tool": row.tool,
            "arguments": row.arguments,
            **invocation_outcome_values(row),
        }
        async with self.engine.begin() as conn:
            await conn.execute(insert(tool_invocations).values(**values))
