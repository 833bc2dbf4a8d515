"""``mana-ai approvals`` and what the other commands show of approvals, in-process against real
PostgreSQL: a parked run is listed, shown, decided once (a second decision says who decided),
and ``missions``, ``iterations show``, ``replay`` and ``policy report`` say so."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from planner.testing import FunctionChatModel
from tests.integration.cli_harness import as_json
from tests.integration.test_approvals import Model, a_note, asking
from tests.integration.worker_harness import add_mission, make_worker


def status(run: Any, *argv: str) -> tuple[int, str, str]:
    """``run``, with argparse's exit (a malformed value: 2) as the status."""
    try:
        code, out, err = run(*argv)
    except SystemExit as exc:
        return int(exc.code or 0), "", ""
    return int(code), str(out), str(err)


async def cli(run: Any, *argv: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(status, run, *argv)


async def parked(db: AsyncEngine) -> tuple[int, int]:
    note_id = await a_note(db)
    mission_id = await add_mission(db, cron=None, objective="Delete the old note.")
    worker = make_worker(db, FunctionChatModel(Model(note_id)), policy=asking(db))
    assert await worker.run_once() == ["awaiting_approval"]
    return note_id, mission_id


async def test_a_parked_run_is_listed_shown_and_decided_once(db: AsyncEngine, run: Any) -> None:
    note_id, mission_id = await parked(db)
    [request] = await asyncio.to_thread(as_json, run, "approvals", "list", "--status", "pending")
    rid = request["id"]
    code, out, _ = await cli(run, "approvals", "list")
    assert code == 0 and "pending" in out and "notes_delete" in out and "expires" in out
    code, out, _ = await cli(run, "approvals", "show", str(rid))
    assert code == 0 and f"approval request {rid}: pending until" in out
    assert f'notes_delete({{"id": {note_id}}})' in out and "Deleting it." in out
    assert "a person must approve this call" in out and "waiting" in out

    code, out, _ = await cli(run, "missions", "list")
    assert f"active, awaiting approval {rid}" in out
    shown = await asyncio.to_thread(as_json, run, "missions", "show", str(mission_id))
    assert shown["awaiting_approval"] == rid
    code, out, _ = await cli(run, "iterations", "show", "latest")
    assert code == 0 and "notes_delete" in out and f"approval {rid}: pending until" in out
    assert "verdict: parked: waiting for a person's approval of notes_delete" in out
    assert ", parked 20" in out and "finished" not in out
    code, out, _ = await cli(run, "missions", "resume", str(mission_id))
    assert code == 0 and "waits for an approval" in out and "goes on once it is decided" in out
    code, out, _ = await cli(run, "replay", "latest")
    assert "policy asks a person (enforce)" in out and f"approval {rid}: pending" in out

    code, out, _ = await cli(run, "approvals", "approve", str(rid), "--by", "alice", "--note", "ok")
    assert code == 0 and f"approval request {rid} (notes_delete) approved by alice" in out
    code, _, err = await cli(run, "approvals", "deny", str(rid), "--reason", "no")
    assert code == 1 and "was approved by alice at" in err and "nothing changed" in err
    [decided] = await asyncio.to_thread(as_json, run, "approvals", "list", "--status", "approved")
    assert (decided["decided_by"], decided["decision_note"]) == ("alice", "ok")
    report = await asyncio.to_thread(as_json, run, "policy", "report")
    assert report["approvals"] == {"approved": 1}
    assert report["by_mode"]["enforce"]["asked"] == 1

    worker = make_worker(db, FunctionChatModel(Model(note_id)), policy=asking(db))
    assert await worker.run_once() == ["succeeded"]
    report = await asyncio.to_thread(as_json, run, "policy", "report")
    enforced = report["by_mode"]["enforce"]  # the call ran, approved: asked, and allowed
    assert (enforced["asked"], enforced["allowed"], enforced["denied"]) == (1, 1, 0)
    code, out, _ = await cli(run, "iterations", "show", "latest")
    assert "; 2 by w1 (resumed after round 1, after the approval decision)" in out
    assert "resumed here with the approval decision, after round 1" in out


async def test_bad_decisions_are_refused_and_change_nothing(db: AsyncEngine, run: Any) -> None:
    await parked(db)
    [request] = await asyncio.to_thread(as_json, run, "approvals", "list")
    rid = str(request["id"])
    assert (await cli(run, "approvals", "approve", "999"))[0] == 1
    assert (await cli(run, "approvals", "approve", rid, "--by", "a\nb"))[0] == 2
    code, _, err = await cli(run, "approvals", "deny", rid, "--reason", "\x1b[2J")
    assert code == 2 and "--reason" in err
    assert (await cli(run, "approvals", "list", "--status", "maybe"))[0] == 2
    [still] = await asyncio.to_thread(as_json, run, "approvals", "list")
    assert still["status"] == "pending"


def test_agents_take_a_destructive_policy_of_their_own(run: Any) -> None:
    agent = as_json(
        run, "agents", "add", "--name", "careful", "--owner", "u", "--destructive", "ask"
    )
    assert agent["destructive_policy"] == "ask"
    code, out, _ = run("agents", "list")
    assert code == 0 and " ask " in f" {out} "
    changed = as_json(run, "agents", "set", "careful", "--destructive", "default")
    assert changed["destructive_policy"] is None
    code, out, _ = run("agents", "list")
    assert "default (deny)" in out
    assert status(run, "agents", "set", "careful", "--destructive", "maybe")[0] == 2
    assert json.loads(run("agents", "list", "--json")[1])[0]["destructive_policy"] is None
