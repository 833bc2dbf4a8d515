"""Who may use the HTTP API and the console: admin tokens and console sessions.

* Tokens (``admin_tokens``): ``create_token`` makes a random token (256 bits,
  ``secrets.token_urlsafe``, prefixed ``mana_admin_`` so a leaked one is recognisable) and
  stores only its SHA-256 (``worker.queries.mcp_tokens.hash_token``); the token is returned once.
  ``principal`` finds the live token of a presented one: one indexed query per request, so a
  revocation applies to the next request. A ``read_only`` token changes nothing.
* Sessions (``admin_sessions``): signing in to the console with a token starts a session whose
  random id goes in an HttpOnly cookie; only its SHA-256 is stored. ``session_principal``
  finds the live session of a cookie (not ended, not expired, its token not revoked).
  ``csrf_token`` derives the session's CSRF token from its id (a keyed hash: whoever lacks the
  cookie cannot compute it, and nothing more needs storing).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, insert, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.tables import admin_sessions, admin_tokens
from worker.errors import ConflictError
from worker.queries.mcp_tokens import hash_token, revoke_token_row

__all__ = ["ADMIN_TOKEN_PREFIX", "AdminPrincipal", "AdminTokenStore", "csrf_token", "name_key"]

ADMIN_TOKEN_PREFIX = "mana_admin_"
"""Every admin token starts with it (secret scanners, logs)."""

ENDED_SESSIONS_KEPT = timedelta(days=1)
"""How long an ended or expired console session is kept before a sign-in deletes it."""

_TOKEN_COLUMNS = (
    admin_tokens.c.id,
    admin_tokens.c.name,
    admin_tokens.c.read_only,
    admin_tokens.c.created_at,
    admin_tokens.c.revoked_at,
    admin_tokens.c.last_used_at,
)  # never the hash


@dataclass(frozen=True)
class AdminPrincipal:
    """Who a request of the API or the console runs for: the token's ``name`` (kept with
    what it decides) and whether it may change anything (``read_only``)."""

    token_id: int
    name: str
    read_only: bool = False


def csrf_token(session_id: str) -> str:
    """The CSRF token of the console session ``session_id``: hex HMAC-SHA-256 of a fixed
    label keyed with the session id (the cookie's secret), so only a page of that session
    knows it."""
    return hmac.new(session_id.encode(), b"mana-ai csrf", hashlib.sha256).hexdigest()


def name_key(name: str) -> str:
    """What two token names are compared by: NFKC (fullwidth ``U+FF41`` is ``a``; ``é``
    precomposed is ``e`` with a combining accent) and case-folded (``ALICE`` is ``alice``).
    Look-alikes from other scripts (Cyrillic ``U+0430``) stay apart: operators make tokens and
    pick their names."""
    return unicodedata.normalize("NFKC", name).casefold()


class AdminTokenStore:
    """``admin_tokens`` and ``admin_sessions`` over one engine (see the module docstring);
    every method is one short transaction."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def create_token(
        self, name: str, *, read_only: bool = False
    ) -> tuple[dict[str, Any], str]:
        """A new token for ``name``: ``(its row without the hash, the token)``. The token is
        not stored and cannot be shown again.

        Raises:
            ConflictError: a live (not revoked) token has that name already, compared as
                ``name_key`` compares (``Alice`` is ``alice``): the name is who decides, so two
                live tokens never share one (index ``uq_admin_tokens_live_name``).
        """
        token = ADMIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
        name = unicodedata.normalize("NFC", name)
        stmt = (
            pg_insert(admin_tokens)
            .values(
                name=name,
                name_key=name_key(name),
                read_only=read_only,
                token_hash=hash_token(token),
            )
            .on_conflict_do_nothing(
                index_elements=["name_key"], index_where=text("revoked_at IS NULL")
            )
            .returning(*_TOKEN_COLUMNS)
        )
        async with self.engine.begin() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        if row is None:
            raise ConflictError(
                f"a live admin token is named {name!r} already (a name is who decides, so it "
                "is one person's); pick another name, or revoke that token first "
                "(`mana-ai admin token list`)"
            )
        return dict(row), token

    async def list_tokens(self) -> list[dict[str, Any]]:
        """Every token (revoked ones too, never a hash), oldest first."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(*_TOKEN_COLUMNS).order_by(admin_tokens.c.id))
            return [dict(r) for r in rows.mappings()]

    async def revoke_token(self, token_id: int) -> tuple[dict[str, Any], bool]:
        """Revoke token ``token_id`` (its console sessions end with it): ``(its row, whether it
        was live until now)``.

        Raises:
            NotFoundError: no token has that id.
        """
        return await revoke_token_row(
            self.engine,
            admin_tokens,
            _TOKEN_COLUMNS,
            token_id,
            f"no admin token with id {token_id} (see `mana-ai admin token list`)",
        )

    async def principal(self, token: str) -> AdminPrincipal | None:
        """The principal of a live ``token`` (and its use stamped), else ``None``."""
        stmt = (
            update(admin_tokens)
            .where(
                admin_tokens.c.token_hash == hash_token(token), admin_tokens.c.revoked_at.is_(None)
            )
            .values(last_used_at=func.now())
            .returning(admin_tokens.c.id, admin_tokens.c.name, admin_tokens.c.read_only)
        )
        async with self.engine.begin() as conn:
            row = (await conn.execute(stmt)).first()
        if row is None:
            return None
        return AdminPrincipal(token_id=int(row.id), name=row.name, read_only=bool(row.read_only))

    async def start_session(
        self, token: str, *, ttl: timedelta
    ) -> tuple[AdminPrincipal, str] | None:
        """Sign in with ``token``: a new session of ``ttl`` and its id (for the cookie), or
        ``None`` when the token is not live. Sessions that ended or expired more than
        ``ENDED_SESSIONS_KEPT`` ago are deleted on the way (a sign-in is rare; nothing else
        needs them)."""
        principal = await self.principal(token)
        if principal is None:
            return None
        session_id = secrets.token_urlsafe(32)
        stmt = insert(admin_sessions).values(
            session_hash=hash_token(session_id),
            token_id=principal.token_id,
            expires_at=func.now() + ttl,
        )
        over = func.now() - ENDED_SESSIONS_KEPT
        sessions = admin_sessions.c
        purge = delete(admin_sessions).where(
            or_(sessions.expires_at < over, sessions.ended_at < over)
        )
        async with self.engine.begin() as conn:
            await conn.execute(purge)
            await conn.execute(stmt)
        return principal, session_id

    async def session_principal(self, session_id: str) -> AdminPrincipal | None:
        """The principal of a live session (not ended, not expired, its token not revoked),
        else ``None``."""
        sessions, tokens = admin_sessions.c, admin_tokens.c
        stmt = (
            select(tokens.id, tokens.name, tokens.read_only)
            .select_from(admin_sessions.join(admin_tokens, tokens.id == sessions.token_id))
            .where(
                sessions.session_hash == hash_token(session_id),
                sessions.ended_at.is_(None),
                sessions.expires_at > func.now(),
                tokens.revoked_at.is_(None),
            )
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(stmt)).first()
        if row is None:
            return None
        return AdminPrincipal(token_id=int(row.id), name=row.name, read_only=bool(row.read_only))

    async def end_session(self, session_id: str) -> None:
        """Sign out: the session ends now (nothing happens for an unknown one)."""
        stmt = (
            update(admin_sessions)
            .where(
                admin_sessions.c.session_hash == hash_token(session_id),
                admin_sessions.c.ended_at.is_(None),
            )
            .values(ended_at=func.now())
        )
        async with self.engine.begin() as conn:
            await conn.execute(stmt)
