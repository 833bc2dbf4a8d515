"""The SQL mana-ai sends, as reviewers read it: every statement a mission's life makes (claim,
rounds with a read and a destructive write, a park for approval, the decision, the resumed
run, the finish) and the admin reads and decisions around it, recorded at the driver
(SQLAlchemy's ``before_cursor_execute``) and written per module that issued it to
``tests/sql/<module>.sql``. A statement that changes, appears or goes fails here with the diff;
``MANA_AI_UPDATE_SQL_SNAPSHOTS=1`` rewrites the files, to be reviewed and committed with the
change (procrastinate keeps its ``queries.sql`` for the same reason)."""

from __future__ import annotations

import difflib
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import greenlet
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse, DestructivePolicy, ToolContext
from planner.policy import PolicyConfig
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.integration.worker_harness import add_mission, make_worker
from worker.policy_setup import PolicySetup
from worker.queries import reads
from worker.queries.approval_requests import ApprovalStore
from worker.queries.missions import AdminStore
from worker.queries.user_policy import PolicyStore
from worker.store.ledger import PostgresCallLedger
from worker.tools import builtin_tools

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "tests" / "sql"
SKIPPED = ("worker/db/engine.py", "worker/db/transient.py")
"""Modules that only pass a statement on: the module that called them issued it."""


def _issuer(frame: FrameType | None) -> tuple[str, str] | None:
    """The ``worker`` module nearest the statement and its public function there (a private
    helper's caller names it): ``("worker.store.postgres", "claim_due")``; ``None`` for
    statements of the test itself."""
    module = function = None
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else ""
        name = rel[:-3].replace("/", ".")
        if module is None:
            if rel.startswith("tests/"):
                return None
            if rel.startswith("worker/") and rel not in SKIPPED:
                module, function = name, frame.f_code.co_name
        elif name != module:
            break
        elif not frame.f_code.co_name.startswith("_") and function.startswith("_"):
            function = frame.f_code.co_name
        frame = frame.f_back
    return None if module is None or function is None else (module, function)


@contextmanager
def recorded() -> Iterator[dict[str, set[tuple[str, str]]]]:
    """Every statement sent while inside, by issuing module: ``{module: {(function, sql)}}``.
    A statement runs in a greenlet whose caller (the coroutine that awaited it) is the
    parent greenlet's frame."""
    seen: dict[str, set[tuple[str, str]]] = defaultdict(set)

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        current = greenlet.getcurrent()
        frame = current.parent.gr_frame if current.parent is not None else sys._getframe(1)
        issuer = _issuer(frame)
        if issuer is not None:
            seen[issuer[0]].add((issuer[1], statement.strip()))

    event.listen(Engine, "before_cursor_execute", on_execute)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", on_execute)


def render(statements: set[tuple[str, str]]) -> str:
    """One module's statements, sorted by function then text, each headed by its function."""
    return "".join(f"-- {fn}\n{sql};\n\n" for fn, sql in sorted(statements)).rstrip("\n") + "\n"


class Model:
    """Reads the clock and deletes note ``note_id`` in round 1, answers in round 2."""

    def __init__(self, note_id: int) -> None:
        self.note_id = note_id

    def __call__(self, request: CompletionRequest) -> CompletionResponse:
        if any(m.role == "tool" for m in request.messages):
            return final_answer("Done.")
        return tool_calls(("clock_now", {}), ("notes_delete", {"id": self.note_id}))


async def a_mission_life(db: AsyncEngine) -> None:
    """Park, decide, resume, finish; then what the admin commands read."""
    policy = PolicySetup(
        default_mode="enforce",  # type: ignore[arg-type]
        config=PolicyConfig(),
        ledger=PostgresCallLedger(db),
        default_destructive=DestructivePolicy.ASK,
    )
    create = {t.name: t for t in builtin_tools(db)}["notes_create"]
    note = await create.handler({"title": "old", "body": "x"}, ToolContext(user_id="u1"))
    mission_id = await add_mission(db, cron=None, objective="Delete the old note.")
    model = FunctionChatModel(Model(int(note["id"])))
    assert await make_worker(db, model, policy=policy).run_once() == ["awaiting_approval"]
    approvals = ApprovalStore(db)
    [request] = await approvals.list_requests()
    await approvals.decide(request["id"], approve=True, by="alice", note="old")
    assert await make_worker(db, model, policy=policy).run_once() == ["succeeded"]

    admin = AdminStore(db)
    await admin.list_agents()
    await admin.list_missions()
    [iteration] = await admin.list_iterations(mission_id=mission_id)
    await admin.get_iteration(iteration["id"])
    await admin.mission_history(mission_id)
    await approvals.of_iteration(iteration["id"])
    await approvals.stats()
    await PolicyStore(db).user_settings("u1")
    async with db.connect() as conn:
        await reads.list_missions(conn, last_run=True)


async def test_the_sql_a_mission_life_sends_is_the_reviewed_sql(db: AsyncEngine) -> None:
    with recorded() as seen:
        await a_mission_life(db)
    assert seen, "no statement was recorded: the recorder lost the issuing frames"
    update = os.environ.get("MANA_AI_UPDATE_SQL_SNAPSHOTS") == "1"
    diffs: list[str] = []
    for module, statements in sorted(seen.items()):
        path = SNAPSHOTS / f"{module}.sql"
        text = render(statements)
        old = path.read_text() if path.exists() else ""
        if text != old:
            if update:
                SNAPSHOTS.mkdir(exist_ok=True)
                path.write_text(text)
            diffs.append(
                "".join(
                    difflib.unified_diff(
                        old.splitlines(True), text.splitlines(True), str(path), "now sent"
                    )
                )
            )
    gone = sorted({p.stem for p in SNAPSHOTS.glob("*.sql")} - set(seen))
    if update:
        for stem in gone:
            (SNAPSHOTS / f"{stem}.sql").unlink()
    assert update or not diffs, "SQL changed (MANA_AI_UPDATE_SQL_SNAPSHOTS=1 rewrites):\n" + (
        "\n".join(diffs)
    )
    assert update or not gone, f"no statement from these any more: {gone}"
