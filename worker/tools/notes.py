"""The built-in notes workspace: six tools over the ``notes`` table, scope ``notes``.

Every query is filtered by ``ctx.user_id``: a user's agents see, change and delete only that
user's notes. A note id that belongs to another user is answered exactly like an id that does
not exist, so ids leak nothing.

The writes' effects live in mana-ai's own database, so each write tool has an ``effect``
(``ToolSpec.effect``: its statement on a connection in a transaction its caller owns): a
mission run commits it together with the call's record (``MissionStore.run_effect``), so a
call found started after its worker died never took effect and runs again, with its approval
if a person gave one; the handler runs it in a transaction of its own (``mcp serve``).
``notes_create`` also makes at most one note per idempotency key (a second attempt at the same
call returns the note the first made: ``ToolSpec.idempotent``), and each write tool's
``outcome_of`` tells what a call did.

Results are JSON objects (timestamps as ISO-8601 strings in UTC). Failures the model should
react to (an unknown id, an update with nothing to change) raise ``LookupError`` /
``ValueError`` with a message written for the model; the loop turns them into error tool
results. A database that fails transiently (``worker.db.transient.is_transient``) is not the
model's to handle: the tools raise ``RunInterrupted``, the run stops and resumes later (a
write in flight is then reported by its ``outcome_of``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import RowMapping, Select, delete, func, or_, select, union_all, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.expression import Executable

from planner.errors import RunInterrupted, ToolError
from planner.tools import EffectHandler, ToolContext, ToolSpec
from worker.db.tables import notes
from worker.db.transient import describe_error, is_transient, refused_text

__all__ = [
    "BODY_MAX_CHARS",
    "LIST_DEFAULT",
    "LIST_MAX",
    "QUERY_MAX_CHARS",
    "SNIPPET_CHARS",
    "TITLE_MAX_CHARS",
    "notes_tools",
]

TITLE_MAX_CHARS = 200
BODY_MAX_CHARS = 20_000
QUERY_MAX_CHARS = 200
LIST_DEFAULT = 20
LIST_MAX = 100
SNIPPET_CHARS = 160
SCOPE = "notes"

_ID = {
    "type": "integer",
    "minimum": 1,
    "maximum": 2**63 - 1,  # a BIGINT: a larger id is no note's
    "description": "The note's id.",
}
_LIMIT = {
    "type": "integer",
    "minimum": 1,
    "maximum": LIST_MAX,
    "default": LIST_DEFAULT,
    "description": f"At most this many notes (1-{LIST_MAX}, default {LIST_DEFAULT}).",
}
_TITLE = {
    "type": "string",
    "minLength": 1,
    "maxLength": TITLE_MAX_CHARS,
    "pattern": r"\S",
    "description": f"A short title (1-{TITLE_MAX_CHARS} characters, not only spaces).",
}
_BODY = {
    "type": "string",
    "maxLength": BODY_MAX_CHARS,
    "description": f"The note's text (at most {BODY_MAX_CHARS} characters).",
}


def _object(properties: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        **extra,
    }


def notes_tools(engine: AsyncEngine) -> list[ToolSpec]:
    """The notes tools, bound to ``engine``: list, search, read (``read``), create, update
    (``write``) and delete (``destructive``), all in scope ``notes``."""
    book = _Notebook(engine)
    specs = [*_read_specs(book), *_write_specs(book)]
    return [
        dataclasses.replace(spec, handler=_interrupting_on_outage(spec.name, spec.handler))
        for spec in specs
    ]


@dataclasses.dataclass(frozen=True)
class _Notebook:
    """The notes tools' reads over ``engine``, each in a connection of its own: the read
    tools' handlers and the write tools' ``outcome_of``."""

    engine: AsyncEngine

    async def notes_list(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """``notes_list``: the user's notes, most recently changed first."""
        limit = int(args.get("limit", LIST_DEFAULT))
        query = (
            select(notes.c.id, notes.c.title, notes.c.updated_at)
            .where(notes.c.user_id == ctx.user_id)
            .order_by(notes.c.updated_at.desc(), notes.c.id.desc())
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return {"notes": [_summary(row) for row in rows], "count": len(rows)}

    async def notes_search(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """``notes_search``: the user's notes whose title or body contains the query."""
        text = _text(args, "query")
        limit = int(args.get("limit", LIST_DEFAULT))
        pattern = f"%{escape_like(text)}%"
        query = (
            select(notes.c.id, notes.c.title, notes.c.body, notes.c.updated_at)
            .where(
                notes.c.user_id == ctx.user_id,
                or_(
                    notes.c.title.ilike(pattern, escape="\\"),
                    notes.c.body.ilike(pattern, escape="\\"),
                ),
            )
            .order_by(notes.c.updated_at.desc(), notes.c.id.desc())
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        found = [{**_summary(row), "snippet": snippet(row["body"], text)} for row in rows]
        return {"query": text, "notes": found, "count": len(found)}

    async def notes_read(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """``notes_read``: one of the user's notes in full; LookupError when it has none."""
        note_id = int(args["id"])
        query = select(notes).where(notes.c.id == note_id, notes.c.user_id == ctx.user_id)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).mappings().one_or_none()
        if row is None:
            raise LookupError(_missing(note_id))
        return _full(row)

    async def notes_create_outcome(self, args: dict[str, Any], ctx: ToolContext) -> str | None:
        """What a ``notes_create`` call did: the note it made, or none."""
        if ctx.idempotency_key is None:
            return None
        query = select(notes.c.id, notes.c.title).where(
            notes.c.user_id == ctx.user_id, notes.c.idempotency_key == ctx.idempotency_key
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        if row is None:
            return "no note was created by that call (it can safely be made again)"
        return f"that call created note {row.id} titled {row.title!r}; do not create it again"

    async def note_state(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """What an update or delete call left: the note as it is now, or that it is gone."""
        note_id = int(args["id"])
        query = select(notes.c.title, notes.c.updated_at).where(
            notes.c.id == note_id, notes.c.user_id == ctx.user_id
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        if row is None:
            return f"note {note_id} does not exist now"
        return (
            f"note {note_id} exists now, titled {row.title!r}, last changed {_iso(row.updated_at)}"
        )

    async def note_target(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """What an update or delete call would act on, for its reviewer (``describe``): the
        note's title, size and last change, or that the user has no such note."""
        note_id = int(args["id"])
        # the version: a digest of everything the call would act on, so that an approval is
        # bound to the note's content, not to what its card can show of it
        content = func.concat_ws("\x1f", notes.c.title, notes.c.body, notes.c.updated_at)
        query = select(
            notes.c.title,
            func.char_length(notes.c.body).label("size"),
            notes.c.updated_at,
            func.left(func.md5(content), 12).label("version"),
        ).where(notes.c.id == note_id, notes.c.user_id == ctx.user_id)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        if row is None:
            return f"note {note_id}: the user has no such note"
        size = row.size or 0
        changed = row.updated_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        title = repr(row.title)
        if len(title) > _TITLE_SHOWN:
            title = title[: _TITLE_SHOWN - 1] + "…"
        return (
            f"note {note_id} {title} (a body of {size} character{'' if size == 1 else 's'}, "
            f"last changed {changed}, version {row.version})"
        )


async def notes_create(
    args: dict[str, Any], ctx: ToolContext, conn: AsyncConnection
) -> dict[str, Any]:
    """``notes_create``'s effect: at most one note per call (a second attempt at the same call,
    same idempotency key, returns the note the first one made)."""
    values = {
        "user_id": ctx.user_id,
        "title": _text(args, "title"),
        "body": _text(args, "body"),
        "idempotency_key": ctx.idempotency_key,
    }
    row = (await conn.execute(_created_or_earlier(values))).first()
    if row is None:
        # the attempt that made it committed while this statement ran (its snapshot is
        # older than the note): a statement of its own sees it
        row = (await conn.execute(_note_of_call(ctx.user_id, ctx.idempotency_key))).first()
        if row is None:
            raise RuntimeError(f"note of call {ctx.idempotency_key} neither created nor found")
    return {
        "id": row.id,
        "title": row.title,
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
    }


async def notes_update(
    args: dict[str, Any], ctx: ToolContext, conn: AsyncConnection
) -> dict[str, Any]:
    """``notes_update``'s effect: a new title, body or both; ValueError without a change,
    LookupError for a note the user does not have."""
    note_id = int(args["id"])
    changes = {key: _text(args, key) for key in ("title", "body") if key in args}
    if not changes:
        raise ValueError("nothing to change: give a new title, a new body, or both")
    statement = (
        update(notes)
        .where(notes.c.id == note_id, notes.c.user_id == ctx.user_id)
        .values(**changes, updated_at=func.now())
        .returning(notes.c.id, notes.c.title, notes.c.updated_at)
    )
    row = (await conn.execute(statement)).mappings().one_or_none()
    if row is None:
        raise LookupError(_missing(note_id))
    return {**_summary(row), "changed": sorted(changes)}


async def notes_delete(
    args: dict[str, Any], ctx: ToolContext, conn: AsyncConnection
) -> dict[str, Any]:
    """``notes_delete``'s effect; LookupError for a note the user does not have."""
    note_id = int(args["id"])
    statement = (
        delete(notes)
        .where(notes.c.id == note_id, notes.c.user_id == ctx.user_id)
        .returning(notes.c.id, notes.c.title)
    )
    row = (await conn.execute(statement)).one_or_none()
    if row is None:
        raise LookupError(_missing(note_id))
    return {"deleted": row.id, "title": row.title}


def _read_specs(book: _Notebook) -> list[ToolSpec]:
    """``notes_list``, ``notes_search`` and ``notes_read``."""
    return [
        ToolSpec(
            name="notes_list",
            description=(
                "List your notes, most recently changed first: id, title and last change time "
                "(no bodies; use notes_read for one note's text)."
            ),
            input_schema=_object({"limit": _LIMIT}, []),
            policy_hint="read",
            scope=SCOPE,
            handler=book.notes_list,
        ),
        ToolSpec(
            name="notes_search",
            description=(
                "Find your notes whose title or text contains `query` (plain text, "
                "case-insensitive; no wildcards). Returns id, title, last change time and a "
                "short snippet around the first match, most recently changed first."
            ),
            input_schema=_object(
                {
                    "query": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": QUERY_MAX_CHARS,
                        "description": "Text to look for, matched literally.",
                    },
                    "limit": _LIMIT,
                },
                ["query"],
            ),
            policy_hint="read",
            scope=SCOPE,
            handler=book.notes_search,
        ),
        ToolSpec(
            name="notes_read",
            description="Read one of your notes in full: title, text, creation and change times.",
            input_schema=_object({"id": _ID}, ["id"]),
            policy_hint="read",
            scope=SCOPE,
            handler=book.notes_read,
        ),
    ]


def _write_specs(book: _Notebook) -> list[ToolSpec]:
    """``notes_create``, ``notes_update`` and ``notes_delete``: each with its ``effect``, a
    handler running it in a transaction of its own, and an ``outcome_of``."""
    engine = book.engine
    return [
        ToolSpec(
            name="notes_create",
            description="Create a note with a title and optional text. Returns the new note's id.",
            input_schema=_object({"title": _TITLE, "body": _BODY}, ["title"]),
            policy_hint="write",
            scope=SCOPE,
            handler=_in_own_transaction(engine, notes_create),
            effect=notes_create,
            outcome_of=book.notes_create_outcome,
            idempotent=True,  # at most one note per idempotency key
        ),
        ToolSpec(
            name="notes_update",
            description=(
                "Change one of your notes: give its id and a new title, a new text, or both "
                "(the text is replaced, not appended to)."
            ),
            input_schema=_object(
                {"id": _ID, "title": _TITLE, "body": _BODY}, ["id"], minProperties=2
            ),
            policy_hint="write",
            scope=SCOPE,
            handler=_in_own_transaction(engine, notes_update),
            effect=notes_update,
            outcome_of=book.note_state,
            describe=_interrupting_on_outage("notes", book.note_target),
        ),
        ToolSpec(
            name="notes_delete",
            description="Delete one of your notes for good. This cannot be undone.",
            input_schema=_object({"id": _ID}, ["id"]),
            policy_hint="destructive",
            scope=SCOPE,
            handler=_in_own_transaction(engine, notes_delete),
            effect=notes_delete,
            outcome_of=book.note_state,
            describe=_interrupting_on_outage("notes", book.note_target),
        ),
    ]


def _in_own_transaction(engine: AsyncEngine, effect: EffectHandler) -> Handler:
    """A handler running ``effect`` in a transaction of its own (a consumer that journals
    its calls runs the spec's ``effect`` in its own, with the call's record)."""

    async def handle(args: dict[str, Any], ctx: ToolContext) -> Any:
        async with engine.begin() as conn:
            return await effect(args, ctx, conn)

    return handle


_TITLE_SHOWN = 160
"""Characters of a note's title (as ``repr`` writes it) a read-back shows: the rest of the
read-back (size, last change, version) must fit on the card (500 characters)."""

_CREATED = (notes.c.id, notes.c.title, notes.c.created_at, notes.c.updated_at)
"""What ``notes_create`` answers with."""


def _created_or_earlier(values: dict[str, Any]) -> Executable:
    """One statement: insert the note of ``values``, or, when a note with its idempotency key
    exists (an earlier attempt at the same call made it), nothing; either way its
    ``_CREATED`` columns. No row when the earlier note committed after the statement's
    snapshot was taken (a concurrent attempt): ``_note_of_call`` then finds it."""
    inserted = (
        pg_insert(notes)
        .values(**values)
        .on_conflict_do_nothing(
            index_elements=["user_id", "idempotency_key"],
            index_where=notes.c.idempotency_key.is_not(None),
        )
        .returning(*_CREATED)
    )
    if values["idempotency_key"] is None:
        return inserted  # nothing to conflict with: it inserts
    made = inserted.cte("made")
    return union_all(
        select(made.c.id, made.c.title, made.c.created_at, made.c.updated_at),
        _note_of_call(values["user_id"], values["idempotency_key"]).where(
            ~select(made.c.id).exists()
        ),
    )


def _note_of_call(user_id: str, key: str | None) -> Select[Any]:
    """The ``_CREATED`` columns of ``user_id``'s note made by the call with idempotency key
    ``key``."""
    return select(*_CREATED).where(
        notes.c.user_id == user_id,
        notes.c.idempotency_key.is_not(None),
        notes.c.idempotency_key == key,
    )


Handler = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]


def _interrupting_on_outage(name: str, handler: Handler) -> Handler:
    """``handler`` with a transient database failure raised as ``RunInterrupted``, and one the
    database refused as ``ToolError`` in words (``refused_text``: no statement text)."""

    async def handle(args: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            return await handler(args, ctx)
        except Exception as exc:
            if is_transient(exc):
                raise RunInterrupted(
                    f"{name}: the notes database did not answer ({describe_error(exc)})"
                ) from exc
            if isinstance(exc, SQLAlchemyError):
                raise ToolError(f"{name} failed: {refused_text(exc)}") from exc
            raise

    return handle


def escape_like(text: str) -> str:
    """``text`` with LIKE's wildcards (``%``, ``_``) and the escape character ``\\`` escaped,
    for a pattern used with ``ESCAPE '\\'``."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def snippet(body: str, query: str, width: int = SNIPPET_CHARS) -> str:
    """About ``width`` characters of ``body`` around the first case-insensitive match of
    ``query`` (the start of the body when the match is in the title), with ``…`` where cut."""
    at = body.lower().find(query.lower())
    start = 0 if at < 0 else max(0, at - (width - len(query)) // 2)
    end = min(len(body), start + width)
    start = max(0, min(start, end - width))
    return ("…" if start > 0 else "") + body[start:end] + ("…" if end < len(body) else "")


def _text(args: dict[str, Any], key: str) -> str:
    """``args[key]`` as text (``""`` when absent). Raises ValueError, for the model to read,
    on what PostgreSQL text cannot hold: a NUL character or an unpaired UTF-16 surrogate."""
    value = str(args.get(key, ""))
    if "\x00" in value:
        raise ValueError(f"{key} contains a NUL character (\\x00), which notes cannot hold")
    if any("\ud800" <= c <= "\udfff" for c in value):
        raise ValueError(f"{key} contains an unpaired surrogate, which is not valid text")
    return value


def _missing(note_id: int) -> str:
    return f"no note with id {note_id}"


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def _summary(row: RowMapping) -> dict[str, Any]:
    return {"id": row["id"], "title": row["title"], "updated_at": _iso(row["updated_at"])}


def _full(row: RowMapping) -> dict[str, Any]:
    return {
        "id": row["id"],
        "title": row["title"],
        "body": row["body"],
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
    }
